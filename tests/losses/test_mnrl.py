"""Part mnrl of the assignment, minknn/losses/mnrl.py: the multiple negatives ranking loss over
in-batch negatives (Henderson et al. 2017, the multiple negatives ranking loss). Its command runs
every check of the loss, and no other:

    python -m pytest -q tests/losses/test_mnrl.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (mnrl_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, batch order, separation, the sanity check against
tests/fixtures/references/mnrl.pt, the cases worked by hand, then fp32 under autocast (--pair_loss
mnrl too). A failure names the part.
"""
import math

import pytest
import torch

from elsewhere import check_on_second_device
from checks import (D, OPPOSITE, agrees, check_degenerate_inputs_are_finite,
                    check_falls_as_classes_separate, check_every_input, check_gradcheck,
                    check_invariant_to_batch_order, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_in_fp32_under_autocast,
                    check_runs_on_the_inputs_device, check_sanity_check,
                    check_stays_finite_on_large_inputs, e, make, near, ok, randn, run, value,
                    worked)
import formula
from grading import describe, simple_factor
from minknn.losses.mnrl import mnrl_pairs


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_mnrl_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("mnrl")


def test_mnrl_the_scale_multiplies_the_cosines():
    loss = make("mnrl")
    values = []
    for scale in (1.0, 20.0):
        loss.scale = scale
        values.append(value("mnrl", loss, *OPPOSITE))
    ok("mnrl", not near(*values), f"the loss is {values[0]:.6g} at scale 1 and at scale 20: S = "
       f"scale * cos, the logits of the softmax (two equal examples of a class and one opposite "
       f"give log(1 + e^(-2 scale)))")


def test_mnrl_candidates_are_the_positive_and_the_other_classes():
    # three equal examples of class 0 and one opposite: each (i, p) has p at cos 1 and the one
    # negative at cos -1 as candidates
    h, y = torch.stack([e(0)] * 3 + [-e(0)]), torch.tensor([0, 0, 0, 1])
    v, want = value("mnrl", make("mnrl"), h, y), math.log1p(math.exp(-40))
    worked("mnrl", v, want, "three equal examples of class 0 and one opposite, scale 20: the "
           "candidates of each (i, p) are p and the other classes' examples, not the anchor nor "
           "the rest of its class, so each chooses between p and the one negative, log(1 + "
           "e^(-2 * 20))", {
               "with 4 terms at cos 1 in each denominator, not p's one, log(4 + e^-40): every "
               "example among the negatives, the anchor, its class and p itself":
                   math.log(4 + math.exp(-40)),
               "with 3 terms at cos 1 in each denominator, not p's one, log(3 + e^-40): the "
               "anchor and the rest of its class among the candidates, or every example but the "
               "anchor among the negatives (p twice)": math.log(3 + math.exp(-40)),
               "with 2 terms at cos 1 in each denominator, not p's one, log(2 + e^-40): one more "
               "example of its class (or p again) among the candidates":
                   math.log(2 + math.exp(-40)),
               "without the scale, log(1 + e^-2)": math.log1p(math.exp(-2))},
           atol=1e-12, rtol=1e-9)


def mnrl_pairs_formula(a, p, scale=20.0, cosine=True, over="positives", reduction="mean",
                       target="diagonal"):
    """J for K pairs, written out: -1/K sum_i [S_ii - log sum_j exp S_ij], S_ij = scale cos(a_i,
    p_j); or another reading: raw inner products, the softmax over the anchors (column i), the
    sum over the pairs."""
    K = len(a)
    def unit(v, which):
        return v / v.norm() if cosine in (True, which) else v
    S = [[scale * (unit(ai, "anchors") @ unit(pj, "positives")) for pj in p] for ai in a]
    right = (lambda i: 0) if target == "first" else (lambda i: i)
    terms = [S[i][right(i)] - torch.log(sum(torch.exp(S[i][j] if over == "positives" else S[j][i])
                                            for j in range(K))) for i in range(K)]
    return -sum(terms) / (1 if reduction == "sum" else K)


MNRL_PAIRS_READINGS = {
    "S = cos, the scale left out": {"scale": 1.0},
    "raw inner products, not cosines": {"cosine": False},
    "the anchors normalised, the positives not": {"cosine": "anchors"},
    "the positives normalised, the anchors not": {"cosine": "positives"},
    "the softmax over the anchors for each positive (S transposed), not over the positives for "
    "each anchor": {"over": "anchors"},
    "the terms summed over the pairs, not averaged": {"reduction": "sum"},
    "column 0 the right answer of every row, not the diagonal (targets all 0)": {
        "target": "first"}}


