import pytest

from minknn.metrics import (accuracy, binary_f1, hamming_loss, macro_f1, matthews, micro_f1, multilabel_macro_f1,
                            pearson)


def test_accuracy_and_macro_f1_by_hand():
    gold = [0, 0, 0, 1, 1, 2]
    pred = [0, 0, 1, 1, 2, 2]
    assert accuracy(pred, gold) == pytest.approx(4 / 6)
    # class 0: tp 2 fp 0 fn 1 -> 4/5; class 1: tp 1 fp 1 fn 1 -> 2/4; class 2: tp 1 fp 1 fn 0 -> 2/3
    assert macro_f1(pred, gold) == pytest.approx((4 / 5 + 2 / 4 + 2 / 3) / 3)


def test_macro_f1_counts_a_predicted_class_absent_from_gold():
    assert macro_f1([0, 3], [0, 0]) == pytest.approx((2 / 3 + 0) / 2)
    assert macro_f1([1, 1], [1, 1]) == 1.0


def test_pearson_by_hand():
    # x = 1, 2, 3, 4 (mean 2.5), y = 2, 1, 4, 3 (mean 2.5): deviations -1.5 -0.5 0.5 1.5 and -0.5 -1.5 1.5 0.5
    # sum dx dy = 0.75 + 0.75 + 0.75 + 0.75 = 3; sum dx^2 = sum dy^2 = 5; r = 3 / 5
    assert pearson([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.6)
    assert pearson([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([2, 2, 2], [1, 2, 3]) == 0.0  # constant predictions: 0/0, reported as 0


def test_binary_f1_and_matthews_by_hand():
    gold = [1, 1, 1, 0, 0, 0, 0, 1]
    pred = [1, 1, 0, 1, 0, 0, 0, 0]
    # TP 2 (rows 0, 1), FN 2 (rows 2, 7), FP 1 (row 3), TN 3: F1 = 4 / (4 + 1 + 2)
    assert binary_f1(pred, gold) == pytest.approx(4 / 7)
    # MCC = (2 * 3 - 1 * 2) / sqrt((2 + 1)(2 + 2)(3 + 1)(3 + 2)) = 4 / sqrt(240)
    assert matthews(pred, gold) == pytest.approx(4 / 240 ** 0.5)
    assert matthews(gold, gold) == pytest.approx(1.0) and matthews([1 - g for g in gold], gold) == pytest.approx(-1.0)
    assert matthews([1] * 8, gold) == 0.0  # one class predicted: a zero factor, reported as 0
    assert binary_f1([0, 0], [0, 0]) == 0.0


def test_multilabel_scores_by_hand():
    gold = [[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0]]
    pred = [[1, 0, 0, 0], [0, 1, 1, 0], [1, 0, 0, 0]]
    # cells: TP 3 ((0,0), (1,1), (2,0)), FP 1 ((1,2)), FN 2 ((0,2), (2,1)); 12 cells, 3 wrong
    assert micro_f1(pred, gold) == pytest.approx(6 / (6 + 1 + 2))
    assert hamming_loss(pred, gold) == pytest.approx(3 / 12)
    # per label: 0: tp 2 -> 1; 1: tp 1 fn 1 -> 2/3; 2: fp 1 fn 1 -> 0; 3: never gold nor predicted, left out
    assert multilabel_macro_f1(pred, gold) == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert micro_f1(gold, gold) == 1.0 and hamming_loss(gold, gold) == 0.0


def test_micro_f1_counts_cells_not_examples():
    gold = [[1, 1, 1, 1], [1, 0, 0, 0]]
    pred = [[1, 1, 1, 1], [0, 0, 0, 0]]
    # cells: TP 4, FN 1 -> 8/9; averaging per example would give (1 + 0) / 2
    assert micro_f1(pred, gold) == pytest.approx(8 / 9)


def test_multilabel_macro_f1_counts_a_label_only_predicted():
    gold, pred = [[1, 0], [1, 0]], [[1, 1], [1, 0]]
    assert multilabel_macro_f1(pred, gold) == pytest.approx((1 + 0) / 2)  # label 1: predicted, never gold
