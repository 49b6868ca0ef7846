"""Multi-label contrastive loss (Su, Wang, Dai 2022, "Contrastive Learning-Enhanced Nearest
Neighbor Mechanism for Multi-Label Text Classification", eqs. 2-3).

Two examples of a multi-label batch may share some labels and not others, so a pair is neither
simply positive nor negative: each pair's term is weighted by how many labels it shares.

    L_con^ij = -beta_ij log( exp(-d(z_i, z_j) / tau') / sum_{k in g(i)} exp(-d(z_i, z_k) / tau') )
    C_ij = y_i . y_j          the number of labels i and j share (y multi-hot)
    beta_ij = C_ij / sum_{k in g(i)} C_ik
    L_con = sum_i sum_{j in g(i)} L_con^ij

    z_i                   the pooled representation, not normalised (the one the kNN datastore
                          stores and searches, minknn/knn.py's euclidean vote)
    d(z_i, z_j)           the Euclidean distance ||z_i - z_j||
    g(i)                  every other example of the batch
So for each example i the loss is a cross-entropy over the other examples, with softmax(-d / tau')
as the prediction and beta_i (a distribution over i's label-sharers) as the target.

Edge cases, both finite:
    an example sharing no label with anyone in the batch (sum_k C_ik = 0): beta_i. = 0/0, taken
        as 0, so it adds no term of its own (it still stands in the others' denominators);
    an all-zero label vector: C_ij = 0 for every j, so it is such an example.
A batch of one example has no pair and gives 0.

Hyper-parameters (the paper's): tau' = 10; trained as L = BCE + gamma L_con with gamma = --lam =
0.1 (AAPD's; 0.01 on RCV1-V2). Note the sum: L_con adds up the batch's examples, it is not their
mean, so its size grows with the batch (the paper trains BERT with batches of 128).
"""
import torch
import torch.nn as nn


def mlcon(z, y, tau=10.0):
    """z (B, d) representations, y (B, C) multi-hot labels. A scalar."""
    # d (B, B): Euclidean distances (not squared) of the raw z, by broadcasting z[:, None] -
    # z[None]; clamp before the sqrt (d_ii = 0). log_p: log-softmax of -d / tau' over each row's
    # OTHER examples (the diagonal at -inf, then set to 0 so 0 * -inf gives no NaN).
    # C = y y^T without the diagonal; beta = C / its row sums (a row of zeros stays 0).
    # L_con is the SUM over the batch of -beta * log_p.
    # BEGIN part mlcon
    B = len(z)
    if B < 2:
        return z.sum() * 0.0
    eye = torch.eye(B, dtype=torch.bool, device=z.device)
    # the clamp keeps d_ii's gradient finite
    d = ((z[:, None] - z[None]) ** 2).sum(-1).clamp(min=1e-12).sqrt()   # (B, B)
    logits = (-d / tau).masked_fill(eye, float("-inf"))                 # k in g(i): every k != i
    log_p = (logits - logits.logsumexp(1, keepdim=True)).masked_fill(eye, 0.0)
    C = (y @ y.T).masked_fill(eye, 0.0)                                  # (B, B) shared labels
    # counts (y multi-hot): a row of zeros stays zeros
    beta = C / C.sum(1, keepdim=True).clamp(min=1)
    return -(beta * log_p).sum()
    # END part mlcon


class MultiLabelContrastiveLoss(nn.Module):
    lam = 0.1                 # gamma
    kind = "multilabel"       # L = BCE + lam L_con (Objective)

    def __init__(self, num_classes=None, dim=None, tau=10.0):
        super().__init__()
        self.tau = tau

    def forward(self, h, labels):
        return mlcon(h, labels.to(h.dtype), self.tau)
