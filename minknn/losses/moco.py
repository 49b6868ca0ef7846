"""The MoCo contrastive loss (He et al. 2020, "Momentum Contrast for Unsupervised Visual
Representation Learning", eq. 1), the baseline KNN-BERT compares with (its Table 1, "MoCo").

    L(q) = -log( exp(q.k+ / tau) / (exp(q.k+ / tau) + sum_{k_i in memory} exp(q.k_i / tau)) )
         = softplus( logsumexp_i(q.k_i / tau) - q.k+ / tau )

    q = h / ||h||   the query: the L2-normalised pooled representation
    k+              the positive: the key encoder's encoding of the same example (--memory queue),
                    or that example's own memory-bank entry (--memory bank, Wu et al. 2018)
    k_i             every key in the memory, as negatives; labels are ignored, so keys of q's own
                    class are negatives too: the unsupervised baseline that KNN-BERT's loss
                    (knnbert.py) improves on by using the labels

The batch loss is the mean over the batch. Hyper-parameters: tau = 0.07 (MoCo's), lam = 0.1 (the
weight of KNN-BERT's contrastive term). When the whole training set fits in the queue it also
holds an older key of the query itself, which counts here as one negative among thousands.
"""
import torch.nn as nn
import torch.nn.functional as F


class MoCoLoss(nn.Module):
    lam = 0.1
    uses_memory = True  # called with the batch's keys and the memory (Objective.forward)

    def __init__(self, num_classes=None, dim=None, tau=0.07):
        super().__init__()
        self.tau = tau

    def forward(self, h, labels, batch_keys, memory_keys, memory_labels):
        q = F.normalize(h, dim=-1)
        positive = (q * batch_keys).sum(1) / self.tau                  # (B,)
        negatives = (q @ memory_keys.T / self.tau).logsumexp(1)        # (B,)
        return F.softplus(negatives - positive).mean()
