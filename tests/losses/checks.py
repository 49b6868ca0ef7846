"""The checks every metric-learning loss goes through, and what the losses' tests are built of.

Each loss's own file, tests/losses/test_<loss>.py (its part's command, minknn/assignment/parts.py), runs them
for its loss, in this order: check_normalises_what_its_formula_normalises, its property tests,
check_matches_its_oracle (tests/losses/oracles.py), check_degenerate_inputs_are_finite,
check_gradcheck, check_invariant_to_batch_order and check_falls_as_classes_separate (the losses
called as loss(h, labels)), check_sanity_check (the stored reference outputs,
tests/fixtures/references/<part>.pt), its by-hand tests, then check_runs_in_fp32_under_autocast.
checks_of(name) lists the ones that apply to a loss; tests/losses/test_objective.py holds every
registered loss to them.

The order matters. A property test builds a batch on which one choice of the formula shows, and
says which choice fails and how to fix it; the oracle only says that a value differs. pytest -x
stops at the first failure, so the property tests run before the oracle: each one's batch leaves
the choices checked after it out of play (the values they would change do not occur on it), so a
failure names the mistake made, not one checked later.

Also here: how a failure names the loss's part ("part 8 supcon: ...", through tests/grading.py:
ok, agrees, run), the losses built in float64 (make), the batches they are compared with their
oracles on (cases, degenerate_cases, fixed_inputs), and the vectors the property tests are built
of (e, at_angle, apart, triangle).
"""
import copy
import inspect
import math
import os

import torch
import torch.nn.functional as F

import formula
from elsewhere import DeviceSlip, check_on_second_device
from grading import (FLOAT64, GENERIC, InPlace, argument_names, check, describe, differs, kept,
                     fail_if_changed, matches_reference, simple_factor)
from minknn.assignment.parts import BY_NAME, PARTS, label
from minknn.losses import METRIC_LOSSES, Objective, loss_kind, task_loss
from minknn.losses.pairs import PAIR_LOSSES, PairLoss
from minknn.model import Output
from minknn.tasks.registry import TASKS
from oracles import IN_BATCH, PAIR_LOSS_ORACLES, READINGS, WITH_ORACLE, oracle_of, table_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
C, D = 4, 8
# settings other than the defaults, to keep a test small or exercise a choice (absent: defaults)
SETTINGS = {"knnbert": {"m_most": 2, "m_least": 3}, "softtriple": {"centres": 3}}


# ---- naming a failure: the part that writes the loss, or the loss's file ----

def source_file(name):
    return os.path.relpath(inspect.getsourcefile(METRIC_LOSSES[name]), ROOT)


def part_of(name):
    """The part whose file holds loss `name` (moco's is 'moco-loss'); None for a loss that is no
    part of the assignment."""
    return next((p.name for p in PARTS if p.file == source_file(name)), None)


def ok(name, condition, message):
    """tests/grading.py's check() for the loss's part (a loss that is no part is named by file);
    a failure first names the readings of the formula the loss is checked to compute
    (readings_that_fit), where some are."""
    if not condition:
        fitted(name, message)
        fail(name, message)


def fail(name, message):
    part = part_of(name)
    if part:
        check(part, False, message)
    raise AssertionError(f"loss '{name}' ({source_file(name)}): {message}")


def agrees(name, condition, what, reference, detail):
    """A value check (tests/grading.py, differs()): `what` equals `reference`, an oracle's value or
    one computed by hand, else a failure saying only that it differs. The property checks that say
    what is wrong run before it."""
    if condition:
        return
    fitted(name, f"{what}{detail}")
    if part_of(name):
        differs(part_of(name), what, reference, detail)
    raise AssertionError(f"loss '{name}' ({source_file(name)}): {what}{GENERIC}{reference}"
                         f"{detail}")


def run(name, loss, *args):
    """loss(*args); an error raised inside the loss is reported naming its part, and so is a
    loss that changed one of its inputs or its parameters in place (grading.InPlace), before any
    value read from them afterwards (the oracle's on the same inputs) could name another cause."""
    params = loss.named_parameters() if isinstance(loss, torch.nn.Module) else ()
    copies = kept([*zip(argument_names(loss, len(args)), args),
                   *((f"the loss's parameter {n}", p) for n, p in params)])
    try:
        value = loss(*args)
    except (NotImplementedError, DeviceSlip):  # the stub names its part; a slip is said whole
        raise
    except Exception as e:
        # no local holding the label: pytest's traceback would show it above the message, and
        # the first line naming the part would be that local, not what failed
        raise AssertionError((label(part_of(name)) if part_of(name) else f"loss '{name}'")
                             + f": the loss raised {type(e).__name__}: {e}") from e
    fail_if_changed(copies, label(part_of(name)) if part_of(name) else
              f"loss '{name}' ({source_file(name)})", "the loss")
    return value


