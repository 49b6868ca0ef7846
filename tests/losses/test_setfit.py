"""Part setfit of the assignment, minknn/losses/setfit.py: SetFit's pair loss: the cosine of each
pair's two vectors regressed onto 1 for a pair of one class, 0 for two (Tunstall et al. 2022
(SetFit), sec. 3.1; sentence-transformers' CosineSimilarityLoss). Its command runs every check of
the loss, and no other:

    python -m pytest -q tests/losses/test_setfit.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (setfit_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, the sanity check against tests/fixtures/references/setfit.pt, fp32 under
autocast, then SetFit's pairs: draw_pairs and minknn/tools/engine.py's PairBatches. A failure names the
part.
"""
import math
import random

import pytest
import torch
import torch.nn.functional as F

from checks import (at_angle, check_degenerate_inputs_are_finite, check_every_input,
                    check_gradcheck, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises,
                    check_runs_in_fp32_under_autocast, check_runs_on_the_inputs_device,
                    check_sanity_check, check_stays_finite_on_large_inputs, e, make, near, ok,
                    ratio, value, worked)
from minknn import MinknnError
from minknn.losses.setfit import draw_pairs
from minknn.tools.engine import PairBatches


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_setfit_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("setfit")


def test_setfit_a_pair_of_one_class_targets_one():
    """One pair of equal vectors (cos 1): (cos - target)^2 is 0 when its texts share a class
    (target 1) and 1 when not (target 0). The rule is named as the fault only where the values
    are the two exchanged (checked); else the message says which value is off and how."""
    loss, x = make("setfit"), torch.stack([e(0), e(0)])
    same, other = (value("setfit", loss, x, torch.tensor(y)) for y in ([2, 2], [2, 3]))
    if near(same, 1.0) and near(other, 0.0):
        ok("setfit", False, "a pair of equal vectors gives 1 when its texts share a class and 0 "
           "when not, where (cos - target)^2 gives 0 and 1: the targets are exchanged (the "
           "target is 1.0 for a pair of one class, labels[:B] == labels[B:], 0.0 for two)")
    said = [f"{v:.6g} when its texts {when}, where (cos - target)^2 gives {want:g}"
            f"{ratio([v], [want]).replace('each value got', 'it')}" for v, want, when in
            ((same, 0.0, "share a class"), (other, 1.0, "do not share one")) if not near(v, want)]
    ok("setfit", not said, f"one pair of equal vectors (cos 1): the loss is {'; and '.join(said)}")


def setfit_under(u, v, same, err=lambda x: x ** 2, reduce=torch.mean):
    """The loss on pairs (u_i, v_i) of targets `same` (1 or 0), under a choice of error and
    reduction: the mistakes' values, recomputed."""
    return reduce(err(F.cosine_similarity(u, v, dim=-1) - same)).item()


def test_setfit_pairs_the_first_half_with_the_second():
    """h = [e0, e1, e2, e0, x, -e2], x = (e1 + e2) / sqrt(2), labels [0, 1, 2, 0, 1, 2]: pairs
    (e0, e0), (e1, x) and (e2, -e2), each of one class, at cos 1, 1/sqrt(2) and -1. Each mistake
    below gives its own value on it, recomputed."""
    loss = make("setfit")
    x = (e(1) + e(2)) / math.sqrt(2)
    h = torch.stack([e(0), e(1), e(2), e(0), x, -e(2)])
    got = value("setfit", loss, h, torch.tensor([0, 1, 2, 0, 1, 2]))
    one = torch.ones(3, dtype=torch.float64)
    u, v = h[:3], h[3:]
    worked("setfit", got, setfit_under(u, v, one), "pairs (e0, e0), (e1, x), (e2, -e2), each of "
           "one class (x = (e1 + e2) / sqrt(2)): the mean of (cos - 1)^2", {
               "with neighbouring rows as pairs (h[0::2], h[1::2]); pair i is text i with text "
               "B + i, u, v = h.chunk(2)": setfit_under(h[0::2], h[1::2], one),
               "with target 0 for each of these pairs, which are all of one class "
               "(labels[:B] == labels[B:] is true for each, so each target is 1)":
                   setfit_under(u, v, 0 * one),
               "summed over the pairs, not their mean": setfit_under(u, v, one, reduce=torch.sum),
               "with the absolute error, not its square": setfit_under(u, v, one, err=torch.abs),
           }, atol=1e-9)


