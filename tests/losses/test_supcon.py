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
                    check_gradcheck, check_invariant_to_batch_order, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_in_fp32_under_autocast,
                    check_sanity_check, e, falls_with_tau, make, near, ok, value)


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_supcon_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("supcon")


def test_supcon_an_anchor_is_not_in_its_own_denominator():
    v = value("supcon", make("supcon"), *OPPOSITE)
    ok("supcon", v < math.log(2), f"two equal examples of a class and one opposite: the loss is "
       f"log(1 + e^(-2 / tau)), about 0; got {v:.6g}, not below log 2: with the anchor's own "
       f"e^(z_i.z_i / tau) in its denominator it cannot fall below log 2. A(i) is every OTHER "
       f"example: mask the diagonal before the logsumexp")


def test_supcon_divides_by_the_temperature():
    values, falls = falls_with_tau("supcon", make("supcon"), "temperature", OPPOSITE)
    ok("supcon", falls, f"two equal examples of a class and one opposite: the loss "
       f"log(1 + e^(-2 / tau)) must fall as tau falls (1, 0.5, 0.1); it went "
       f"{', '.join(f'{v:.4g}' for v in values)}: divide z_i.z_j by tau, do not multiply")


def test_supcon_anchors_without_a_positive_are_left_out():
    # two equal examples of class 0 and an orthogonal one of class 1, which has no positive
    h, y = torch.stack([e(0), e(0), e(1)]), torch.tensor([0, 0, 1])
    v, want = value("supcon", make("supcon"), h, y), math.log1p(math.exp(-10))
    ok("supcon", near(v, want), f"two equal examples of class 0 and one orthogonal of class 1: "
       f"anchors 0 and 1 each cost log(1 + e^(-1 / tau)) = {want:.6g}, anchor 2 has no positive "
       f"and is left out; got {v:.6g} ({2 * want / 3:.6g} is the mean over all 3 anchors): "
       f"average over I+, the anchors with at least one positive")


def test_supcon_averages_over_the_positives():
    # four equal examples of class 0, one opposite: each anchor's softmax gives 1/3 to each of
    # its 3 positives
    h, y = torch.stack([e(0)] * 4 + [-e(0)]), torch.tensor([0, 0, 0, 0, 1])
    v, want = value("supcon", make("supcon"), h, y), math.log(3 + math.exp(-20))
    ok("supcon", near(v, want), f"four equal examples of class 0 and one opposite: each anchor "
       f"puts 1/3 on each of its 3 positives, so the MEAN of -log p over P(i) is log 3 = "
       f"{want:.6g}; got {v:.6g}: divide each anchor's sum over P(i) by |P(i)|")


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_supcon_matches_its_oracle():
    check_matches_its_oracle("supcon")


def test_supcon_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("supcon")


def test_supcon_gradcheck():
    check_gradcheck("supcon")


def test_supcon_invariant_to_batch_order():
    check_invariant_to_batch_order("supcon")


def test_supcon_falls_as_classes_separate():
    check_falls_as_classes_separate("supcon")


def test_supcon_sanity_check():
    check_sanity_check("supcon")


def test_supcon_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("supcon")