def worked(name, got, want, case, mistakes=None, atol=1e-6, rtol=1e-6, readings=True):
    """A case worked by hand: `got` (a number, or a list of them) equals `want`; else the failure
    names the readings of the formula that give the loss's value on every comparison batch
    (readings_that_fit), where some do; else it says what the case gives, what it got, by how
    much, and how the two relate where one factor does (ratio). `mistakes` ({the value under a
    mistake, e.g. "with tau multiplied, not divided": its value on the case, recomputed}) are
    named only with readings=False, for a case of a function of the part other than the loss
    itself (contrastive(), mnrl_pairs), whose own readings they are: for the loss, one value on
    one case can fit several mistakes, and naming the one listed sent students to correct code
    (RESULTS.md, set F), so a cause is named only where every comparison batch confirms it."""
    def numbers(x):
        return [float(v) for v in x] if isinstance(x, (list, tuple)) else [float(x)]

    def same(a, b):
        return len(a) == len(b) and all(math.isclose(u, v, abs_tol=atol, rel_tol=rtol)
                                        for u, v in zip(a, b))

    def show(x):
        return ", ".join(f"{v:.6g}" for v in x)
    g, w = numbers(got), numbers(want)
    if same(g, w):
        return
    said = f"{case}: got {show(g)}, expected {show(w)}"
    if readings:  # the readings that hold on every comparison batch; one case proves too little
        fitted(name, said)
    else:  # a function of the part whose own readings are `mistakes`, on the case's points
        for mistake, wrong in (mistakes or {}).items():
            if same(g, numbers(wrong)):
                fail(name, f"{said}; {show(g)} is the loss {mistake}")
    gap = max(abs(u - v) for u, v in zip(g, w))
    if not all(math.isfinite(u) for u in g) and all(math.isfinite(v) for v in w):
        fail(name, f"{said}: the loss is not finite where the formula's is")
    fail(name, f"{said} (off by up to {gap:.3g}){negative(g)}{ratio(g, w)}{where_off(name, got, w)}")


def where_off(name, got, want):
    """'; its gradient in z is 0 everywhere ...' for the first value of `got` (a Value, value()'s)
    that is off its expected one, where the loss has an oracle: the examples whose gradient is
    off; '' where none can be said."""
    for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want):
        if isinstance(g, Value) and g.name == name and oracle_of(name) and not math.isclose(
                g, w, abs_tol=1e-9, rel_tol=1e-9):
            off = gradient_off(name, g.loss, g.args)
            return f"; {off}" if off else ""
    return ""


def ratio(got, want):
    """'; each value got is 2 times the expected one' where one simple factor (an integer or its
    inverse, the same at every value) relates them: '' otherwise."""
    pairs = [(u, v) for u, v in zip(got, want) if abs(v) > 1e-12]
    if not pairs or any(abs(u) < 1e-12 for u, _ in pairs):
        return ""
    r = [u / v for u, v in pairs]
    if max(r) - min(r) > 1e-6 * max(1.0, abs(r[0])):
        return ""
    for n in range(2, 65):
        for c, say in ((n, f"{n} times"), (1 / n, f"1/{n} of"), (-1, "minus")):
            if abs(r[0] - c) < 1e-6 * max(1.0, abs(c)):
                return f"; each value got is {say} the expected one"
    return ""


def negative(values):
    """What a negative loss says, whose formula's every term is >= 0 (a -log of a probability, a
    log(1 + ...), a max(0, ...) or a square): '' when none is negative."""
    low = min(values)
    return (f"; a loss of {low:.6g} is negative, and every term of the formula is >= 0"
            if low < -1e-9 else "")


def readings_that_fit(name):
    """The readings of the formula (READINGS in tests/losses/oracles.py) whose value the loss
    gives on every one of its comparison batches (cases() and degenerate_cases()), where the
    formula's it does not:
    the mistakes the loss is checked to have made. Several can fit: all are named."""
    if name not in READINGS:
        return []
    loss, oracle = make(name), oracle_of(name)
    fits, differs_somewhere = dict(READINGS[name]), False
    for _, args in cases(name) + degenerate_cases(name):
        try:
            with torch.no_grad():
                got = run(name, loss, *args)  # an input changed in place: that, not a reading
        except InPlace:
            raise
        except Exception:
            return []
        differs_somewhere |= not near(got, oracle(*args, loss), atol=1e-6, rtol=1e-9)
        for reading, settings in list(fits.items()):
            if not near(got, oracle(*args, loss, **settings), atol=1e-6, rtol=1e-9):
                del fits[reading]
        if not fits:
            return []
    return list(fits) if differs_somewhere else []


def fitted(name, said):
    """Fails naming the readings of the formula the loss is checked to compute, if any."""
    fits = readings_that_fit(name)
    if fits:
        fail(name, f"{said}; on every one of its {len(cases(name) + degenerate_cases(name))} "
             f"comparison batches the loss is the formula with {' or with '.join(fits)}")


