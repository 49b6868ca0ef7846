"""The --pair_loss terms of a siamese sentence-pair task (--pair_mode siamese): a metric loss on
the two texts' vectors u and v, added to the task's cross-entropy as (1 - lam) CE + lam L_pair.

    contrastive   d = ||u/|u| - v/|v|||, contrastive(d, dissimilar) (contrastive.py): matching
                  pairs pulled together, the others pushed at least the margin apart
    mnrl          mnrl_pairs(u, v) over the batch's matching pairs (mnrl.py): each pair's second
                  text against the other matching pairs' second texts

A pair "matches" when its label is the task's positive class (Task.positive: Quora's duplicate,
MRPC's paraphrase). The siamese batch's representations are the B first texts, then the B
second ones (minknn/model.py), so z (2B, H) splits into u and v.
"""
import torch.nn as nn
import torch.nn.functional as F

from minknn.losses.contrastive import ContrastiveLoss, contrastive
from minknn.losses.mnrl import MNRLoss, mnrl_pairs

PAIR_LOSSES = {"contrastive": ContrastiveLoss, "mnrl": MNRLoss}  # for their lam and margin / scale


class PairLoss(nn.Module):
    def __init__(self, name, positive):
        super().__init__()
        self.name, self.positive = name, positive
        self.loss = PAIR_LOSSES[name]()
        self.lam = self.loss.lam

    def forward(self, z, labels):
        u, v = z.chunk(2)
        match = labels == self.positive
        if self.name == "contrastive":
            d = (F.normalize(u, dim=-1) - F.normalize(v, dim=-1)).norm(dim=-1)
            return contrastive(d, ~match, self.loss.margin).mean()
        return mnrl_pairs(u[match], v[match], self.loss.scale) if match.any() else z.sum() * 0.0
