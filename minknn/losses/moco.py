"""The MoCo contrastive loss (He et al. 2020, "Momentum Contrast for Unsupervised Visual
Representation Learning", eq. 1), the baseline KNN-BERT compares with (its Table 1, "MoCo").

    L(q) = -log( exp(q.k+ / tau) / (exp(q.k+ / tau) + sum_{k_i in N(q)} exp(q.k_i / tau)) )
         = softplus( logsumexp_{N(q)}(q.k_i / tau) - q.k+ / tau )

    q = z / ||z||   the query: the L2-normalised pooled representation of training example i
    k+              the positive: the key encoder's encoding of the same example (--memory queue),
                    or that example's own memory-bank entry v_i (--memory bank)
    N(q)            the negatives: every key in memory except those of example i itself (each
                    key carries its example's id, minknn/memory.py). Labels are ignored, so keys of
                    q's own class are negatives too: the unsupervised baseline that KNN-BERT's
                    loss (knnbert.py) improves on by using the labels

Why example i's own keys are left out of N(q):
  - bank: v_i is the positive; counted among the negatives too it would sit twice in the
    denominator and the loss could never fall below log 2. Without it this is Wu et al. 2018's
    non-parametric softmax (eq. 2), P(i | f_i) = exp(v_i.f_i / tau) / sum_j exp(v_j.f_i / tau),
    with v_i once in the sum and every other entry as a negative.
  - queue: when the whole training set fits in the queue (the default) it holds an older key of
    example i, cosine about 0.995 to k+. As a negative it pushes q away from its own positive.

The batch loss is the mean over the batch. Hyper-parameters: tau = 0.07 (MoCo's; `temperature` in
the code), lam = 0.1 (the weight of KNN-BERT's contrastive term).
"""
import torch.nn as nn
import torch.nn.functional as F


class MoCoLoss(nn.Module):
    lam = 0.1
    part = "moco-loss"  # the assignment's (minknn/assignment/parts.py)
    uses_memory = True  # called with the batch's keys and the memory (Objective.forward)

    def __init__(self, num_classes=None, dim=None, temperature=0.07):
        super().__init__()
        self.temperature = temperature

    def forward(self, z, labels, batch_keys, memory_keys, memory_labels, rows, memory_rows):
        """z (B, d), batch_keys (B, d) the positives, rows (B,) the batch's training-set rows;
        memory_keys (K, d) unit keys, memory_rows (K,) their examples' rows. A scalar."""
        # q = normalised z. The positive logit q.k+ / tau, (B,); the negatives' logits
        # q.k_i / tau, (B, K), with -inf where a key belongs to the query's own example (rows
        # against memory_rows). -log(e^pos / (e^pos + sum_N e^neg)) = softplus(lse_N - pos): the
        # positive stays in the denominator. The mean over the batch.
        # BEGIN part moco-loss
        q = F.normalize(z, dim=-1)
        positive = (q * batch_keys).sum(1) / self.temperature                            # (B,)
        own = rows[:, None] == memory_rows[None, :]                                # (B, K)
        s = (q @ memory_keys.T / self.temperature).masked_fill(own, float("-inf"))        # (B, K)
        return F.softplus(s.logsumexp(1) - positive).mean()
        # END part moco-loss
