"""The classifier: BERT encoder -> pooling -> dropout -> linear head.

    h = BERT(x)                       (B, T, H) last hidden states
    z = pool(h)                       (B, H)    the sentence representation
    logits = W dropout(z) + b         (B, C)

Pooling (--pooling):
    cls   z = h[:, 0], the [CLS] token's last hidden state
    mean  z = sum_t m_t h_t / sum_t m_t, the average over real tokens (m is the attention mask)
    max   z_d = max over real tokens t of h_t,d
The representation z (before dropout) is what the metric-learning losses and the kNN datastore
see; the logits are what cross-entropy sees. --option pretrain freezes BERT and trains the head
only; finetune trains everything (the CS224N minBERT convention).
"""
from dataclasses import dataclass

import torch
import torch.nn as nn

from minknn.bert import BertModel

POOLINGS = ("cls", "mean", "max")


@dataclass
class Output:
    logits: torch.Tensor     # (B, C)
    embeddings: torch.Tensor  # (B, H), the pooled representation z


def pool(h, attention_mask, how):
    if how == "cls":
        return h[:, 0]
    m = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
    if how == "mean":
        return (h * m).sum(1) / m.sum(1).clamp(min=1)
    if how == "max":
        return h.masked_fill(m == 0, torch.finfo(h.dtype).min).max(1).values
    raise ValueError(f"unknown pooling '{how}'; choose one of: {', '.join(POOLINGS)}")


class Classifier(nn.Module):
    def __init__(self, bert, num_labels, pooling="mean", option="finetune"):
        super().__init__()
        self.bert, self.pooling = bert, pooling
        self.dropout = nn.Dropout(bert.config.hidden_dropout_prob)
        self.head = nn.Linear(bert.config.hidden_size, num_labels)
        for p in self.bert.parameters():
            p.requires_grad = option == "finetune"

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        h = self.bert(input_ids, attention_mask, token_type_ids)
        z = pool(h, attention_mask, self.pooling)
        return Output(logits=self.head(self.dropout(z)), embeddings=z)

    @classmethod
    def from_config(cls, bert_config, num_labels, pooling, option="finetune"):
        return cls(BertModel(bert_config), num_labels, pooling, option)