def near(a, b, atol=1e-9, rtol=1e-9):
    a, b = (x.detach().item() if torch.is_tensor(x) else float(x) for x in (a, b))
    return math.isclose(a, b, abs_tol=atol, rel_tol=rtol)


def make(name, seed=0, **settings):
    torch.manual_seed(seed)
    return METRIC_LOSSES[name](C, D, **{**SETTINGS.get(name, {}), **settings}).double()


def randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g)


# ---- the inputs: batches in each loss's calling convention ----

BATCHES = {  # labels of the test batches: mixed, with a class seen once, with a class absent
    "mixed": [0, 1, 2, 3, 0, 1, 2, 3, 0, 1],
    "one singleton": [0, 0, 1, 1, 1, 2, 3, 3],
    "class absent": [0, 0, 1, 1, 1, 0],
}
# In-batch losses have nothing to compare on these (npairs: its L2 penalty alone); the proxy
# losses still compare each example with the proxies.
NOTHING_TO_COMPARE = {"every class once": [0, 1, 2, 3], "one class": [2, 2, 2, 2, 2],
                      "one example": [1]}
TRIPLETS = {  # B anchors' classes, the B texts' (the same), the B negatives' (another)
    "four": [0, 1, 2, 0, 0, 1, 2, 0, 1, 2, 3, 3],
    "three": [1, 3, 3, 1, 3, 3, 0, 1, 2],
}
MULTI_HOT = {  # rows of label sets over C = 4 classes
    "overlapping": [[1, 1, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 0], [0, 0, 1, 1],
                    [0, 0, 0, 1]],
    "one shares no label": [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]],
    "an all-zero row": [[1, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 1, 0]],
}
MULTI_HOT_NOTHING = {"no pair shares a label": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]],
                     "one example": [[1, 1, 0, 0]]}


def memory(n, classes, seed, n_examples=None):
    """n unit keys, their labels, and their examples' ids: rows of a training set of n_examples
    (default n: each example once, as after the fill); fewer rows than keys repeat some."""
    g = torch.Generator().manual_seed(seed)
    keys = F.normalize(torch.randn(n, D, dtype=torch.float64, generator=g), dim=1)
    ids = torch.randperm(n, generator=g) % (n_examples or n)
    return keys, torch.randint(0, classes, (n,), generator=g), ids


def queue_case(seed):
    """30 keys of classes 0 to 2 (queries of class 3 have no positive) from 20 examples, so some
    queries have older keys in memory; query 1's are of its class."""
    keys, key_labels, ids = memory(30, C - 1, seed, n_examples=20)
    key_labels[ids == 5] = 1
    y, rows = torch.tensor([0, 1, 2, 3, 0, 3, 1]), torch.tensor([0, 5, 9, 11, 19, 3, 7])
    h, batch_keys = randn(len(y), D, seed=seed + 10), F.normalize(randn(len(y), D, seed=seed), 1)
    return h, y, batch_keys, keys, key_labels, rows, ids


def bank_case(seed):
    """A memory bank: entry i is example i; each query's positive is its own entry."""
    bank, bank_labels, _ = memory(10, C, seed)
    rows = torch.tensor([4, 0, 9])
    h = randn(3, D, seed=seed + 10)
    return h, bank_labels[rows], bank[rows], bank, bank_labels, rows, torch.arange(10)


def cases(name):
    """[(what, args)]: the inputs on which loss `name` is compared with its oracle."""
    table = table_of(name)
    if table in ("ORACLES", "PAIR_ORACLES"):  # as pairs: the first half with the second
        y = BATCHES["mixed"]  # and one tight cluster, where every pair is within a margin
        return [(f"the '{b}' batch {y} (seed {s})", (randn(len(y), D, seed=s), torch.tensor(y)))
                for b, y in BATCHES.items() for s in range(3)] + [
            (f"the 'mixed' batch {y} in one tight cluster",
             (3 * e(0) + 0.3 * randn(len(y), D, seed=7), torch.tensor(y)))]
    if table == "TRIPLET_ORACLES":  # the anchors, the texts, the negatives
        return [(f"{len(y) // 3} triplets of classes {y[:len(y) // 3]}, negatives of classes "
                 f"{y[2 * len(y) // 3:]} (seed {s})", (randn(len(y), D, seed=s), torch.tensor(y)))
                for y in TRIPLETS.values() for s in range(3)] + [
            (f"the triplets {y} in one tight cluster",
             (3 * e(0) + 0.3 * randn(len(y), D, seed=7), torch.tensor(y)))
            for y in list(TRIPLETS.values())[:1]]
    if table == "MULTILABEL_ORACLES":
        return [(f"the '{b}' batch (seed {s})",
                 (3 * randn(len(y), D, seed=s), torch.tensor(y, dtype=torch.float64)))
                for b, y in MULTI_HOT.items() for s in range(3)]
    return ([(f"a queue holding older keys of some queries (seed {s})", queue_case(s))
             for s in range(3)]
            + [(f"a memory bank (seed {s})", bank_case(s)) for s in range(3)])


