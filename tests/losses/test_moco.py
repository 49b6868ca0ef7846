"""Part moco-loss of the assignment, minknn/losses/moco.py: the MoCo contrastive loss: one positive key
against the memory's negatives (He et al. 2020, eq. 1). Its command runs every check of the loss,
and no other:

    python -m pytest -q tests/losses/test_moco.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (moco_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, the sanity check against tests/fixtures/references/moco-loss.pt, then the cases
worked by hand. A failure names the part.
"""
import math

import torch

from checks import (agrees, at_angle, bank_case, check_degenerate_inputs_are_finite,
                    check_every_input, check_gradcheck, check_matches_its_oracle,
                    check_normalises_what_its_formula_normalises, check_runs_on_the_inputs_device,
                    check_sanity_check, check_stays_finite_on_large_inputs, e, make, memory_of,
                    near, ok, run, value, worked)
from oracles import mean, unit


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_moco_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("moco")


def moco_query(keys, cos_positive=1.0, tau=0.07):
    """The MoCo loss of one query, e_0 of training row 0, over the memory `keys`."""
    positive = at_angle(math.acos(cos_positive))[None]
    vectors, labels, ids = memory_of(*keys)
    return value("moco", make("moco", temperature=tau), e(0)[None], torch.tensor([0]), positive,
                 vectors, labels, torch.tensor([0]), ids)


def lse(*xs):
    return math.log(sum(math.exp(x) for x in xs))


def test_moco_the_positive_stays_in_its_denominator():
    v, t = moco_query([(-e(0), 0, 1), (-e(0), 0, 2), (e(1), 0, 3)]), 0.07
    worked("moco", v, math.log1p(math.exp(lse(-1 / t, -1 / t, 0.0) - 1 / t)), "the query on its "
           "positive key, the negatives opposite, opposite and orthogonal, tau 0.07: the loss "
           "-log(e^pos / (e^pos + sum_N e^neg)) = softplus(logsumexp_N - pos)", {
               "without the positive in its denominator, logsumexp_N - pos (keep it: "
               "softplus(logsumexp_N - pos))": lse(-1 / t, -1 / t, 0.0) - 1 / t,
               "with q.k multiplied by tau, not divided":
                   math.log1p(math.exp(lse(-t, -t, 0.0) - t))}, atol=1e-9)


def test_moco_the_querys_own_keys_are_no_negatives():
    keys, t = [(-e(0), 0, 1), (e(1), 0, 2)], 0.07
    v, with_own = moco_query(keys), moco_query(keys + [(e(0), 0, 0)])
    case = (f"the query on its positive, the negatives opposite and orthogonal, tau 0.07, and an "
            f"older key of the query's own example (id 0 = its row) added on the query: the loss "
            f"must not move from {v:.6g}, the key is no negative")
    if not near(v, with_own):  # named only when the loss equals that mistake's, recomputed
        worked("moco", with_own, math.log1p(math.exp(lse(-1 / t, 0.0) - 1 / t)), case, {
            "with that key among the negatives": math.log1p(math.exp(lse(-1 / t, 0.0, 1 / t)
                                                                     - 1 / t))}, atol=1e-9)
    ok("moco", near(v, with_own), f"{case}: it moved to {with_own:.6g} (by "
       f"{abs(with_own - v):.3g}); a key whose id is the query's row is not a negative")


def test_moco_the_positive_shares_the_temperature():
    half, t = at_angle(math.acos(0.5)), 0.07
    v = moco_query([(half, 0, 1), (half, 1, 2), (half, 2, 3)], cos_positive=0.5)
    worked("moco", v, math.log(4), "the query at cosine 0.5 to its positive and to its 3 "
           "negatives: all 4 logits are equal, the loss log 4", {
               "with the positive's q.k+ not divided by tau (the negatives' are)":
                   math.log1p(math.exp(lse(0.5 / t, 0.5 / t, 0.5 / t) - 0.5)),
               "with q.k multiplied by tau, not divided": math.log(4)})


def test_moco_averages_over_the_batch():
    # two queries, each at cosine 0.5 to its positive and to the 3 keys: each costs log 4
    half = at_angle(math.acos(0.5))
    vectors, labels, ids = memory_of((half, 0, 2), (half, 1, 3), (half, 2, 4))
    v = value("moco", make("moco", temperature=0.07), torch.stack([e(0), e(0)]),
              torch.tensor([0, 1]), torch.stack([half, half]), vectors, labels,
              torch.tensor([0, 1]), ids)
    worked("moco", v, math.log(4), "two queries, each at cosine 0.5 to its positive and to the "
           "3 keys of the memory (no own key among them): each costs log 4, and the loss, the "
           "mean over the batch, is log 4", {
               "summed over the 2 queries, not averaged (2 log 4)": 2 * math.log(4)}, atol=1e-9)


