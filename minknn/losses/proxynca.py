"""ProxyNCA (Movshovitz-Attias et al. 2017, "No Fuss Distance Metric Learning using Proxies").

One learnable proxy p_c per class; an example should be nearer its class's proxy than the others:

    L = -1/B sum_i log( exp(-s d(x_i, p_{y_i})) / sum_{c=1}^{C} exp(-s d(x_i, p_c)) )
    d(x, p) = || x/||x|| - p/||p|| ||^2 = 2 - 2 cos(x, p)

which is cross-entropy with logits -s d(x, p_c). Which denominator: the paper's sum runs over the
OTHER proxies only (z != y), which makes L unbounded below; like the popular implementations
(pytorch-metric-learning, ProxyNCA++) we sum over all C proxies, positive included, so that L >= 0
is a plain cross-entropy and the proxies cannot run off to make it -infinity.

Hyper-parameters: scale s = 9; lam = 0.5. Proxies start at random (or with --proxy_init names at
the encoded class names: minknn/proxy.py) and are trained with --proxy_lr like Proxy Anchor's.
The scale is ProxyNCA++'s (Teh et al. 2020, "ProxyNCA++: Revisiting and Revitalizing Proxy
Neighborhood Component Analysis"): a softmax over -d / T with temperature T = 1/9 (their code
scales both unit vectors by 3 before the squared distance: the same 9 d). The paper has no scale,
and pytorch-metric-learning's ProxyNCALoss defaults to softmax_scale = 1; but d lies in [0, 4], so
at s = 1 the logits span at most 4 and the softmax stays almost flat. Each term is then at least
log(1 + (C-1) e^-4) (0.071 for SST's 5 classes, reached only with every other proxy opposite;
5 proxies as far apart as they can be, a regular simplex, allow 0.284), and the gradients are weak
and badly aimed: with random proxies in 384 dimensions an example lying on its own proxy still
costs 0.44 with gradient norm 0.36, one lying on another class's proxy 2.51 with 1.85. At s = 9:
0 and 0, 18.3 and 18.0.
On SST (1,000 training examples, 1 epoch, 2 seeds; RESULTS.md, "ProxyNCA's scale") the nearest
proxy reaches macro-F1 .27-.31 at s = 9 against .14-.15 at s = 1; the linear head loses a few
points of accuracy.
`class_logits` gives -s d(z, p_c), up to a constant per example the same as 2 s cos(z, p_c).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ProxyNCALoss(nn.Module):
    lam = 0.5
    trains = ("encoder", "proxies")  # a frozen encoder leaves the proxies to train
    one_proxy = True  # --proxy_init names can start it at the class names (minknn/proxy.py)
    part = "proxynca"  # the assignment's (minknn/assignment/parts.py)

    def __init__(self, num_classes, dim, scale=9.0):
        super().__init__()
        self.scale = scale
        self.proxies = nn.Parameter(torch.randn(num_classes, dim))

    def class_logits(self, z):
        # (B, C): -s d(x, p_c), d the squared distance of the NORMALISED x and p_c, which is
        # 2 - 2 cos(x, p_c): one matrix product of the normalised z and proxies.
        # BEGIN part proxynca
        cos = F.normalize(z, dim=-1) @ F.normalize(self.proxies, dim=-1).T   # (B, C)
        return -self.scale * (2 - 2 * cos)                                     # -s d(x, p_c)
        # END part proxynca

    def forward(self, z, labels):
        # The softmax over every proxy, the positive included: cross-entropy on class_logits.
        # BEGIN part proxynca
        return F.cross_entropy(self.class_logits(z), labels)
        # END part proxynca