def degenerate_cases(name):
    """[(what, args)]: inputs with nothing, or almost nothing, to compare."""
    table = table_of(name)
    if table == "ORACLES":
        return [(f"a batch with {b} {y}", (randn(len(y), D, seed=0), torch.tensor(y)))
                for b, y in NOTHING_TO_COMPARE.items()]
    if table == "PAIR_ORACLES":  # SetFit pairs an example with itself: cos 1, at the top of its range
        x = randn(2, D, seed=0)
        return [("one pair, a text with itself", (torch.cat([x[:1], x[:1]]), torch.tensor([1, 1]))),
                ("a text with itself, its class not its own", (torch.cat([x, x]),
                                                              torch.tensor([0, 1, 1, 0])))]
    if table == "TRIPLET_ORACLES":  # a text that is its own anchor and its own negative
        x = randn(1, D, seed=0)
        return [("one triplet, one text as anchor, text and negative", (x.repeat(3, 1),
                                                                      torch.tensor([1, 1, 2]))),
                ("one triplet, the anchor's opposite as the negative",
                 (torch.cat([x, x, -x]), torch.tensor([0, 0, 1])))]
    if table == "MULTILABEL_ORACLES":
        return [(f"a batch with {b}", (randn(len(y), D, seed=0),
                                       torch.tensor(y, dtype=torch.float64)))
                for b, y in MULTI_HOT_NOTHING.items()]
    keys, _, ids = memory(6, C, 0)
    h, rows = randn(3, D, seed=1), torch.tensor([0, 1, 2])
    batch_keys = F.normalize(randn(3, D, seed=2), dim=1)
    y = torch.tensor([2, 2, 2])
    return [("a memory where no query has a positive",
             (h, torch.tensor([0, 1, 0]), batch_keys, keys, torch.full((6,), 3), rows, ids)),
            ("a memory without negatives", (h, y, batch_keys, keys, torch.full((6,), 2), rows,
                                            ids)),
            ("a memory of one key, query 0's own",
             (h, y, batch_keys, keys[:1], torch.tensor([2]), rows, torch.tensor([0])))]


def source(name):
    part = part_of(name)
    return BY_NAME[part].source if part else "its docstring's formula"


