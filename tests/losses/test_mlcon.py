"""Part mlcon of the assignment, minknn/losses/mlcon.py: the multi-label contrastive loss, each pair
weighted by the labels it shares (Su et al. 2022, eqs. 2 and 3). Its command runs every check of the
loss, and no other:

    python -m pytest -q tests/losses/test_mlcon.py

In this order (tests/losses/checks.py says why it matters): its normalisation, the properties that
tell its common mistakes apart, its oracle (mlcon_oracle, tests/losses/oracles.py), degenerate
inputs, gradcheck, the sanity check against tests/fixtures/references/mlcon.pt, the cases worked by
hand, then fp32 under autocast. A failure names the part.
"""
import math

import torch

from checks import (D, apart, check_degenerate_inputs_are_finite, check_every_input, check_gradcheck,
                    check_matches_its_oracle, check_normalises_what_its_formula_normalises,
                    check_runs_in_fp32_under_autocast, check_runs_on_the_inputs_device,
                    check_sanity_check, check_stays_finite_on_large_inputs, e, make, near, ok,
                    randn, run, worked)
from minknn.losses import task_loss
from minknn.losses.mlcon import mlcon
from minknn.tasks.registry import TASKS


# ---- what it normalises, then the properties that tell its mistakes apart ----

def test_mlcon_normalises_what_its_formula_normalises():
    check_normalises_what_its_formula_normalises("mlcon")


LINE = torch.tensor([[0.0], [2], [3]], dtype=torch.float64) * e(0)   # z = 0, 2 and 3 on a line


def test_mlcon_example_i_is_not_in_its_own_denominator():
    z, y = 5 * apart(2.0), torch.tensor([[1.0, 0, 0, 0]] * 2, dtype=torch.float64)  # 10 apart
    v = run("mlcon", mlcon, z, y).item()
    # with example i in its own denominator (d_ii = 0): p = e^-1 / (e^-1 + 1) for each of the two
    worked("mlcon", v, 0.0, "two examples sharing a label, 10 apart: each is the other's only "
           "candidate (k in g(i), k != i), p = 1, so the loss is 0", {
               "with example i in its own denominator (d_ii = 0, e^0 = 1 beside e^(-10/10)); "
               "k != i: the diagonal at -inf before the logsumexp": 2 * math.log1p(math.e)},
           atol=1e-6)


def test_mlcon_sums_over_the_batch():
    z, y = LINE, torch.tensor([[1.0, 0, 0, 0]] * 3, dtype=torch.float64)
    one = run("mlcon", mlcon, z, y).item()
    # a second copy 10^4 away, of other labels: it adds its own rows and nothing to the first's
    two = run("mlcon", mlcon, torch.cat([z, z + e(1, 1e4)]), torch.cat([y, y.roll(2, 1)])).item()
    ok("mlcon", near(two, 2 * one), f"a batch and a copy of it 10^4 away (sharing no label with "
       f"it) must cost twice the batch alone, {2 * one:.6g}; got {two:.6g}" + (
           ", the same as the batch alone, as a mean over the rows gives: L_con is the SUM of the "
           "rows over the batch" if near(two, one) else f" (off by {abs(two - 2 * one):.3g})"))


def test_mlcon_uses_the_unsquared_distance():
    """z = 0, 2 and 3 on a line; 0 and 1 share a label, 2 shares none (its row adds nothing)."""
    y = torch.tensor([[1.0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]], dtype=torch.float64)
    e = {d: math.exp(-d / 10) for d in (1, 2, 3)}  # tau' = 10, d the distance (not its square)
    expected = -math.log(e[2] / (e[2] + e[3])) - math.log(e[2] / (e[2] + e[1]))
    sq = {d: math.exp(-d * d / 10) for d in (1, 2, 3)}   # d squared
    squared = -math.log(sq[2] / (sq[2] + sq[3])) - math.log(sq[2] / (sq[2] + sq[1]))
    got = run("mlcon", mlcon, LINE, y).item()
    worked("mlcon", got, expected, "z = 0, 2, 3 on a line (0 and 1 share a label, 2 none), d the "
           "Euclidean distance", {"with d the squared distance; d is the distance itself":
                                  squared}, atol=1e-9, rtol=1e-6)


