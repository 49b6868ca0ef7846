"""minknn/kinds.py: each kind's targets, predictions, scores and files, and the overall score."""
import numpy as np
import pytest
import torch

from minknn.kinds import kind_of, overall, score, selection_score
from minknn.tasks.data import Example
from minknn.tasks.registry import TASKS


def test_targets_by_kind():
    examples = [Example("a", label=(0, 2)), Example("b", label=(1,))]
    y = kind_of(TASKS["reuters"]).targets(TASKS["reuters"], examples, "cpu")
    assert y.shape == (2, 90) and y.dtype == torch.float
    assert y[0].nonzero().flatten().tolist() == [0, 2] and y[1].nonzero().flatten().tolist() == [1]
    sts = kind_of(TASKS["sts"]).targets(TASKS["sts"], [Example("a", "b", 3.5)], "cpu")
    assert sts.dtype == torch.float and sts.tolist() == [3.5]
    assert kind_of(TASKS["sst"]).targets(TASKS["sst"], [Example("a", label=4)], "cpu").tolist() == [4]


def test_predictions_by_kind():
    classify, multilabel, similarity = kind_of(TASKS["sst"]), kind_of(TASKS["reuters"]), kind_of(TASKS["sts"])
    assert classify.decide(classify.probabilities(torch.tensor([[0.1, 0.9], [2.0, 1.0]]))).tolist() == [1, 0]
    # sigmoid > 0.5 is logit > 0, per class
    assert multilabel.decide(multilabel.probabilities(torch.tensor([[0.3, -0.1, 0.0]]))).tolist() == [[True, False, False]]
    assert similarity.decide(similarity.probabilities(torch.tensor([1.5, 4.0]))).tolist() == [1.5, 4.0]


def test_scores_and_the_overall_score():
    sst = score(TASKS["sst"], [0, 1, 2, 2], [0, 1, 2, 3])
    mrpc = score(TASKS["mrpc"], [1, 0], [1, 1])
    sts = score(TASKS["sts"], [1, 2, 3, 4], [2, 1, 4, 3])  # Pearson 0.6 (see test_metrics)
    assert list(sst) == ["acc", "macro_f1"] and list(mrpc) == ["acc", "f1", "macro_f1"] and list(sts) == ["pearson"]
    assert sst["acc"] == 0.75 and mrpc["acc"] == 0.5 and mrpc["f1"] == pytest.approx(2 / 3)
    assert sts["pearson"] == pytest.approx(0.6)
    tasks = [TASKS["sst"], TASKS["mrpc"], TASKS["sts"]]
    # minBERT's overall score: (sst_acc + para_acc + (pearson + 1) / 2) / 3
    assert overall(tasks, {"sst": sst, "mrpc": mrpc, "sts": sts}) == pytest.approx((0.75 + 0.5 + 1.6 / 2) / 3)
    cola = score(TASKS["cola"], [1, 1, 0, 0], [1, 0, 0, 0])
    assert list(cola)[0] == "mcc", "CoLA's first score is MCC"
    assert selection_score(TASKS["cola"], cola) == pytest.approx((cola["mcc"] + 1) / 2), "MCC put in [0, 1]"
    reuters = score(TASKS["reuters"], np.eye(2, 90, dtype=bool), np.eye(2, 90, dtype=bool))
    assert list(reuters) == ["micro_f1", "macro_f1", "hamming"] and reuters["hamming"] == 0 and reuters["micro_f1"] == 1