def clustered(spread, seed=0):
    """Four well-separated class centres and examples around them at distance ~spread."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.eye(C, D, dtype=torch.float64) * 3
    y = torch.tensor([0, 1, 2, 3] * 3)
    return centres, centres[y] + spread * torch.randn(len(y), D, dtype=torch.float64,
                                                      generator=g), y


# ---- the sanity check: fixed inputs, the solution's outputs stored (tests/grading.py) ----

def fixed_inputs(name):
    """The loss and its inputs, made without a random generator."""
    B = 6
    h = 2 * torch.sin(1.3 * torch.arange(B * D, dtype=torch.float64) + 0.2).reshape(B, D)
    loss = METRIC_LOSSES[name](C, D, **SETTINGS.get(name, {})).double()
    with torch.no_grad():
        for p in loss.parameters():
            p.copy_(torch.cos(0.37 * torch.arange(p.numel(), dtype=p.dtype) + 1).reshape(p.shape))
    table = table_of(name)
    if table in ("ORACLES", "PAIR_ORACLES"):
        return loss, (h, torch.tensor([0, 1, 0, 2, 1, 0]))
    if table == "TRIPLET_ORACLES":  # 5 triplets: 3 with the hinge on (the first 9 rows of this
        # construction's h), 2 with it off (h's own 6), so that a gradient cut on either side shows
        h9 = 2 * torch.sin(1.3 * torch.arange(9 * D, dtype=torch.float64) + 0.2).reshape(9, D)
        h = torch.cat([torch.cat([x.chunk(3)[k] for x in (h9, h)]) for k in range(3)])
        return loss, (h, torch.tensor([0, 1, 2, 0, 1] * 2 + [1, 2, 0, 1, 0]))
    if table == "MULTILABEL_ORACLES":
        return loss, (h, torch.tensor(MULTI_HOT["overlapping"], dtype=torch.float64))
    K = 12
    keys = F.normalize(torch.cos(0.7 * torch.arange(K * D, dtype=torch.float64)).reshape(K, D), 1)
    batch_keys = F.normalize(torch.cos(0.9 * torch.arange(B * D, dtype=torch.float64) + 0.5)
                             .reshape(B, D), 1)
    ids = torch.arange(K) % 9  # examples 0, 1 and 2 have two keys
    return loss, (h, torch.tensor([0, 1, 2, 1, 1, 2]), batch_keys, keys, torch.arange(K) % 3,
                  torch.tensor([0, 4, 2, 7, 1, 5]), ids)


# ---- the vectors the property tests are built of ----

def e(i, scale=1.0):
    """The i-th unit vector of R^D, times scale."""
    return scale * torch.eye(D, dtype=torch.float64)[i]


def at_angle(a):
    """The unit vector at angle a from e_0, in the plane of e_0 and e_1."""
    return math.cos(a) * e(0) + math.sin(a) * e(1)


def apart(d):
    """Two unit vectors at distance d."""
    return torch.stack([e(0), at_angle(2 * math.asin(d / 2))])


def triangle(r=0.1):
    """Three unit vectors around e_0, each pair at the squared distance 3 sin(r)^2 (0.03)."""
    return torch.stack([math.cos(r) * e(0) + math.sin(r) * (math.cos(a) * e(1) + math.sin(a) * e(2))
                        for a in (0, 2 * math.pi / 3, 4 * math.pi / 3)])


# two equal examples of class 0 and one opposite: z_0.z_1 = 1, z_0.z_2 = -1
OPPOSITE = (torch.stack([e(0), e(0), -e(0)]), torch.tensor([0, 0, 1]))


class Value(float):
    """A loss's value, a float that keeps the loss (a copy) and the inputs it was computed on:
    a case worked by hand whose value is off then says at which examples the loss's gradient is
    off too (gradient_off), not only by how much the value is."""


def value(name, loss, *args):
    got = Value(run(name, loss, *args).item())
    got.name, got.loss, got.args = name, copy.deepcopy(loss), args
    return got


def falls_with_tau(name, loss, attribute, args, taus=(1.0, 0.5, 0.1)):
    """The loss at each temperature, and whether it falls as tau does."""
    values = []
    for tau in taus:
        setattr(loss, attribute, tau)
        values.append(value(name, loss, *args))
    return values, all(a > b for a, b in zip(values, values[1:]))


def orthonormal_proxies(name, **settings):
    loss = make(name, **settings)
    with torch.no_grad():
        loss.proxies.copy_(torch.eye(C, D, dtype=torch.float64))
    return loss


def memory_of(*keys):
    """Unit keys given as (vector, label, id)."""
    vectors, labels, ids = zip(*keys)
    return torch.stack(vectors), torch.tensor(labels), torch.tensor(ids)


# ---- the checks every loss goes through (each loss's test file runs those of checks_of) ----

def check_normalises_what_its_formula_normalises(name):
    """Each h_i scaled by its own factor: a loss on normalised vectors does not move, one on the raw
    vectors (npairs, mlcon) does; the same for the proxies or centres, each row scaled."""
    loss, oracle = make(name), oracle_of(name)
    _, args = cases(name)[0]
    factors = torch.linspace(0.3, 3.0, len(args[0]), dtype=torch.float64)[:, None]
    scaled = (args[0] * factors, *args[1:])
    before, after = run(name, loss, *args), run(name, loss, *scaled)
    if near(oracle(*scaled, loss), oracle(*args, loss)):
        ok(name, near(before, after), f"scaling each h_i by its own factor (0.3 to 3) moved the "
           f"loss from {before.item():.6g} to {after.item():.6g} (by "
           f"{abs(after.item() - before.item()):.3g}); the formula normalises each vector over "
           f"its features, z_i = h_i / ||h_i||, which no such scaling moves")
    else:
        ok(name, not near(before, after), f"scaling each h_i by its own factor (0.3 to 3) left "
           f"the loss at {before.item():.6g}; the formula uses h as it is, not normalised: there "
           f"it moves to {oracle(*scaled, loss).item():.6g}")
    for p in loss.parameters():
        with torch.no_grad():  # each proxy (or centre) by its own factor
            n = p[..., 0].numel()
            p.mul_(torch.linspace(0.3, 3.0, n, dtype=p.dtype).reshape(*p.shape[:-1], 1))
        ok(name, near(run(name, loss, *args), before, atol=1e-9, rtol=1e-7),
           f"scaling each row of the loss's {tuple(p.shape)} parameter (its proxies or centres) "
           f"moved the loss from {before.item():.6g} to {run(name, loss, *args).item():.6g}; "
           f"the formula normalises each of them, p / ||p|| (along the last dimension)")


def check_matches_its_oracle(name):
    loss, oracle = make(name), oracle_of(name)
    for what, args in cases(name):
        got, want = run(name, loss, *args), oracle(*args, loss)
        if not near(got, want, atol=1e-6, rtol=1e-9):
            fitted(name, f"the loss on {what}: got {got.item():.8g}, the formula gives "
                   f"{want.item():.8g}")
            ok(name, got.item() >= -1e-9, f"the loss on {what} is {got.item():.8g}"
               f"{negative([got.item()]).removeprefix(';')} (the formula gives "
               f"{want.item():.8g})")
        if near(got, want, atol=1e-6, rtol=1e-9):
            continue
        factor = simple_factor(got.item() / want.item()) if want.item() else None
        said = f"; it is {factor} the formula's" if factor else ""
        grad = gradient_off(name, loss, args)  # where: the examples whose gradient is off
        if grad == "":
            grad = (f"its gradient in z is the formula's: the difference, "
                    f"{got.item() - want.item():+.6g}, does not move with z here")
        if grad and formula.VALUE_ONLY not in grad:
            fail(name, f"the loss on {what} is {got.item():.8g}, where the formula gives "
                 f"{want.item():.8g}{said}; {grad}")
        agrees(name, False, f"the loss on {what}", f"the literal transcription of {source(name)} "
               f"({oracle.__name__} in tests/losses/oracles.py)", f": got {got.item():.8g}, it "
               f"gives {want.item():.8g}{said}{'; ' + grad if grad else ''}")


def gradient_off(name, loss, args):
    """How the loss's gradient in z is off its oracle's on the same batch (describe(): at
    which examples, of which pattern): where a loss value is off, which examples it is off for.
    "" where it is the oracle's; None where it cannot be computed."""
    try:
        _, got = formula.run(lambda h: loss(h, *args[1:]), {"h": args[0]}, {},
                             formula.fixed_cotangent())
        _, want = formula.run(lambda h: oracle_of(name)(h, *args[1:], loss), {"h": args[0]}, {},
                              formula.fixed_cotangent())
    except Exception:
        return None
    w = want["h"] if want["h"] is not None else torch.zeros_like(args[0])
    g = got["h"] if got["h"] is not None else torch.zeros_like(w)
    return describe(g, w, "its gradient in z", ("example", "feature"), atol=1e-7, rtol=1e-6) or ""


