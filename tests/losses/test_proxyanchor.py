"""Part proxyanchor of the assignment, minknn/losses/proxyanchor.py: Proxy Anchor: each proxy pulls its
class and pushes the rest, by log-sum-exp (Kim et al. 2020, the Proxy Anchor loss). Its command runs
every check of the loss, and no other:

    python -m pytest -q tests/losses/test_proxyanchor.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (proxyanchor_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, batch order, separation, the sanity check against
tests/fixtures/references/proxyanchor.pt, the cases worked by hand, then fp32 under autocast. A
failure names the part.
"""
import math

import torch

from checks import (BATCHES, C, D, agrees, check_degenerate_inputs_are_finite,
                    check_falls_as_classes_separate, check_every_input, check_gradcheck,
                    check_invariant_to_batch_order, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_in_fp32_under_autocast,
                    check_runs_on_the_inputs_device, check_sanity_check,
                    check_stays_finite_on_large_inputs, e, make, near, orthonormal_proxies, randn,
                    run, value, worked)
from oracles import proxyanchor_oracle


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_proxyanchor_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("proxyanchor")


def test_proxyanchor_the_margin_in_the_negative_term():
    loss, a, d = orthonormal_proxies("proxyanchor"), 32.0, 0.1
    v = value("proxyanchor", loss, torch.eye(C, D, dtype=torch.float64), torch.arange(C))
    pos = math.log1p(math.exp(-a * (1 - d)))
    worked("proxyanchor", v, pos + math.log1p(3 * math.exp(a * d)), "one example on each of the "
           "4 orthonormal proxies, alpha 32, delta 0.1: each proxy's positive term log(1 + "
           "e^(-alpha (1 - delta))), its 3 negatives at cos 0 still cost log(1 + 3 e^(alpha "
           "delta)), the negative term exp(alpha (cos + delta))", {
               "with the negative term's margin subtracted, exp(alpha (cos - delta))":
                   pos + math.log1p(3 * math.exp(-a * d)),
               "without the margin in the negative term": pos + math.log(4)})


def test_proxyanchor_each_proxy_sums_over_the_batch():
    loss, a, d = orthonormal_proxies("proxyanchor"), 32.0, 0.1
    v = value("proxyanchor", loss, e(0)[None], torch.tensor([0]))
    pos, neg = math.log1p(math.exp(-a * (1 - d))), math.log1p(math.exp(a * d))
    worked("proxyanchor", v, pos + 3 * neg / 4, "one example, of class 0, on proxy 0, alpha 32, "
           "delta 0.1: proxies 1 to 3 each have it as their one negative (cos 0), log(1 + "
           "e^(alpha delta)) each, proxy 0 none (log 1 = 0); the negative term the mean of these "
           "C = 4 per-proxy terms, each a log-sum-exp over the batch", {
               "with the negative term's log-sum-exp over the proxies (dim 1), not the batch":
                   pos + math.log1p(3 * math.exp(a * d)),
               "with the negative term averaged over the 3 proxies with a negative, not all C":
                   pos + neg,
               "with the positive term averaged over all C proxies, not P+": pos / 4 + 3 * neg / 4})


def test_proxyanchor_the_positive_term_over_the_proxies_in_the_batch():
    loss, a, d = orthonormal_proxies("proxyanchor"), 32.0, 0.1
    v = value("proxyanchor", loss, e(C)[None], torch.tensor([0]))   # orthogonal to every proxy
    term = math.log1p(math.exp(a * d))
    worked("proxyanchor", v, term + 3 * term / 4, "one example, of class 0, orthogonal to every "
           "proxy, alpha 32, delta 0.1: only proxy 0 is in P+, so the positive term, the mean "
           "over P+, is its log(1 + e^(alpha delta)) alone; the negative term 3/4 of that", {
               "with the positive term averaged over all C proxies, not P+": term / 4 + 3 * term / 4,
               "with the negative term's log-sum-exp over the proxies (dim 1), not the batch":
                   term + math.log1p(3 * math.exp(a * d))})


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_proxyanchor_matches_its_oracle():
    check_matches_its_oracle("proxyanchor")


def test_proxyanchor_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("proxyanchor")


def test_proxyanchor_gradcheck():
    check_gradcheck("proxyanchor")


def test_proxyanchor_every_input():
    check_every_input("proxyanchor")


def test_proxyanchor_invariant_to_batch_order():
    check_invariant_to_batch_order("proxyanchor")


def test_proxyanchor_falls_as_classes_separate():
    check_falls_as_classes_separate("proxyanchor")


def test_proxyanchor_sanity_check():
    check_sanity_check("proxyanchor")


# ---- by hand: the cases that show one choice of its formula ----

def test_proxyanchor_averages_the_positive_term_over_the_proxies_in_the_batch():
    """Class 3 is absent: its positive term is log(1 + 0) = 0 and must not count in the mean
    (1/|P+|), while its negative term counts (1/|P|)."""
    loss = make("proxyanchor")
    h, y = randn(6, D, seed=0), torch.tensor(BATCHES["class absent"])
    got, want = run("proxyanchor", loss, h, y), proxyanchor_oracle(h, y, loss)
    agrees("proxyanchor", near(got, want, atol=1e-9), "the loss with classes 2 and 3 absent "
           "from the batch", "proxyanchor_oracle's", f": got {got.item():.8g}, it gives "
           f"{want.item():.8g} (the positive term is averaged over P+, the proxies with an "
           f"example in the batch, the negative term over all C proxies)")


def test_proxyanchor_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("proxyanchor")


def test_proxyanchor_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("proxyanchor")


def test_proxyanchor_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("proxyanchor")
