"""Categorical cross-entropy on the linear head's logits, the standard fine-tuning loss.

    L = -1/B sum_i log softmax(F(z_i))_{y_i}

F is the linear head, z_i the pooled representation, y_i the class index. No parameters of its
own; `dim` is unused (every loss takes the same constructor arguments).
"""
import torch.nn as nn
import torch.nn.functional as F


class CrossEntropy(nn.Module):
    trains = ("encoder", "head")  # through the logits

    def __init__(self, num_classes, dim):
        super().__init__()

    def forward(self, output, labels):
        return F.cross_entropy(output.logits.float(), labels)
