"""Part knnbert of the assignment, minknn/losses/knnbert.py: KNN-BERT's supervised contrastive loss
over the labelled memory (Li et al. (KNN-BERT), eq. 3). Its command runs every check of the loss,
and no other:

    python -m pytest -q tests/losses/test_knnbert.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (knnbert_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, the sanity check against tests/fixtures/references/knnbert.pt, then the cases
worked by hand. A failure names the part.
"""
import math

import torch

from checks import (C, D, agrees, at_angle, check_degenerate_inputs_are_finite, check_every_input, check_gradcheck,
                    check_matches_its_oracle, check_normalises_what_its_formula_normalises,
                    check_runs_on_the_inputs_device, check_sanity_check,
                    check_stays_finite_on_large_inputs, e, make, memory, memory_of, near, ok,
                    queue_case, randn, run, value, worked)
from minknn.losses.knnbert import select_positives
from oracles import knnbert_oracle


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_knnbert_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("knnbert")


def test_knnbert_select_positives_by_rank():
    s = torch.tensor([[5.0, 4, 3, 2, 1, 9]])   # five positives, then a negative
    positive = torch.tensor([[True] * 5 + [False]])
    got = run("knnbert", select_positives, s, positive, 1, 2)
    picked = s[got].tolist()
    # each a selection the test worked out under that mistake: named only when it is the one
    named = {(5.0, 1.0): "; it is one least similar positive too few, rank > n_pos - M_l",
             (5.0, 4.0, 2.0, 1.0): "; it is one most similar positive too many, rank <= M_m",
             (5.0, 4.0, 3.0, 2.0, 1.0): "; it is every positive",
             (9.0, 5.0, 2.0, 1.0): "; it counts the negative (s = 9) among the positives"}
    ok("knnbert", picked == [5, 2, 1], f"select_positives with positives at s = 5, 4, 3, 2, 1 "
       f"and a negative at 9, M_m = 1, M_l = 2: S(q) is the positives of rank < M_m from the "
       f"top or rank >= n_pos - M_l, s = [5, 2, 1]; got s = {picked}"
       + named.get(tuple(sorted(picked, reverse=True)), ""))


def test_knnbert_select_positives_ranks_positives_with_a_negative_s():
    s = torch.tensor([[-1.0, -2, -3, -4, -5, -9]])   # five positives below 0, then a negative
    positive = torch.tensor([[True] * 5 + [False]])
    got = run("knnbert", select_positives, s, positive, 1, 2)
    picked = sorted(s[got].tolist(), reverse=True)
    # the selection worked out with the non-positives ranked as s = 0, above every positive here:
    # the positives take ranks 1 to 5, so rank < 1 picks none of them and rank >= 3 three
    ok("knnbert", picked == [-1, -4, -5], f"select_positives with positives at s = -1, -2, -3, "
       f"-4, -5 (all below 0) and a negative at -9, M_m = 1, M_l = 2: the negative ranks after "
       f"every positive, so S(q) is s = [-1, -4, -5]; got s = {picked}"
       + ("; it is the selection with the non-positives ranked as s = 0, above these positives "
          "(rank them after every positive: fill them with -inf)" if picked == [-3, -4, -5]
          else ""))


def knnbert_query(keys, tau=0.07):
    """The loss of one query, e_0 of class 0 and training row 0, over the memory `keys`."""
    vectors, labels, ids = memory_of(*keys)
    return value("knnbert", make("knnbert", temperature=tau), e(0)[None], torch.tensor([0]), None,
                 vectors, labels, torch.tensor([0]), ids)


def softplus(x):
    return math.log1p(math.exp(x))


def test_knnbert_the_querys_own_older_key_is_no_positive():
    v = knnbert_query([(e(0), 0, 0), (e(1), 1, 1)])   # its own older key, and a negative
    worked("knnbert", v, 0.0, "a memory holding the query's own older key (id = its row) and an "
           "orthogonal negative: the query has no positive, so it contributes nothing, a loss of 0",
           {"with the query's own older key a positive, softplus(-1 / tau) (leave it out of P(q): "
            "rows against key ids)": softplus(-1 / 0.07)}, atol=1e-12, rtol=1e-9)


