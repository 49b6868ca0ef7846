"""The memory of the memory losses (--loss knnbert, --loss moco): a labelled MoCo queue filled by a
momentum key encoder, or a memory bank (--memory queue|bank).

Queue (He et al. 2020, "Momentum Contrast"; KNN-BERT sec. 3.4):
    key encoder    a copy of the model, never trained by gradients; after every step
                       theta_k <- m theta_k + (1 - m) theta_q,   m = 0.999 (--momentum)
                   (KNN-BERT eq. 5). It runs without dropout: its keys are targets, and the
                   query's own dropout is the only noise between a query and its key.
    queue          K keys k = pool(key_encoder(x)) / ||.|| with their labels y, K = --queue_size
                   (default min(32000, training set size), as KNN-BERT: a small training set
                   goes in whole). After each step the batch's keys are written at a pointer
                   that wraps round the end, overwriting the oldest keys (first in, first out),
                   so any batch size works, a short last batch too. Each key vector is
                   normalised (dim 1), never each dimension across keys.
Memory bank (Wu et al. 2018, "Unsupervised Feature Learning via Non-Parametric Instance
Discrimination", sec. 3.2): one entry per training example, no key encoder; when example i is in
a batch its entry moves towards the query's representation f_i:
                       v_i <- (m v_i + (1 - m) f_i) / ||m v_i + (1 - m) f_i||,   m = 0.5 (theirs)
Both are filled before the first step by one pass over the training set (the queue with its
first K examples) through the same pooling and normalisation as the keys of training, with the
examples' true labels. Each key also keeps the id of its example (its row in the training set):
when the whole training set fits in the queue, a query's own older key is in memory, cosine
about 0.995 to its fresh key, and the losses leave it out (losses/moco.py, losses/knnbert.py).
Their tensors are registered buffers, saved with the checkpoint.
MoCo's shuffle-BN is not needed here: it fights BatchNorm's batch statistics, and BERT has only
LayerNorm, which normalises each example on its own.
Under DDP (minknn/tools/distributed.py) every rank holds the same memory as one process would: the
key encoder encodes the rank's slice of the batch, and the keys of all ranks are gathered (without
gradient, MoCo's concat_all_gather) before the loss and the enqueue, with the whole batch's labels
and rows; a memory bank moves towards the gathered queries. The fill is sharded: each rank encodes
its share of the examples, and the keys are gathered in their order. The key encoders stay equal,
because DDP keeps the models equal.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from minknn import MinknnError
from minknn.tools.distributed import gather_keys, is_main, rank, sizes, slice_of, world
from minknn.tools.engine import predict

MOMENTUM, BANK_MOMENTUM, QUEUE_SIZE = 0.999, 0.5, 32000


class KeyEncoder:
    def __init__(self, model, m=MOMENTUM):
        self.encoder, self.m = copy.deepcopy(model).eval(), m
        for p in self.encoder.parameters():
            p.requires_grad = False

    @torch.no_grad()
    def update(self, model):
        """theta_k <- m theta_k + (1 - m) theta_q."""
        # The key encoder is a copy of the model: their parameters pair up in order. Change each
        # key parameter in place (mul_, add_): a new tensor bound to a local name changes nothing.
        # BEGIN part memory
        for k, q in zip(self.encoder.parameters(), model.parameters()):
            k.mul_(self.m).add_(q.detach(), alpha=1 - self.m)
        # END part memory

    @torch.no_grad()
    def __call__(self, task, batch):
        """The unit keys (B, H) of one task's tokenised batch."""
        return F.normalize(self.encoder(task, **batch).z.float(), dim=1)


class Memory(nn.Module):
    """size keys (size, dim), their labels (size,) and the training-set rows of their examples
    (size,), as buffers. The rows' buffer is named ids: checkpoints and last.pt save it under that
    name. (A datastore's ids are something else: the examples' own ids, minknn/datastore.py.)"""

    def __init__(self, size, dim):
        super().__init__()
        self.register_buffer("keys", torch.zeros(size, dim))
        self.register_buffer("labels", torch.zeros(size, dtype=torch.long))
        self.register_buffer("ids", torch.zeros(size, dtype=torch.long))

    @torch.no_grad()
    def fill(self, keys, labels, rows):
        self.keys.copy_(F.normalize(keys.float(), dim=1))
        self.labels.copy_(labels)
        self.ids.copy_(rows)


class Queue(Memory):
    def __init__(self, size, dim):
        super().__init__(size, dim)
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))  # the next slot to write

    @torch.no_grad()
    def enqueue(self, keys, labels, rows):
        """Writes a batch's keys (B, dim), labels (B,) and training-set rows (B,) over the
        oldest."""
        size = len(self.keys)
        # The batch goes to slots ptr, ptr + 1, ... taken modulo size, so that it wraps round
        # the end onto the oldest keys; each key is normalised to unit length (dim 1). Then ptr
        # moves past the batch, modulo size too. A batch larger than the queue keeps its last
        # `size` keys.
        # BEGIN part memory
        keys, labels, rows = keys[-size:], labels[-size:], rows[-size:]
        slots = (self.ptr + torch.arange(len(keys), device=self.keys.device)) % size
        self.keys[slots] = F.normalize(keys.float(), dim=1)
        self.labels[slots] = labels
        self.ids[slots] = rows
        self.ptr.copy_((self.ptr + len(keys)) % size)
        # END part memory


