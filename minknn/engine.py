"""The plumbing shared by train.py and evaluate.py: seeds, device, batches, prediction.

Batches are tokenised on the fly and padded to their longest example. For prediction the
examples are also sorted by length first, so that each batch holds examples of similar length
and almost no padding; the outputs are put back in the original order.
"""
import contextlib
import random

import numpy as np
import torch
from tqdm import tqdm

from minknn import MinknnError
from minknn.model import represent


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA


def pick_device(name="auto"):
    """'auto' is CUDA when a GPU is visible, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MinknnError(f"--device {name}: no CUDA GPU is visible to PyTorch")
    try:
        return torch.device(name)
    except RuntimeError:
        raise MinknnError(f"--device '{name}' is not a device; use auto, cpu or cuda") from None


def autocast(device):
    """bf16 autocast on CUDA (matmuls in bf16, softmax/LayerNorm kept in fp32 by PyTorch's rules).
    The CPU stays in fp32: CPUs without bf16 matrix units run bf16 matmuls far slower."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def texts_of(examples):
    """(texts, texts_b): the examples' first texts, and their second texts for a pair task (else None)."""
    return [e.text for e in examples], ([e.text_b for e in examples] if examples[0].text_b is not None else None)


def to_device(batch, device):
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def encode(tokenizer, examples, device):
    """Tokenises a list of Examples into model inputs on `device`, padded to the longest."""
    return to_device(tokenizer(*texts_of(examples)), device)


def labels_tensor(examples, device):
    return torch.tensor([e.label for e in examples], device=device)


def train_batches(n, batch_size, rng):
    """One epoch of shuffled batches of row indices into the n training examples (the memory bank
    needs the rows); the last batch may be short."""
    order = list(range(n))
    rng.shuffle(order)
    for i in range(0, n, batch_size):
        yield order[i:i + batch_size]


@torch.inference_mode()
def predict(model, tokenizer, examples, batch_size, device, progress=None, key=None):
    """Returns (logits (N, C), embeddings (N, H)) as float32 CPU tensors, in the order of
    `examples`. embeddings are the pooled z, or with `key` the representation it names
    (model.represent, for a kNN datastore). progress: an optional tqdm description."""
    model.eval()
    encodings = tokenizer.encode(*texts_of(examples))  # tokenised once, then sorted by length
    chunks, inverse = batches_by_length([len(ids) for ids, _ in encodings], batch_size, progress)
    logits, embeddings = [], []
    for chunk in chunks:
        batch = to_device(tokenizer.pad([encodings[i] for i in chunk]), device)
        with autocast(device):
            out = model(**batch)
        logits.append(out.logits.float().cpu())
        z = out.embeddings if key is None else represent(out, batch["attention_mask"], key)
        embeddings.append(z.float().cpu())
    return torch.cat(logits)[inverse], torch.cat(embeddings)[inverse]


def batches_by_length(lengths, batch_size, progress=None):
    """Prediction batches: lists of example indices in order of length, and `inverse`, which
    puts the concatenated batch outputs back in the examples' order (outputs[inverse])."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return (tqdm(chunks, desc=progress, leave=False) if progress else chunks), inverse
