"""The decoupled retrieval representation of Liang et al., "Retrieval-Augmented Classification
with Decoupled Representation" (sec. 2.2, eq. 4, appendix B), trained with --decoupled.

    r_i = MLP(h0_i)     the retrieval head (minknn/model.py); h0_i, the pooled representation z,
                        still feeds the linear head
    L = (1 - beta) CE + beta L_DIS,   L_DIS = 1/B sum_i max(d(r_i, r_i+) - d(r_i, r_i-) + mu, 0)
    d(u, v) = ||u - v||^2   squared L2 on the raw (unnormalised) r, the distance the kNN datastore
                            votes with (minknn/knn.py, --vote distance)

One triplet per anchor, drawn from the batch by label (appendix B): r_i+ a random other example
with label y_i, or r_i itself when there is none; r_i- a random example with another label, or a
random other example when the batch has one class only (r_i itself for a batch of one).

Hyper-parameters: beta = 0.5 (the paper's, set with --lam); margin mu = 1.0, which the paper does
not give (our choice). The draws use PyTorch's global generator, so --seed fixes them.
"""
import torch
import torch.nn as nn


def sample_triplets(labels, generator=None):
    """(positive, negative) example indices (B,), one of each per anchor, as described above."""
    B = len(labels)
    eye = torch.eye(B, dtype=torch.bool, device=labels.device)
    same = labels[:, None] == labels[None, :]
    positive = same & ~eye
    positive = positive | (eye & ~positive.any(1, keepdim=True))   # no positive: the anchor itself
    negative = ~same
    negative = negative | (~eye & ~negative.any(1, keepdim=True))  # no negative: any other example
    negative = negative | (eye & ~negative.any(1, keepdim=True))   # batch of one: the anchor itself
    draw = lambda mask: torch.multinomial(mask.float(), 1, generator=generator).squeeze(1)
    return draw(positive), draw(negative)


def decoupled_triplet(r, positive, negative, margin):
    d = lambda a, b: ((a - b) ** 2).sum(-1)
    return (d(r, r[positive]) - d(r, r[negative]) + margin).clamp(min=0).mean()


class DecoupledTripletLoss(nn.Module):
    lam = 0.5  # the paper's beta
    trains = ("encoder", "retrieval")  # r = MLP(z): a frozen encoder leaves the MLP to train

    def __init__(self, num_classes=None, dim=None, margin=1.0):
        super().__init__()
        self.margin = margin

    def forward(self, r, labels):
        positive, negative = sample_triplets(labels)
        return decoupled_triplet(r, positive, negative, self.margin)
