"""Triplet margin loss over every valid triplet in the batch (Schroff et al. 2015, FaceNet).

    L = 1/|T| sum_{(a,p,n) in T} max(0, d(u_a, u_p) - d(u_a, u_n) + m)

    u_i = z_i / ||z_i||               the L2-normalised pooled representation
    d(u, v) = ||u - v||^2 = 2 - 2 u.v  squared Euclidean distance, as in FaceNet
    T = {(a, p, n) : y_p = y_a, p != a, y_n != y_a}, every valid triplet of the batch

Hyper-parameters: margin m = 0.2 (FaceNet's alpha); lam = 0.1 is its weight in the combined
objective (1 - lam) CE + lam L (see losses/__init__.py).
The mean runs over all valid triplets, the already-satisfied ones (zero terms) included, so the
loss shrinks as the batch gets sorted out. A batch without a valid triplet (one class only, or
every class seen once) gives 0.
Cost: a (B, B, B) tensor, 32^3 = 32k numbers at the default batch size.
"""
import torch.nn as nn
import torch.nn.functional as F


class TripletLoss(nn.Module):
    lam = 0.1
    part = "triplet"  # the assignment's (minknn/assignment/parts.py)

    def __init__(self, num_classes=None, dim=None, margin=0.2):
        super().__init__()
        self.margin = margin

    def forward(self, z, labels):
        # z (B, dim), labels (B,). Normalise first; then every squared distance at once from the
        # Gram matrix, d = 2 - 2 u u^T, clamped at 0 (rounding can make it slightly negative).
        # Every (a, p, n) term by broadcasting, d[:, :, None] - d[:, None, :] + m: (B, B, B). A
        # mask keeps the valid triplets (p != a: an example is not its own positive); the mean
        # runs over ALL valid triplets, zero terms included; no valid triplet gives 0, not 0/0.
        # BEGIN part triplet
        u = F.normalize(z, dim=-1)
        d = (2 - 2 * u @ u.T).clamp(min=0)                         # (B, B) squared distances
        # (a, p): same class, not a
        positive = (labels[:, None] == labels[None, :]).fill_diagonal_(False)
        negative = labels[:, None] != labels[None, :]              # (a, n)
        valid = positive[:, :, None] & negative[:, None, :]        # (a, p, n)
        terms = (d[:, :, None] - d[:, None, :] + self.margin).clamp(min=0)
        return (terms * valid).sum() / valid.sum().clamp(min=1)
        # END part triplet
