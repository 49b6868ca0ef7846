"""SoftTriple loss (Qian et al. 2019, "SoftTriple Loss: Deep Metric Learning Without Triplet
Sampling").

K learnable centres w_c^k per class (unit vectors), so a class can have several modes. The
similarity of x to class c is a soft max over its centres:

    S_c(x) = sum_k softmax_k(x.w_c^k / gamma) x.w_c^k
    L_SoftTriple = -log( exp(lambda (S_y - delta))
                         / (exp(lambda (S_y - delta)) + sum_{c != y} exp(lambda S_c)) )

i.e. cross-entropy with logits lambda (S_c - delta [c = y]), plus a regulariser that merges
centres of a class that come close (so K acts as an upper bound on the modes):

    R = tau * sum_c sum_{s < t} ||w_c^s - w_c^t|| / (C K (K - 1)),
    ||w^s - w^t|| = sqrt(2 - 2 w^s.w^t)

x = z / ||z||. Hyper-parameters (the paper's): K = 10, lambda = 20 (`scale` in the code, since
`lam` is the weight of the loss in the combined objective), gamma = 0.1, delta = 0.01, tau = 0.2
(`reg_weight`: the regulariser's weight, no temperature); lam = 0.5. The centres are trained with
--proxy_lr. If the loss turns NaN, the paper's advice is a smaller lambda. `class_logits` gives
lambda * S_c(z), the class score that proxy inference (minknn/proxy.py) uses.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SoftTripleLoss(nn.Module):
    lam = 0.5
    trains = ("encoder", "proxies")  # its centres: a frozen encoder leaves them to train
    part = "softtriple"  # the assignment's (minknn/assignment/parts.py)

    def __init__(self, num_classes, dim, centres=10, scale=20.0, gamma=0.1, delta=0.01,
                 reg_weight=0.2):
        super().__init__()
        self.scale, self.gamma, self.delta, self.reg_weight = scale, gamma, delta, reg_weight
        # w_c^k = centres[c, k]
        self.centres = nn.Parameter(torch.randn(num_classes, centres, dim))

    def similarity(self, z):
        """S_c(x), (B, C)."""
        # Normalise both x and the centres (unit vectors). sim[b, c, k] = x_b.w_c^k, (B, C, K),
        # in one einsum; the weights are a softmax over a class's K centres (the last dimension,
        # not the classes) at temperature gamma; S_c is the weighted sum of that class's sims.
        # BEGIN part softtriple
        x = F.normalize(z, dim=-1)
        w = F.normalize(self.centres, dim=-1)
        sim = torch.einsum("bd,ckd->bck", x, w)                              # x.w_c^k, (B, C, K)
        return (F.softmax(sim / self.gamma, dim=-1) * sim).sum(-1)
        # END part softtriple

    def class_logits(self, z):
        return self.scale * self.similarity(z)

    def regulariser(self):
        # Over each class's pairs of centres s < t (torch.triu_indices, offset 1), of the
        # normalised centres: tau * sum ||w^s - w^t|| / (C K (K - 1)); the distance not squared,
        # sqrt(2 - 2 w^s.w^t) clamped away from 0. One centre per class has no pair: 0.
        # BEGIN part softtriple
        C, K, _ = self.centres.shape
        if K < 2:
            return self.centres.sum() * 0.0
        w = F.normalize(self.centres, dim=-1)
        s, t = torch.triu_indices(K, K, offset=1, device=w.device)           # every pair s < t
        gap = (2 - 2 * (w[:, s] * w[:, t]).sum(-1)).clamp(min=1e-12).sqrt()  # (C, pairs)
        return self.reg_weight * gap.sum() / (C * K * (K - 1))
        # END part softtriple

    def forward(self, z, labels):
        # Cross-entropy on the logits lambda (S_c - delta [c = y]): the margin delta comes off
        # the true class only, inside the scale. Then add the regulariser.
        # BEGIN part softtriple
        S = self.similarity(z)
        logits = self.scale * (S - self.delta * F.one_hot(labels, S.shape[1]))
        return F.cross_entropy(logits, labels) + self.regulariser()
        # END part softtriple