def test_knnbert_the_querys_own_older_key_is_no_negative():
    keys = [(at_angle(0.5), 0, 1), (e(1), 1, 2)]   # a positive and a negative
    v, with_own = knnbert_query(keys), knnbert_query(keys + [(e(0), 0, 0)])
    t, c = 0.07, math.cos(0.5)
    case = ("a query with a positive at angle 0.5 and an orthogonal negative, tau 0.07, and its "
            "own older key (id = its row) added on the query: that key is neither a positive nor "
            "a negative (the negatives are the keys of another label), the loss softplus(-cos "
            "0.5 / tau)")
    if not near(v, with_own):  # named only when the loss equals that mistake's, recomputed
        worked("knnbert", with_own, softplus(-c / t), case, {
            "with the own key among the negatives": softplus(math.log1p(math.exp(1 / t)) - c / t),
            "with the own key among the positives": (softplus(-c / t) + softplus(-1 / t)) / 2},
            atol=1e-12, rtol=1e-9)
    ok("knnbert", near(v, with_own), f"{case}: adding the key moved the loss from {v:.6g} to "
       f"{with_own:.6g} (by "
       f"{abs(with_own - v):.3g})")


def test_knnbert_each_term_keeps_its_positive_in_the_denominator():
    v, tau = knnbert_query([(e(0), 0, 1), (-e(0), 1, 2)]), 0.07
    worked("knnbert", v, softplus(-2 / tau), "a positive on the query and a negative opposite: "
           "the loss -log(e^s_j / (e^s_j + e^s_n)) = softplus(-2 / tau)",
           {"without k_j in its own denominator, logsumexp_N(s) - s_j = -2 / tau (keep it: "
            "softplus(logsumexp_N(s) - s_j))": -2 / tau,
            "with q.k multiplied by tau, not divided, softplus(-2 tau)": softplus(-2 * tau)},
           atol=1e-9)


def test_knnbert_divides_by_the_temperature():
    keys, taus = [(e(0), 0, 1), (-e(0), 1, 2)], (1.0, 0.5, 0.07)
    values = [knnbert_query(keys, tau) for tau in taus]
    worked("knnbert", values, [softplus(-2 / t) for t in taus], "a positive on the query and a "
           "negative opposite at tau 1, 0.5, 0.07: the loss softplus(-2 / tau)",
           {"with q.k multiplied by tau, not divided, softplus(-2 tau)":
            [softplus(-2 * t) for t in taus]}, atol=1e-9)


def test_knnbert_averages_over_the_selected_positives():
    keys, tau = [(at_angle(0.3), 0, 1), (e(1), 1, 2)], 0.07
    v, twice = knnbert_query(keys), knnbert_query(keys + [(at_angle(0.3), 0, 3)])
    s_p, s_n = math.cos(0.3) / tau, 0.0
    worked("knnbert", twice, v, f"a second copy of the query's one positive: the loss must stay "
           f"at {v:.6g}, each term's denominator its own positive and the negatives, and L_sc(q) "
           f"the mean over S(q)", {
               "summed over S(q), not averaged (divide by |S(q)|)": 2 * v,
               "with every selected positive in each term's denominator, log(2 + e^(s_n - s_j)) "
               "(it holds k_j and the negatives only)": math.log(2 + math.exp(s_n - s_p))},
           atol=1e-9)


def test_knnbert_select_positives_counts_each_querys_positives():
    # row 0 as above (five positives at 5 to 1, a negative at 9); row 1 one positive, at 6
    s = torch.tensor([[5.0, 4, 3, 2, 1, 9], [0.0, 0, 0, 0, 0, 6]])
    positive = torch.tensor([[True] * 5 + [False], [False] * 5 + [True]])
    got = run("knnbert", select_positives, s, positive, 1, 2)
    picked = [s[i][got[i]].tolist() for i in range(2)]
    ok("knnbert", picked == [[5, 2, 1], [6]], f"select_positives on two queries, M_m = 1, "
       f"M_l = 2: row 0 with positives at s = 5, 4, 3, 2, 1 (and a negative at 9), row 1 with one "
       f"positive at 6; each row's n_pos is its own count of positives (5 and 1), so S(q) is "
       f"[5, 2, 1] and [6]; got {picked}")


