"""Accuracy, macro-F1 and Pearson's correlation.

    accuracy  = mean_i [pred_i == gold_i]
    F1_c      = 2 TP_c / (2 TP_c + FP_c + FN_c)
    macro-F1  = mean of F1_c over the classes that occur in gold or predictions
                (the convention of scikit-learn's f1_score(average="macro"))
    pearson   = sum_i (x_i - mean x)(y_i - mean y) / sqrt(sum_i (x_i - mean x)^2 sum_i (y_i - mean y)^2)
                (STS's metric; 0 when either side is constant, where the formula is 0/0)
"""
import numpy as np


def accuracy(pred, gold):
    pred, gold = np.asarray(pred), np.asarray(gold)
    return float((pred == gold).mean())


def macro_f1(pred, gold):
    pred, gold = np.asarray(pred), np.asarray(gold)
    scores = []
    for c in np.union1d(pred, gold):
        tp = np.sum((pred == c) & (gold == c))
        fp = np.sum((pred == c) & (gold != c))
        fn = np.sum((pred != c) & (gold == c))
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def pearson(pred, gold):
    x, y = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0
