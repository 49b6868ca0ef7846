"""minknn/losses/ancsetfit.py, AncSetFit's triplet loss (Pauli et al. 2023): each text pulled to its
class's statement and pushed from a text of another class, max(0, d(s, x) - d(s, n) + margin) with
d = 1 - cos, the mean over the triplets; its triplets (draw_pairs) and their batches, and the
statements train.py encodes in the anchors' place (minknn/tools/step.py batch). No part of the
assignment: a failure names the loss's file. Its checks, in the order tests/losses/checks.py says:

    python -m pytest -q tests/losses/test_ancsetfit.py
"""
import math
import random

import pytest
import torch

from checks import (at_angle, check_degenerate_inputs_are_finite, check_every_input, check_gradcheck,
                    check_matches_its_oracle, check_normalises_what_its_formula_normalises,
                    check_runs_in_fp32_under_autocast, check_runs_on_the_inputs_device,
                    check_stays_finite_on_large_inputs, e, make, value, worked)
from minknn import MinknnError
from minknn.losses.ancsetfit import MARGIN, draw_pairs, statement_row
from minknn.tasks.data import class_statements
from minknn.tasks.registry import TASKS
from minknn.tools.engine import PairBatches

N = "ancsetfit"


def test_ancsetfit_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises(N)


def triplets(*rows):
    """h (3B, dim) of B triplets given as (anchor, text, negative) rows."""
    return torch.stack([r[0] for r in rows] + [r[1] for r in rows] + [r[2] for r in rows])


def test_ancsetfit_hinges_on_the_margin():
    """One triplet, anchor e0: a text at cos c_p and a negative at cos c_n give
    max(0, (1 - c_p) - (1 - c_n) + 0.25) = max(0, c_n - c_p + 0.25): 0 once the text is nearer by
    more than the margin, the margin when both are equally near, linear in between."""
    loss = make(N)
    labels = torch.tensor([0, 0, 1])
    for c_p, c_n in ((0.9, 0.1), (0.5, 0.5), (0.5, 0.4), (0.2, 0.9)):
        h = triplets((e(0), at_angle(math.acos(c_p)), at_angle(math.acos(c_n))))
        got = value(N, loss, h, labels)
        worked(N, got, max(0.0, c_n - c_p + MARGIN), f"one triplet, the text at cos {c_p} to its "
               f"anchor, the negative at cos {c_n}: max(0, (1 - {c_p}) - (1 - {c_n}) + 0.25)",
               atol=1e-9)


def test_ancsetfit_anchor_text_and_negative_are_the_batch_thirds():
    """Two triplets: (e0, e0, e1) costs 0 (text on its anchor, negative orthogonal), (e2, e3, e2)
    costs 1 + 0.25 (the negative on the anchor): their mean, 0.625."""
    loss = make(N)
    h = triplets((e(0), e(0), e(1)), (e(2), e(3), e(2)))
    got = value(N, loss, h, torch.tensor([0, 1, 0, 1, 1, 0]))
    worked(N, got, (0.0 + 1.25) / 2, "triplets (e0, e0, e1) and (e2, e3, e2) as the thirds of the "
           "batch: the mean of 0 and 1.25", atol=1e-9)


def test_ancsetfit_matches_its_oracle():
    check_matches_its_oracle(N)


def test_ancsetfit_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite(N)


def test_ancsetfit_gradcheck():
    check_gradcheck(N)


def test_ancsetfit_every_input():
    check_every_input(N)


def test_ancsetfit_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast(N)


def test_ancsetfit_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs(N)


def test_ancsetfit_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device(N)


def test_ancsetfit_refuses_a_batch_that_is_not_triplets():
    with pytest.raises(ValueError, match="triplets"):
        make(N)(torch.randn(4, 8, dtype=torch.float64), torch.tensor([0, 1, 0, 1]))


# ---- its triplets (draw_pairs) and their batches (minknn/tools/engine.py PairBatches) ----

LABELS = [0, 1, 2, 0, 1, 0, 0, 2]


def test_ancsetfit_every_example_heads_r_triplets_anchored_at_its_class():
    drawn = draw_pairs(LABELS, random.Random(0), 5)
    assert len(drawn) == 5 * len(LABELS), f"{len(drawn)} triplets, not R x N = 40"
    assert [i for _, i, _ in drawn] == list(range(len(LABELS))) * 5, \
        "each round must give each example, in row order, one triplet"
    for anchor, i, negative in drawn:
        assert anchor == statement_row(LABELS[i]) == -1 - LABELS[i], (
            f"example {i} (class {LABELS[i]}) is anchored at row {anchor}: its class's statement "
            f"is row -1 - {LABELS[i]}")
        assert LABELS[negative] != LABELS[i], \
            f"example {i}'s negative {negative} is of its own class {LABELS[i]}"


def test_ancsetfit_negatives_cover_every_other_class_and_the_seed_decides():
    drawn = draw_pairs(LABELS, random.Random(1), 200)
    for i, y in enumerate(LABELS):
        negatives = {n for _, j, n in drawn if j == i}
        assert negatives == {j for j, c in enumerate(LABELS) if c != y}, (
            f"example {i}'s negatives over 200 rounds are {sorted(negatives)}: they must be drawn "
            f"from every row of the other classes")
    assert draw_pairs(LABELS, random.Random(7), 3) == draw_pairs(LABELS, random.Random(7), 3)
    assert draw_pairs(LABELS, random.Random(7), 3) != draw_pairs(LABELS, random.Random(8), 3)
    with pytest.raises(MinknnError, match="one class only"):
        draw_pairs([2, 2], random.Random(0), 1)


def test_ancsetfit_batches_are_the_anchors_then_the_texts_then_the_negatives():
    rng = random.Random(0)
    stream = PairBatches(draw_pairs(LABELS, rng, 2), 5, rng)  # 16 triplets: batches of 5, 5, 5, 1
    seen = []
    for _ in range(4):
        rows = next(stream)
        B = len(rows) // 3
        assert all(r < 0 for r in rows[:B]) and all(r >= 0 for r in rows[B:]), \
            f"a batch's first third must be the anchors (rows below 0), then the rows: {rows}"
        seen += list(zip(rows[:B], rows[B:2 * B], rows[2 * B:]))
    assert sorted(seen) == sorted(stream.pairs), \
        "one pass of batches must hold every triplet once, as (rows[k], rows[B + k], rows[2B + k])"


def test_ancsetfit_statements_of_the_papers_tasks_are_theirs():
    """SST-5's and CR's statements as AncSetFit's templates.py writes them (less a doubled
    space); TREC's from its names; a task without names has none."""
    assert class_statements(TASKS["sst5"]) == [f"The movie is {w}" for w in
                                               ("terrible", "bad", "okay", "good", "great")]
    assert class_statements(TASKS["cr"]) == ["The movie is bad", "The movie is good"]
    assert class_statements(TASKS["trec"])[3] == "The question is regarding human being"
    assert class_statements(TASKS["subj"]) == ["This sentence is objective.",
                                               "This sentence is subjective."]
    assert class_statements(TASKS["reuters"]) is None