def test_knnbert_queries_without_a_selected_key_are_left_out():
    # query 0 (e0, class 0) with a positive on it and a negative opposite costs softplus(-2 / tau);
    # query 1 (e1, class 2) has no key of its class: no term, and it is left out of the mean
    keys = [(e(0), 0, 5), (-e(0), 1, 6)]
    vectors, key_labels, ids = memory_of(*keys)
    tau = 1.0
    v = value("knnbert", make("knnbert", temperature=tau), torch.stack([e(0), e(1)]),
              torch.tensor([0, 2]), None, vectors, key_labels, torch.tensor([0, 1]), ids)
    worked("knnbert", v, softplus(-2 / tau), "two queries, tau 1: query 0 with a positive on it "
           "and a negative opposite costs softplus(-2 / tau); query 1 has no key of its class, so "
           "no selected key: the loss is the mean over the queries that have one, softplus(-2)", {
               "averaged over both queries, the one with no selected key included (softplus(-2) "
               "/ 2)": softplus(-2 / tau) / 2}, atol=1e-9)


def test_knnbert_averages_over_each_query_then_over_the_queries():
    # tau 1, every positive selected: query 0 (e0, class 0) has two positives on it and the
    # negatives e1 and e2, so each term costs softplus(log 2 - 1); query 1 (e1, class 1) one
    # positive on it and the negatives e0, e0 and e2: softplus(log 3 - 1)
    keys = [(e(0), 0, 5), (e(0), 0, 6), (e(1), 1, 7), (e(2), 2, 8)]
    vectors, key_labels, ids = memory_of(*keys)
    v = value("knnbert", make("knnbert", temperature=1.0), torch.stack([e(0), e(1)]),
              torch.tensor([0, 1]), None, vectors, key_labels, torch.tensor([0, 1]), ids)
    a, b = softplus(math.log(2) - 1), softplus(math.log(3) - 1)
    worked("knnbert", v, (a + b) / 2, "two queries, tau 1: query 0 with two positives on it "
           "(each term softplus(log 2 - 1)), query 1 with one (softplus(log 3 - 1)): L_sc(q) is "
           "the mean over each query's S(q), then the loss the mean over the queries", {
               "taken as one mean over all 3 selected (query, key) pairs, (2 softplus(log 2 - 1) + "
               "softplus(log 3 - 1)) / 3, not per query then over the queries": (2 * a + b) / 3},
           atol=1e-9)


