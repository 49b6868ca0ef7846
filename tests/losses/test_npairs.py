"""Part npairs of the assignment, minknn/losses/npairs.py: the N-pairs loss with its L2 penalty (Sohn
2016, the multi-class N-pair loss). Its command runs every check of the loss, and no other:

    python -m pytest -q tests/losses/test_npairs.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (npairs_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, batch order, separation, the sanity check against
tests/fixtures/references/npairs.pt, then fp32 under autocast. A failure names the part.
"""
import math

import torch

from checks import (cases, check_degenerate_inputs_are_finite, check_falls_as_classes_separate,
                    check_every_input, check_gradcheck, check_invariant_to_batch_order, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_in_fp32_under_autocast,
                    check_runs_on_the_inputs_device, check_sanity_check,
                    check_stays_finite_on_large_inputs, e, make, near, ok, value, worked)


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_npairs_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("npairs")


def test_npairs_penalty_is_the_mean_squared_norm():
    h = torch.stack([e(0, 1.0), e(1, 2.0), e(2, 3.0)])   # ||f_i||^2 = 1, 4, 9
    v = value("npairs", make("npairs"), h, torch.tensor([2, 2, 2]))
    want = 0.002 * 14 / 3
    worked("npairs", v, want, "a batch of one class has no (anchor, positive, negative): the loss "
           "is the penalty alone, l2_reg * mean_i ||f_i||^2 = 0.002 * (1 + 4 + 9) / 3", {
               "with the penalty a mean over every coordinate, not of each ||f_i||^2 (a sum over "
               "the features)": want / h.shape[1],
               "with the penalty's sum over the batch, not its mean": 3 * want}, atol=1e-12)


def test_npairs_uses_raw_inner_products():
    loss, (h, y) = make("npairs", l2_reg=0.0), cases("npairs")[0][1]
    v, doubled = value("npairs", loss, h, y), value("npairs", loss, 2 * h, y)
    ok("npairs", not near(v, doubled), f"with l2_reg = 0, doubling every f_i left the loss at "
       f"{v:.6g}: N-pairs uses the raw inner products f_a.f_n, so their size counts")


def test_npairs_an_anchor_is_not_its_own_negative():
    # two equal examples of class 0, ||f||^2 = 9, and one of class 1 orthogonal to them
    h = torch.stack([e(0, 3.0), e(0, 3.0), e(1, 3.0)])
    v = value("npairs", make("npairs", l2_reg=0.0), h, torch.tensor([0, 0, 1]))
    want = math.log1p(math.exp(-9))
    # the anchor itself a negative too: anchors 0 and 1 cost log(1 + e^(9 - 9) + e^(0 - 9))
    itself = math.log1p(1 + math.exp(-9))
    worked("npairs", v, want, "two equal examples of class 0 (||f||^2 = 9) and one orthogonal of "
           "class 1, l2_reg = 0: each pair costs log(1 + e^(0 - 9))", {
               "with the anchor among its own negatives (f_a.f_a = 9 in its denominator); its "
               "negatives are the other classes' examples only": itself}, atol=1e-9)


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_npairs_matches_its_oracle():
    check_matches_its_oracle("npairs")


def test_npairs_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("npairs")


def test_npairs_gradcheck():
    check_gradcheck("npairs")


def test_npairs_every_input():
    check_every_input("npairs")


def test_npairs_invariant_to_batch_order():
    check_invariant_to_batch_order("npairs")


def test_npairs_falls_as_classes_separate():
    check_falls_as_classes_separate("npairs")


def test_npairs_sanity_check():
    check_sanity_check("npairs")


def test_npairs_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("npairs")


def test_npairs_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("npairs")


def test_npairs_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("npairs")
