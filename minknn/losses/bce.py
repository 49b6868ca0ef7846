"""Binary cross-entropy on a multi-label head's logits, the standard multi-label loss.

    L = -1/(B C) sum_i sum_c [ y_ic log sigmoid(F(z_i))_c + (1 - y_ic) log(1 - sigmoid(F(z_i))_c) ]

F is the linear head (one logit per class), y_i the example's multi-hot labels; each class is its
own yes/no question. The mean over every (example, class) cell (PyTorch's default). No parameters
of its own; `dim` is unused (every loss takes the same constructor arguments).
"""
import torch.nn as nn
import torch.nn.functional as F


class BinaryCrossEntropy(nn.Module):
    kind = "multilabel"
    trains = ("encoder", "head")  # through the logits

    def __init__(self, num_classes, dim):
        super().__init__()

    def forward(self, output, labels):
        return F.binary_cross_entropy_with_logits(output.logits.float(), labels.float())