def test_knnbert_selects_the_most_and_least_similar_positives_by_hand():
    # one query along e0; five positives at decreasing similarity, one negative
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    angles = torch.tensor([0.1, 0.5, 0.9, 1.3, 1.7, 2.5], dtype=torch.float64)
    keys = torch.stack([angles.cos(), angles.sin()], 1)
    key_labels, ids = torch.tensor([0, 0, 0, 0, 0, 1]), torch.arange(1, 7)
    loss = make("knnbert", m_most=1, m_least=2, temperature=1.0)
    s = keys @ q[0]
    # each selected positive j against the one negative, key 5
    term = [-(s[j] - torch.log(torch.exp(s[j]) + torch.exp(s[5]))) for j in range(5)]
    args = (q, torch.tensor([0]), None, keys, key_labels, torch.tensor([0]))
    got = run("knnbert", loss, *args, ids)
    want = (term[0] + term[3] + term[4]) / 3
    if near(got, (term[0] + term[1] + term[4]) / 3, atol=1e-12):
        ok("knnbert", False, f"one query, positives at angles 0.1 to 1.7, M_m = 1, M_l = 2 "
           f"(make(m_most=1, m_least=2)): the loss {got.item():.8g} is the mean over the TWO most "
           f"similar positives and the ONE least similar, as M_m = 2, M_l = 1 give: the loss's "
           f"m_most and m_least reach select_positives exchanged; expected {want.item():.8g}")
    ok("knnbert", near(got, want, atol=1e-12), f"one query, positives at angles 0.1 to 1.7, "
       f"M_m = 1, M_l = 2: the loss must average the terms of the most similar positive and the "
       f"two least similar ones, {want.item():.8g}; got {got.item():.8g}")
    # key 0 is now the query's own older key (id 0 = its row): it leaves the positives, so the
    # most similar positive is key 1 and the least similar stay 3, 4
    ids[0] = 0
    got = run("knnbert", loss, *args, ids)
    # with key 0 a negative too: the selected positives 1, 3, 4 against keys 5 and 0
    as_negative = [-(s[j] - torch.log(torch.exp(s[j]) + torch.exp(s[5]) + torch.exp(s[0])))
                   for j in range(5)]
    worked("knnbert", got, (term[1] + term[3] + term[4]) / 3, "the same query with key 0 "
           "(angle 0.1) its own older key (id 0 = its row): no positive, so S(q) is keys 1, 3 "
           "and 4", {"with its own older key kept among the positives (keys 0, 3, 4 selected)":
                     (term[0] + term[3] + term[4]) / 3,
                     "with its own older key counted as a negative":
                     (as_negative[1] + as_negative[3] + as_negative[4]) / 3},
           atol=1e-12, rtol=0)


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_knnbert_matches_its_oracle():
    check_matches_its_oracle("knnbert")


def test_knnbert_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("knnbert")


def test_knnbert_gradcheck():
    check_gradcheck("knnbert")


def test_knnbert_every_input():
    check_every_input("knnbert")


def test_knnbert_sanity_check():
    check_sanity_check("knnbert")


# ---- by hand: the cases that show one choice of its formula ----

def test_knnbert_matches_equation_3_for_each_selection():
    for m_most, m_least in [(2, 3), (1, 0), (0, 2), (50, 100)]:
        loss = make("knnbert", m_most=m_most, m_least=m_least, temperature=0.5)
        for seed in range(3):
            args = queue_case(seed)
            got, want = run("knnbert", loss, *args), knnbert_oracle(*args, loss)
            agrees("knnbert", near(got, want, atol=1e-9, rtol=0), f"the loss at M_m = "
                   f"{m_most}, M_l = {m_least} (seed {seed})", "eq. 3 (knnbert_oracle)",
                   f": got {got.item():.8g}, it gives {want.item():.8g}; S(q) is the M_m most "
                   f"similar and the M_l least similar positives, or all of them when there "
                   f"are at most M_m + M_l")


def test_knnbert_says_once_when_a_class_uses_every_positive(capsys):
    """A class with no more than M_m + M_l keys in memory has S(q) = P(q) (few-shot runs): one
    warning line on stderr on the first call, none after, none when every class is larger."""
    keys, _, ids = memory(12, C, 0)
    key_labels = torch.tensor([0] * 8 + [1] * 4)
    y, rows = torch.tensor([0, 1]), torch.tensor([0, 8])
    h = randn(2, D, seed=0)
    loss = make("knnbert", m_most=2, m_least=2)
    run("knnbert", loss, h, y, None, keys, key_labels, rows, ids)
    run("knnbert", loss, h, y, None, keys, key_labels, rows, ids)
    lines = capsys.readouterr().err.splitlines()
    ok("knnbert", len(lines) == 1 and "1 of 2 classes" in lines[0] and "fewest 4" in lines[0],
       f"the warning about classes using every positive, once: {lines}")
    run("knnbert", make("knnbert", m_most=2, m_least=1), h, y, None, keys, key_labels, rows, ids)
    ok("knnbert", capsys.readouterr().err == "", "a warning where no class is that small")


def test_knnbert_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("knnbert")


def test_knnbert_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("knnbert")