class MemoryBank(Memory):
    """Entry i is training example i's (its rows, in ids: 0 .. size - 1)."""

    @torch.no_grad()
    def update(self, rows, queries, m=BANK_MOMENTUM):
        """Moves the entries of training examples `rows` towards their queries (B, dim)."""
        # v_i <- (m v_i + (1 - m) f_i) / ||.||, with f_i the query as a unit vector: m is the
        # share the old entry keeps. Normalise each row (dim 1).
        # BEGIN part memory
        queries = F.normalize(queries.float(), dim=1)  # f_i
        self.keys[rows] = F.normalize(m * self.keys[rows] + (1 - m) * queries, dim=1)
        # END part memory


class MoCo:
    """What a step calls for a memory loss: before the loss, batch_keys() (trainer.forward); after
    the optimiser step, after_step() (train.py's train_step). The memory itself is `self.memory`;
    it serves one classification task. Under DDP it is given the model itself, not its DDP
    wrapper (the key encoder is a copy)."""

    def __init__(self, model, task, kind, size, momentum=MOMENTUM):
        self.task, self.kind = task, kind
        dim = model.bert.config.hidden_size
        self.key_encoder = KeyEncoder(model, momentum) if kind == "queue" else None
        device = next(model.parameters()).device
        self.memory = (Queue if kind == "queue" else MemoryBank)(size, dim).to(device)

    def fill(self, model, tokenizer, examples, labels, batch_size, device, precision=None):
        """One pass over the first `size` training examples (the key encoder's for the queue, in
        the run's --precision, as the keys of training are): slot i holds training example i.
        Under DDP each rank encodes its slice of them, and the keys are gathered."""
        size, dim = self.memory.keys.shape
        encoder = self.key_encoder.encoder if self.key_encoder else model
        start, stop = slice_of(size, rank(), world())
        keys = torch.zeros(0, dim)  # a rank with no share (size < world)
        if stop > start:
            _, keys = predict(encoder, tokenizer, self.task, examples[start:stop], batch_size,
                              device, progress=f"filling the {self.kind}" if is_main() else None,
                              precision=precision)
        keys = gather_keys(keys.to(device), sizes(size, world()))
        self.memory.fill(keys, labels[:size].to(device), torch.arange(size, device=device))
        model.train()  # predict() left it in eval mode

    def batch_keys(self, model, batch, rows):
        """The positives' side of this batch: the key encoder's keys after its momentum step
        (queue), or the batch's own memory-bank entries (bank). rows: the batch's training-set
        rows. Under DDP `batch` is this rank's slice of the batch and `rows` the whole batch's:
        the keys of all ranks' slices are gathered, so every rank has the whole batch's keys."""
        if self.kind == "queue":
            n = sizes(len(rows), world())  # a rank with no rows encodes a stand-in: none of it
            return gather_keys(self.encode_keys(model, batch)[:n[rank()]], n)
        return self.memory.keys[rows]  # already float32 unit vectors

    def encode_keys(self, model, batch):
        """The key encoder's unit keys (B, H) of a tokenised batch, after its momentum step."""
        # MoCo's Algorithm 1 moves the key encoder after each optimiser step; here that move
        # comes at the start of the next step, so it must come before this batch's keys:
        # they are the keys of an encoder that has followed the model's last step.
        # BEGIN part memory
        self.key_encoder.update(model)
        return self.key_encoder(self.task.name, batch)
        # END part memory

    def after_step(self, batch_keys, labels, rows, queries):
        """The memory after the step: the batch's keys (B, dim) join the queue, with their
        labels and rows; or the batch's bank entries move towards its queries (B, dim). Under
        DDP all of them are the whole batch's (the keys and queries gathered), so that every
        rank writes the same."""
        # The queue takes the key encoder's keys, never the queries (the model's, with gradients
        # and dropout); the bank moves towards the queries, detached from the graph.
        # BEGIN part memory
        if self.kind == "queue":
            self.memory.enqueue(batch_keys, labels, rows)
        else:
            self.memory.update(rows, queries.detach())
        # END part memory


def new_memory(model, task, train, kind, size, momentum):
    """The empty memory of a run's memory loss (trainer.make_memory), sized for its training
    examples: size None is min(QUEUE_SIZE, training set) for the queue; the bank always holds one
    entry per example. MoCo.fill fills it (trainer.fill_memory)."""
    size = len(train) if kind == "bank" else size or min(QUEUE_SIZE, len(train))
    if not 1 <= size <= len(train):
        raise MinknnError(f"--queue_size {size}: the queue is filled from the {len(train)} "
                          f"training examples, so it must be between 1 and {len(train)}")
    return MoCo(model, task, kind, size, momentum)
