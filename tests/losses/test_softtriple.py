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
                    check_every_input, check_gradcheck, check_invariant_to_batch_order, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_in_fp32_under_autocast,
                    check_runs_on_the_inputs_device, check_sanity_check,
                    check_stays_finite_on_large_inputs, make, ok, randn, run, value, worked)


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_softtriple_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("softtriple")


def similarities(loss, h):
    """x.w_c^k of the normalised vectors, (B, C, K): the oracle's and the mistakes' input."""
    return torch.einsum("bd,ckd->bck", F.normalize(h, dim=-1), F.normalize(loss.centres, dim=-1))


def test_softtriple_the_centres_weights_use_gamma():
    loss, h = make("softtriple"), randn(5, D, seed=0)
    sim, S = similarities(loss, h), []
    for gamma in (1e-3, 10.0):
        loss.gamma = gamma
        S.append(run("softtriple", loss.similarity, h).detach())
    if torch.allclose(*S):
        # each a value the test recomputes: named only when S equals it
        for mistake, wrong in {
                "each class's centres weighted uniformly, the mean over k": sim.mean(-1),
                "each centre weighted by softmax_k(x.w_c^k), without gamma":
                    (F.softmax(sim, dim=-1) * sim).sum(-1)}.items():
            ok("softtriple", not torch.allclose(S[1], wrong, atol=1e-9), f"S_c(x) is the same "
               f"at gamma = 0.001 and 10, and it is the S_c(x) of {mistake}")
    gap = (S[0] - S[1]).abs().max().item()
    ok("softtriple", not torch.allclose(*S), f"S_c(x) at gamma = 0.001 and at 10 differ by at "
       f"most {gap:.3g} (5 random examples): each centre's weight is softmax_k(x.w_c^k / gamma), "
       f"so S_c(x) must move with gamma (the largest x.w_c^k at 0.001, nearly the mean at 10)")


def test_softtriple_weights_a_class_own_centres():
    loss, h = make("softtriple"), randn(5, D, seed=0)
    sim = similarities(loss, h)
    loss.gamma = 1e-4  # the softmax picks the largest
    S = run("softtriple", loss.similarity, h).detach()
    best = sim.max(-1).values
    if not torch.allclose(S, best, atol=1e-9):
        over_classes = (F.softmax(sim / loss.gamma, dim=1) * sim).sum(-1)
        ok("softtriple", not torch.allclose(S, over_classes, atol=1e-9), f"at gamma = 1e-4, "
           f"S_c(x) is {S[0].tolist()} for example 0, the S_c(x) of a softmax over the classes "
           f"(dim 1 of the (B, C, K) similarities), not over class c's K centres (the last "
           f"dimension)")
    i = (S - best).abs().amax(1).argmax().item()
    ok("softtriple", torch.allclose(S, best, atol=1e-9), f"as gamma falls to 0 (1e-4), S_c(x) "
       f"must become the largest x.w_c^k over class c's own K centres; example {i}: got "
       f"{S[i].tolist()}, its best centre per class {best[i].tolist()} (off by up to "
       f"{(S - best).abs().max().item():.3g})")


def test_softtriple_the_margin_inside_the_scale():
    loss = make("softtriple", reg_weight=0.0)   # no regulariser
    loss.similarity = lambda h: torch.full((1, C), 0.5, dtype=torch.float64)  # S fixed: a tie
    v = value("softtriple", loss, randn(1, D, seed=0), torch.tensor([0]))
    # 1e-7: delta * F.one_hot(...) is float32
    worked("softtriple", v, math.log1p(3 * math.exp(20 * 0.01)), "S_c = 0.5 for all 4 classes, "
           "lambda 20, delta 0.01, no regulariser: the logits lambda (S_c - delta [c = y]) lower "
           "the true class's by lambda delta = 0.2, the loss log(1 + 3 e^0.2)", {
               "with the margin outside the scale, lambda S_c - delta [c = y]":
                   math.log1p(3 * math.exp(0.01)),
               "without the margin": math.log(4)}, atol=1e-7, rtol=0)


def test_softtriple_regulariser_by_hand():
    loss = make("softtriple")   # C = 4 classes of K = 3 centres, tau = 0.2
    with torch.no_grad():  # each class's centres orthonormal: every pair sqrt 2 apart
        loss.centres.copy_(torch.eye(3, D, dtype=torch.float64).expand(C, 3, D))
    v = run("softtriple", loss.regulariser).item()
    want = 0.2 * C * 3 * math.sqrt(2) / (C * 3 * 2)
    worked("softtriple", v, want, "each class's 3 centres orthonormal (3 pairs s < t, sqrt 2 "
           "apart, per class), tau 0.2: R = tau sum_{s<t} ||w^s - w^t|| / (C K (K - 1)) = "
           "0.2 * 12 sqrt 2 / 24", {
               "with the sum over s < t divided by 12, C K (K - 1) / 2 the number of pairs "
               "(or C K, the same at K = 3), or the sum over ordered pairs s != t by C K "
               "(K - 1): twice R": 2 * want,
               "of the squared distance, 2 - 2 w^s.w^t": 0.2 * C * 3 * 2 / (C * 3 * 2)})


def test_softtriple_the_loss_adds_the_regulariser():
    # the same batch and centres (each class's 3 centres orthonormal, R = 0.141421 at tau 0.2)
    # at tau 0.2 and at tau 0: the loss's difference is R
    h, y = randn(4, D, seed=1), torch.tensor([0, 1, 2, 3])
    values = []
    for tau in (0.2, 0.0):
        loss = make("softtriple", reg_weight=tau)
        with torch.no_grad():
            loss.centres.copy_(torch.eye(3, D, dtype=torch.float64).expand(C, 3, D))
        values.append(value("softtriple", loss, h, y))
    want = 0.2 * C * 3 * math.sqrt(2) / (C * 3 * 2)
    worked("softtriple", values[0] - values[1], want, "the loss at tau 0.2 minus the loss at tau 0 "
           "(the same batch; each class's 3 centres orthonormal): the loss is the cross-entropy "
           "plus R, and R = 0.2 * 12 sqrt 2 / 24 here, so the difference is R", {
               "with no regulariser added (the difference 0)": 0.0}, atol=1e-7)

# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_softtriple_matches_its_oracle():
    check_matches_its_oracle("softtriple")


def test_softtriple_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("softtriple")


def test_softtriple_gradcheck():
    check_gradcheck("softtriple")


def test_softtriple_every_input():
    check_every_input("softtriple")


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


def test_softtriple_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("softtriple")


def test_softtriple_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("softtriple")
