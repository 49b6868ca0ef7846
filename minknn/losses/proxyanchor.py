"""Proxy Anchor loss (Kim, Kim, Cho, Kwak 2020, "Proxy Anchor Loss for Deep Metric Learning").

One learnable proxy p_c per class. Each proxy is an anchor that pulls the batch's examples of its
class and pushes the others away, weighting the hard ones most (the log-sum-exp):

    L = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (cos(x, p) - delta)))
      + 1/|P|  sum_{p in P}  log(1 + sum_{x in X_p-} exp( alpha (cos(x, p) + delta)))

    P  = all C proxies;  P+ = the proxies whose class has at least one example in the batch
    X_p+ = the batch's examples of p's class;  X_p- = all the others
    cos(x, p) = x.p / (||x|| ||p||)   (both normalised here)

Hyper-parameters: scale alpha = 32 (`scale` in the code), margin delta = 0.1 (the paper's values);
lam = 0.5 (the proxy term carries as much weight as cross-entropy; the DML paper tunes this mix).
The proxies are initialised at random (or, with train.py --proxy_init names, at the encoded class
names: minknn/proxy.py) and trained with their own, larger learning rate (train.py --proxy_lr,
default 100x the encoder's, following the authors' "x100" for proxies).
log(1 + sum exp(a)) is computed as logsumexp over [0, a...], which neither overflows nor, for an
empty set, returns anything but log 1 = 0.
`class_logits` gives alpha * cos(z, p_c), used by proxy inference (minknn/proxy.py).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def log1p_sum_exp(a, mask, dim):
    """log(1 + sum over the masked entries of exp(a)), along `dim`."""
    a = a.masked_fill(~mask, float("-inf"))
    zero = torch.zeros_like(a.narrow(dim, 0, 1))
    return torch.logsumexp(torch.cat([zero, a], dim), dim)


class ProxyAnchorLoss(nn.Module):
    lam = 0.5
    trains = ("encoder", "proxies")  # a frozen encoder leaves the proxies to train
    one_proxy = True  # --proxy_init names can start it at the class names (minknn/proxy.py)
    part = "proxyanchor"  # the assignment's (minknn/assignment/parts.py)

    def __init__(self, num_classes, dim, scale=32.0, delta=0.1):
        super().__init__()
        self.scale, self.delta = scale, delta
        self.proxies = nn.Parameter(torch.randn(num_classes, dim))

    def cos(self, z):
        # (B, C): cos(x_b, p_c), both normalised.
        # BEGIN part proxyanchor
        return F.normalize(z, dim=-1) @ F.normalize(self.proxies, dim=-1).T   # (B, C)
        # END part proxyanchor

    def class_logits(self, z):
        return self.scale * self.cos(z)

    def forward(self, z, labels):
        # positive[b, c]: example b is of class c (F.one_hot), so column c is X_p+ and ~column c
        # X_p-. Each proxy's two terms by log1p_sum_exp over the BATCH (dim 0), giving (C,) each:
        # -alpha (cos - delta) on its positives, alpha (cos + delta) on its negatives. The first
        # is averaged over P+ only (proxies with an example in the batch), the second over all C.
        # BEGIN part proxyanchor
        cos = self.cos(z)
        positive = F.one_hot(labels, len(self.proxies)).bool()    # (B, C): x in X_p+
        with_positives = positive.any(0)                           # P+
        pos_term = log1p_sum_exp(-self.scale * (cos - self.delta), positive, dim=0)    # (C,)
        neg_term = log1p_sum_exp(self.scale * (cos + self.delta), ~positive, dim=0)    # (C,)
        return pos_term[with_positives].mean() + neg_term.mean()
        # END part proxyanchor
