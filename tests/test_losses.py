"""Every metric-learning loss against a slow, literal transcription of its paper's formula (the
oracles below: plain Python loops over the examples, pairs and triplets), its properties,
gradcheck, and stored reference outputs.

Each loss is a part of the assignment (PARTS in minknn/parts.py) and a failure names it
("part 8 supcon: ..."). A student who wrote one loss runs its tests, or only its sanity check:

    python -m pytest -q tests/test_losses.py -k supcon
    python -m pytest -q tests/test_losses.py -k "sanity and supcon"

The tests run over the registry (METRIC_LOSSES, minknn/losses/__init__.py): a new loss is tested
as soon as it is registered, and fails test_every_registered_loss_has_an_oracle until its oracle
is in ORACLES (a loss called as loss(h, labels)), MEMORY_ORACLES (a loss over the MoCo memory),
MULTILABEL_ORACLES (multi-hot labels) or PAIR_ORACLES (a loss of pair batches: setfit).
"""
import inspect
import math
import os
import random

import pytest
import torch
import torch.nn.functional as F

from grading import GENERIC, check, differs, matches_reference
from minknn import MinknnError
from minknn.parts import BY_NAME, PARTS, label
from minknn.losses import LOSSES, METRIC_LOSSES, Objective, loss_kind, task_loss
from minknn.losses.contrastive import contrastive
from minknn.losses.knnbert import select_positives
from minknn.losses.mlcon import mlcon
from minknn.losses.mnrl import mnrl_pairs
from minknn.engine import PairBatches
from minknn.losses.setfit import draw_pairs
from minknn.model import Output
from minknn.memory import Queue
from minknn.tasks import TASKS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    """tests/grading.py's check() for the loss's part; a loss that is no part is named by file."""
    part = part_of(name)
    if part:
        check(part, condition, message)
    elif not condition:
        raise AssertionError(f"loss '{name}' ({source_file(name)}): {message}")


def agrees(name, condition, what, reference, detail):
    """A value check (tests/grading.py, differs()): `what` equals `reference`, an oracle's value or
    one computed by hand, else a failure saying only that it differs. The property checks that say
    what is wrong run before it."""
    if condition:
        return
    if part_of(name):
        differs(part_of(name), what, reference, detail)
    raise AssertionError(f"loss '{name}' ({source_file(name)}): {what}{GENERIC}{reference}"
                         f"{detail}")


def run(name, loss, *args):
    """loss(*args); an error raised inside the loss is reported naming its part."""
    try:
        return loss(*args)
    except NotImplementedError:  # the student edition's stub names its part already
        raise
    except Exception as e:
        who = label(part_of(name)) if part_of(name) else f"loss '{name}'"
        raise AssertionError(f"{who}: the loss raised {type(e).__name__}: {e}") from e


def near(a, b, atol=1e-9, rtol=1e-9):
    a, b = (x.detach().item() if torch.is_tensor(x) else float(x) for x in (a, b))
    return math.isclose(a, b, abs_tol=atol, rel_tol=rtol)


def make(name, seed=0, **settings):
    torch.manual_seed(seed)
    return METRIC_LOSSES[name](C, D, **{**SETTINGS.get(name, {}), **settings}).double()


def unit(v):
    return v / v.norm()


def mean(terms):
    return sum(terms) / len(terms) if terms else torch.tensor(0.0, dtype=torch.float64)


@pytest.fixture(autouse=True)
def keep_the_global_generator():
    """Tests seed torch's global generator (make() does); the seeding stays inside the test."""
    with torch.random.fork_rng(devices=[]):
        yield


def randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g)


# ---- the oracles: each file's docstring formula, one example at a time ----

def triplet_oracle(h, y, loss):
    z, B, m = [unit(v) for v in h], len(h), loss.margin
    d = [[(zi - zj).pow(2).sum() for zj in z] for zi in z]   # d[i][j] = ||z_i - z_j||^2
    return mean([torch.clamp(d[a][p] - d[a][n] + m, min=0)
                 for a in range(B) for p in range(B) for n in range(B)
                 if y[a] == y[p] and a != p and y[n] != y[a]])


def npairs_oracle(h, y, loss):
    B, terms = len(h), []
    for a in range(B):
        negatives = [n for n in range(B) if y[n] != y[a]]
        for p in range(B):
            if p != a and y[p] == y[a] and negatives:
                terms.append(torch.log(1 + sum(torch.exp(h[a] @ h[n] - h[a] @ h[p])
                                               for n in negatives)))
    return mean(terms) + loss.l2_reg * mean([v @ v for v in h])


def supcon_oracle(h, y, loss):
    z, B, t, terms = [unit(v) for v in h], len(h), loss.temperature, []
    for i in range(B):
        P = [p for p in range(B) if p != i and y[p] == y[i]]
        if P:
            denominator = sum(torch.exp(z[i] @ z[a] / t) for a in range(B) if a != i)
            terms.append(-sum(torch.log(torch.exp(z[i] @ z[p] / t) / denominator)
                              for p in P) / len(P))
    return mean(terms)


def contrastive_oracle(h, y, loss):
    z, B, m, terms = [unit(v) for v in h], len(h), loss.margin, []
    for i in range(B):
        for j in range(i + 1, B):
            d, dissimilar = (z[i] - z[j]).norm(), float(y[i] != y[j])
            terms.append(0.5 * (1 - dissimilar) * d ** 2
                         + 0.5 * dissimilar * torch.clamp(m - d, min=0) ** 2)
    return mean(terms)


def mnrl_oracle(h, y, loss):
    z, B, terms = [unit(v) for v in h], len(h), []
    S = [[loss.scale * zi @ zj for zj in z] for zi in z]   # S[i][j] = scale cos(x_i, x_j)
    for i in range(B):
        for p in range(B):
            if p != i and y[p] == y[i]:
                candidates = [p] + [n for n in range(B) if y[n] != y[i]]
                terms.append(-torch.log(torch.exp(S[i][p])
                                        / sum(torch.exp(S[i][c]) for c in candidates)))
    return mean(terms)


def proxynca_oracle(h, y, loss):
    P = [unit(p) for p in loss.proxies]
    terms = []
    for x, c in zip(h, y):
        d = [(unit(x) - p).pow(2).sum() for p in P]
        terms.append(-torch.log(torch.exp(-loss.scale * d[c])
                                / sum(torch.exp(-loss.scale * dk) for dk in d)))
    return mean(terms)


def proxyanchor_oracle(h, y, loss):
    a, delta = loss.scale, loss.delta
    pos, neg = [], []
    for c, p in enumerate(loss.proxies):
        X_pos = [unit(x) for x, yi in zip(h, y) if yi == c]
        X_neg = [unit(x) for x, yi in zip(h, y) if yi != c]
        p = unit(p)
        if X_pos:
            pos.append(torch.log(1 + sum(torch.exp(-a * (x @ p - delta)) for x in X_pos)))
        neg.append(torch.log(1 + sum((torch.exp(a * (x @ p + delta)) for x in X_neg),
                                     torch.tensor(0.0, dtype=h.dtype))))
    return sum(pos) / len(pos) + sum(neg) / len(neg)


