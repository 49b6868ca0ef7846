"""Part supcon of the assignment, minknn/losses/supcon.py: the supervised contrastive loss over the
batch (Khosla et al. 2020, eq. 2). Its command runs every check of the loss, and no other:

    python -m pytest -q tests/losses/test_supcon.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (supcon_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, batch order, separation, the sanity check against
tests/fixtures/references/supcon.pt, then fp32 under autocast. A failure names the part.
"""
import math

import torch

from checks import (OPPOSITE, check_degenerate_inputs_are_finite, check_falls_as_classes_separate,
                    check_every_input, check_gradcheck, check_invariant_to_batch_order,
                    check_matches_its_oracle, check_normalises_what_its_formula_normalises,
                    check_runs_in_fp32_under_autocast, check_runs_on_the_inputs_device,
                    check_sanity_check, check_stays_finite_on_large_inputs, e, falls_with_tau, make,
                    value, worked)


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_supcon_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("supcon")


def test_supcon_an_anchor_is_not_in_its_own_denominator():
    v, tau = value("supcon", make("supcon"), *OPPOSITE), 0.1
    worked("supcon", v, math.log1p(math.exp(-2 / tau)), "two equal examples of a class and one "
           "opposite, tau 0.1: the loss log(1 + e^(-2 / tau))", {
               "with each anchor's own e^(z_i.z_i / tau) in its denominator, log(2 + "
               "e^(-2 / tau)); A(i) is every OTHER example: mask the diagonal":
                   math.log(2 + math.exp(-2 / tau)),
               "with z_i.z_j multiplied by tau, not divided, log(1 + e^(-2 tau))":
                   math.log1p(math.exp(-2 * tau))})


def test_supcon_divides_by_the_temperature():
    taus = (1.0, 0.5, 0.1)
    values, _ = falls_with_tau("supcon", make("supcon"), "temperature", OPPOSITE, taus)
    worked("supcon", values, [math.log1p(math.exp(-2 / t)) for t in taus], "two equal examples "
           "of a class and one opposite at tau 1, 0.5, 0.1: the loss log(1 + e^(-2 / tau))", {
               "with z_i.z_j multiplied by tau, not divided, log(1 + e^(-2 tau))":
                   [math.log1p(math.exp(-2 * t)) for t in taus]})


def test_supcon_anchors_without_a_positive_are_left_out():
    # two equal examples of class 0 and an orthogonal one of class 1, which has no positive
    h, y = torch.stack([e(0), e(0), e(1)]), torch.tensor([0, 0, 1])
    v, want = value("supcon", make("supcon"), h, y), math.log1p(math.exp(-10))
    worked("supcon", v, want, "two equal examples of class 0 and one orthogonal of class 1: "
           "anchors 0 and 1 each cost log(1 + e^(-1 / tau)), anchor 2 has no positive and is left "
           "out", {"averaged over all 3 anchors, not over I+ (the anchors with a positive)":
                   2 * want / 3})


def test_supcon_averages_over_the_positives():
    # four equal examples of class 0, one opposite: each anchor's softmax gives 1/3 to each of
    # its 3 positives
    h, y = torch.stack([e(0)] * 4 + [-e(0)]), torch.tensor([0, 0, 0, 0, 1])
    v, want = value("supcon", make("supcon"), h, y), math.log(3 + math.exp(-20))
    worked("supcon", v, want, "four equal examples of class 0 and one opposite: each anchor puts "
           "1/3 on each of its 3 positives, the MEAN of -log p over P(i) is log 3",
           {"summed over P(i), not averaged (divide each anchor's sum by |P(i)|)": 3 * want})


def test_supcon_averages_each_anchors_positives_then_the_anchors():
    # e0 three times (class 0, 2 positives each) and e1 twice (class 1, 1 positive each), tau 0.1:
    # a class-0 anchor costs A = log(2 + 2 e^-10) (its 2 positives at cos 1, 2 others at cos 0,
    # each positive's -log(e^10 / (2 e^10 + 2))), a class-1 anchor B = log(1 + 3 e^-10)
    h, y = torch.stack([e(0), e(0), e(0), e(1), e(1)]), torch.tensor([0, 0, 0, 1, 1])
    v = value("supcon", make("supcon"), h, y)
    A, B = math.log(2 + 2 * math.exp(-10)), math.log1p(3 * math.exp(-10))
    worked("supcon", v, (3 * A + 2 * B) / 5, "e0 three times (class 0) and e1 twice (class 1), "
           "tau 0.1: each class-0 anchor's mean over its 2 positives is A = log(2 + 2 e^-10), "
           "each class-1 anchor's over its 1 positive B = log(1 + 3 e^-10); the loss, the mean "
           "over the 5 anchors, (3 A + 2 B) / 5", {
               "as one mean over all 8 (anchor, positive) pairs, (6 A + 2 B) / 8, not each "
               "anchor's mean over its positives, then the mean over the anchors":
                   (6 * A + 2 * B) / 8})

# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_supcon_matches_its_oracle():
    check_matches_its_oracle("supcon")


def test_supcon_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("supcon")


def test_supcon_gradcheck():
    check_gradcheck("supcon")


def test_supcon_every_input():
    check_every_input("supcon")


def test_supcon_invariant_to_batch_order():
    check_invariant_to_batch_order("supcon")


def test_supcon_falls_as_classes_separate():
    check_falls_as_classes_separate("supcon")


def test_supcon_sanity_check():
    check_sanity_check("supcon")


def test_supcon_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("supcon")


def test_supcon_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("supcon")


def test_supcon_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("supcon")
