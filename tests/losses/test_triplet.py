"""Part triplet of the assignment, minknn/losses/triplet.py: the batch-all triplet loss on
L2-normalised vectors (Schroff et al. 2015 (FaceNet), the triplet loss). Its command runs every
check of the loss, and no other:

    python -m pytest -q tests/losses/test_triplet.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (triplet_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, batch order, separation, the sanity check against
tests/fixtures/references/triplet.pt, then fp32 under autocast. A failure names the part.
"""
import math

import torch

from checks import (check_degenerate_inputs_are_finite, check_falls_as_classes_separate,
                    check_every_input, check_gradcheck, check_invariant_to_batch_order,
                    check_matches_its_oracle, check_normalises_what_its_formula_normalises,
                    check_runs_in_fp32_under_autocast, check_runs_on_the_inputs_device,
                    check_sanity_check, check_stays_finite_on_large_inputs, e, make, ok, triangle,
                    value, worked)


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_triplet_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("triplet")


def test_triplet_an_anchor_is_not_its_own_positive():
    v = value("triplet", make("triplet"), triangle(), torch.tensor([0, 1, 2]))
    d = 3 * math.sin(0.1) ** 2   # each pair's squared distance
    ok("triplet", not math.isnan(v), "three examples of three classes: no valid triplet, so the "
       "loss is 0; got nan (the mean over no triplet is taken as 0)")
    worked("triplet", v, 0.0, "three examples of three classes, close together (squared "
           "distances 0.03 < m): no valid triplet (p != a, of a's class), so the loss is 0", {
               "with each anchor its own positive (p = a, d_ap = 0: 6 triplets costing m - 0.03); "
               "p != a, the positive mask's diagonal False": 0.2 - d}, atol=1e-9)


def test_triplet_the_margin_on_a_tie():
    v = value("triplet", make("triplet"), triangle(), torch.tensor([0, 0, 1]))
    worked("triplet", v, 0.2, "three examples at equal distances (labels 0, 0, 1): each of the 2 "
           "triplets costs max(0, d_ap - d_an + m) = m, so the loss is m = 0.2", {
               "without +m in the hinge (max(0, d_ap - d_an) and max(0, d_ap - d_an - m) both "
               "give 0 here); the margin is added to d_ap - d_an, inside the hinge": 0.0},
           atol=1e-9)


def test_triplet_the_mean_counts_the_satisfied_triplets():
    # the triangle (labels 0, 0, 1: 2 triplets at m) and two equal examples of class 2 on e_3,
    # 2 away from it: 12 valid triplets, the 10 new ones satisfied (terms 0)
    h = torch.cat([triangle(), torch.stack([e(3), e(3)])])
    v = value("triplet", make("triplet"), h, torch.tensor([0, 0, 1, 2, 2]))
    worked("triplet", v, 0.4 / 12, "12 valid triplets, 2 of them active at m = 0.2 and 10 "
           "satisfied: the loss 0.4 / 12", {"averaged over the active triplets only; the mean "
                                             "runs over every valid one, the satisfied included":
                                             0.4 / 2}, atol=1e-9)


def test_triplet_compares_squared_distances():
    # a = e0 and p = -e0 of class 0 (squared distance 4), n = e1 of class 1 (2 from each):
    # 2 triplets, (a, p, n) and (p, a, n), each max(0, 4 - 2 + m) = 2.2
    h = torch.stack([e(0), -e(0), e(1)])
    v = value("triplet", make("triplet"), h, torch.tensor([0, 0, 1]))
    worked("triplet", v, 2.2, "e0 and -e0 of class 0 and e1 of class 1, m = 0.2: the squared "
           "distances are d_ap = ||a - p||^2 = 4 and d_an = 2, so each of the 2 triplets costs "
           "max(0, 4 - 2 + 0.2) = 2.2", {
               "of the distances, not squared (2 - sqrt 2 + 0.2)":
                   2 - math.sqrt(2) + 0.2}, atol=1e-6)

# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_triplet_matches_its_oracle():
    check_matches_its_oracle("triplet")


def test_triplet_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("triplet")


def test_triplet_gradcheck():
    check_gradcheck("triplet")


def test_triplet_every_input():
    check_every_input("triplet")


def test_triplet_invariant_to_batch_order():
    check_invariant_to_batch_order("triplet")


def test_triplet_falls_as_classes_separate():
    check_falls_as_classes_separate("triplet")


def test_triplet_sanity_check():
    check_sanity_check("triplet")


def test_triplet_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("triplet")


def test_triplet_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("triplet")


def test_triplet_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("triplet")
