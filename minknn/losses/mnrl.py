"""Multiple negatives ranking loss (Henderson et al. 2017, "Efficient Natural Language Response
Suggestion for Smart Reply"), with cosine similarity and a scale, as in the minBERT extension
report.

For K (anchor, positive) pairs (x_i, y_i), every other pair's positive is a negative for x_i:

    J = -1/K sum_i [ S(x_i, y_i) - log sum_j exp S(x_i, y_j) ],   S(x, y) = scale * cos(x, y)

which is cross-entropy over the K candidates with the right one on the diagonal: `mnrl_pairs`.
On a sentence-pair task x_i and y_i are the two sentences of a paraphrase pair.

Pairing rule on a labelled single-sentence batch: every ordered pair (i, p) of two different
examples with the same label is an (anchor, positive) pair, and its candidates are p and every
example of another class:

    L(i, p) = -S(x_i, x_p) + log( exp S(x_i, x_p) + sum_{n: y_n != y_i} exp S(x_i, x_n) )
            = log(1 + sum_{n: y_n != y_i} exp(S(x_i, x_n) - S(x_i, x_p)))

Other examples of the anchor's own class are left out of the candidates: with labels we know they
are not negatives, and counting them as such (the "false negatives" of in-batch training) would push
same-class examples apart. Written this way it is the N-pairs loss (npairs.py) with scaled cosine
similarity in place of raw inner products. L is the mean over all (i, p); no pair gives 0.

Hyper-parameters: scale = 20 (sentence-transformers' default, a temperature of 0.05); lam = 0.1.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def mnrl_pairs(anchors, positives, scale=20.0):
    """J for K explicit (anchor, positive) pairs, both (K, dim)."""
    # s (K, K): scale * cos of every anchor with every positive, both normalised; row i's right
    # answer is column i, so J is cross-entropy with targets 0, 1, ..., K - 1.
    # BEGIN part mnrl
    s = scale * F.normalize(anchors, dim=-1) @ F.normalize(positives, dim=-1).T   # (K, K)
    return F.cross_entropy(s, torch.arange(len(s), device=s.device))
    # END part mnrl


class MNRLoss(nn.Module):
    lam = 0.1
    part = "mnrl"  # the assignment's (minknn/assignment/parts.py)

    def __init__(self, num_classes=None, dim=None, scale=20.0):
        super().__init__()
        self.scale = scale

    def forward(self, z, labels):
        # z (B, dim), labels (B,). S = scale * u u^T, (B, B). As in npairs.py: for each anchor,
        # logsumexp of S over its negatives (another label; a masked row), then every (i, p),
        # p != i of the same label, gives softplus(that - S_ip). Same-class examples other than
        # p are not candidates at all. The mean over the (i, p) pairs; none gives 0.
        # BEGIN part mnrl
        u = F.normalize(z, dim=-1)
        s = self.scale * u @ u.T                                   # (B, B) S(x_i, x_j)
        positive = (labels[:, None] == labels[None, :]).fill_diagonal_(False)
        negative = labels[:, None] != labels[None, :]
        if not positive.any() or not negative.any():
            # no pair, or one class: -log 1 = 0
            return s.sum() * 0.0
        # log sum_n exp S(x_i, x_n) over the negatives; every row has one here
        neg_lse = torch.logsumexp(s.masked_fill(~negative, float("-inf")), dim=1, keepdim=True)
        # (i, p): log(1 + sum_n exp(S_in - S_ip))
        terms = F.softplus(neg_lse - s)
        return terms[positive].mean()
        # END part mnrl