def test_setfit_squares_the_error_and_averages_over_the_pairs():
    """Two pairs: one class at cos 0.5, two classes at cos 0.8: ((0.5 - 1)^2 + 0.8^2) / 2."""
    loss = make("setfit")
    h = torch.stack([e(0), e(0), at_angle(math.acos(0.5)), at_angle(math.acos(0.8))])
    got = value("setfit", loss, h, torch.tensor([0, 1, 0, 2]))
    want = (0.25 + 0.64) / 2
    hints = {0.89: "a sum over the pairs, not the mean", 0.445 / 2: "a mean over the 2B texts, not "
             "the B pairs", 0.65: "the absolute error, not its square"}
    hint = next((why for v, why in hints.items() if near(got, v, atol=1e-9)), "")
    ok("setfit", near(got, want), f"the loss is {got:.6g}, expected {want:.6g} (the mean over the "
       f"pairs of (cos - target)^2){': ' + hint if hint else ''}")


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_setfit_matches_its_oracle():
    check_matches_its_oracle("setfit")


def test_setfit_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("setfit")


def test_setfit_gradcheck():
    check_gradcheck("setfit")


def test_setfit_every_input():
    check_every_input("setfit")


def test_setfit_sanity_check():
    check_sanity_check("setfit")


def test_setfit_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("setfit")


# ---- SetFit's pairs (minknn/losses/setfit.py draw_pairs, minknn/tools/engine.py PairBatches) ----

SETFIT_LABELS = [0, 1, 2, 0, 1, 0, 0, 2]   # class 0 of 4 rows, 1 and 2 of 2


def test_setfit_every_example_gets_r_positives_and_r_negatives():
    pairs = draw_pairs(SETFIT_LABELS, random.Random(0), 5)
    assert len(pairs) == 2 * 5 * len(SETFIT_LABELS), f"{len(pairs)} pairs, not R x 2 x N = 80"
    for i, y in enumerate(SETFIT_LABELS):
        partners = [b for a, b in pairs if a == i]
        positives = [b for b in partners if SETFIT_LABELS[b] == y]
        negatives = [b for b in partners if SETFIT_LABELS[b] != y]
        assert (len(positives), len(negatives)) == (5, 5), (
            f"example {i} (class {y}) heads {len(positives)} positive and {len(negatives)} "
            f"negative pairs; SetFit gives each example one of each per round, 5 rounds")


def test_setfit_positives_cover_the_class_and_negatives_the_other_classes():
    """Uniform draws over the rows, not always the first; a positive may be the example itself
    (SetFit draws it from its whole class); a class of one row pairs with itself."""
    pairs = draw_pairs(SETFIT_LABELS, random.Random(1), 200)
    for i, y in enumerate(SETFIT_LABELS):
        partners = {b for a, b in pairs if a == i}
        same = {j for j, c in enumerate(SETFIT_LABELS) if c == y}
        assert partners == set(range(len(SETFIT_LABELS))), (
            f"example {i}'s partners over 200 rounds are {sorted(partners)}: its positives must "
            f"be drawn from all of its class {sorted(same)} (itself included), its negatives from "
            f"all the other rows")
    lone = [b for a, b in draw_pairs([0, 1, 1], random.Random(0), 4) if a == 0]
    assert lone[0::2] == [0] * 4 and set(lone[1::2]) <= {1, 2}, \
        f"example 0, alone in its class, must be its own positive: its partners are {lone}"


def test_setfit_the_same_seed_draws_the_same_pairs():
    a, b = (draw_pairs(SETFIT_LABELS, random.Random(7), 4) for _ in range(2))
    assert a == b, "draw_pairs must draw only from the rng it is given"
    assert a != draw_pairs(SETFIT_LABELS, random.Random(8), 4), "another seed, the same pairs"
    with pytest.raises(MinknnError, match="one class only"):
        draw_pairs([3, 3, 3], random.Random(0), 2)


def test_setfit_batches_are_the_first_texts_then_the_second_and_resume():
    """PairBatches: each batch is its pairs' first rows then their second rows; one pass covers
    every pair once; a stream restored from its state_dict goes on with the same batches."""
    rng = random.Random(0)
    stream = PairBatches(draw_pairs(SETFIT_LABELS, rng, 3), 5, rng)  # 48 pairs: 9 batches of 5 and 3
    seen = []
    for _ in range(10):
        rows = next(stream)
        B = len(rows) // 2
        seen += list(zip(rows[:B], rows[B:]))
    assert sorted(seen) == sorted(stream.pairs), \
        "one pass of batches must hold every pair once, as (rows[k], rows[B + k])"
    state, rng_state = stream.state_dict(), stream.batches.rng.getstate()  # last.pt keeps both
    ahead = [next(stream) for _ in range(12)]   # on into the next pass, shuffled again
    rng = random.Random(0)
    again = PairBatches(draw_pairs(SETFIT_LABELS, rng, 3), 5, rng)  # a resumed run's: from the seed
    again.load_state_dict(state)
    rng.setstate(rng_state)
    assert again.pairs == stream.pairs, "a resumed run must draw the same pairs"
    assert [next(again) for _ in range(12)] == ahead, "a resumed stream must go on as it would have"


def test_setfit_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("setfit")


def test_setfit_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("setfit")
