"""The loss registry: --loss NAME picks one of the losses below. Adding a loss is one new file here
and one line in METRIC_LOSSES; train.py needs no change.

Every metric-learning loss is an nn.Module built as Loss(num_classes, dim) and called as
loss(h, labels), with h the pooled representation (B, dim) and labels (B,) class indices. Each
file normalises h itself where its formula says so. A loss may own parameters (the proxies of
the proxy losses); they are trained with their own learning rate (--proxy_lr) and saved in the
checkpoint.

train.py trains the combined objective of the DML paper (eq. 8) and KNN-BERT (eq. 6):

    L = (1 - lam) CE(F(h), y) + lam L_metric(h, y)

F the linear head. --lam sets lam; by default each loss's own `lam` class attribute: 0.1 for the
in-batch and memory losses (KNN-BERT's weight for its contrastive term, eq. 6) and 0.5 for the proxy
losses, whose proxies only learn through their term. --lam 0 is plain CE; --lam 1 trains the metric
loss alone, and the untrained linear head's predictions are then meaningless (use proxy inference,
evaluate.py --proxy, for the proxy losses). With --decoupled the metric term is Liang et al.'s
triplet loss on the retrieval head's output r instead of h (minknn/decoupled.py; lam is their beta, 0.5).

The memory losses (knnbert, moco) also see the MoCo memory (minknn/moco.py): they are called as
loss(h, labels, batch_keys, memory_keys, memory_labels), batch_keys being the key encoder's
encoding of the same batch. A loss built with train.py flags lists them in its `flags` attribute.
Every metric loss runs outside autocast, in fp32: a bf16 q.k / 0.07 would be off by a few percent.
"""
import torch
import torch.nn as nn

from minknn import MinknnError
from minknn.decoupled import DecoupledTripletLoss
from minknn.losses.ce import CrossEntropy
from minknn.losses.contrastive import ContrastiveLoss
from minknn.losses.knnbert import KNNBertLoss
from minknn.losses.mnrl import MNRLoss
from minknn.losses.moco import MoCoLoss
from minknn.losses.npairs import NPairsLoss
from minknn.losses.proxyanchor import ProxyAnchorLoss
from minknn.losses.proxynca import ProxyNCALoss
from minknn.losses.softtriple import SoftTripleLoss
from minknn.losses.supcon import SupConLoss
from minknn.losses.triplet import TripletLoss

METRIC_LOSSES = {
    "triplet": TripletLoss,
    "npairs": NPairsLoss,
    "supcon": SupConLoss,
    "softtriple": SoftTripleLoss,
    "proxynca": ProxyNCALoss,
    "proxyanchor": ProxyAnchorLoss,
    "contrastive": ContrastiveLoss,
    "mnrl": MNRLoss,
    "knnbert": KNNBertLoss,
    "moco": MoCoLoss,
}
LOSSES = ("ce", *METRIC_LOSSES)
MEMORY_LOSSES = tuple(name for name, loss in METRIC_LOSSES.items() if getattr(loss, "uses_memory", False))


def check_loss_name(name):
    if name not in LOSSES:
        raise MinknnError(f"unknown --loss '{name}'; choose one of: {', '.join(LOSSES)}")


def loss_flags(name, args):
    """The train.py flags (a dict of them) that loss `name` is built with, e.g. knnbert's --m_most."""
    return {flag: args[flag] for flag in getattr(METRIC_LOSSES.get(name), "flags", ())}


class Objective(nn.Module):
    """L = (1 - lam) CE + lam L_metric; just CE for --loss ce (without --decoupled). Called as
    objective(output, labels) with the model's Output, plus the batch's keys and the memory for a
    memory loss; returns the total and, for the progress bar, its parts."""

    def __init__(self, name, num_classes, dim, lam=None, decoupled=False, **flags):
        super().__init__()
        check_loss_name(name)
        self.ce = CrossEntropy(num_classes, dim)
        self.decoupled = decoupled  # train.py allows it with --loss ce only
        if decoupled:
            self.metric = DecoupledTripletLoss()
        else:
            self.metric = METRIC_LOSSES[name](num_classes, dim, **flags) if name != "ce" else None
        self.lam = 0.0 if self.metric is None else (self.metric.lam if lam is None else lam)  # train.py checks 0 <= lam <= 1

    def forward(self, output, labels, batch_keys=None, memory=None):
        ce = self.ce(output, labels)
        if self.metric is None:
            return ce, {}
        h = (output.retrieval if self.decoupled else output.embeddings).float()
        with torch.autocast(h.device.type, enabled=False):
            if getattr(self.metric, "uses_memory", False):
                metric = self.metric(h, labels, batch_keys, memory.keys, memory.labels)
            else:
                metric = self.metric(h, labels)
        total = (1 - self.lam) * ce + self.lam * metric
        return total, {"ce": ce.detach(), "metric": metric.detach()}
