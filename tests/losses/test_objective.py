"""The objective (minknn/losses/__init__.py): the loss registry, Objective (a metric loss mixed with
CE or BCE, run outside autocast, with the memory for a memory loss), task_loss (each task's loss as
train.py builds it, the pair losses of a siamese pair task included) and BCE.

The registry's promise: a loss added to METRIC_LOSSES is tested at once. It fails here until its
oracle is in tests/losses/oracles.py and its own test file, tests/losses/test_<loss>.py (its part's
command), runs the checks every loss goes through (tests/losses/checks.py).
"""
import os

import pytest
import torch
import torch.nn.functional as F

from checks import C, D, MULTI_HOT, checks_of, near, ok, part_of, source_file
from minknn.assignment.parts import BY_NAME
from minknn.losses import LOSSES, METRIC_LOSSES, Objective, task_loss
from minknn.losses.contrastive import contrastive
from minknn.losses.mlcon import mlcon
from minknn.losses.mnrl import mnrl_pairs
from minknn.memory import Queue
from minknn.model import Output
from minknn.tasks.registry import TASKS
from oracles import TABLES, knnbert_oracle, oracle_of, setfit_oracle, table_of

HERE = os.path.dirname(os.path.abspath(__file__))


def test_every_registered_loss_has_an_oracle():
    missing = [f"loss '{name}' ({source_file(name)}) has no oracle: add a literal transcription "
               f"of its formula to {table_of(name)} in tests/losses/oracles.py"
               for name in METRIC_LOSSES if not oracle_of(name)]
    assert not missing, "\n".join(missing)
    stale = [f"{table}['{name}']" for table, oracles in TABLES.items() for name in oracles
             if name not in METRIC_LOSSES or table_of(name) != table]
    assert not stale, (f"oracles of no registered loss, or in the wrong table: {', '.join(stale)} "
                       f"(METRIC_LOSSES in minknn/losses/__init__.py)")
    assert tuple(LOSSES) == ("ce", "bce", *METRIC_LOSSES)


def test_every_pair_loss_has_an_oracle():
    """Each --pair_loss (PAIR_LOSSES, minknn/losses/pairs.py) is held, value and gradient in both
    texts of each pair, to a literal transcription (checks.check_as_a_pair_loss): a new one fails
    here until it has one."""
    from minknn.losses.pairs import PAIR_LOSSES
    from oracles import PAIR_LOSS_ORACLES
    missing = sorted(set(PAIR_LOSSES) - set(PAIR_LOSS_ORACLES))
    assert not missing, (f"--pair_loss {', '.join(missing)} has no oracle: add a literal "
                         f"transcription to PAIR_LOSS_ORACLES in tests/losses/oracles.py")
    stale = sorted(set(PAIR_LOSS_ORACLES) - set(PAIR_LOSSES))
    assert not stale, f"PAIR_LOSS_ORACLES holds {', '.join(stale)}, which PAIR_LOSSES does not"
    assert all(name in METRIC_LOSSES for name in PAIR_LOSSES), \
        "a pair loss's checks run in its metric loss's test file (check_every_input)"


def test_every_registered_loss_has_its_test_file():
    """Each loss's checks run from its own file, tests/losses/test_<loss>.py, its part's command: a
    registered loss without one, or whose file leaves out a check every loss goes through, fails."""
    problems = []
    for name in METRIC_LOSSES:
        path, checks = os.path.join(HERE, f"test_{name}.py"), [c.__name__ for c in checks_of(name)]
        if not os.path.exists(path):
            problems.append(f"loss '{name}' ({source_file(name)}) has no test file: write "
                            f"tests/losses/test_{name}.py, running {', '.join(checks)} "
                            f"(tests/losses/checks.py) for it")
            continue
        text = open(path, encoding="utf-8").read()
        left_out = [c for c in checks if f"{c}(" not in text]
        if left_out:
            problems.append(f"tests/losses/test_{name}.py does not run {', '.join(left_out)} "
                            f"(tests/losses/checks.py) for loss '{name}'")
        part = part_of(name)
        if part and BY_NAME[part].test != f"python -m pytest -q tests/losses/test_{name}.py":
            problems.append(f"part {part}'s command is `{BY_NAME[part].test}`, not its loss's "
                            f"test file tests/losses/test_{name}.py (PARTS in minknn/assignment/parts.py)")
    assert not problems, "\n".join(problems)


# ---- the objective: each task's loss as train.py builds it ----

def test_objective_mixes_ce_and_metric():
    torch.manual_seed(0)
    logits, h, y = torch.randn(6, C), torch.randn(6, D), torch.tensor([0, 1, 0, 1, 2, 2])
    out = Output(logits=logits, z=h)
    ce = F.cross_entropy(logits, y)
    metric = Objective("supcon", C, D).metric(h, y)
    assert Objective("ce", C, D)(out, y)[0] == ce
    assert Objective("supcon", C, D, lam=0)(out, y)[0] == ce
    assert Objective("supcon", C, D, lam=1)(out, y)[0] == metric
    total, parts = Objective("supcon", C, D, lam=0.25)(out, y)
    assert total.item() == pytest.approx(0.75 * ce.item() + 0.25 * metric.item())
    assert parts == {"ce": ce, "metric": metric}
    assert Objective("supcon", C, D).lam == 0.1 and Objective("proxyanchor", C, D).lam == 0.5


