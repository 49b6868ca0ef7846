"""Part softtriple of the assignment, minknn/losses/softtriple.py: SoftTriple: the relaxed class
similarity over K centres and its smoothed softmax loss (Qian et al. 2019, the SoftTriple loss and
its regulariser). Its command runs every check of the loss, and no other:

    python -m pytest -q tests/losses/test_softtriple.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (softtriple_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, batch order, separation, the sanity check against
tests/fixtures/references/softtriple.pt, the cases worked by hand, then fp32 under autocast. A
failure names the part.
"""
import math

import torch
import torch.nn.functional as F

from checks import (C, D, check_degenerate_inputs_are_finite, check_falls_as_classes_separate,
                    check_gradcheck, check_invariant_to_batch_order, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_in_fp32_under_autocast,
                    check_sanity_check, make, near, ok, randn, run, value)


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_softtriple_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("softtriple")


def test_softtriple_the_centres_weights_use_gamma():
    loss, h = make("softtriple"), randn(5, D, seed=0)
    S = []
    for gamma in (1e-3, 10.0):
        loss.gamma = gamma
        S.append(run("softtriple", loss.similarity, h))
    ok("softtriple", not torch.allclose(*S), "S_c(x) is the same at gamma = 0.001 and 10: each "
       "centre's weight is softmax_k(x.w_c^k / gamma), the temperature gamma inside the softmax "
       "(uniform weights, or a softmax without gamma, ignore it)")


def test_softtriple_weights_a_class_own_centres():
    loss, h = make("softtriple"), randn(5, D, seed=0)
    sim = torch.einsum("bd,ckd->bck", F.normalize(h, dim=-1), F.normalize(loss.centres, dim=-1))
    loss.gamma = 1e-4  # the softmax picks the largest
    S = run("softtriple", loss.similarity, h).detach()
    ok("softtriple", torch.allclose(S, sim.max(-1).values, atol=1e-9), f"as gamma falls to 0, "
       f"S_c(x) must become the largest x.w_c^k over class c's own K centres: the softmax runs "
       f"over a class's centres (the last dimension of the (B, C, K) similarities), not over the "
       f"classes; got {S[0].tolist()} for example 0, its best centre per class "
       f"{sim.max(-1).values[0].tolist()}")


def test_softtriple_the_margin_inside_the_scale():
    loss = make("softtriple", reg_weight=0.0)   # no regulariser
    loss.similarity = lambda h: torch.full((1, C), 0.5, dtype=torch.float64)  # S fixed: a tie
    v = value("softtriple", loss, randn(1, D, seed=0), torch.tensor([0]))
    want = math.log1p(3 * math.exp(20 * 0.01))
    # 1e-7: delta * F.one_hot(...) is float32
    ok("softtriple", near(v, want, atol=1e-7), f"S_c = 0.5 for all 4 classes: the margin lowers "
       f"the true class's logit by lambda delta = 20 * 0.01, so the loss is log(1 + 3 e^0.2) = "
       f"{want:.6g}; got {v:.6g}: the logits are lambda (S_c - delta [c = y]), the margin "
       f"inside the scale")


def test_softtriple_regulariser_by_hand():
    loss = make("softtriple")   # C = 4 classes of K = 3 centres, tau = 0.2
    with torch.no_grad():  # each class's centres orthonormal: every pair sqrt 2 apart
        loss.centres.copy_(torch.eye(3, D, dtype=torch.float64).expand(C, 3, D))
    v = run("softtriple", loss.regulariser).item()
    want = 0.2 * C * 3 * math.sqrt(2) / (C * 3 * 2)
    ok("softtriple", near(v, want), f"each class's 3 centres orthonormal (3 pairs sqrt 2 apart "
       f"per class): R = tau sum ||w^s - w^t|| / (C K (K - 1)) = 0.2 * 12 sqrt 2 / 24 = "
       f"{want:.6g}; got {v:.6g}: the distance (not squared) summed over the pairs s < t, "
       f"divided by C K (K - 1), twice the number of pairs")


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_softtriple_matches_its_oracle():
    check_matches_its_oracle("softtriple")


def test_softtriple_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("softtriple")


def test_softtriple_gradcheck():
    check_gradcheck("softtriple")


def test_softtriple_invariant_to_batch_order():
    check_invariant_to_batch_order("softtriple")


def test_softtriple_falls_as_classes_separate():
    check_falls_as_classes_separate("softtriple")


def test_softtriple_sanity_check():
    check_sanity_check("softtriple")


# ---- by hand: the cases that show one choice of its formula ----

def test_softtriple_gradient_with_two_coinciding_centres_is_finite():
    """Two centres of a class at the same point (as the regulariser pulls them) are at distance 0,
    where the sqrt's gradient is infinite: the gap clamped away from 0 (1e-12), not at 0."""
    loss = make("softtriple")  # 3 centres per class
    with torch.no_grad():
        loss.centres[0, 0] = loss.centres[0, 1] = torch.eye(D, dtype=torch.float64)[0]
    h = randn(6, D, seed=0).requires_grad_()
    value = run("softtriple", loss, h, torch.tensor([0, 1, 2, 3, 0, 1]))
    value.backward()
    grad = loss.centres.grad
    ok("softtriple", bool(torch.isfinite(value)) and bool(torch.isfinite(grad).all())
       and bool(torch.isfinite(h.grad).all()), f"with centres 0 and 1 of class 0 equal, the loss "
       f"{value.item():.6g} and its gradient (that of those centres: {grad[0, :2, 0].tolist()} "
       f"in dimension 0) must be finite: the sqrt's gradient at 0 is infinite, so the "
       f"regulariser's 2 - 2 w^s.w^t is clamped away from 0 (min=1e-12) before the sqrt")


def test_softtriple_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("softtriple")
