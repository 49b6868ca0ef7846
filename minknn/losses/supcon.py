"""Supervised contrastive loss over the batch (Khosla et al. 2020, eq. 2, "L_out"), the SCL of
Gunel et al. 2021.

    L = 1/|I+| sum_{i in I+}  -1/|P(i)| sum_{p in P(i)}
        log( exp(u_i.u_p / tau) / sum_{a in A(i)} exp(u_i.u_a / tau) )

    u_i = z_i / ||z_i||      the L2-normalised pooled representation (Khosla et al.'s z_i)
    A(i) = every other example of the batch; P(i) = those in A(i) with label y_i
    I+ = the anchors with at least one positive (anchors without one are left out; naive code
         divides by |P(i)| = 0 there and returns NaN)

Hyper-parameters: temperature tau = 0.1 (also pytorch-metric-learning's default; a smaller tau
weighs the hardest negatives more); lam = 0.1, the weight KNN-BERT gives its own contrastive term.
A batch where no example has a positive gives 0.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SupConLoss(nn.Module):
    lam = 0.1
    part = "supcon"  # the assignment's (minknn/assignment/parts.py)

    def __init__(self, num_classes=None, dim=None, temperature=0.1):
        super().__init__()
        self.temperature = temperature

    def forward(self, z, labels):
        # z (B, dim), labels (B,). s = u u^T / tau, (B, B). log_prob[i, p] = s_ip - log sum over
        # a in A(i) of exp(s_ia): the anchor itself is not in A(i), so mask the diagonal with -inf
        # before the logsumexp (over dim 1, the candidates). Average each anchor's log_prob over
        # its positives P(i) (not itself), then over the anchors that have a positive.
        # BEGIN part supcon
        u = F.normalize(z, dim=-1)
        s = u @ u.T / self.temperature                             # (B, B)
        self_mask = torch.eye(len(u), dtype=torch.bool, device=u.device)
        positive = (labels[:, None] == labels[None, :]) & ~self_mask
        anchors = positive.any(1)
        if not anchors.any():
            return s.sum() * 0.0
        log_prob = s - torch.logsumexp(s.masked_fill(self_mask, float("-inf")), dim=1, keepdim=True)
        per_anchor = -(log_prob * positive).sum(1)[anchors] / positive.sum(1)[anchors]
        return per_anchor.mean()
        # END part supcon