def test_mlcon_beta_is_a_distribution_over_the_sharers():
    one = torch.tensor([[1.0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]], dtype=torch.float64)
    two = torch.tensor([[1.0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.float64)
    a, b = (run("mlcon", mlcon, LINE, y).item() for y in (one, two))
    # with beta = C (not divided by its row's sum): rows 0 and 1 weigh their only sharer 2, not 1
    want = row([1, 0], [2, 3]) + row([1, 0], [2, 1])
    unnormalised = near(a, want) and near(b, 2 * want)
    ok("mlcon", near(a, b), f"z = 0, 2, 3 on a line, 0 and 1 each other's only label-sharer: "
       f"sharing two labels instead of one must change nothing, beta_01 = C_01 / C_01 = 1; the "
       f"loss went from {a:.6g} to {b:.6g}" + (
           f", {b / a:.3g} times, as beta = C (C_01 = 2, not divided by its row's sum) gives: "
           f"beta_ij = C_ij / sum_k C_ik" if unnormalised else
           f" (by {b - a:.3g}): beta_ij = C_ij / sum_k C_ik, a distribution over the sharers"))


def row(beta, d, tau=10.0):
    """One row of L_con: -sum_j beta_j log softmax_j(-d / tau), over the other examples."""
    lse = math.log(sum(math.exp(-x / tau) for x in d))
    return -sum(b * (-x / tau - lse) for b, x in zip(beta, d))


def test_mlcon_weighs_each_sharer_by_the_labels_it_shares():
    # z = 0, 1, 4 on a line (not 0, 2, 3: its rows 0 and 1 mirror each other, and any weights
    # summing to 1 give the same total); 0 and 1 share two labels, each shares one with 2
    z = torch.tensor([[0.0], [1], [4]], dtype=torch.float64) * e(0)
    y = torch.tensor([[1.0, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    want = row([2 / 3, 1 / 3], [1, 4]) + row([2 / 3, 1 / 3], [1, 3]) + row([1 / 2, 1 / 2], [4, 3])
    v = run("mlcon", mlcon, z, y).item()
    same = row([1 / 2, 1 / 2], [1, 4]) + row([1 / 2, 1 / 2], [1, 3]) + row([1 / 2, 1 / 2], [4, 3])
    worked("mlcon", v, want, "z = 0, 1, 4 on a line, 0 and 1 sharing two labels and each one "
           "with 2: the targets are beta_0 = beta_1 = (2/3, 1/3), beta_2 = (1/2, 1/2)", {
               "with every sharer weighted the same, beta_0 = beta_1 = (1/2, 1/2); each sharer j "
               "weighs C_ij, the labels it shares": same}, atol=1e-9)


# ---- the checks every loss goes through (tests/losses/checks.py) ----

def test_mlcon_matches_its_oracle():
    check_matches_its_oracle("mlcon")


def test_mlcon_degenerate_inputs_are_finite():
    check_degenerate_inputs_are_finite("mlcon")


def test_mlcon_gradcheck():
    check_gradcheck("mlcon")


def test_mlcon_every_input():
    check_every_input("mlcon")


def test_mlcon_sanity_check():
    check_sanity_check("mlcon")


# ---- by hand: the cases that show one choice of its formula ----

def test_mlcon_weighs_a_pair_by_its_shared_labels():
    """beta: i = 0 shares 2 labels with j = 1 and 1 with j = 2, so its target is (2/3, 1/3)."""
    y = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float64)
    h = torch.zeros(4, 2, dtype=torch.float64)  # all distances 0: uniform over the 3 others
    # rows 0, 1 and 2: -log(1/3) each, whatever their targets; row 3 shares nothing
    got = run("mlcon", mlcon, h, y)
    ok("mlcon", near(got, 3 * math.log(3), atol=1e-6), f"four examples at distance 0: got "
       f"{got.item():.6g}, expected 3 log 3 (three rows of -log(1/3) each, the fourth shares no "
       f"label and adds nothing)")
    ok("mlcon", run("mlcon", mlcon, h[:1], y[:1]).item() == 0, "one example has no pair: 0")


def test_mlcon_by_hand_sums_over_the_batch():
    """Three examples sharing one label, all at distance 0: each row is -log(1/2) (its two others
    equally likely); the batch's loss is their sum, 3 log 2, not their mean."""
    y = torch.tensor([[1.0, 0.0]] * 3, dtype=torch.float64)
    got = run("mlcon", mlcon, torch.zeros(3, 2, dtype=torch.float64), y)
    ok("mlcon", near(got, 3 * math.log(2), atol=1e-6), f"three examples at distance 0: got "
       f"{got.item():.6g}, expected 3 log 2: L_con sums the rows, it is not their mean")


def test_mlcon_mean_divides_the_sum_by_the_anchors_with_a_sharer():
    """--mlcon_reduction mean (mlcon.py's docstring): L_con / n, n the examples that share a label with another
    of the batch. Worked by hand on the batch above: rows 0, 1, 2 each -log(1/3), row 3 shares nothing, so
    sum 3 log 3 and mean log 3 (not / 4 examples, nor / 12 pairs)."""
    y = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float64)
    h = torch.zeros(4, 2, dtype=torch.float64)
    total, mean = (run("mlcon", make("mlcon", mlcon_reduction=r), h, y) for r in ("sum", "mean"))
    assert near(total, 3 * math.log(3), atol=1e-6) and near(mean, math.log(3), atol=1e-6), \
        f"mlcon.py MultiLabelContrastiveLoss: sum {total.item():.6g} (expected 3 log 3), mean {mean.item():.6g} " \
        f"(expected log 3: the sum over the 3 anchors with a sharer, divided by 3)"
    torch.manual_seed(0)  # spread-out z: mean = sum / 3 still, the sharers counted from the labels alone
    z = torch.randn(4, 2, dtype=torch.float64)
    torch.testing.assert_close(run("mlcon", make("mlcon", mlcon_reduction="mean"), z, y), mlcon(z, y) / 3,
                               msg="--mlcon_reduction mean on random z: mlcon()'s sum / 3 anchors with a sharer")
    alone = torch.eye(3, dtype=torch.float64)  # nobody shares a label: no anchor, 0 (not 0 / 0)
    got = run("mlcon", make("mlcon", mlcon_reduction="mean"), torch.randn(3, 2, dtype=torch.float64), alone)
    assert got.item() == 0, f"--mlcon_reduction mean with no label shared in the batch: got {got.item()}, not 0"
    assert make("mlcon").reduction == "sum", "mlcon's reduction defaults to the paper's sum"
    assert task_loss(TASKS["reuters"], D, {"loss": "mlcon", "mlcon_reduction": "mean"}).metric.reduction == "mean", \
        "--mlcon_reduction must reach the loss (MultiLabelContrastiveLoss.flags)"
    assert task_loss(TASKS["reuters"], D, {"loss": "mlcon"}).metric.reduction == "sum", \
        "a run or checkpoint from before --mlcon_reduction must build the sum it trained with"


def test_mlcon_falls_as_label_sharers_come_together():
    y = torch.tensor([[1, 0, 0, 0]] * 3 + [[0, 1, 0, 0]] * 3 + [[0, 0, 1, 1]] * 3,
                     dtype=torch.float64)
    centres = torch.eye(3, D, dtype=torch.float64) * 30
    noise = randn(9, D, seed=0)
    values = [run("mlcon", mlcon, centres.repeat_interleave(3, 0) + spread * noise, y).item()
              for spread in (30.0, 10.0, 3.0, 1.0)]
    ok("mlcon", values == sorted(values, reverse=True), f"the loss must fall as the examples "
       f"sharing labels gather (spread 30, 10, 3, 1); it went {values}")


def test_mlcon_runs_in_fp32_under_autocast():
    check_runs_in_fp32_under_autocast("mlcon")


def test_mlcon_stays_finite_on_large_inputs():
    check_stays_finite_on_large_inputs("mlcon")


def test_mlcon_runs_on_the_inputs_device():
    check_runs_on_the_inputs_device("mlcon")