def softtriple_oracle(h, y, loss):
    W = [[unit(w) for w in centres] for centres in loss.centres]       # W[c][k]
    K, lam, gamma, delta = len(W[0]), loss.scale, loss.gamma, loss.delta
    terms = []
    for x, yi in zip(h, y):
        x = unit(x)
        S = []
        for c in range(len(W)):
            weights = [torch.exp(x @ w / gamma) for w in W[c]]
            S.append(sum(wt / sum(weights) * (x @ w) for wt, w in zip(weights, W[c])))
        top = torch.exp(lam * (S[yi] - delta))
        others = sum(torch.exp(lam * S[c]) for c in range(len(W)) if c != yi)
        terms.append(-torch.log(top / (top + others)))
    R = sum(torch.sqrt(2 - 2 * W[c][s] @ W[c][t])
            for c in range(len(W)) for s in range(K) for t in range(s + 1, K))
    return mean(terms) + loss.reg_weight * R / (len(W) * K * (K - 1))


ORACLES = {"triplet": triplet_oracle, "npairs": npairs_oracle, "supcon": supcon_oracle,
           "contrastive": contrastive_oracle, "mnrl": mnrl_oracle, "proxynca": proxynca_oracle,
           "proxyanchor": proxyanchor_oracle, "softtriple": softtriple_oracle}


# The memory losses are called as loss(h, labels, batch_keys, keys, key_labels, rows, ids), and
# their oracles with the same arguments and the loss. Each key carries the training-set row of its
# example (ids); rows are the batch's rows. A key whose id is a query's own row is that query's
# older key: neither a negative nor a positive.

def knnbert_oracle(h, y, batch_keys, keys, key_labels, rows, ids, loss):
    """KNN-BERT eq. 3, one query and one positive at a time; S(q) by sorting the positives."""
    per_query = []
    for i in range(len(h)):
        q = unit(h[i])
        s = [q @ k / loss.temperature for k in keys]
        positives = [j for j in range(len(keys)) if key_labels[j] == y[i] and ids[j] != rows[i]]
        negatives = [j for j in range(len(keys)) if key_labels[j] != y[i]]
        if not positives:
            continue  # no positive in memory: this query contributes nothing
        ranked = sorted(positives, key=lambda j: -s[j].item())
        if len(ranked) <= loss.m_most + loss.m_least:
            selected = ranked
        else:
            selected = ranked[:loss.m_most] + ranked[len(ranked) - loss.m_least:]
        terms = [-torch.log(torch.exp(s[j])
                            / (torch.exp(s[j]) + sum(torch.exp(s[n]) for n in negatives)))
                 for j in selected]
        per_query.append(sum(terms) / len(terms))
    return mean(per_query)


def moco_oracle(h, y, batch_keys, keys, key_labels, rows, ids, loss):
    """MoCo eq. 1: the query's own key against every key in memory but its own example's."""
    terms = []
    for i in range(len(h)):
        q = unit(h[i])
        positive = torch.exp(q @ batch_keys[i] / loss.temperature)
        negatives = sum(torch.exp(q @ keys[j] / loss.temperature)
                        for j in range(len(keys)) if ids[j] != rows[i])
        terms.append(-torch.log(positive / (positive + negatives)))
    return mean(terms)


MEMORY_ORACLES = {"knnbert": knnbert_oracle, "moco": moco_oracle}


def mlcon_oracle(h, y, loss):
    """L_con = sum_i sum_{j != i} -beta_ij log( exp(-d_ij / tau) / sum_{k != i} exp(-d_ik / tau) ),
    beta_ij = C_ij / sum_{k != i} C_ik, C_ij = y_i . y_j; a row with no shared label adds 0."""
    B, tau, total = len(h), loss.temperature, torch.tensor(0.0, dtype=h.dtype)
    d = [[(hi - hj).pow(2).sum().sqrt() for hj in h] for hi in h]   # d[i][j] = ||h_i - h_j||
    for i in range(B):
        shared = {j: float(y[i] @ y[j]) for j in range(B) if j != i}
        if sum(shared.values()) == 0:
            continue
        denominator = sum(torch.exp(-d[i][k] / tau) for k in range(B) if k != i)
        for j, c in shared.items():
            total = total - c / sum(shared.values()) * torch.log(torch.exp(-d[i][j] / tau)
                                                                 / denominator)
    return total


MULTILABEL_ORACLES = {"mlcon": mlcon_oracle}


# ---- pair losses, called as loss(h, labels) on a batch of pairs: the B first texts, then the B
# second ones (h (2B, dim), labels (2B,) the texts' classes)

def setfit_oracle(h, y, loss):
    B, terms = len(h) // 2, []
    for i in range(B):
        u, v = h[i], h[B + i]                       # pair i: text i and text B + i
        cos = (u @ v) / (u.norm() * v.norm())
        target = 1.0 if y[i] == y[B + i] else 0.0   # one class: 1; two classes: 0
        terms.append((cos - target) ** 2)
    return mean(terms)


PAIR_ORACLES = {"setfit": setfit_oracle}
TABLES = {"ORACLES": ORACLES, "MEMORY_ORACLES": MEMORY_ORACLES,
          "MULTILABEL_ORACLES": MULTILABEL_ORACLES, "PAIR_ORACLES": PAIR_ORACLES}


def table_of(name):
    """Where loss `name`'s oracle belongs, by how the loss is called."""
    if getattr(METRIC_LOSSES[name], "uses_memory", False):
        return "MEMORY_ORACLES"
    if getattr(METRIC_LOSSES[name], "pairs", False):
        return "PAIR_ORACLES"
    return "MULTILABEL_ORACLES" if loss_kind(name) == "multilabel" else "ORACLES"


def oracle_of(name):
    return TABLES[table_of(name)].get(name)


WITH_ORACLE = [name for name in METRIC_LOSSES if oracle_of(name)]
IN_BATCH = [name for name in METRIC_LOSSES if table_of(name) == "ORACLES"]  # loss(h, labels)


def test_every_registered_loss_has_an_oracle():
    missing = [f"loss '{name}' ({source_file(name)}) has no oracle: add a literal transcription "
               f"of its formula to {table_of(name)} in tests/test_losses.py"
               for name in METRIC_LOSSES if not oracle_of(name)]
    assert not missing, "\n".join(missing)
    stale = [f"{table}['{name}']" for table, oracles in TABLES.items() for name in oracles
             if name not in METRIC_LOSSES or table_of(name) != table]
    assert not stale, (f"oracles of no registered loss, or in the wrong table: {', '.join(stale)} "
                       f"(METRIC_LOSSES in minknn/losses/__init__.py)")
    assert tuple(LOSSES) == ("ce", "bce", *METRIC_LOSSES)


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
        return [(f"the '{b}' batch {y} (seed {s})", (randn(len(y), D, seed=s), torch.tensor(y)))
                for b, y in BATCHES.items() for s in range(3)]
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


# ---- what each loss must compute: its normalisation, its properties, then its oracle ----

