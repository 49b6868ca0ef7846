"""ProxyNCA (Movshovitz-Attias et al. 2017, "No Fuss Distance Metric Learning using Proxies").

One learnable proxy p_c per class; an example should be nearer its class's proxy than the others:

    L = -1/B sum_i log( exp(-s d(x_i, p_{y_i})) / sum_{c=1}^{C} exp(-s d(x_i, p_c)) )
    d(x, p) = || x/||x|| - p/||p|| ||^2 = 2 - 2 cos(x, p)

which is cross-entropy with logits -s d(x, p_c). Which denominator: the paper's sum runs over the
OTHER proxies only (z != y), which makes L unbounded below; like the popular implementations
(pytorch-metric-learning, ProxyNCA++) we sum over all C proxies, positive included, so that L >= 0
is a plain cross-entropy and the proxies cannot run off to make it -infinity.

Hyper-parameters: scale s = 1 (the paper has no scale; since d lies in [0, 4], larger s sharpens
the softmax); lam = 0.5. Proxies are trained with --proxy_lr like Proxy Anchor's.
`class_logits` gives -s d(h, p_c), up to a constant per example the same as 2 s cos(h, p_c).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ProxyNCALoss(nn.Module):
    lam = 0.5

    def __init__(self, num_classes, dim, scale=1.0):
        super().__init__()
        self.scale = scale
        self.proxies = nn.Parameter(torch.randn(num_classes, dim))

    def class_logits(self, h):
        cos = F.normalize(h, dim=-1) @ F.normalize(self.proxies, dim=-1).T   # (B, C)
        return -self.scale * (2 - 2 * cos)                                     # -s d(x, p_c)

    def forward(self, h, labels):
        return F.cross_entropy(self.class_logits(h), labels)
