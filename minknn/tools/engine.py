"""The plumbing shared by train.py and evaluate.py: seeds, device, batches, prediction.

Training batches are tokenised on the fly and padded to their longest example; the encoder then
computes on the real tokens only (minknn/bert.py), so the padding costs little but the attention.
For prediction the examples are also sorted by length first, so that each batch holds examples of
similar length and almost no padding; the outputs are put back in the original order.
"""
import contextlib
import random

import numpy as np
import torch

from minknn import MinknnError, progress_bar
from minknn.model import represent


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA


def random_states():
    """Every generator a training step draws from (torch's also drives dropout)."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state["numpy"] = [kind, keys.tolist(), pos, has_gauss, gauss]  # no arrays: weights_only
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_random_states(state):
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def pick_device(name="auto"):
    """'auto' is CUDA when a GPU is visible, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise MinknnError(f"--device '{name}': minknn runs on auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MinknnError(f"--device {name}: no CUDA GPU is visible to PyTorch")
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise MinknnError(f"--device {name}: only {torch.cuda.device_count()} CUDA GPU(s) visible")
    return device


PRECISIONS = ("fp32", "bf16")  # --precision


def default_precision(device):
    """bf16 on CUDA; fp32 on the CPU, whose bf16 matmuls run far slower without bf16 matrix
    units."""
    return "bf16" if device.type == "cuda" else "fp32"


def autocast(device, precision=None):
    """--precision bf16: autocast (matmuls in bf16, softmax and LayerNorm kept in fp32 by PyTorch's
    rules; the weights stay fp32); fp32: nothing. None: the device's default. bf16 on the CPU is
    slow, but it runs the CUDA path's dtypes, so the tests catch dtype mistakes without a GPU."""
    if (precision or default_precision(device)) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def texts_of(examples):
    """(texts, texts_b): the examples' first texts, and their second texts for a pair task
    (else None)."""
    return ([e.text for e in examples],
            [e.text_b for e in examples] if examples[0].text_b is not None else None)


def to_device(batch, device):
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def encode_batch(tokenizer, examples, siamese=False):
    """Tokenizer inputs for a batch, padded to its longest: single texts, pairs as one sequence
    [CLS] a [SEP] b [SEP], or (siamese) pairs as the B first texts followed by the B second ones."""
    texts, texts_b = texts_of(examples)
    if texts_b is not None and siamese:
        return tokenizer(texts + texts_b)
    return tokenizer(texts, texts_b)


class TrainBatches:
    """Batches of row indices into n training examples, one shuffled pass after another, for
    ever; the last batch of a pass may be short. A run of several tasks draws one batch of each
    per step, so a smaller task starts a new pass whenever it runs out. Rows, not examples: the
    memory bank updates the entries of the batch's rows. Its place in the pass (state_dict) is
    saved with a run's last state, so a resumed run draws the batches it would have drawn."""

    def __init__(self, n, batch_size, rng):
        self.n, self.batch_size, self.rng = n, batch_size, rng
        self.order, self.pos = [], n  # the first batch starts a pass

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos >= self.n:
            self.order = list(range(self.n))
            self.rng.shuffle(self.order)
            self.pos = 0
        rows = self.order[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        return rows

    def state_dict(self):
        return {"order": list(self.order), "pos": self.pos}

    def load_state_dict(self, state):
        self.order, self.pos = list(state["order"]), state["pos"]


class PairBatches:
    """The batch stream of a loss trained on pairs (--loss setfit) or triplets (ancsetfit): each
    batch the rows of its pairs' first texts, then of their second ones (2B rows for B pairs; a
    triplet's third ones after them, 3B rows); one shuffled pass over the pairs after another
    (TrainBatches over the pair list). pairs: [(row, row)] or [(row, row, row)], drawn once by
    the loss from the run's rng, so a resumed run rebuilds the same ones; its place in the pass
    is saved with last.pt."""

    def __init__(self, pairs, batch_size, rng):
        self.pairs = pairs
        self.batches = TrainBatches(len(pairs), batch_size, rng)
        self.n = len(pairs)

    def __iter__(self):
        return self

    def __next__(self):
        chosen = [self.pairs[r] for r in next(self.batches)]
        return [t[k] for k in range(len(chosen[0])) for t in chosen]

    def state_dict(self):
        return self.batches.state_dict()

    def load_state_dict(self, state):
        self.batches.load_state_dict(state)


@torch.inference_mode()
def predict(model, tokenizer, task, examples, batch_size, device, progress=None, key=None,
            precision=None):
    """The model's outputs on one task's examples, as float32 CPU tensors in their order:
    (outputs (N, C) or (N,) for a similarity score, representations (N, H)). The representations
    are the pooled z, or with `key` the one it names (model.represent, for a kNN datastore); None
    for a siamese pair task, whose pairs have two. progress: an optional tqdm description;
    precision: --precision (None: the device's default)."""
    model.eval()
    texts, texts_b = texts_of(examples)
    siamese = model.siamese(task)
    if siamese:  # each text tokenised alone, batched by the longer of the two
        encodings = list(zip(tokenizer.encode(texts), tokenizer.encode(texts_b)))
        lengths = [max(len(a[0]), len(b[0])) for a, b in encodings]
    else:  # tokenised once, then sorted by length
        encodings = [(e,) for e in tokenizer.encode(texts, texts_b)]  # one side, (ids, type_ids)
        lengths = [len(ids) for ((ids, _),) in encodings]
    chunks, inverse = batches_by_length(lengths, batch_size, progress)
    outputs, representations = [], []
    for chunk in chunks:
        sides = [[encodings[i][side] for i in chunk] for side in range(len(encodings[0]))]
        batch = to_device(tokenizer.pad([e for side in sides for e in side]), device)
        with autocast(device, precision):
            out = model(task.name, **batch)
        outputs.append(out.logits.float().cpu())
        if not siamese:
            z = out.z if key is None else represent(out, batch["attention_mask"], key)
            representations.append(z.float().cpu())
    return (torch.cat(outputs)[inverse],
            torch.cat(representations)[inverse] if not siamese else None)


def batches_by_length(lengths, batch_size, progress=None):
    """Prediction batches: lists of example indices in order of length, and `inverse`, which
    puts the concatenated batch outputs back in the examples' order (outputs[inverse])."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return (progress_bar(chunks, desc=progress, leave=False) if progress else chunks), inverse