@pytest.mark.parametrize("name", WITH_ORACLE)
def test_normalises_what_its_formula_normalises(name):
    """Each h_i scaled by its own factor: a loss on normalised vectors does not move, one on the raw
    vectors (npairs, mlcon) does; the same for the proxies or centres, each row scaled."""
    loss, oracle = make(name), oracle_of(name)
    _, args = cases(name)[0]
    factors = torch.linspace(0.3, 3.0, len(args[0]), dtype=torch.float64)[:, None]
    scaled = (args[0] * factors, *args[1:])
    before, after = run(name, loss, *args), run(name, loss, *scaled)
    if near(oracle(*scaled, loss), oracle(*args, loss)):
        ok(name, near(before, after), f"scaling each h_i by its own factor (0.3 to 3) moved the "
           f"loss from {before.item():.6g} to {after.item():.6g}; the formula normalises each "
           f"vector, z_i = h_i / ||h_i|| (F.normalize(h, dim=-1): along the features, not the "
           f"batch)")
    else:
        ok(name, not near(before, after), "scaling each h_i changed nothing, but the formula "
           "uses h as it is: it must not be normalised")
    for p in loss.parameters():
        with torch.no_grad():  # each proxy (or centre) by its own factor
            n = p[..., 0].numel()
            p.mul_(torch.linspace(0.3, 3.0, n, dtype=p.dtype).reshape(*p.shape[:-1], 1))
        ok(name, near(run(name, loss, *args), before, atol=1e-9, rtol=1e-7),
           f"scaling each row of the loss's {tuple(p.shape)} parameter (its proxies or centres) "
           f"moved the loss from {before.item():.6g} to {run(name, loss, *args).item():.6g}; "
           f"the formula normalises each of them, p / ||p|| (along the last dimension)")


# ---- the properties that tell a loss's common mistakes apart, before its oracle ----
# Each test builds a batch on which one choice of the formula shows, and says which choice fails
# and how to fix it; the oracle (next) only says that a value differs. pytest -x stops at the first
# failure, so the tests run in this order: each one's batch leaves the choices checked after it
# out of play (the values they would change do not occur on it), so a failure names the mistake
# made, not one checked later.

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


def value(name, loss, *args):
    return run(name, loss, *args).item()


def falls_with_tau(name, loss, attribute, args, taus=(1.0, 0.5, 0.1)):
    """The loss at each temperature, and whether it falls as tau does."""
    values = []
    for tau in taus:
        setattr(loss, attribute, tau)
        values.append(value(name, loss, *args))
    return values, all(a > b for a, b in zip(values, values[1:]))


def test_triplet_an_anchor_is_not_its_own_positive():
    v = value("triplet", make("triplet"), triangle(), torch.tensor([0, 1, 2]))
    ok("triplet", v == 0, f"three examples of three classes, close together (squared distances "
       f"0.03 < m): no valid triplet, so the loss is 0; got {v:.6g}: an anchor is not its own "
       f"positive (p != a: fill the positive mask's diagonal with False), and a mean over no "
       f"triplet is 0, not 0/0")


def test_triplet_the_margin_on_a_tie():
    v = value("triplet", make("triplet"), triangle(), torch.tensor([0, 0, 1]))
    ok("triplet", near(v, 0.2), f"three examples at equal distances (labels 0, 0, 1): each of "
       f"the 2 triplets costs max(0, d_ap - d_an + m) = m, so the loss is m = 0.2; got {v:.6g}: "
       f"add the margin to d_ap - d_an, inside the hinge")


def test_triplet_the_mean_counts_the_satisfied_triplets():
    # the triangle (labels 0, 0, 1: 2 triplets at m) and two equal examples of class 2 on e_3,
    # 2 away from it: 12 valid triplets, the 10 new ones satisfied (terms 0)
    h = torch.cat([triangle(), torch.stack([e(3), e(3)])])
    v = value("triplet", make("triplet"), h, torch.tensor([0, 0, 1, 2, 2]))
    ok("triplet", near(v, 0.4 / 12), f"12 valid triplets, 2 of them active at m = 0.2 and 10 "
       f"satisfied: the loss is 0.4 / 12 = {0.4 / 12:.6g}; got {v:.6g}: the mean runs over every "
       f"valid triplet, the satisfied (zero) ones included, not over the active ones only")


def test_npairs_penalty_is_the_mean_squared_norm():
    h = torch.stack([e(0, 1.0), e(1, 2.0), e(2, 3.0)])   # ||f_i||^2 = 1, 4, 9
    v = value("npairs", make("npairs"), h, torch.tensor([2, 2, 2]))
    want = 0.002 * 14 / 3
    ok("npairs", near(v, want), f"a batch of one class has no (anchor, positive, negative): the "
       f"loss is the penalty alone, l2_reg * mean_i ||f_i||^2 = 0.002 * (1 + 4 + 9) / 3 = "
       f"{want:.6g}; got {v:.6g}: average the squared norms (each a sum over the features) over "
       f"the batch, not every coordinate")


def test_npairs_uses_raw_inner_products():
    loss, (h, y) = make("npairs", l2_reg=0.0), cases("npairs")[0][1]
    v, doubled = value("npairs", loss, h, y), value("npairs", loss, 2 * h, y)
    ok("npairs", not near(v, doubled), f"with l2_reg = 0, doubling every f_i left the loss at "
       f"{v:.6g}: N-pairs uses the raw inner products f_a.f_n, so their size counts (do not "
       f"normalise h)")


def test_npairs_an_anchor_is_not_its_own_negative():
    # two equal examples of class 0, ||f||^2 = 9, and one of class 1 orthogonal to them
    h = torch.stack([e(0, 3.0), e(0, 3.0), e(1, 3.0)])
    v = value("npairs", make("npairs", l2_reg=0.0), h, torch.tensor([0, 0, 1]))
    want = math.log1p(math.exp(-9))
    ok("npairs", near(v, want), f"two equal examples of class 0 (||f||^2 = 9) and one "
       f"orthogonal of class 1, l2_reg = 0: each pair costs log(1 + e^(0 - 9)) = {want:.4g}; got "
       f"{v:.4g} (log 2 = 0.693 if f_a.f_a is a negative): the anchor's negatives are the other "
       f"classes' examples only, not itself")


# two equal examples of class 0 and one opposite: z_0.z_1 = 1, z_0.z_2 = -1
OPPOSITE = (torch.stack([e(0), e(0), -e(0)]), torch.tensor([0, 0, 1]))


def test_supcon_an_anchor_is_not_in_its_own_denominator():
    v = value("supcon", make("supcon"), *OPPOSITE)
    ok("supcon", v < math.log(2), f"two equal examples of a class and one opposite: the loss is "
       f"log(1 + e^(-2 / tau)), about 0; got {v:.6g}, not below log 2: with the anchor's own "
       f"e^(z_i.z_i / tau) in its denominator it cannot fall below log 2. A(i) is every OTHER "
       f"example: mask the diagonal before the logsumexp")