def test_prediction_files_by_kind():
    """Each kind's file: the prediction, then, where the split has labels, the gold answer in the same form."""
    sst, reuters, sts = TASKS["sst"], TASKS["reuters"], TASKS["sts"]
    gold = [Example("a", label=4, id="x"), Example("b", label=0, id="y")]
    header, rows = kind_of(sst).rows(sst, gold, np.array([4, 2]))
    assert header == ["id", "prediction", "prediction_name", "gold", "gold_name"]
    assert rows == [["x", 4, "very positive", 4, "very positive"], ["y", 2, "neutral", 0, "very negative"]]
    gold = [Example("a", label=(0,), id="x"), Example("b", label=(1, 2), id="y")]
    header, rows = kind_of(reuters).rows(reuters, gold, np.array([[1, 0, 1] + [0] * 87, [0] * 90]))
    assert header == ["id", "prediction", "prediction_name", "gold", "gold_name"]
    assert rows == [["x", "0 2", "acq barley", "0", "acq"], ["y", "", "", "1 2", "alum barley"]]
    gold = [Example("a", "b", 3.5, id="x"), Example("c", "d", 1.0, id="y")]
    header, rows = kind_of(sts).rows(sts, gold, np.array([1.23456, 4.0]))
    assert header == ["id", "similarity", "gold"] and rows == [["x", "1.2346", 3.5], ["y", "4.0000", 1.0]]
    # a split without labels (test-student files): no gold columns
    unlabelled = [Example("a", id="x"), Example("b", id="y")]
    assert kind_of(sst).rows(sst, unlabelled, np.array([4, 2])) == (
        ["id", "prediction", "prediction_name"], [["x", 4, "very positive"], ["y", 2, "neutral"]])
    assert kind_of(reuters).rows(reuters, unlabelled, np.zeros((2, 90)))[0] == ["id", "prediction", "prediction_name"]
    assert kind_of(sts).rows(sts, unlabelled, np.array([1.0, 2.0])) == (["id", "similarity"], [["x", "1.0000"], ["y", "2.0000"]])


def test_a_multilabel_head_starts_at_its_classes_priors():
    task = TASKS["goemotions"]
    examples = [Example("a", label=(0,)), Example("b", label=(0, 2)), Example("c", label=(27,)),
                Example("d", label=(0,))]
    head = kind_of(task).head(task, 8, siamese=False)
    kind_of(task).start_head(head, task, examples)
    p = torch.sigmoid(head.bias)
    torch.testing.assert_close(p[[0, 2, 27]], torch.tensor([0.75, 0.25, 0.25]),
                               msg="a class's starting probability is its share of the examples")
    torch.testing.assert_close(p[1], torch.tensor(0.125), msg="an absent class counts as half an example")
    sst = kind_of(TASKS["sst"]).head(TASKS["sst"], 8, siamese=False)
    before = sst.bias.clone()
    kind_of(TASKS["sst"]).start_head(sst, TASKS["sst"], [Example("a", label=1)])
    assert torch.equal(sst.bias, before)  # a classification head keeps its random start


def test_classify_probabilities_are_a_softmax_per_example():
    classify = kind_of(TASKS["sst"])
    logits = torch.tensor([[0.1, 0.9, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 3.0], [0.0, 5.0, 0.0]])  # not square
    p = classify.probabilities(logits)
    torch.testing.assert_close(p, torch.softmax(logits.double(), dim=-1), msg="softmax over each row's classes")
    assert classify.decide(p).tolist() == [1, 0, 2, 1], "argmax over each row's classes"


def test_a_multilabel_task_scores_macro_f1_per_label():
    gold, pred = np.zeros((3, 90), dtype=bool), np.zeros((3, 90), dtype=bool)
    gold[:, :4] = [[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0]]
    pred[:, :4] = [[1, 0, 0, 0], [0, 1, 1, 0], [1, 0, 0, 0]]
    got = score(TASKS["reuters"], pred, gold)["macro_f1"]
    assert got == pytest.approx((1 + 2 / 3 + 0) / 3), "multi-label macro-F1: the labels' F1s (multilabel_macro_f1)"


def test_a_class_in_every_example_starts_below_certainty():
    task = TASKS["goemotions"]
    head = kind_of(task).head(task, 8, siamese=False)
    kind_of(task).start_head(head, task, [Example("a", label=(0,))] * 4)
    assert torch.isfinite(head.bias).all(), "a class in every example must not give log(1/0)"
    torch.testing.assert_close(torch.sigmoid(head.bias[0]), torch.tensor(3.5 / 4), msg="n - 1/2 of n examples")