def check_degenerate_inputs_are_finite(name):
    """Nothing to compare gives a finite loss and gradient, the oracle's value (often 0); the
    vectors and every parameter of the loss get a gradient (a tensor, not None)."""
    loss, oracle = make(name), oracle_of(name)
    for what, args in degenerate_cases(name):
        h = args[0].clone().requires_grad_()
        value = run(name, loss, h, *args[1:])
        want = oracle(*args, loss)
        if not near(value, want, atol=1e-9):
            fitted(name, f"the loss on {what}: got {value.item():.8g}, the formula gives "
                   f"{want.item():.8g}")
        ok(name, bool(torch.isfinite(value)), f"the loss on {what} is {value.item():.8g}; the "
           f"formula gives {want.item():.8g}")
        agrees(name, near(value, want, atol=1e-9), f"the loss on {what}", "the oracle's value",
               f": got {value.item():.8g}, expected {want.item():.8g}")
        ok(name, value.requires_grad, f"the loss on {what} ({value.item():.8g}) is not connected "
           f"to its inputs in autograd's graph (requires_grad False): backward() gives the "
           f"vectors z{' and the parameters' if list(loss.parameters()) else ''} no gradient")
        value.backward()
        ok(name, h.grad is not None, f"the vectors z got no gradient (.grad None) from the loss on "
           f"{what}")
        ok(name, bool(torch.isfinite(h.grad).all()), f"the gradient in z of the loss on {what} is "
           f"not finite at {h.grad.isfinite().logical_not().sum().item()} of its "
           f"{h.grad.numel()} elements")
        for p, param in loss.named_parameters():
            ok(name, param.grad is not None, f"the loss's parameter {p} got no gradient (.grad "
               f"None) from the loss on {what}")
            ok(name, bool(torch.isfinite(param.grad).all()), f"the gradient of the loss's "
               f"parameter {p} on {what} is not finite")