def test_supcon_divides_by_the_temperature():
    values, falls = falls_with_tau("supcon", make("supcon"), "temperature", OPPOSITE)
    ok("supcon", falls, f"two equal examples of a class and one opposite: the loss "
       f"log(1 + e^(-2 / tau)) must fall as tau falls (1, 0.5, 0.1); it went "
       f"{', '.join(f'{v:.4g}' for v in values)}: divide z_i.z_j by tau, do not multiply")


def test_supcon_anchors_without_a_positive_are_left_out():
    # two equal examples of class 0 and an orthogonal one of class 1, which has no positive
    h, y = torch.stack([e(0), e(0), e(1)]), torch.tensor([0, 0, 1])
    v, want = value("supcon", make("supcon"), h, y), math.log1p(math.exp(-10))
    ok("supcon", near(v, want), f"two equal examples of class 0 and one orthogonal of class 1: "
       f"anchors 0 and 1 each cost log(1 + e^(-1 / tau)) = {want:.6g}, anchor 2 has no positive "
       f"and is left out; got {v:.6g} ({2 * want / 3:.6g} is the mean over all 3 anchors): "
       f"average over I+, the anchors with at least one positive")


def test_supcon_averages_over_the_positives():
    # four equal examples of class 0, one opposite: each anchor's softmax gives 1/3 to each of
    # its 3 positives
    h, y = torch.stack([e(0)] * 4 + [-e(0)]), torch.tensor([0, 0, 0, 0, 1])
    v, want = value("supcon", make("supcon"), h, y), math.log(3 + math.exp(-20))
    ok("supcon", near(v, want), f"four equal examples of class 0 and one opposite: each anchor "
       f"puts 1/3 on each of its 3 positives, so the MEAN of -log p over P(i) is log 3 = "
       f"{want:.6g}; got {v:.6g}: divide each anchor's sum over P(i) by |P(i)|")


def test_contrastive_a_pair_of_one_class_is_similar():
    v = value("contrastive", make("contrastive"), apart(0.0), torch.tensor([1, 1]))
    ok("contrastive", near(v, 0), f"two equal vectors of the same class (a similar pair at "
       f"distance 0) must cost 0; got {v:.6g} (a dissimilar pair there costs m^2 / 2 = 0.125): "
       f"y_ij = 1 marks a DISSIMILAR pair, labels that differ")


