"""N-pairs loss (Sohn 2016, "Improved Deep Metric Learning with Multi-class N-pair Loss Objective").

For an anchor f_a, a positive f_p of the same class and negatives f_n of other classes:

    L(a, p) = log(1 + sum_n exp(f_a.f_n - f_a.f_p))
    L = mean over (a, p) of L(a, p)  +  l2_reg * mean_i ||f_i||^2

Pairing rule on a labelled batch: every ordered pair (a, p) of two different examples with the same
label is an (anchor, positive) pair, and all examples of the other classes are its negatives. (Sohn
builds batches of exactly one pair per class; taking every same-class pair keeps the loss
independent of the order of the batch.)

f is the pooled representation z as it is, NOT normalised: Sohn uses raw inner products and keeps
the norms in check with an L2 penalty; l2_reg = 0.002 is a small weight of our choosing. lam = 0.1.
A batch with no (anchor, positive, negative) triple, e.g. a single class, gives 0 (plus the
penalty).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class NPairsLoss(nn.Module):
    lam = 0.1
    part = "npairs"  # the assignment's (minknn/assignment/parts.py)

    def __init__(self, num_classes=None, dim=None, l2_reg=0.002):
        super().__init__()
        self.l2_reg = l2_reg

    def forward(self, z, labels):
        # z (B, dim) as it is (raw inner products, no normalisation), labels (B,).
        # s = z z^T holds every f_a.f_n. For each anchor, log sum_n exp(f_a.f_n) over its
        # negatives by logsumexp on a masked row (-inf where not a negative); then every (a, p)
        # term is softplus(that - f_a.f_p) = log(1 + sum_n exp(f_a.f_n - f_a.f_p)). A pair needs
        # p != a. The penalty: l2_reg times the mean over the batch of ||f_i||^2.
        # BEGIN part npairs
        penalty = self.l2_reg * z.pow(2).sum(-1).mean()
        s = z @ z.T                                                # (B, B) inner products f_i.f_j
        positive = (labels[:, None] == labels[None, :]).fill_diagonal_(False)
        negative = labels[:, None] != labels[None, :]
        if not positive.any() or not negative.any():
            return penalty
        # log sum_n exp(f_a.f_n) for every anchor; every row has a negative here
        neg_lse = torch.logsumexp(s.masked_fill(~negative, float("-inf")), dim=1, keepdim=True)
        # (a, p): log(1 + sum_n exp(s_an - s_ap))
        terms = F.softplus(neg_lse - s)
        return terms[positive].mean() + penalty
        # END part npairs
