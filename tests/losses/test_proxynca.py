"""Part proxynca of the assignment, minknn/losses/proxynca.py: ProxyNCA: softmax over negative scaled
distances to the class proxies (Movshovitz-Attias et al. 2017, the proxy NCA loss). Its command runs
every check of the loss, and no other:

    python -m pytest -q tests/losses/test_proxynca.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (proxynca_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, batch order, separation, the sanity check against
tests/fixtures/references/proxynca.pt, the cases worked by hand, then fp32 under autocast. A failure
names the part.
"""
import math

import torch

from checks import (BATCHES, C, D, agrees, check_degenerate_inputs_are_finite,
                    check_falls_as_classes_separate, check_every_input, check_gradcheck,
                    check_invariant_to_batch_order, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_in_fp32_under_autocast,
                    check_runs_on_the_inputs_device, check_sanity_check,
                    check_stays_finite_on_large_inputs, e, make, near, ok, orthonormal_proxies,
                    randn, run, value, worked)
from minknn.losses import METRIC_LOSSES
from oracles import unit


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_proxynca_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("proxynca")


def named(logits, mistakes):
    """The first of `mistakes` ({what the student did: the logits it gives, recomputed}) that
    `logits` equal, as '; it is ...', else '': a cause named only where it is checked."""
    for mistake, wrong in mistakes.items():
        if logits.shape == wrong.shape and torch.allclose(logits, wrong, atol=1e-9):
            return f"; these are the logits {mistake}"
    return ""


def test_proxynca_the_nearest_proxy_scores_highest():
    logits = run("proxynca", orthonormal_proxies("proxynca").class_logits, e(0, 2.0)[None])
    logits = logits.detach()
    d = torch.tensor([[0.0, 2, 2, 2]], dtype=torch.float64)   # ||x - p_c||^2, x on proxy 0
    ok("proxynca", logits.argmax().item() == 0, f"h on proxy 0 (orthonormal proxies, s = 9) "
       f"must give proxy 0 the largest logit, -s d(x, p_c) = {(-9 * d)[0].tolist()}; got "
       f"{logits[0].tolist()}" + named(logits, {"+s d(x, p_c), the sign flipped": 9 * d}))


def test_proxynca_the_scale_multiplies_the_logits():
    loss, h = orthonormal_proxies("proxynca", scale=1.0), randn(3, D, seed=0)
    at_1 = run("proxynca", loss.class_logits, h).detach()
    loss.scale = 9.0
    at_9 = run("proxynca", loss.class_logits, h).detach()
    ok("proxynca", torch.allclose(at_9, 9 * at_1), f"the logits at s = 9 must be 9 times those "
       f"at s = 1, -s d(x, p_c); got {at_9[0].tolist()} and {at_1[0].tolist()} for example 0"
       + ("; they do not change with s" if torch.allclose(at_9, at_1) else ""))


def test_proxynca_d_is_the_squared_distance():
    h = torch.stack([e(0), -e(0)])   # on proxy 0, then opposite it; orthogonal to the others
    logits = run("proxynca", orthonormal_proxies("proxynca").class_logits, h).detach()
    cos = torch.tensor([[1.0, 0, 0, 0], [-1, 0, 0, 0]], dtype=torch.float64)
    want = -9 * (2 - 2 * cos)
    ok("proxynca", torch.allclose(logits, want), f"d(x, p) = ||x - p||^2 = 2 - 2 cos is 0 on the "
       f"proxy, 2 orthogonal to it and 4 opposite, so at s = 9 the logits are 0, -18 and -36; "
       f"got {logits.tolist()}, off by up to {(logits - want).abs().max().item():.3g}"
       + named(logits, {"of the distance not squared, -s ||x - p||":
                            -9 * (2 - 2 * cos).sqrt(),
                        "of -s (1 - cos), half the squared distance": -9 * (1 - cos),
                        "+s d(x, p_c), the sign flipped": -want,
                        "-d(x, p_c), s left out": want / 9}))