def test_contrastive_each_unordered_pair_once():
    # three unit vectors pairwise 1 apart (cosine 1/2), where d = d^2
    h = F.pad(torch.tensor([[1.0, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=torch.float64), (0, D - 3))
    h = h / math.sqrt(2)
    y = torch.tensor([0, 0, 1])
    want = run("contrastive", contrastive, torch.ones(3, dtype=torch.float64),
               torch.tensor([0, 1, 1]), 0.5).mean().item()
    v = value("contrastive", make("contrastive"), h, y)
    ok("contrastive", near(v, want, atol=1e-12), f"three examples pairwise 1 apart (labels 0, 0, "
       f"1): the loss is the mean over the 3 pairs i < j of your contrastive(d_ij, y_i != y_j, "
       f"m), {want:.6g}; got {v:.6g}: each unordered pair once (torch.triu_indices with offset "
       f"1: not i with itself, not (j, i) again)")


def test_contrastive_d_is_the_distance():
    v = value("contrastive", make("contrastive"), apart(0.3), torch.tensor([1, 1]))
    ok("contrastive", near(v, 0.045), f"a similar pair 0.3 apart costs 1/2 d^2 = 0.045; got "
       f"{v:.6g}: d is the distance ||z_i - z_j|| = sqrt(2 - 2 z_i.z_j), not its square")


def test_contrastive_the_hinge_is_on_the_distance():
    loss = make("contrastive")
    v, far = (value("contrastive", loss, apart(d), torch.tensor([0, 1])) for d in (0.3, 1.0))
    ok("contrastive", near(v, 0.02) and near(far, 0), f"a dissimilar pair 0.3 apart costs 1/2 "
       f"max(0, m - d)^2 = 1/2 (0.5 - 0.3)^2 = 0.02, one 1.0 apart (beyond m) 0; got {v:.6g} and "
       f"{far:.6g}: the hinge max(0, m - d) on the distance, then squared")


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
    ok("mnrl", near(v, want), f"three equal examples of class 0 and one opposite: each (i, p) "
       f"chooses between p and the one negative, log(1 + e^(-2 * 20)), about 0; got {v:.6g} "
       f"(log 3 = 1.0986 with i and all of its class as candidates): the anchor and the other "
       f"examples of its class are no candidates, only p and the other classes' examples")


def test_mnrl_pairs_normalises_anchors_and_positives():
    a, p = randn(5, D, seed=0), randn(5, D, seed=1)
    factors = torch.linspace(0.3, 3.0, 5, dtype=torch.float64)[:, None]
    v = run("mnrl", mnrl_pairs, a, p).item()
    for what, args in (("anchor", (a * factors, p)), ("positive", (a, p * factors))):
        moved = run("mnrl", mnrl_pairs, *args).item()
        ok("mnrl", near(v, moved), f"mnrl_pairs: scaling each {what} by its own factor (0.3 to "
           f"3) moved J from {v:.6g} to {moved:.6g}: S is scale * cos, so normalise the anchors "
           f"and the positives (F.normalize(x, dim=-1)) before their product")


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


def orthonormal_proxies(name, **settings):
    loss = make(name, **settings)
    with torch.no_grad():
        loss.proxies.copy_(torch.eye(C, D, dtype=torch.float64))
    return loss


def test_proxynca_the_nearest_proxy_scores_highest():
    logits = run("proxynca", orthonormal_proxies("proxynca").class_logits, e(0, 2.0)[None])
    ok("proxynca", logits.argmax().item() == 0, f"h on proxy 0 (orthonormal proxies) must give "
       f"proxy 0 the largest logit; got {logits[0].tolist()}: the logits are MINUS s d(x, p_c), "
       f"so that the nearest proxy scores highest")


def test_proxynca_the_scale_multiplies_the_logits():
    loss, h = orthonormal_proxies("proxynca", scale=1.0), randn(3, D, seed=0)
    at_1 = run("proxynca", loss.class_logits, h).detach()
    loss.scale = 9.0
    at_9 = run("proxynca", loss.class_logits, h).detach()
    ok("proxynca", torch.allclose(at_9, 9 * at_1), f"the logits at s = 9 must be 9 times those "
       f"at s = 1, -s d(x, p_c); got {at_9[0].tolist()} and {at_1[0].tolist()} for example 0")


def test_proxynca_d_is_the_squared_distance():
    h = torch.stack([e(0), -e(0)])   # on proxy 0, then opposite it; orthogonal to the others
    logits = run("proxynca", orthonormal_proxies("proxynca").class_logits, h).detach()
    want = torch.tensor([[0.0, -18, -18, -18], [-36, -18, -18, -18]], dtype=torch.float64)
    ok("proxynca", torch.allclose(logits, want), f"d(x, p) = ||x - p||^2 = 2 - 2 cos is 0 on the "
       f"proxy, 2 orthogonal to it and 4 opposite, so at s = 9 the logits are 0, -18 and -36; "
       f"got {logits.tolist()}: the SQUARED distance of the normalised vectors")


def test_proxyanchor_the_margin_in_the_negative_term():
    loss, a, d = orthonormal_proxies("proxyanchor"), 32.0, 0.1
    v = value("proxyanchor", loss, torch.eye(C, D, dtype=torch.float64), torch.arange(C))
    want = math.log1p(math.exp(-a * (1 - d))) + math.log1p(3 * math.exp(a * d))
    ok("proxyanchor", near(v, want), f"one example on each of the 4 orthonormal proxies: each "
       f"proxy's 3 negatives lie at cos 0, which still costs log(1 + 3 e^(alpha delta)) = "
       f"{math.log1p(3 * math.exp(a * d)):.6g} (the margin pushes them below -delta), the "
       f"positive terms about 0: the loss is {want:.6g}; got {v:.6g}: the negative term is "
       f"exp(alpha (cos + delta))")


def test_proxyanchor_each_proxy_sums_over_the_batch():
    loss, a, d = orthonormal_proxies("proxyanchor"), 32.0, 0.1
    v = value("proxyanchor", loss, e(0)[None], torch.tensor([0]))
    want = math.log1p(math.exp(-a * (1 - d))) + 3 * math.log1p(math.exp(a * d)) / 4
    ok("proxyanchor", near(v, want), f"one example, of class 0, on proxy 0: proxies 1 to 3 each "
       f"have it as their one negative (cos 0), log(1 + e^(alpha delta)) each, proxy 0 has none "
       f"(log 1 = 0); the negative term averages these C = 4 per-proxy terms: the loss is "
       f"{want:.6g}; got {v:.6g}: each proxy's log-sum-exp runs over the batch (dim 0), not over "
       f"the proxies")


def test_proxyanchor_the_positive_term_over_the_proxies_in_the_batch():
    loss, a, d = orthonormal_proxies("proxyanchor"), 32.0, 0.1
    v = value("proxyanchor", loss, e(C)[None], torch.tensor([0]))   # orthogonal to every proxy
    term = math.log1p(math.exp(a * d))
    want = term + 3 * term / 4
    ok("proxyanchor", near(v, want), f"one example, of class 0, orthogonal to every proxy: only "
       f"proxy 0 is in P+, so the positive term is its log(1 + e^(alpha delta)) = {term:.6g} "
       f"alone, the mean over P+ (not over all C proxies); the loss is {want:.6g}; got {v:.6g}")


def memory_of(*keys):
    """Unit keys given as (vector, label, id)."""
    vectors, labels, ids = zip(*keys)
    return torch.stack(vectors), torch.tensor(labels), torch.tensor(ids)


def test_knnbert_select_positives_by_rank():
    s = torch.tensor([[5.0, 4, 3, 2, 1, 9]])   # five positives, then a negative
    positive = torch.tensor([[True] * 5 + [False]])
    got = run("knnbert", select_positives, s, positive, 1, 2)
    picked = s[got].tolist()
    ok("knnbert", picked == [5, 2, 1], f"select_positives with positives at s = 5, 4, 3, 2, 1 "
       f"and a negative at 9, M_m = 1, M_l = 2: S(q) is the most similar positive and the two "
       f"least similar, s = [5, 2, 1]; got s = {picked}: rank < M_m from the top, or "
       f"rank >= n_pos - M_l")


def knnbert_query(keys, tau=0.07):
    """The loss of one query, e_0 of class 0 and training row 0, over the memory `keys`."""
    vectors, labels, ids = memory_of(*keys)
    return value("knnbert", make("knnbert", temperature=tau), e(0)[None], torch.tensor([0]), None,
                 vectors, labels, torch.tensor([0]), ids)


def test_knnbert_the_querys_own_older_key_is_no_positive():
    v = knnbert_query([(e(0), 0, 0), (e(1), 1, 1)])   # its own older key, and a negative
    ok("knnbert", v == 0, f"a memory holding the query's own older key (id = its row) and a "
       f"negative: the query has no positive, so it contributes nothing and the loss is 0; got "
       f"{v:.6g}: leave the query's own older keys out of P(q) (rows against key ids)")


def test_knnbert_the_querys_own_older_key_is_no_negative():
    keys = [(at_angle(0.5), 0, 1), (e(1), 1, 2)]   # a positive and a negative
    v, with_own = knnbert_query(keys), knnbert_query(keys + [(e(0), 0, 0)])
    ok("knnbert", near(v, with_own), f"adding the query's own older key (id = its row) to the "
       f"memory moved the loss from {v:.6g} to {with_own:.6g}: it is neither a positive nor a "
       f"negative (the negatives are the keys of another label)")


def test_knnbert_each_term_keeps_its_positive_in_the_denominator():
    v = knnbert_query([(e(0), 0, 1), (-e(0), 1, 2)])
    ok("knnbert", v >= 0, f"a positive on the query and a negative opposite: the loss is "
       f"-log(e^s_j / (e^s_j + sum_N e^s_i)), a probability's -log, at least 0; got {v:.6g}: "
       f"keep k_j in its own denominator, softplus(logsumexp_N(s) - s_j)")


def test_knnbert_divides_by_the_temperature():
    keys = [(e(0), 0, 1), (-e(0), 1, 2)]
    values = [knnbert_query(keys, tau) for tau in (1.0, 0.5, 0.07)]
    ok("knnbert", values[0] > values[1] > values[2], f"a positive on the query and a negative "
       f"opposite: the loss softplus(-2 / tau) must fall as tau falls (1, 0.5, 0.07); it went "
       f"{', '.join(f'{v:.4g}' for v in values)}: divide q.k by tau, do not multiply")


def test_knnbert_averages_over_the_selected_positives():
    keys = [(at_angle(0.3), 0, 1), (e(1), 1, 2)]
    v, twice = knnbert_query(keys), knnbert_query(keys + [(at_angle(0.3), 0, 3)])
    ok("knnbert", near(v, twice), f"a second copy of the query's one positive moved the loss "
       f"from {v:.6g} to {twice:.6g}: each term's denominator holds its own positive and the "
       f"negatives only, and L_sc(q) is the MEAN over S(q) (divide by |S(q)|)")


def moco_query(keys, cos_positive=1.0, tau=0.07):
    """The MoCo loss of one query, e_0 of training row 0, over the memory `keys`."""
    positive = at_angle(math.acos(cos_positive))[None]
    vectors, labels, ids = memory_of(*keys)
    return value("moco", make("moco", temperature=tau), e(0)[None], torch.tensor([0]), positive,
                 vectors, labels, torch.tensor([0]), ids)


def test_moco_the_positive_stays_in_its_denominator():
    v = moco_query([(-e(0), 0, 1), (-e(0), 0, 2), (e(1), 0, 3)])
    ok("moco", v >= 0, f"the query on its positive key, the negatives opposite or orthogonal: the "
       f"loss is -log(e^pos / (e^pos + sum_N e^neg)), a probability's -log, at least 0; got "
       f"{v:.6g}: keep the positive in the denominator, softplus(logsumexp_N - pos)")


def test_moco_the_querys_own_keys_are_no_negatives():
    keys = [(-e(0), 0, 1), (e(1), 0, 2)]
    v, with_own = moco_query(keys), moco_query(keys + [(e(0), 0, 0)])
    ok("moco", near(v, with_own), f"adding an older key of the query's own example (id = its row) "
       f"to the memory moved the loss from {v:.6g} to {with_own:.6g}: the query's own keys are "
       f"not negatives (mask them with -inf, rows against the keys' ids)")


def test_moco_the_positive_shares_the_temperature():
    half = at_angle(math.acos(0.5))
    v = moco_query([(half, 0, 1), (half, 1, 2), (half, 2, 3)], cos_positive=0.5)
    ok("moco", near(v, math.log(4)), f"the query at cosine 0.5 to its positive and to its 3 "
       f"negatives: all 4 logits are equal, so the loss is log 4 = 1.386; got {v:.6g}: divide "
       f"the positive's q.k+ by tau as well as the negatives'")


LINE = torch.tensor([[0.0], [2], [3]], dtype=torch.float64) * e(0)   # z = 0, 2 and 3 on a line


def test_mlcon_example_i_is_not_in_its_own_denominator():
    z, y = 5 * apart(2.0), torch.tensor([[1.0, 0, 0, 0]] * 2, dtype=torch.float64)  # 10 apart
    v = run("mlcon", mlcon, z, y).item()
    ok("mlcon", near(v, 0), f"two examples sharing a label, 10 apart: each is the other's only "
       f"candidate (k in g(i), k != i), p = 1, so the loss is 0; got {v:.6g}: leave example i "
       f"out of its own denominator (the diagonal at -inf before the logsumexp)")


def test_mlcon_sums_over_the_batch():
    z, y = LINE, torch.tensor([[1.0, 0, 0, 0]] * 3, dtype=torch.float64)
    one = run("mlcon", mlcon, z, y).item()
    # a second copy 10^4 away, of other labels: it adds its own rows and nothing to the first's
    two = run("mlcon", mlcon, torch.cat([z, z + e(1, 1e4)]), torch.cat([y, y.roll(2, 1)])).item()
    ok("mlcon", near(two, 2 * one), f"a batch and a copy of it 10^4 away (sharing no label with "
       f"it) must cost twice the batch alone, {2 * one:.6g}; got {two:.6g}: L_con is the SUM of "
       f"the rows over the batch, not their mean")


def test_mlcon_uses_the_unsquared_distance():
    """z = 0, 2 and 3 on a line; 0 and 1 share a label, 2 shares none (its row adds nothing)."""
    y = torch.tensor([[1.0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]], dtype=torch.float64)
    e = {d: math.exp(-d / 10) for d in (1, 2, 3)}  # tau' = 10, d the distance (not its square)
    expected = -math.log(e[2] / (e[2] + e[3])) - math.log(e[2] / (e[2] + e[1]))
    got = run("mlcon", mlcon, LINE, y)
    ok("mlcon", near(got, expected, rtol=1e-6), f"z = 0, 2, 3 on a line: got {got.item():.8g}, "
       f"expected {expected:.8g} with d the Euclidean distance, not its square")


def test_mlcon_beta_is_a_distribution_over_the_sharers():
    one = torch.tensor([[1.0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]], dtype=torch.float64)
    two = torch.tensor([[1.0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.float64)
    a, b = (run("mlcon", mlcon, LINE, y).item() for y in (one, two))
    ok("mlcon", near(a, b), f"z = 0, 2, 3 on a line, 0 and 1 each other's only label-sharer: "
       f"sharing two labels instead of one must change nothing, beta_01 = C_01 / C_01 = 1; the "
       f"loss went from {a:.6g} to {b:.6g}: divide C_ij by its row's sum, sum_k C_ik")


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
    ok("mlcon", near(v, want), f"z = 0, 1, 4 on a line, 0 and 1 sharing two labels and each one "
       f"with 2: the targets are beta_0 = beta_1 = (2/3, 1/3), beta_2 = (1/2, 1/2), so the loss "
       f"is {want:.6g}; got {v:.6g}: weigh each sharer j by C_ij, the labels it shares, not the "
       f"same for all")


def test_setfit_a_pair_of_one_class_targets_one():
    loss, x = make("setfit"), torch.stack([e(0), e(0)])   # one pair of equal vectors: cos 1
    same, other = (value("setfit", loss, x, torch.tensor(y)) for y in ([2, 2], [2, 3]))
    ok("setfit", near(same, 0.0) and near(other, 1.0), f"a pair of equal vectors gives "
       f"{same:.6g} when its texts share a class and {other:.6g} when not; expected 0 and 1: the "
       f"target is 1.0 for a pair of one class, 0.0 for two (labels[:B] == labels[B:])")


def test_setfit_pairs_the_first_half_with_the_second():
    """h = [e0, e1, e2, e0, e1, -e2], labels [0, 1, 2, 0, 1, 2]: pairs (e0, e0), (e1, e1) and
    (e2, -e2), each of one class: errors 0, 0 and (-1 - 1)^2 = 4, mean 4/3. Neighbouring rows as
    pairs, (e0, e1), (e2, e0), (e1, -e2), all at cos 0, give 1."""
    loss = make("setfit")
    h = torch.stack([e(0), e(1), e(2), e(0), e(1), -e(2)])
    got = value("setfit", loss, h, torch.tensor([0, 1, 2, 0, 1, 2]))
    hints = {1.0: "pair i is text i with text B + i (h[:B] with h[B:], u, v = h.chunk(2)), not "
                  "neighbouring rows (h[0::2], h[1::2])", 4.0: "a sum over the pairs, not the mean",
             2 / 3: "the absolute error, not its square"}
    hint = next((": " + why for v, why in hints.items() if near(got, v)), "")
    ok("setfit", near(got, 4 / 3), f"on pairs (e0, e0), (e1, e1), (e2, -e2), each of one class, "
       f"the loss is {got:.6g}, not (0 + 0 + 4) / 3{hint}")


def test_setfit_squares_the_error_and_averages_over_the_pairs():
    """Two pairs: one class at cos 0.5, two classes at cos 0.8: ((0.5 - 1)^2 + 0.8^2) / 2."""
    loss = make("setfit")
    h = torch.stack([e(0), e(0), at_angle(math.acos(0.5)), at_angle(math.acos(0.8))])
    got = value("setfit", loss, h, torch.tensor([0, 1, 0, 2]))
    want = (0.25 + 0.64) / 2
    hints = {0.89: "a sum over the pairs, not the mean", 0.445 / 2: "a mean over the 2B texts, not "
             "the B pairs", 0.65: "the absolute error, not its square"}
    hint = next((why for v, why in hints.items() if near(got, v, atol=1e-9)), "")
    ok("setfit", near(got, want), f"the loss is {got:.6g}, expected {want:.6g} (the mean over the "
       f"pairs of (cos - target)^2){': ' + hint if hint else ''}")


@pytest.mark.parametrize("name", WITH_ORACLE)
def test_matches_its_oracle(name):
    loss, oracle = make(name), oracle_of(name)
    for what, args in cases(name):
        got, want = run(name, loss, *args), oracle(*args, loss)
        agrees(name, near(got, want, atol=1e-6, rtol=1e-9), f"the loss on {what}",
               f"the literal transcription of {source(name)} ({oracle.__name__} in "
               f"tests/test_losses.py)", f": got {got.item():.8g}, it gives {want.item():.8g}")


@pytest.mark.parametrize("name", WITH_ORACLE)
def test_degenerate_inputs_are_finite(name):
    """Nothing to compare gives a finite loss and gradient, the oracle's value (often 0)."""
    loss, oracle = make(name), oracle_of(name)
    for what, args in degenerate_cases(name):
        h = args[0].clone().requires_grad_()
        value = run(name, loss, h, *args[1:])
        value.backward()
        want = oracle(*args, loss)
        ok(name, bool(torch.isfinite(value)), f"the loss on {what} is {value.item():.8g}: a mean "
           f"over no terms must be 0, not 0/0 (divide by the count clamped at 1)")
        agrees(name, near(value, want, atol=1e-9), f"the loss on {what}", f"the oracle's value",
               f": got {value.item():.8g}, expected {want.item():.8g}")
        ok(name, bool(torch.isfinite(h.grad).all()), f"the gradient on {what} is not finite "
           f"(a sqrt or a division at 0?)")
        ok(name, all(torch.isfinite(p.grad).all() for p in loss.parameters()),
           f"the gradient of the proxies on {what} is not finite")


@pytest.mark.parametrize("name", METRIC_LOSSES)
def test_gradcheck(name):
    loss, args = fixed_inputs(name)  # 6 examples
    inputs = (args[0].clone().requires_grad_(), *loss.parameters())
    passed = torch.autograd.gradcheck(lambda h, *params: run(name, loss, h, *args[1:]), inputs,
                                      raise_exception=False, fast_mode=True)
    ok(name, passed, "the gradient autograd computes is not the numerical one "
       "(torch.autograd.gradcheck): an in-place change of a tensor that autograd needs, or a "
       "value taken out of the graph (.item(), .detach())?")


def clustered(spread, seed=0):
    """Four well-separated class centres and examples around them at distance ~spread."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.eye(C, D, dtype=torch.float64) * 3
    y = torch.tensor([0, 1, 2, 3] * 3)
    return centres, centres[y] + spread * torch.randn(len(y), D, dtype=torch.float64,
                                                      generator=g), y


@pytest.mark.parametrize("name", IN_BATCH)
def test_invariant_to_batch_order(name):
    loss = make(name)
    _, h, y = clustered(1.0)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    a, b = run(name, loss, h[perm], y[perm]), run(name, loss, h, y)
    ok(name, near(a, b, atol=1e-12), f"shuffling the batch moved the loss from {b.item():.8g} "
       f"to {a.item():.8g}")


@pytest.mark.parametrize("name", IN_BATCH)
def test_falls_as_classes_separate(name):
    loss = make(name)
    with torch.no_grad():  # put the proxies (or each class's centres) at the class centres
        for p in loss.parameters():
            centres, _, _ = clustered(0)
            p.copy_(centres if p.ndim == 2 else centres[:, None, :] + 0.01 * torch.randn_like(p))
    values = [run(name, loss, *clustered(spread)[1:]).item() for spread in (3.0, 1.0, 0.3, 0.1)]
    ok(name, values == sorted(values, reverse=True) and values[-1] < values[0],
       f"the loss must fall as the classes' examples gather around their centres (spread 3, 1, "
       f"0.3, 0.1); it went {', '.join(f'{v:.4g}' for v in values)}")


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
    if table == "MULTILABEL_ORACLES":
        return loss, (h, torch.tensor(MULTI_HOT["overlapping"], dtype=torch.float64))
    K = 12
    keys = F.normalize(torch.cos(0.7 * torch.arange(K * D, dtype=torch.float64)).reshape(K, D), 1)
    batch_keys = F.normalize(torch.cos(0.9 * torch.arange(B * D, dtype=torch.float64) + 0.5)
                             .reshape(B, D), 1)
    ids = torch.arange(K) % 9  # examples 0, 1 and 2 have two keys
    return loss, (h, torch.tensor([0, 1, 2, 1, 1, 2]), batch_keys, keys, torch.arange(K) % 3,
                  torch.tensor([0, 4, 2, 7, 1, 5]), ids)


@pytest.mark.parametrize("name", [name for name in METRIC_LOSSES if part_of(name)])
def test_sanity_check(name):
    """The loss and its gradient on fixed inputs against the stored reference outputs."""
    loss, (h, *rest) = fixed_inputs(name)
    h = h.clone().requires_grad_()
    value = run(name, loss, h, *rest)
    value.backward()
    matches_reference(part_of(name), "loss", value, atol=1e-8, rtol=1e-6)
    matches_reference(part_of(name), "gradient of h", h.grad, atol=1e-8, rtol=1e-6)


# ---- each loss by hand: the cases that show one choice of its formula ----

def test_contrastive_by_hand():
    loss = make("contrastive", margin=0.5)
    # two orthogonal unit vectors are sqrt(2) apart; the third is 0.3 from the first
    angle = 2 * math.asin(0.15)
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0], [math.cos(angle), math.sin(angle)]],
                     dtype=torch.float64)
    # (0,1) similar: 1/2 * 2 = 1; (0,2) dissimilar at 0.3: 1/2 * 0.2^2 = 0.02; (1,2) far: 0
    value = run("contrastive", loss, h, torch.tensor([0, 0, 1]))
    agrees("contrastive", near(value, (1 + 0.02 + 0) / 3, atol=1e-9), "the loss on three "
           "vectors (labels 0, 0, 1)", "its value by hand", f": got {value.item():.6g}, expected "
           f"(1/2 * 2 + 1/2 * (0.5 - 0.3)^2 + 0) / 3 = 0.34 (d^2 for the similar pair, "
           f"max(0, m - d)^2 for a dissimilar one, d the distance, the mean over the 3 pairs)")


def test_contrastive_gradient_of_two_equal_vectors_is_finite():
    """Two equal rows (a sentence twice in a batch) are at distance 0, where the sqrt's gradient
    is infinite: d = sqrt(2 - 2 z_i.z_j) clamped away from 0 (1e-12), not at 0."""
    h = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
                     dtype=torch.float64, requires_grad=True)
    for labels in ([0, 0, 1], [0, 1, 1]):  # the equal pair similar, then dissimilar
        h.grad = None
        value = run("contrastive", make("contrastive"), h, torch.tensor(labels))
        value.backward()
        ok("contrastive", bool(torch.isfinite(value)) and bool(torch.isfinite(h.grad).all()),
           f"two equal vectors (labels {labels}): the loss {value.item():.6g} and the gradient "
           f"{h.grad.tolist()} must be finite; clamp 2 - 2 z_i.z_j away from 0 (min=1e-12), not "
           f"at 0, before the sqrt (its gradient at 0 is infinite)")


def test_mnrl_pairs_is_cross_entropy_over_the_other_positives():
    a, p = randn(5, D, seed=0), randn(5, D, seed=1)
    S = [[20 * F.cosine_similarity(ai, pj, dim=0) for pj in p] for ai in a]
    expected = -sum(S[i][i] - torch.log(sum(torch.exp(S[i][j]) for j in range(5)))
                    for i in range(5)) / 5
    got = run("mnrl", mnrl_pairs, a, p)
    agrees("mnrl", near(got, expected), "mnrl_pairs on 5 (anchor, positive) pairs",
           "J of Henderson et al. with S = 20 cos, written out",
           f": got {got.item():.8g}, it gives {expected.item():.8g}")


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
       f"in dimension 0) must be finite; clamp the regulariser's 2 - 2 w^s.w^t away from 0 "
       f"(min=1e-12), not at 0, before the sqrt (its gradient at 0 is infinite)")


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
    ok("knnbert", near(got, (term[0] + term[3] + term[4]) / 3, atol=1e-12),
       "one query, positives at angles 0.1 to 1.7, M_m = 1, M_l = 2: the loss must average the "
       "terms of the most similar positive and the two least similar ones")
    # key 0 is now the query's own older key (id 0 = its row): it leaves the positives, so the
    # most similar positive is key 1 and the least similar stay 3, 4
    ids[0] = 0
    got = run("knnbert", loss, *args, ids)
    ok("knnbert", near(got, (term[1] + term[3] + term[4]) / 3, atol=1e-12),
       "the query's own older key (its id is the query's row) was counted as a positive")


def test_knnbert_says_once_when_a_class_uses_every_positive(capsys):
    """A class with no more than M_m + M_l keys in memory has S(q) = P(q) (few-shot runs): one
    warning line on the first call, none after, none when every class is larger."""
    keys, _, ids = memory(12, C, 0)
    key_labels = torch.tensor([0] * 8 + [1] * 4)
    y, rows = torch.tensor([0, 1]), torch.tensor([0, 8])
    h = randn(2, D, seed=0)
    loss = make("knnbert", m_most=2, m_least=2)
    run("knnbert", loss, h, y, None, keys, key_labels, rows, ids)
    run("knnbert", loss, h, y, None, keys, key_labels, rows, ids)
    lines = capsys.readouterr().out.splitlines()
    ok("knnbert", len(lines) == 1 and "1 of 2 classes" in lines[0] and "fewest 4" in lines[0],
       f"the warning about classes using every positive, once: {lines}")
    run("knnbert", make("knnbert", m_most=2, m_least=1), h, y, None, keys, key_labels, rows, ids)
    ok("knnbert", capsys.readouterr().out == "", "a warning where no class is that small")


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
    ok("moco", near(value, expected, atol=1e-9) and value.item() < 0.01,
       f"the query on its fresh key, its older key at cosine 0.995: got {value.item():.4g}, "
       f"expected {expected.item():.4g}; with its own older key as a negative it would be about "
       f"log 2")


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
    ok("moco", value.item() < 1e-5, f"the query on its own bank entry, the others far: got "
       f"{value.item():.4g}, expected about 0 (log 2 if the positive is also a negative)")


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


@pytest.mark.parametrize("name", [*(n for n in METRIC_LOSSES if n in WITH_ORACLE
                                    and table_of(n) != "MEMORY_ORACLES"),
                                  "pair_loss mnrl", "pair_loss contrastive"])
def test_every_metric_term_runs_in_fp32_under_autocast(name):
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


# ---- SetFit's pairs (minknn/losses/setfit.py draw_pairs, minknn/engine.py PairBatches) ----

SETFIT_LABELS = [0, 1, 2, 0, 1, 0, 0, 2]   # class 0 of 4 rows, 1 and 2 of 2


def test_setfit_every_example_gets_r_positives_and_r_negatives():
    pairs = draw_pairs(SETFIT_LABELS, random.Random(0), 5)
    assert len(pairs) == 2 * 5 * len(SETFIT_LABELS), f"{len(pairs)} pairs, not R x 2 x N = 80"
    for i, y in enumerate(SETFIT_LABELS):
        partners = [b for a, b in pairs if a == i]
        positives = [b for b in partners if SETFIT_LABELS[b] == y]
        negatives = [b for b in partners if SETFIT_LABELS[b] != y]
        assert (len(positives), len(negatives)) == (5, 5), (
            f"example {i} (class {y}) heads {len(positives)} positive and {len(negatives)} "
            f"negative pairs; SetFit gives each example one of each per round, 5 rounds")


def test_setfit_positives_cover_the_class_and_negatives_the_other_classes():
    """Uniform draws over the rows, not always the first; a positive may be the example itself
    (SetFit draws it from its whole class); a class of one row pairs with itself."""
    pairs = draw_pairs(SETFIT_LABELS, random.Random(1), 200)
    for i, y in enumerate(SETFIT_LABELS):
        partners = {b for a, b in pairs if a == i}
        same = {j for j, c in enumerate(SETFIT_LABELS) if c == y}
        assert partners == set(range(len(SETFIT_LABELS))), (
            f"example {i}'s partners over 200 rounds are {sorted(partners)}: its positives must "
            f"be drawn from all of its class {sorted(same)} (itself included), its negatives from "
            f"all the other rows")
    lone = [b for a, b in draw_pairs([0, 1, 1], random.Random(0), 4) if a == 0]
    assert lone[0::2] == [0] * 4 and set(lone[1::2]) <= {1, 2}, \
        f"example 0, alone in its class, must be its own positive: its partners are {lone}"


def test_setfit_the_same_seed_draws_the_same_pairs():
    a, b = (draw_pairs(SETFIT_LABELS, random.Random(7), 4) for _ in range(2))
    assert a == b, "draw_pairs must draw only from the rng it is given"
    assert a != draw_pairs(SETFIT_LABELS, random.Random(8), 4), "another seed, the same pairs"
    with pytest.raises(MinknnError, match="one class only"):
        draw_pairs([3, 3, 3], random.Random(0), 2)


def test_setfit_batches_are_the_first_texts_then_the_second_and_resume():
    """PairBatches: each batch is its pairs' first rows then their second rows; one pass covers
    every pair once; a stream restored from its state_dict goes on with the same batches."""
    rng = random.Random(0)
    stream = PairBatches(draw_pairs(SETFIT_LABELS, rng, 3), 5, rng)  # 48 pairs: 9 batches of 5 and 3
    seen = []
    for _ in range(10):
        rows = next(stream)
        B = len(rows) // 2
        seen += list(zip(rows[:B], rows[B:]))
    assert sorted(seen) == sorted(stream.pairs), \
        "one pass of batches must hold every pair once, as (rows[k], rows[B + k])"
    state, rng_state = stream.state_dict(), stream.batches.rng.getstate()  # last.pt keeps both
    ahead = [next(stream) for _ in range(12)]   # on into the next pass, shuffled again
    rng = random.Random(0)
    again = PairBatches(draw_pairs(SETFIT_LABELS, rng, 3), 5, rng)  # a resumed run's: from the seed
    again.load_state_dict(state)
    rng.setstate(rng_state)
    assert again.pairs == stream.pairs, "a resumed run must draw the same pairs"
    assert [next(again) for _ in range(12)] == ahead, "a resumed stream must go on as it would have"


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