def test_setfit_objective_is_the_pair_loss_alone():
    """No cross-entropy term: the head gets no gradient (train.py fits it after each epoch)."""
    torch.manual_seed(0)
    logits, h = torch.randn(6, C, requires_grad=True), torch.randn(6, D, requires_grad=True)
    y = torch.tensor([0, 1, 0, 0, 2, 1])
    objective = Objective("setfit", C, D)
    total, parts = objective(Output(logits=logits, z=h), y)
    torch.testing.assert_close(total, setfit_oracle(h.detach().double(), y, None).float(),
                               msg="--loss setfit: the objective is the pair loss alone, lam 1")
    assert set(parts) == {"metric"} and objective.lam == 1, parts
    total.backward()
    assert logits.grad is None and h.grad is not None, \
        "--loss setfit: the pair loss trains z; the head's cross-entropy must take no part"
    assert not objective.trains_head, "--loss setfit at lam 1 trains no head: train.py must fit it after each epoch"


def test_setfit_below_lam_1_adds_the_cross_entropy_of_every_text_of_the_pairs():
    """--loss setfit --lam 0.25 (the LP-FT start for SetFit's body): 0.75 CE over the batch's 2B texts, each with
    its own class, + 0.25 the pair loss; the head trains, so train.py must not refit it."""
    torch.manual_seed(0)
    logits, h = torch.randn(6, C, requires_grad=True), torch.randn(6, D)
    y = torch.tensor([0, 1, 0, 0, 2, 1])
    objective = Objective("setfit", C, D, lam=0.25)
    total, parts = objective(Output(logits=logits, z=h), y)
    ce = F.cross_entropy(logits.detach().double(), y)
    want = 0.75 * ce + 0.25 * setfit_oracle(h.double(), y, None)
    assert total.item() == pytest.approx(want.item()), \
        f"--loss setfit --lam 0.25: the objective is {total.item():.6f}, 0.75 CE + 0.25 pair loss is {want.item():.6f}"
    assert set(parts) == {"ce", "metric"}, parts
    total.backward()
    assert logits.grad is not None, "--loss setfit --lam 0.25: the cross-entropy must train the head"
    assert objective.trains_head, "--loss setfit --lam 0.25: the head trains, so train.py must not refit it"


