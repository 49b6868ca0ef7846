import pytest

from minknn.metrics import accuracy, macro_f1


def test_accuracy_and_macro_f1_by_hand():
    gold = [0, 0, 0, 1, 1, 2]
    pred = [0, 0, 1, 1, 2, 2]
    assert accuracy(pred, gold) == pytest.approx(4 / 6)
    # class 0: tp 2 fp 0 fn 1 -> 4/5; class 1: tp 1 fp 1 fn 1 -> 2/4; class 2: tp 1 fp 1 fn 0 -> 2/3
    assert macro_f1(pred, gold) == pytest.approx((4 / 5 + 2 / 4 + 2 / 3) / 3)


def test_macro_f1_counts_a_predicted_class_absent_from_gold():
    assert macro_f1([0, 3], [0, 0]) == pytest.approx((2 / 3 + 0) / 2)
    assert macro_f1([1, 1], [1, 1]) == 1.0