def test_proxynca_the_true_proxy_is_in_the_denominator():
    # one example on proxy 0 (of 4 orthonormal ones), class 0, s = 1: logits -s d = 0 for its
    # proxy, -2 for the 3 others; the softmax's cross-entropy log(1 + 3 e^-2)
    loss = orthonormal_proxies("proxynca", scale=1.0)
    v = value("proxynca", loss, e(0)[None], torch.tensor([0]))
    worked("proxynca", v, math.log1p(3 * math.exp(-2)), "one example on proxy 0 (4 orthonormal "
           "proxies), class 0, s = 1: the logits -s d(x, p_c) are 0 for its proxy and -2 for the "
           "others, the loss -log(e^0 / (e^0 + 3 e^-2)) = log(1 + 3 e^-2)", {
               "with the true proxy's term left out of the denominator, log(3 e^-2) - 0 "
               "(the sum over the negatives only)": math.log(3) - 2}, atol=1e-7)

# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_proxynca_matches_its_oracle():
    check_matches_its_oracle("proxynca")


def test_proxynca_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("proxynca")


def test_proxynca_gradcheck():
    check_gradcheck("proxynca")


def test_proxynca_every_input():
    check_every_input("proxynca")


def test_proxynca_invariant_to_batch_order():
    check_invariant_to_batch_order("proxynca")


def test_proxynca_falls_as_classes_separate():
    check_falls_as_classes_separate("proxynca")


def test_proxynca_sanity_check():
    check_sanity_check("proxynca")


# ---- by hand: the cases that show one choice of its formula ----

def test_proxynca_at_scale_1_has_a_floor():
    """d lies in [0, 4], so at s = 1 no embedding gets a term below log(1 + (C-1) e^-4): reached
    with h on its proxy and every other proxy opposite, and far above it with random proxies."""
    floor = math.log(1 + (C - 1) * math.exp(-4))
    loss = make("proxynca", scale=1.0)
    with torch.no_grad():
        loss.proxies[1:] = -loss.proxies[0]
    on_its_proxy = run("proxynca", loss, loss.proxies[:1].detach(), torch.tensor([0]))
    ok("proxynca", near(on_its_proxy, floor, atol=0, rtol=1e-9), f"at s = 1, h on its proxy "
       f"and the other proxies opposite: got {on_its_proxy.item():.8g}, expected "
       f"log(1 + 3 e^-4) = {floor:.8g}")
    for seed in range(5):
        torch.manual_seed(seed)
        loss = METRIC_LOSSES["proxynca"](C, 64, scale=1.0).double()
        perfect = run("proxynca", loss, loss.proxies.detach(), torch.arange(C)).item()
        anywhere = run("proxynca", loss, torch.randn(20, 64, dtype=torch.float64),
                       torch.randint(0, C, (20,))).item()
        ok("proxynca", floor < perfect and floor < anywhere and perfect > 0.2,
           f"seed {seed}, s = 1: each example on its own proxy costs {perfect:.4g}, random ones "
           f"{anywhere:.4g}; the floor is {floor:.4g}, and nearly orthogonal proxies give "
           f"log(1 + 3 e^-2) = 0.37 each")


def test_proxynca_default_is_proxynca_pp_temperature():
    """The default scale 9 is ProxyNCA++'s T = 1/9, the loss transcribed with T written out:
    L = -1/B sum_i log( exp(-d(x_i, p_y) / T) / sum_c exp(-d(x_i, p_c) / T) )."""
    T = 1 / 9
    loss = make("proxynca")
    h, y = randn(10, D, seed=0), torch.tensor(BATCHES["mixed"])
    terms = []
    for x, c in zip(h, y):
        d = [(unit(x) - unit(p)).pow(2).sum() for p in loss.proxies]
        terms.append(-torch.log(torch.exp(-d[c] / T) / sum(torch.exp(-dk / T) for dk in d)))
    got = run("proxynca", loss, h, y)
    agrees("proxynca", near(got, sum(terms) / len(terms), atol=1e-12, rtol=1e-12),
           "the loss at the default scale", "ProxyNCA++'s with T = 1/9, written out",
           f": got {got.item():.8g}, it gives {(sum(terms) / len(terms)).item():.8g}")
    for seed in range(5):  # each h on its own proxy, random proxies in 64 dimensions: ~3 e^-18
        torch.manual_seed(seed)
        loss = METRIC_LOSSES["proxynca"](C, 64).double()
        perfect = run("proxynca", loss, loss.proxies.detach(), torch.arange(C)).item()
        ok("proxynca", perfect < 1e-4, f"seed {seed}: at the default scale an example on its "
           f"own proxy still costs {perfect:.4g}")


def test_proxynca_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("proxynca")


def test_proxynca_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("proxynca")


def test_proxynca_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("proxynca")
