"""Accuracy and macro-F1.

    accuracy  = mean_i [pred_i == gold_i]
    F1_c      = 2 TP_c / (2 TP_c + FP_c + FN_c)
    macro-F1  = mean of F1_c over the classes that occur in gold or predictions
                (the convention of scikit-learn's f1_score(average="macro"))
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
