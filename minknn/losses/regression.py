"""The similarity tasks' loss (STS): the predicted score against the gold one, on the 0-5 scale.

    --sts_loss mse   L = 1/B sum_i (s_i - y_i)^2
    --sts_loss l1    L = 1/B sum_i |s_i - y_i|

s_i is the head's score (or, with --pair_mode siamese, 2.5 (cos(u, v) + 1)); the task is scored
by the Pearson correlation of s and y.
"""
import torch.nn as nn
import torch.nn.functional as F

STS_LOSSES = {"mse": F.mse_loss, "l1": F.l1_loss}


class Regression(nn.Module):
    trains_head = True  # as every task's loss but SetFit's (Objective.trains_head)

    def __init__(self, loss="mse"):
        super().__init__()
        self.loss = loss

    def forward(self, output, targets, batch_keys=None, memory=None):
        return STS_LOSSES[self.loss](output.logits.float(), targets.float()), {}