def check_gradcheck(name):
    """The loss's gradient in h and in its parameters is the formula's (autograd through the
    oracle, tests/formula.py: which tensor is off, where, how), and the numerical one of its own
    value (torch.autograd.gradcheck)."""
    loss, args = fixed_inputs(name)  # 6 examples
    params = dict(loss.named_parameters())
    if name in WITH_ORACLE:
        _, got = formula.run(lambda h: run(name, loss, h, *args[1:]), {"h": args[0]}, params,
                             formula.fixed_cotangent())
        _, want = formula.run(lambda h: oracle_of(name)(h, *args[1:], loss), {"h": args[0]},
                              params, formula.fixed_cotangent())
        for tensor, w in want.items():
            g = got.get(tensor)
            what = (f"on {len(args[0])} fixed examples, the gradient of "
                    f"{'z' if tensor == 'h' else tensor}")
            if w is None:
                continue
            ok(name, g is not None or not w.abs().max(), f"{what} is None: no gradient reaches "
               f"it (nothing connects it to the loss in autograd's graph)")
            off = describe(g if g is not None else torch.zeros_like(w), w, what,
                                   ("example", "feature") if tensor == "h" else None,
                                   atol=1e-7, rtol=1e-6)
            if off is not None:  # a reading whose gradients, every one, the loss's are
                fits = [r for r, kw in READINGS.get(name, {}).items() if all(
                    formula._close(got[t] if got[t] is not None else torch.zeros_like(v), v,
                                   1e-7, 1e-6) for t, v in formula.run(
                        lambda h: oracle_of(name)(h, *args[1:], loss, **kw), {"h": args[0]},
                        params, formula.fixed_cotangent())[1].items() if v is not None)]
                fail(name, f"{off.replace(formula.VALUE_ONLY, ' is off')}; every gradient is "
                     f"the formula's with {' or with '.join(fits)}") if fits else None
            ok(name, off is None, str(off))
    inputs = (args[0].clone().requires_grad_(), *loss.parameters())
    passed = torch.autograd.gradcheck(lambda h, *params: run(name, loss, h, *args[1:]), inputs,
                                      raise_exception=False, fast_mode=True)
    ok(name, passed, f"on {len(args[0])} fixed examples, the gradient autograd computes (in z"
       f"{' and the parameters' if list(loss.parameters()) else ''}) is not the numerical "
       "one, the loss's change under small steps of its inputs (torch.autograd.gradcheck)")


def check_every_input(name):
    """The loss's value has its inputs' dtype: float32 in (z, the loss's parameters and float
    labels, as a run trains), float32 out; float64 in, float64 out. As a --pair_loss of a
    sentence-pair task (PAIR_LOSSES, minknn/losses/pairs.py), its value and its gradient in each
    pair's first text (the anchor, u) and second (the positive, v) are the formula's
    (PAIR_LOSS_ORACLES). Its gradient in z and in its parameters is check_gradcheck's. The
    memory's keys are held to no gradient: a run passes them without one (the key encoder's,
    made under no_grad, or the bank's detached z), so whether the loss detaches them changes
    nothing a run computes."""
    what, args = cases(name)[0]
    for dtype in (torch.float32, torch.float64):
        loss = make(name).to(dtype)
        out = run(name, loss, *(a.to(dtype) if a.is_floating_point() else a for a in args))
        params = ", the parameters" if list(loss.parameters()) else ""
        ok(name, out.dtype == dtype, f"on {what}, with z{params} and every float input in "
           f"{dtype}, the loss's value is {out.dtype}: a tensor of another dtype entered its computation, so the value (and "
           f"the backward) are computed in {out.dtype}")
    if name in PAIR_LOSSES:
        check_as_a_pair_loss(name)


def check_as_a_pair_loss(name):
    """--pair_loss NAME on 5 sentence pairs, 3 of them matching (label 1, the positive class)."""
    B = 5
    z = randn(2 * B, D, seed=3)  # MNRL's loss about 12: far from saturated, every gradient large
    labels, what = torch.tensor([1, 0, 1, 1, 0]), f"--pair_loss {name} on 5 sentence pairs (the " \
        f"pairs 0, 2 and 3 matching)"
    objective = PairLoss(name, positive=1).double()
    cot = formula.fixed_cotangent()
    got, grads = formula.run(lambda z: run(name, objective, z, labels), {"z": z}, {}, cot)
    want, wants = formula.run(lambda z: PAIR_LOSS_ORACLES[name](z, labels, 1, objective.loss),
                              {"z": z}, {}, cot)
    off = describe(got, want, f"{what}: the loss")
    if off is not None:
        fail(name, off)
    g = grads["z"] if grads["z"] is not None else torch.zeros_like(wants["z"])
    for half, rows, role in (("u", slice(0, B), "the first texts (the anchors)"),
                             ("v", slice(B, 2 * B), "the second texts (the positives)")):
        off = describe(g[rows], wants["z"][rows], f"{what}: the gradient of {half}, "
                               f"{role},", ("pair", "feature"), atol=1e-7, rtol=1e-6)
        if off is not None:
            fail(name, off)
    out = run(name, PairLoss(name, positive=1), z.float(), labels)
    ok(name, out.dtype == torch.float32, f"{what}, z in float32: the loss's value is {out.dtype}")


def check_invariant_to_batch_order(name):
    loss = make(name)
    _, h, y = clustered(1.0)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    a, b = run(name, loss, h[perm], y[perm]), run(name, loss, h, y)
    ok(name, near(a, b, atol=1e-12), f"shuffling the batch moved the loss from {b.item():.8g} "
       f"to {a.item():.8g}")


