"""The scores minknn reports, each written out.

One label per example (pred and gold: class indices):
    acc       accuracy, mean_i [pred_i == gold_i]
    macro_f1  the mean of F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c) over the classes that occur in
              gold or predictions (the convention of scikit-learn's f1_score(average="macro"))
    f1        binary tasks: F1 of class 1 (MRPC's paraphrase), GLUE's F1
    mcc       Matthews correlation (CoLA's score), for two classes
                  (TP TN - FP FN) / sqrt((TP + FP)(TP + FN)(TN + FP)(TN + FN)),
                  0 when a factor is 0
Multi-label (pred and gold: (N, C) 0/1 arrays):
    micro_f1  2 TP / (2 TP + FP + FN), counted over every (example, label) cell
    macro_f1  the mean over labels of each label's F1, over the labels that occur in gold or
              predictions (as for one label per example)
    hamming   Hamming loss: the share of cells predicted wrong, mean [pred_ic != gold_ic] (lower
              is better; Su et al. report it beside micro-F1)
Similarity:
    pearson   sum_i (x_i - mean x)(y_i - mean y)
              / sqrt(sum_i (x_i - mean x)^2 sum_i (y_i - mean y)^2)
              (STS's metric; 0 when either side is constant, where the formula is 0/0)
"""
import numpy as np


def accuracy(pred, gold):
    pred, gold = np.asarray(pred), np.asarray(gold)
    return float((pred == gold).mean())


def f1_of(tp, fp, fn):
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def macro_f1(pred, gold):
    pred, gold = np.asarray(pred), np.asarray(gold)
    scores = []
    for c in np.union1d(pred, gold):
        scores.append(f1_of(np.sum((pred == c) & (gold == c)), np.sum((pred == c) & (gold != c)),
                            np.sum((pred != c) & (gold == c))))
    return float(np.mean(scores))


def binary_f1(pred, gold):
    pred, gold = np.asarray(pred) == 1, np.asarray(gold) == 1
    return float(f1_of(np.sum(pred & gold), np.sum(pred & ~gold), np.sum(~pred & gold)))


def matthews(pred, gold):
    pred, gold = np.asarray(pred) == 1, np.asarray(gold) == 1
    tp, tn = float(np.sum(pred & gold)), float(np.sum(~pred & ~gold))
    fp, fn = float(np.sum(pred & ~gold)), float(np.sum(~pred & gold))
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / denominator) if denominator > 0 else 0.0


def micro_f1(pred, gold):
    pred, gold = np.asarray(pred, dtype=bool), np.asarray(gold, dtype=bool)
    return float(f1_of(np.sum(pred & gold), np.sum(pred & ~gold), np.sum(~pred & gold)))


def multilabel_macro_f1(pred, gold):
    pred, gold = np.asarray(pred, dtype=bool), np.asarray(gold, dtype=bool)
    occur = (pred | gold).any(0)
    if not occur.any():
        return 0.0
    tp, fp, fn = (pred & gold).sum(0), (pred & ~gold).sum(0), (~pred & gold).sum(0)
    return float(np.mean((2 * tp / np.maximum(2 * tp + fp + fn, 1))[occur]))


def hamming_loss(pred, gold):
    return float((np.asarray(pred, dtype=bool) != np.asarray(gold, dtype=bool)).mean())


def pearson(pred, gold):
    x, y = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0


METRICS = {  # name -> (function of (pred, gold), its name in printed lines)
    "acc": (accuracy, "accuracy"), "macro_f1": (macro_f1, "macro-F1"), "f1": (binary_f1, "F1"),
    "mcc": (matthews, "MCC"), "pearson": (pearson, "Pearson"), "micro_f1": (micro_f1, "micro-F1"),
    "hamming": (hamming_loss, "Hamming loss"),
}
# the values a score can take: the correlations in [-1, 1], every other score (a share) in [0, 1]
RANGES = {name: (-1, 1) if name in ("mcc", "pearson") else (0, 1) for name in METRICS}
MULTILABEL = {"macro_f1": multilabel_macro_f1}  # the same name, computed over (N, C) label sets
