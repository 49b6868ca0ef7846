"""The model: one BERT encoder, pooling, and one head per task.

    h = BERT(x)                       (B, T, H) last hidden states
    z = pool(h)                       (B, H)    the sentence (or cross-encoded pair) representation
    logits = W dropout(z) + b         (B, C)    the task's head (minknn/kinds.py says its shape)

Pooling (--pooling):
    cls   z = h[:, 0], the first token's last hidden state ([CLS]; RoBERTa's <s>)
    mean  z = sum_t m_t h_t / sum_t m_t, the average over real tokens (m is the attention mask)
    max   z_d = max over real tokens t of h_t,d
The representation z (before dropout) is what the metric-learning losses and, by default, the kNN
datastore see; the logits are what cross-entropy sees. --option pretrain freezes BERT and trains the
heads only; finetune trains everything (the CS224N minBERT convention). A run of several tasks
(train.py --task multitask) shares the encoder and gives each task its own head.

--decoupled adds the retrieval head of Liang et al. ("Retrieval-Augmented Classification with
Decoupled Representation", sec. 2.2): r = MLP(z) = W2 GELU(W1 z + b1) + b2, both layers H -> H. z
still feeds the linear head; r is trained by its own triplet loss (minknn/losses/decoupled.py) and
is what the kNN datastore stores, so retrieval and classification stop pulling z two ways. The
paper says only "a simple MLP layer"; the two layers and the GELU are our choice.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from minknn import backbones
from minknn.kinds import kind_of

POOLINGS = ("cls", "mean", "max")
KNN_KEYS = (*POOLINGS, "decoupled")  # what a kNN datastore can store (--knn_key)


@dataclass
class Output:
    logits: torch.Tensor      # (B, C), or (B,) for a similarity score
    z: torch.Tensor           # (B, H), the pooled representation
    hidden: torch.Tensor | None = None     # (B, T, H), the last hidden states, for pooling
                                           # another way (--knn_key)
    retrieval: torch.Tensor | None = None  # (B, H), r = MLP(z) with --decoupled, else None


def pool(h, attention_mask, how):
    """h: (B, T, H) last hidden states; attention_mask: (B, T), 1 for real tokens, 0 for padding.
    Returns z, (B, H) in h's dtype, pooled as `how` says (POOLINGS; the module docstring)."""
    # Padding positions of h hold anything (BertModel writes zeros there): no pooling may read them.
    # mean: divide by each row's count of real tokens, clamped at 1, so that a row without one
    # gives 0, not 0/0. max: fill the padding with torch.finfo(h.dtype).min first (a padding 0
    # would beat real values that are all negative). Cast the mask to h.dtype, not to float:
    # under bf16 autocast z stays bf16.
    # BEGIN part pooling
    if how == "cls":
        return h[:, 0]
    m = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
    if how == "mean":
        return (h * m).sum(1) / m.sum(1).clamp(min=1)
    if how == "max":
        return h.masked_fill(m == 0, torch.finfo(h.dtype).min).max(1).values
    # END part pooling
    raise ValueError(f"unknown pooling '{how}'; choose one of: {', '.join(POOLINGS)}")


def represent(output, attention_mask, key):
    """The representation --knn_key names: the retrieval head's r ("decoupled"), or the last hidden
    states pooled another way ("cls", "mean", "max")."""
    if key == "decoupled":
        return output.retrieval
    return pool(output.hidden, attention_mask, key)


class Model(nn.Module):
    """One BERT shared by a run's tasks, with one head per task (its kind's, minknn/kinds.py), and
    with --decoupled the retrieval head. forward(task, ...) runs one task's batch."""

    def __init__(self, bert, tasks, pooling="mean", pair_mode="cross", option="finetune",
                 decoupled=False):
        super().__init__()
        self.bert, self.pooling, self.pair_mode = bert, pooling, pair_mode
        self.tasks = {t.name: t for t in tasks}
        self.dropout = nn.Dropout(bert.config.hidden_dropout_prob)
        H = bert.config.hidden_size
        heads = {t.name: kind_of(t).head(t, H, self.siamese(t)) for t in tasks}
        self.heads = nn.ModuleDict({name: head for name, head in heads.items() if head is not None})
        self.retrieval = (nn.Sequential(nn.Linear(H, H), nn.GELU(), nn.Linear(H, H))
                          if decoupled else None)
        for p in self.bert.parameters():
            p.requires_grad = option == "finetune"

    def start_heads(self, train):
        """Each head's starting point from its task's training examples (train: task name ->
        examples): a multi-label head's biases at its classes' priors (minknn/kinds.py)."""
        for name, head in self.heads.items():
            kind_of(self.tasks[name]).start_head(head, self.tasks[name], train[name])

    def siamese(self, task):
        """Whether the task's two texts are encoded alone (--pair_mode siamese) or as one
        sequence."""
        return task.pair and self.pair_mode == "siamese"

    def knn_key(self, asked=None):
        """The representation a kNN datastore stores and searches: --knn_key's (asked), else the
        retrieval head's r with --decoupled, else the pooled z."""
        return asked or ("decoupled" if self.retrieval is not None else self.pooling)

    def forward(self, task, input_ids, attention_mask, token_type_ids=None):
        """Output for one task's batch: logits (B, C), or (B,) for a similarity score. A siamese
        pair batch holds the B first texts, then the B second ones (engine.encode_batch), so z is
        (2B, H)."""
        t = self.tasks[task]
        h = self.bert(input_ids, attention_mask, token_type_ids)
        z = pool(h, attention_mask, self.pooling)
        if not self.siamese(t):
            logits = self.heads[task](self.dropout(z))
        elif t.kind == "similarity":
            u, v = z.chunk(2)
            logits = 2.5 * (F.cosine_similarity(u, v, dim=-1) + 1)
        else:
            u, v = z.chunk(2)
            logits = self.heads[task](self.dropout(torch.cat([u, v, (u - v).abs()], dim=-1)))
        if t.kind == "similarity" and logits.ndim == 2:
            logits = logits.squeeze(-1)
        r = self.retrieval(z) if self.retrieval is not None else None
        return Output(logits=logits, z=z, hidden=h, retrieval=r)

    @classmethod
    def from_config(cls, bert_config, tasks, pooling, pair_mode="cross", decoupled=False):
        return cls(backbones.build(bert_config), tasks, pooling, pair_mode, decoupled=decoupled)