def test_objective_passes_the_memory_and_runs_outside_autocast():
    torch.manual_seed(0)
    queue = Queue(12, D)
    queue.fill(torch.randn(12, D), torch.arange(12) % C, torch.arange(12))
    out = Output(logits=torch.randn(4, C), z=torch.randn(4, D))
    y = torch.tensor([0, 1, 2, 3])
    rows = torch.tensor([0, 5, 6, 11])  # each query's own older key is in the queue
    objective = Objective("knnbert", C, D, m_most=1, m_least=1)
    assert (objective.metric.m_most, objective.metric.m_least, objective.lam) == (1, 1, 0.1)
    total, parts = objective(out, y, None, queue, rows)
    expected = knnbert_oracle(out.z.double(), y, None, queue.keys.double(), queue.labels,
                              rows, queue.ids, objective.metric)
    assert parts["metric"].item() == pytest.approx(expected.item(), rel=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 autocast must not reach q.k / tau
        bf16 = objective(out, y, None, queue, rows)[1]["metric"]
        assert bf16.item() == pytest.approx(expected.item(), rel=1e-5)


def test_multilabel_objective_adds_gamma_mlcon_to_an_unweighted_bce():
    """Su et al.: L = BCE + gamma L_con (not (1 - gamma) BCE + gamma L_con)."""
    torch.manual_seed(0)
    logits, h = torch.randn(4, C), torch.randn(4, D)
    y = torch.tensor(MULTI_HOT["one shares no label"], dtype=torch.float)
    out = Output(logits=logits, z=h)
    bce = F.binary_cross_entropy_with_logits(logits, y)
    total, parts = Objective("mlcon", C, D)(out, y)
    ok("mlcon", near(total, bce + 0.1 * mlcon(h, y), rtol=1e-6), "the objective of --loss mlcon "
       "is BCE + 0.1 L_con")
    assert set(parts) == {"bce", "metric"} and Objective("mlcon", C, D).lam == 0.1
    torch.testing.assert_close(Objective("bce", C, D)(out, y)[0], bce, msg="--loss bce: BCE alone")


def test_task_losses_follow_their_formulas():
    torch.manual_seed(0)
    score, gold = torch.rand(6) * 5, torch.rand(6) * 5
    for sts_loss, reduce in (("mse", lambda d: d.pow(2).mean()), ("l1", lambda d: d.abs().mean())):
        loss = task_loss(TASKS["sts"], D, {"sts_loss": sts_loss})
        torch.testing.assert_close(loss(Output(logits=score, z=None), gold)[0],
                                   reduce(score - gold), msg=f"sts --sts_loss {sts_loss}")
    # a paraphrase task is 2-class classification: cross-entropy over two logits
    logits, labels = torch.randn(6, 2), torch.tensor([1, 0, 1, 1, 0, 1])
    u, v = torch.randn(6, D), torch.randn(6, D)
    # siamese: the 6 first texts, then the 6 second
    out = Output(logits=logits, z=torch.cat([u, v]))
    ce = F.cross_entropy(logits, labels)
    torch.testing.assert_close(task_loss(TASKS["mrpc"], D, {"loss": "supcon"}, siamese=True)(
        out, labels)[0], ce, msg="a siamese pair task gets CE: --loss needs one vector per example")
    d = (F.normalize(u, dim=-1) - F.normalize(v, dim=-1)).norm(dim=-1)
    # lam 0.1, margin 0.5
    with_contrastive = task_loss(TASKS["mrpc"], D, {"pair_loss": "contrastive"}, siamese=True)
    torch.testing.assert_close(with_contrastive(out, labels)[0],
                               0.9 * ce + 0.1 * contrastive(d, 1 - labels, 0.5).mean(),
                               msg="--pair_loss contrastive: non-paraphrases (label 0) are the "
                                   "dissimilar pairs")
    with_mnrl = task_loss(TASKS["mrpc"], D, {"pair_loss": "mnrl", "lam": 0.3}, siamese=True)
    positive = labels == 1
    torch.testing.assert_close(with_mnrl(out, labels)[0],
                               0.7 * ce + 0.3 * mnrl_pairs(u[positive], v[positive], 20.0),
                               msg="--pair_loss mnrl: over the paraphrase pairs")
    assert torch.isfinite(with_mnrl(out, torch.zeros_like(labels))[0])  # no paraphrase in the batch
    # a loss of another kind leaves a task its kind's base loss
    assert task_loss(TASKS["reuters"], D, {"loss": "supcon"}).metric is None
    assert task_loss(TASKS["sst"], D, {"loss": "mlcon"}).metric is None
    flags = {"loss": "knnbert", "m_most": 3, "m_least": 2}
    assert task_loss(TASKS["rte"], D, flags).metric.m_most == 3


def test_a_multilabel_task_under_another_kinds_loss_keeps_bce():
    """In a run mixing kinds, --loss supcon reaches the classification tasks; a multi-label task
    keeps BCE (cross-entropy would silently read its multi-hot rows as soft labels)."""
    torch.manual_seed(0)
    logits, h = torch.randn(4, 90), torch.randn(4, 8)
    y = torch.zeros(4, 90)
    y[[0, 1, 2, 3], [0, 5, 5, 7]] = 1
    objective = task_loss(TASKS["reuters"], 8, {"loss": "supcon"})
    total, _ = objective(Output(logits=logits, z=h), y)
    torch.testing.assert_close(total, F.binary_cross_entropy_with_logits(logits, y),
                               msg="reuters under --loss supcon (a multitask run): BCE alone")


def test_bce_is_the_mean_over_every_cell():
    logits = torch.tensor([[2.0, -1.0, 0.0], [0.5, 0.5, -3.0]])
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    p = torch.sigmoid(logits)
    # over the 2 x 3 (example, class) cells
    expected = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    got = Objective("bce", 3, D)(Output(logits=logits, z=None), y)[0]
    torch.testing.assert_close(got, expected,
                               msg="--loss bce: the mean over every (example, class) cell")
    assert METRIC_LOSSES["mlcon"]().temperature == 10.0 and METRIC_LOSSES["mlcon"].lam == 0.1, \
        "Su et al.: tau' 10, gamma 0.1"


def test_every_reading_of_a_formula_is_another_function():
    """READINGS (tests/losses/oracles.py), the other ways each formula's steps can be read, which
    a failure names when a loss computes one of them: each runs, and moves the oracle's value on
    at least one comparison batch (or, a term detached, its gradient); one that did not would be
    named for a loss that is right."""
    from checks import cases, degenerate_cases, make
    from oracles import READINGS
    same = []
    for name, readings in READINGS.items():
        loss, oracle = make(name), oracle_of(name)
        values = [(oracle(*args, loss), args) for _, args in cases(name) + degenerate_cases(name)]
        for reading, settings in readings.items():
            if all(near(oracle(*args, loss, **settings), v, atol=1e-9) for v, args in values):
                h = values[0][1][0].clone().requires_grad_()  # the same value: the gradient?
                g = [torch.autograd.grad(oracle(h, *values[0][1][1:], loss, **kw), h)[0]
                     for kw in (settings, {})]
                if torch.allclose(*g, atol=1e-9):
                    same.append(f"{name}: {reading}")
    assert not same, f"readings equal to their formula on every comparison batch: {same}"