def check_falls_as_classes_separate(name):
    loss = make(name)
    with torch.no_grad():  # put the proxies (or each class's centres) at the class centres
        for p in loss.parameters():
            centres, _, _ = clustered(0)
            p.copy_(centres if p.ndim == 2 else centres[:, None, :] + 0.01 * torch.randn_like(p))
    values = [run(name, loss, *clustered(spread)[1:]).item() for spread in (3.0, 1.0, 0.3, 0.1)]
    ok(name, values == sorted(values, reverse=True) and values[-1] < values[0],
       f"the loss must fall as the classes' examples gather around their centres (spread 3, 1, "
       f"0.3, 0.1); it went {', '.join(f'{v:.4g}' for v in values)}")


def check_sanity_check(name):
    """The loss and its gradient on fixed inputs against the stored reference outputs."""
    loss, (h, *rest) = fixed_inputs(name)
    h = h.clone().requires_grad_()
    value = run(name, loss, h, *rest)
    value.backward()
    matches_reference(part_of(name), "loss", value, **FLOAT64)  # float64: fixed_inputs
    matches_reference(part_of(name), "gradient of h", h.grad, **FLOAT64)


def check_runs_in_fp32_under_autocast(name):
    """Under bf16 autocast (train.py --precision bf16) each metric term is its fp32 value to float
    precision: bf16 matmuls would move a scaled cosine such as mnrl's 20 cos by about 0.1."""
    torch.manual_seed(0)
    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    if name.startswith("pair_loss"):  # a siamese pair task: the 6 first texts, then the 6 second
        objective = task_loss(TASKS["mrpc"], D, {"pair_loss": name.split()[1]}, siamese=True)
        labels, h = labels.clamp(max=1), torch.randn(12, D)
    else:
        objective, h = Objective(name, C, D), torch.randn(6, D)
        labels = F.one_hot(labels, C).float() if loss_kind(name) == "multilabel" else labels
    out = Output(logits=torch.randn(6, 2 if name.startswith("pair_loss") else C), z=h)
    loss = name.split()[-1]
    fp32 = run(loss, objective, out, labels)[1]["metric"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = run(loss, objective, out, labels)[1]["metric"]
    ok(loss, near(bf16, fp32, atol=1e-6, rtol=1e-6), f"{name}: the metric term under bf16 "
       f"autocast is {bf16.item():.8g}, in fp32 {fp32.item():.8g}")


def check_stays_finite_on_large_inputs(name):
    """In float32, the dtype a run trains in, on the first comparison batch with h (and the
    loss's parameters) scaled by 10: raw inner products of about 100, past exp's float32 range
    (e^88). The formula's value is finite there (log(1 + e^x) is about x), so the loss must be."""
    loss = make(name).float()
    with torch.no_grad():
        for p in loss.parameters():
            p.mul_(10)
    _, args = cases(name)[0]
    args = (10 * args[0].float(), *(a.float() if a.is_floating_point() else a for a in args[1:]))
    value = run(name, loss, *args)
    ok(name, bool(torch.isfinite(value)), f"in float32, on {cases(name)[0][0]} with h scaled by "
       f"10 (raw inner products up to {(args[0] @ args[0].T).abs().max().item():.3g}), the loss "
       f"is {value.item()}; the formula's value is finite there: an exp or a log of a sum of exps "
       f"overflowed (log(1 + e^x), log sum e^x are finite in their softplus / logsumexp forms)")


def check_runs_on_the_inputs_device(name):
    """The loss with its inputs and parameters on a second device (tests/elsewhere.py): a
    tensor the loss makes without device= fails here as on a GPU, naming the line that made it."""
    loss = make(name)
    for what, args in (cases(name)[:1] + cases(name)[-1:]):
        check_on_second_device(part_of(name) or name, f"the loss on {what}",
                               lambda m, **xs: run(name, m, *xs.values()),
                               {f"argument {i}": a for i, a in enumerate(args)}, loss)


def checks_of(name):
    """The checks above that loss `name` goes through, in the order its test file runs them: the
    in-batch ones (order, separation) for a loss called as loss(h, labels) only, the sanity check
    for a part of the assignment, autocast for a loss outside the memory."""
    return [check for check, applies in (
        (check_normalises_what_its_formula_normalises, name in WITH_ORACLE),
        (check_matches_its_oracle, name in WITH_ORACLE),
        (check_degenerate_inputs_are_finite, name in WITH_ORACLE),
        (check_gradcheck, True),
        (check_every_input, name in WITH_ORACLE),
        (check_invariant_to_batch_order, name in IN_BATCH),
        (check_falls_as_classes_separate, name in IN_BATCH),
        (check_sanity_check, part_of(name) is not None),
        (check_runs_in_fp32_under_autocast,
         name in WITH_ORACLE and table_of(name) != "MEMORY_ORACLES"),
        (check_stays_finite_on_large_inputs, name in WITH_ORACLE),
        (check_runs_on_the_inputs_device, True)) if applies]
