"""Part contrastive of the assignment, minknn/losses/contrastive.py: the pairwise contrastive loss with
a margin (Hadsell, Chopra and LeCun 2006, the contrastive loss). Its command runs every check of the
loss, and no other:

    python -m pytest -q tests/losses/test_contrastive.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (contrastive_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, batch order, separation, the sanity check against
tests/fixtures/references/contrastive.pt, the cases worked by hand, then fp32 under autocast
(--pair_loss contrastive too). A failure names the part.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from checks import (D, agrees, apart, check_degenerate_inputs_are_finite,
                    check_falls_as_classes_separate, check_every_input, check_gradcheck,
                    check_invariant_to_batch_order, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_in_fp32_under_autocast,
                    check_runs_on_the_inputs_device, check_sanity_check,
                    check_stays_finite_on_large_inputs, make, near, ok, run, value, worked)
from minknn.losses.contrastive import contrastive


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_contrastive_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("contrastive")


def test_contrastive_the_pair_formula_by_hand():
    """contrastive(d, y, m) itself, the per-pair loss a sentence-pair task calls directly: a
    similar pair (y = 0) at d = 0.3 costs 1/2 d^2 = 0.045, a dissimilar one (y = 1) 1/2 max(0, m -
    d)^2 = 0.02, and one beyond the margin (d = 1) 0."""
    d, y = (torch.tensor([0.3, 0.3, 1.0], dtype=torch.float64), torch.tensor([0, 1, 1]))
    got = run("contrastive", contrastive, d, y, 0.5).tolist()
    def pair(d, y, halves=(0.5, 0.5), hinge=True, squared_hinge=True, on_d2=False, swap=False):
        """The per-pair loss, or another reading of it (the mistakes named)."""
        y = 1 - y if swap else y
        gap = 0.5 - (d ** 2 if on_d2 else d)
        gap = gap.clamp(min=0) if hinge else gap
        pull, push = halves
        return (pull * (1 - y) * d ** 2 + push * y * gap ** (2 if squared_hinge else 1)).tolist()
    worked("contrastive", got, [0.045, 0.02, 0.0], "contrastive(d, y, m = 0.5) at (d, y) = (0.3, "
           "0), (0.3, 1), (1.0, 1)", {
               "with its two halves exchanged: y = 1 pulled in, 1/2 d^2, and y = 0 pushed to the "
               "margin (y = 1 marks a DISSIMILAR pair)": pair(d, y, swap=True),
               "without the hinge: 1/2 (m - d)^2 for a dissimilar pair beyond the margin too":
                   pair(d, y, hinge=False),
               "with the hinge on the squared distance, max(0, m - d^2)^2": pair(d, y, on_d2=True),
               "with the hinge not squared, max(0, m - d)": pair(d, y, squared_hinge=False),
               "with the hinge on the squared distance and not squared after, max(0, m - d^2)":
                   pair(d, y, on_d2=True, squared_hinge=False),
               "without the factors 1/2": pair(d, y, halves=(1.0, 1.0)),
               "without the 1/2 on the similar pairs' term": pair(d, y, halves=(1.0, 0.5)),
               "without the 1/2 on the dissimilar pairs' term": pair(d, y, halves=(0.5, 1.0))},
           atol=1e-9, readings=False)


def test_contrastive_a_pair_of_one_class_is_similar():
    v = value("contrastive", make("contrastive"), apart(0.0), torch.tensor([1, 1]))
    worked("contrastive", v, 0.0, "two equal vectors of the same class (a similar pair at "
           "distance 0) cost 0", {
               "of a dissimilar pair there, m^2 / 2 (y = 1 for labels that are equal); y_ij = 1 "
               "marks a DISSIMILAR pair, labels that differ": 0.5 * 0.5 ** 2}, atol=1e-6)


def test_contrastive_each_unordered_pair_once():
    # three unit vectors pairwise 1 apart (cosine 1/2), where d = d^2
    h = F.pad(torch.tensor([[1.0, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=torch.float64), (0, D - 3))
    h = h / math.sqrt(2)
    y = torch.tensor([0, 0, 1])
    want = run("contrastive", contrastive, torch.ones(3, dtype=torch.float64),
               torch.tensor([0, 1, 1]), 0.5).mean().item()
    v = value("contrastive", make("contrastive"), h, y)
    # each example with itself too: 3 more pairs, similar, at distance ~0 (cost ~0)
    worked("contrastive", v, want, "three examples pairwise 1 apart (labels 0, 0, 1): the mean "
           "over the 3 pairs i < j of your contrastive(d_ij, y_i != y_j, m)", {
               "over the 6 pairs i <= j, each example paired with itself too (at cost 0); the "
               "pairs are i < j, each unordered pair once": want * 3 / 6,
               "over the 9 ordered pairs (i, j), i = j included; the pairs are i < j, each "
               "unordered pair once": want * 6 / 9}, atol=1e-9)


def test_contrastive_d_is_the_distance():
    v = value("contrastive", make("contrastive"), apart(0.3), torch.tensor([1, 1]))
    worked("contrastive", v, 0.045, "a similar pair 0.3 apart costs 1/2 d^2", {
        "with d the squared distance; d is the distance ||z_i - z_j|| = sqrt(2 - 2 z_i.z_j)":
            0.5 * 0.09 ** 2}, atol=1e-9)


def test_contrastive_the_hinge_is_on_the_distance():
    loss = make("contrastive")
    v, far = (value("contrastive", loss, apart(d), torch.tensor([0, 1])) for d in (0.3, 1.0))
    worked("contrastive", [v, far], [0.02, 0.0], "a dissimilar pair 0.3 apart costs 1/2 "
           "max(0, m - d)^2 = 1/2 (0.5 - 0.3)^2 = 0.02, one 1.0 apart (beyond m) 0", {
               "with the hinge on the squared distance, 1/2 max(0, m - d^2), not squared after; "
               "the hinge max(0, m - d) is on the distance, then squared":
                   [0.5 * (0.5 - 0.09), 0.0]}, atol=1e-9)


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_contrastive_matches_its_oracle():
    check_matches_its_oracle("contrastive")


def test_contrastive_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("contrastive")


def test_contrastive_gradcheck():
    check_gradcheck("contrastive")


def test_contrastive_every_input():
    check_every_input("contrastive")


def test_contrastive_invariant_to_batch_order():
    check_invariant_to_batch_order("contrastive")


def test_contrastive_falls_as_classes_separate():
    check_falls_as_classes_separate("contrastive")


def test_contrastive_sanity_check():
    check_sanity_check("contrastive")


# ---- by hand: the cases that show one choice of its formula ----

def test_contrastive_by_hand():
    loss = make("contrastive", margin=0.5)
    # two orthogonal unit vectors are sqrt(2) apart; the third is 0.3 from the first
    angle = 2 * math.asin(0.15)
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0], [math.cos(angle), math.sin(angle)]],
                     dtype=torch.float64)
    # (0,1) similar: 1/2 * 2 = 1; (0,2) dissimilar at 0.3: 1/2 * 0.2^2 = 0.02; (1,2) far: 0
    value = run("contrastive", loss, h, torch.tensor([0, 0, 1]))
    agrees("contrastive", near(value, (1 + 0.02 + 0) / 3, atol=1e-9), "the loss on three "
           "vectors (labels 0, 0, 1)", "its value by hand", f": got {value.item():.6g}, expected "
           f"(1/2 * 2 + 1/2 * (0.5 - 0.3)^2 + 0) / 3 = 0.34 (d^2 for the similar pair, "
           f"max(0, m - d)^2 for a dissimilar one, d the distance, the mean over the 3 pairs)")


def test_contrastive_gradient_of_two_equal_vectors_is_finite():
    """Two equal rows (a sentence twice in a batch) are at distance 0, where the sqrt's gradient
    is infinite: d = sqrt(2 - 2 z_i.z_j) clamped away from 0 (1e-12), not at 0."""
    h = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
                     dtype=torch.float64, requires_grad=True)
    for labels in ([0, 0, 1], [0, 1, 1]):  # the equal pair similar, then dissimilar
        h.grad = None
        value = run("contrastive", make("contrastive"), h, torch.tensor(labels))
        value.backward()
        ok("contrastive", bool(torch.isfinite(value)) and bool(torch.isfinite(h.grad).all()),
           f"two equal vectors (labels {labels}): the loss {value.item():.6g} and the gradient "
           f"{h.grad.tolist()} must be finite: the sqrt's gradient at 0 is infinite, so 2 - 2 "
           f"z_i.z_j is clamped away from 0 (min=1e-12) before the sqrt")


@pytest.mark.parametrize("name", ["contrastive", "pair_loss contrastive"])
def test_contrastive_runs_in_fp32_under_autocast(name):
    """As --loss contrastive, and as --pair_loss contrastive on a siamese pair task."""
    check_runs_in_fp32_under_autocast(name)


def test_contrastive_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("contrastive")


def test_contrastive_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("contrastive")
