import pytest

from minknn.metrics import accuracy, macro_f1, pearson


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
