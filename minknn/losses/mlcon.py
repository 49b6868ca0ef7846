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

Hyper-parameters (the paper's): tau' = 10 (`temperature` in the code); trained as L = BCE + gamma
L_con with gamma = --lam = 0.1 (AAPD's; 0.01 on RCV1-V2), batches of 128, Adam at 1e-3 (their
appendix A).

The reduction (--mlcon_reduction sum|mean, default sum). What the paper writes (sec. 3.3): "the
contrastive loss for the whole minibatch is the summation over all the instance pairs",
L_con = sum_i sum_{j in g(i)} L_con^ij, and L = L_BCE + gamma L_con. Since beta_i. sums to 1
over j, the sum over j is already a weighted mean, one cross-entropy per anchor i (about
log(b - 1) while the distances are alike, as at the start); the sum over i then adds one such
term per example that shares a label with another, so L_con grows with the batch. L_BCE's
reduction is not given: the paper names the loss only, and no code of theirs is published.
PyTorch's default (and bce.py's) is the mean over the B x C (example, label) cells, each term at
most a few tenths once the mostly-absent labels are learnt. So as written, with a mean BCE,
gamma L_con at b = 32 is 0.1 x ~32 anchors x ~3.4 (log 31 at the start) ~ 11 against a BCE
below 1: the contrastive term drives the encoder, whatever gamma was meant to trade off.
    sum    the equations as written: L_con above (mlcon() below). Keep it to reproduce the paper.
    mean   L_con / n, n = the number of anchors i with at least one label-sharer in the batch
           (sum_k C_ik > 0): the mean over the examples that carry a term, each a cross-entropy
           over the batch, so that L_con is a per-example mean as BCE is and does not grow with
           b. Why that n: an example without a sharer adds no term (beta_i. = 0), so counting it
           (dividing by b) would make the loss smaller on a batch of rarer labels for no change
           in the model; dividing by the pairs (b (b - 1)) would divide twice, since beta already
           normalises over j. It is how SupCon (Khosla et al. 2020) and knnbert.py average over
           anchors with a positive. BCE's own 1/C is not matched: each anchor's term is one
           cross-entropy over the batch, not a sum over labels, and gamma weighs what remains.
           A batch where nobody shares a label gives 0, as the sum does.
"""
import torch
import torch.nn as nn


def mlcon(z, y, temperature=10.0):
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
    logits = (-d / temperature).masked_fill(eye, float("-inf"))         # k in g(i): every k != i
    log_p = (logits - logits.logsumexp(1, keepdim=True)).masked_fill(eye, 0.0)
    C = (y @ y.T).masked_fill(eye, 0.0)                                  # (B, B) shared labels
    # counts (y multi-hot): a row of zeros stays zeros
    beta = C / C.sum(1, keepdim=True).clamp(min=1)
    return -(beta * log_p).sum()
    # END part mlcon


def anchors_with_a_sharer(y):
    """y (B, C) multi-hot labels: how many examples share a label with another of the batch (the
    anchors i with a term in L_con, sum_{k != i} C_ik > 0), as a float tensor."""
    shared = (y @ y.T).fill_diagonal_(0)                                 # (B, B) C without C_ii
    return (shared.sum(1) > 0).sum().to(y.dtype)


REDUCTIONS = ("sum", "mean")  # --mlcon_reduction: the docstring says what each is


class MultiLabelContrastiveLoss(nn.Module):
    lam = 0.1                       # gamma
    kind = "multilabel"             # L = BCE + lam L_con (Objective)
    part = "mlcon"                  # the assignment's (minknn/assignment/parts.py)
    flags = {"mlcon_reduction": {   # train.py's flag for it
        "choices": REDUCTIONS, "default": "sum",
        "help": "L_con summed over the batch as Su et al. write it, or its mean over the examples "
                "that share a label with another, on BCE's scale (minknn/losses/mlcon.py)"}}

    def __init__(self, num_classes=None, dim=None, temperature=10.0, mlcon_reduction="sum"):
        super().__init__()
        if mlcon_reduction not in REDUCTIONS:
            raise ValueError(f"mlcon_reduction must be one of {REDUCTIONS}, "
                             f"got {mlcon_reduction!r}")
        self.temperature, self.reduction = temperature, mlcon_reduction

    def forward(self, z, labels):
        y = labels.to(z.dtype)
        total = mlcon(z, y, self.temperature)                                    # the paper's sum
        if self.reduction == "mean":  # over the anchors with a sharer; none: 0 / 1
            return total / anchors_with_a_sharer(y).clamp(min=1)
        return total