def test_moco_each_query_has_its_own_positive():
    # q_0 = e_0 with its key e_0, q_1 = e_1 with its key e_1, one memory key e_2, tau 1:
    # each costs softplus(logsumexp(q.e_2) - q.k+) = softplus(0 - 1)
    vectors, labels, ids = memory_of((e(2), 0, 5))
    v = value("moco", make("moco", temperature=1.0), torch.stack([e(0), e(1)]),
              torch.tensor([0, 1]), torch.stack([e(0), e(1)]), vectors, labels,
              torch.tensor([0, 1]), ids)
    one = math.log1p(math.exp(-1.0))
    worked("moco", v, one, "two queries q_0 = e_0 and q_1 = e_1, each on its own key (batch_keys "
           "e_0 and e_1: q_i's positive is k_i, row i), one orthogonal key e_2 in the memory, "
           "tau 1: each costs softplus(0 - 1) = log(1 + e^-1), and so does their mean", {
               "with every key of the batch a positive of every query (q @ batch_keys.T, a "
               "(B, B) matrix, averaged over its B x B entries); q_i's positive is its own k_i "
               "alone, q_i . k_i": (2 * one + 2 * math.log(2)) / 4}, atol=1e-9)


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_moco_matches_its_oracle():
    check_matches_its_oracle("moco")


def test_moco_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("moco")


def test_moco_gradcheck():
    check_gradcheck("moco")


def test_moco_every_input():
    check_every_input("moco")


def test_moco_sanity_check():
    check_sanity_check("moco")


# ---- by hand: the cases that show one choice of its formula ----

def test_moco_leaves_the_querys_own_older_key_out_of_its_negatives():
    # the queue holds the whole training set: 4 examples, the query is example 2, its older key
    # (id 2) sits at cosine 0.995 to its fresh key
    q = fresh = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    angles = torch.tensor([2.0, 2.5, math.acos(0.995), 3.0], dtype=torch.float64)
    keys, ids = torch.stack([angles.cos(), angles.sin()], 1), torch.tensor([0, 1, 2, 3])
    loss = make("moco", temperature=0.07)
    value = run("moco", loss, q, torch.tensor([0]), fresh, keys, torch.zeros(4, dtype=torch.long),
                torch.tensor([2]), ids)
    s = keys[[0, 1, 3]] @ q[0] / 0.07
    # -log(e^{1/tau} / (e^{1/tau} + sum over ids 0, 1, 3))
    expected = torch.log1p(torch.exp(s - 1 / 0.07).sum())
    worked("moco", value, expected, "the query on its fresh key, its older key (id 2) at "
           "cosine 0.995 among 3 others, tau 0.07", {
               "with its own older key as a negative": torch.log1p(torch.exp(keys @ q[0] / 0.07
                                                                             - 1 / 0.07).sum())},
           atol=1e-9)


def test_moco_over_a_memory_bank_is_wu_et_al_softmax():
    """--memory bank: the positive is the example's own bank entry v_i; it appears once in the
    denominator, as in Wu et al.'s P(i | f_i) = exp(v_i.f / tau) / sum_j exp(v_j.f / tau)."""
    loss = make("moco", temperature=0.5)
    for seed in range(3):
        h, _, v_i, bank, _, rows, ids = args = bank_case(seed)
        want = mean([-torch.log(torch.exp(bank[row] @ unit(f) / loss.temperature)
                                / sum(torch.exp(v @ unit(f) / loss.temperature) for v in bank))
                     for f, row in zip(h, rows)])
        got = run("moco", loss, *args)
        agrees("moco", near(got, want, atol=1e-9), f"the loss over a memory bank (seed {seed})",
               "Wu et al.'s eq. 2, written out", f": got {got.item():.8g}, it gives "
               f"{want.item():.8g}")
    # the query on its own entry, the others far away: near 0; with the positive counted twice
    # it could never fall below log 2
    bank = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    rows = torch.tensor([0])
    value = run("moco", make("moco", temperature=0.07), bank[:1], None, bank[rows], bank, torch.zeros(4),
                rows, torch.arange(4))
    s = bank @ bank[0] / 0.07
    ok("moco", value.item() < 1e-5, f"the query on its own bank entry, the others opposite or "
       f"orthogonal, tau 0.07: got {value.item():.4g}, expected about 0 (below 1e-5)" + (
           "; it is the loss with its own entry also among the negatives (the positive counted "
           "twice)" if near(value, torch.logaddexp(s[0], s.logsumexp(0)) - s[0], atol=1e-9)
           else ""))


def test_moco_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("moco")


def test_moco_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("moco")