def test_mnrl_pairs_is_cross_entropy_over_the_other_positives():
    pairs = [(randn(5, D, seed=s), randn(5, D, seed=s + 1)) for s in (0, 2, 4)]
    got = [run("mnrl", mnrl_pairs, a, p).item() for a, p in pairs]
    want = [mnrl_pairs_formula(a, p).item() for a, p in pairs]
    if not all(near(g, w, atol=1e-6) for g, w in zip(got, want)):
        fits = [what for what, kw in MNRL_PAIRS_READINGS.items()
                if all(near(g, mnrl_pairs_formula(a, p, **kw), atol=1e-6)
                       for g, (a, p) in zip(got, pairs))]
        ok("mnrl", not fits, f"mnrl_pairs on 3 sets of 5 (anchor, positive) pairs: got "
           f"{', '.join(f'{g:.6g}' for g in got)}; each is J with {' or with '.join(fits)}")
        a, p = pairs[0]  # where it is off: the gradient in each anchor and each positive
        cot = formula.fixed_cotangent()
        _, mine = formula.run(lambda a, p: run("mnrl", mnrl_pairs, a, p), {"a": a, "p": p}, {}, cot)
        _, want_grads = formula.run(mnrl_pairs_formula, {"a": a, "p": p}, {}, cot)
        offs = [describe(mine[k] if mine[k] is not None else torch.zeros_like(w), w,
                         f"its gradient in the {role}", ("pair", "feature"), atol=1e-7, rtol=1e-6)
                for (k, w), role in zip(want_grads.items(), ("anchors", "positives"))]
        offs = [o for o in offs if o]
        factor = simple_factor(got[0] / want[0])
        ok("mnrl", not offs or any(formula.VALUE_ONLY in o for o in offs), f"mnrl_pairs on 5 "
           f"(anchor, positive) pairs is {got[0]:.8g}, where J gives {want[0]:.8g}"
           f"{f' ({factor} it)' if factor else ''}; {'; '.join(offs)}")
        agrees("mnrl", False, "mnrl_pairs on 5 (anchor, positive) pairs",
               "J of Henderson et al. with S = 20 cos, written out",
               f": got {got[0]:.8g}, it gives {want[0]:.8g}; {'; '.join(offs)}")


def test_mnrl_pairs_normalises_anchors_and_positives():
    a, p = randn(5, D, seed=0), randn(5, D, seed=1)
    factors = torch.linspace(0.3, 3.0, 5, dtype=torch.float64)[:, None]
    v = run("mnrl", mnrl_pairs, a, p).item()
    for what, args in (("anchor", (a * factors, p)), ("positive", (a, p * factors))):
        moved = run("mnrl", mnrl_pairs, *args).item()
        ok("mnrl", near(v, moved), f"mnrl_pairs: scaling each {what} by its own factor (0.3 to "
           f"3) moved J from {v:.6g} to {moved:.6g} (by {abs(moved - v):.3g}); S is scale * cos, "
           f"which no such scaling moves")


def test_mnrl_pairs_multiplies_the_cosines_by_the_scale():
    # two pairs (e0, e0) and (e1, e1): S = scale * I, each row's cross-entropy log(1 + e^-scale)
    a = torch.stack([e(0), e(1)])
    got = [run("mnrl", mnrl_pairs, a, a.clone(), s).item() for s in (20.0, 5.0)]
    worked("mnrl", got, [math.log1p(math.exp(-20.0)), math.log1p(math.exp(-5.0))], "mnrl_pairs "
           "on pairs (e0, e0) and (e1, e1) at scale 20 and 5: S = scale cos is scale on the "
           "diagonal and 0 off it, so J = log(1 + e^-scale) at each", {
               "with S = cos, the scale not applied, log(1 + e^-1) at each":
                   [math.log1p(math.exp(-1.0))] * 2}, atol=1e-9)

# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_mnrl_matches_its_oracle():
    check_matches_its_oracle("mnrl")


def test_mnrl_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("mnrl")


def test_mnrl_gradcheck():
    check_gradcheck("mnrl")


def test_mnrl_every_input():
    check_every_input("mnrl")


def test_mnrl_invariant_to_batch_order():
    check_invariant_to_batch_order("mnrl")


def test_mnrl_falls_as_classes_separate():
    check_falls_as_classes_separate("mnrl")


def test_mnrl_sanity_check():
    check_sanity_check("mnrl")


# ---- by hand: the cases that show one choice of its formula ----

@pytest.mark.parametrize("name", ["mnrl", "pair_loss mnrl"])
def test_mnrl_runs_in_fp32_under_autocast(name):
    """As --loss mnrl, and as --pair_loss mnrl on a siamese pair task."""
    check_runs_in_fp32_under_autocast(name)


def test_mnrl_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("mnrl")


def test_mnrl_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("mnrl")


def test_mnrl_pairs_runs_on_the_inputs_device():
    """mnrl_pairs (a sentence-pair task's MNRL) with its pairs on a second device
    (tests/elsewhere.py): its targets made on the CPU fail here as on a GPU."""
    check_on_second_device("mnrl", "mnrl_pairs on 5 (anchor, positive) pairs",
                           lambda m, a, p: mnrl_pairs(a, p),
                           {"a": randn(5, D, seed=0), "p": randn(5, D, seed=1)})
