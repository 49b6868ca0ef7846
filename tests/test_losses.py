"""Every metric-learning loss against a slow, literal transcription of its paper's formula (the
oracles below: plain Python loops over the examples, pairs and triplets), gradcheck, and the
properties every loss must have. A student who changed one loss runs: pytest tests/test_losses.py -k <name>
"""
import math

import pytest
import torch
import torch.nn.functional as F

from minknn.losses import LOSSES, MEMORY_LOSSES, METRIC_LOSSES, Objective, loss_kind, task_loss
from minknn.losses.contrastive import ContrastiveLoss, contrastive
from minknn.losses.knnbert import KNNBertLoss
from minknn.losses.mlcon import mlcon
from minknn.losses.mnrl import mnrl_pairs
from minknn.losses.proxynca import ProxyNCALoss
from minknn.model import Output
from minknn.moco import Queue
from minknn.tasks import TASKS

C, D = 4, 8
IN_BATCH = [name for name in METRIC_LOSSES  # called as loss(h, labels) with class indices
            if name not in MEMORY_LOSSES and loss_kind(name) == "classify"]


def unit(v):
    return v / v.norm()


def mean(terms):
    return sum(terms) / len(terms) if terms else torch.tensor(0.0, dtype=torch.float64)


# ---- oracles: the formulas as written in each file's docstring, one example at a time ----

def triplet_oracle(h, y, loss):
    z, B = [unit(v) for v in h], len(h)
    return mean([torch.clamp((z[a] - z[p]).pow(2).sum() - (z[a] - z[n]).pow(2).sum() + loss.margin, min=0)
                 for a in range(B) for p in range(B) for n in range(B) if y[a] == y[p] and a != p and y[n] != y[a]])


def npairs_oracle(h, y, loss):
    B, terms = len(h), []
    for a in range(B):
        negatives = [n for n in range(B) if y[n] != y[a]]
        for p in range(B):
            if p != a and y[p] == y[a] and negatives:
                terms.append(torch.log(1 + sum(torch.exp(h[a] @ h[n] - h[a] @ h[p]) for n in negatives)))
    return mean(terms) + loss.l2_reg * mean([v @ v for v in h])


def supcon_oracle(h, y, loss):
    z, B, t, terms = [unit(v) for v in h], len(h), loss.temperature, []
    for i in range(B):
        P = [p for p in range(B) if p != i and y[p] == y[i]]
        if P:
            denominator = sum(torch.exp(z[i] @ z[a] / t) for a in range(B) if a != i)
            terms.append(-sum(torch.log(torch.exp(z[i] @ z[p] / t) / denominator) for p in P) / len(P))
    return mean(terms)


def contrastive_oracle(h, y, loss):
    z, B, m, terms = [unit(v) for v in h], len(h), loss.margin, []
    for i in range(B):
        for j in range(i + 1, B):
            d, dissimilar = (z[i] - z[j]).norm(), float(y[i] != y[j])
            terms.append(0.5 * (1 - dissimilar) * d ** 2 + 0.5 * dissimilar * torch.clamp(m - d, min=0) ** 2)
    return mean(terms)


def mnrl_oracle(h, y, loss):
    z, B, terms = [unit(v) for v in h], len(h), []
    S = lambda i, j: loss.scale * z[i] @ z[j]
    for i in range(B):
        for p in range(B):
            if p != i and y[p] == y[i]:
                candidates = [p] + [n for n in range(B) if y[n] != y[i]]
                terms.append(-torch.log(torch.exp(S(i, p)) / sum(torch.exp(S(i, c)) for c in candidates)))
    return mean(terms)


def proxynca_oracle(h, y, loss):
    P = [unit(p) for p in loss.proxies]
    terms = []
    for x, c in zip(h, y):
        d = [(unit(x) - p).pow(2).sum() for p in P]
        terms.append(-torch.log(torch.exp(-loss.scale * d[c]) / sum(torch.exp(-loss.scale * dk) for dk in d)))
    return mean(terms)


def proxyanchor_oracle(h, y, loss):
    a, delta = loss.alpha, loss.delta
    cos = lambda x, p: unit(x) @ unit(p)
    pos, neg = [], []
    for c, p in enumerate(loss.proxies):
        X_pos = [x for x, yi in zip(h, y) if yi == c]
        X_neg = [x for x, yi in zip(h, y) if yi != c]
        if X_pos:
            pos.append(torch.log(1 + sum(torch.exp(-a * (cos(x, p) - delta)) for x in X_pos)))
        neg.append(torch.log(1 + sum((torch.exp(a * (cos(x, p) + delta)) for x in X_neg), torch.tensor(0.0, dtype=h.dtype))))
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
        terms.append(-torch.log(top / (top + sum(torch.exp(lam * S[c]) for c in range(len(W)) if c != yi))))
    R = sum(torch.sqrt(2 - 2 * W[c][s] @ W[c][t]) for c in range(len(W)) for s in range(K) for t in range(s + 1, K))
    return mean(terms) + loss.tau * R / (len(W) * K * (K - 1))


ORACLES = {"triplet": triplet_oracle, "npairs": npairs_oracle, "supcon": supcon_oracle, "contrastive": contrastive_oracle,
           "mnrl": mnrl_oracle, "proxynca": proxynca_oracle, "proxyanchor": proxyanchor_oracle, "softtriple": softtriple_oracle}


def make(name, seed=0):
    torch.manual_seed(seed)
    return METRIC_LOSSES[name](C, D).double()


BATCHES = {  # labels of the test batches: mixed, with a class seen once, with a class absent
    "mixed": [0, 1, 2, 3, 0, 1, 2, 3, 0, 1],
    "one singleton": [0, 0, 1, 1, 1, 2, 3, 3],
    "class absent": [0, 0, 1, 1, 1, 0],
}


def test_every_loss_has_an_oracle():
    missing = set(METRIC_LOSSES) - set(ORACLES) - set(MEMORY_ORACLES) - set(MULTILABEL_ORACLES)
    assert not missing, f"no oracle for {missing}: add a literal transcription of its formula to tests/test_losses.py"
    assert LOSSES == ("ce", "bce", *METRIC_LOSSES)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", IN_BATCH)
def test_matches_the_formula(name, batch):
    loss = make(name)
    y = torch.tensor(BATCHES[batch])
    for seed in range(3):
        h = torch.randn(len(y), D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        assert loss(h, y).item() == pytest.approx(ORACLES[name](h, y, loss).item(), abs=1e-6, rel=1e-9)


def test_contrastive_by_hand():
    loss = ContrastiveLoss(margin=0.5)
    # two orthogonal unit vectors are sqrt(2) apart; the third is 0.3 from the first (an angle of about 0.3 rad)
    angle = 2 * math.asin(0.15)
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0], [math.cos(angle), math.sin(angle)]], dtype=torch.float64)
    # pairs (0,1) similar: 1/2 * 2 = 1; (0,2) dissimilar at 0.3: 1/2 * 0.2^2 = 0.02; (1,2) dissimilar, far: 0
    assert loss(h, torch.tensor([0, 0, 1])).item() == pytest.approx((1 + 0.02 + 0) / 3, abs=1e-12)


def test_mnrl_pairs_is_cross_entropy_over_the_other_positives():
    torch.manual_seed(0)
    a, p = torch.randn(5, D, dtype=torch.float64), torch.randn(5, D, dtype=torch.float64)
    S = lambda i, j: 20 * F.cosine_similarity(a[i], p[j], dim=0)
    expected = -sum(S(i, i) - torch.log(sum(torch.exp(S(i, j)) for j in range(5))) for i in range(5)) / 5
    assert mnrl_pairs(a, p).item() == pytest.approx(expected.item(), abs=1e-9)


@pytest.mark.parametrize("name", IN_BATCH)
def test_gradcheck(name):
    loss = make(name)
    if name == "softtriple":  # 3 centres keep the numerical Jacobian small
        loss = METRIC_LOSSES[name](C, D, centres=3).double()
    h = torch.randn(7, D, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 0, 1, 1, 2, 3, 0])
    inputs = (h, *loss.parameters())
    assert torch.autograd.gradcheck(lambda h, *params: loss(h, y), inputs)


def clustered(spread, seed=0):
    """Four well-separated class centres and examples around them at distance ~spread."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.eye(C, D, dtype=torch.float64) * 3
    y = torch.tensor([0, 1, 2, 3] * 3)
    return centres, centres[y] + spread * torch.randn(len(y), D, dtype=torch.float64, generator=g), y


@pytest.mark.parametrize("name", IN_BATCH)
def test_falls_as_classes_separate(name):
    loss = make(name)
    with torch.no_grad():  # put the proxies (or each class's centres) at the class centres
        for p in loss.parameters():
            centres, _, _ = clustered(0)
            p.copy_(centres if p.ndim == 2 else centres[:, None, :] + 0.01 * torch.randn_like(p))
    values = [loss(*clustered(spread)[1:]).item() for spread in (3.0, 1.0, 0.3, 0.1)]
    assert values == sorted(values, reverse=True) and values[-1] < values[0], values


@pytest.mark.parametrize("name", IN_BATCH)
def test_invariant_to_batch_order(name):
    loss = make(name)
    _, h, y = clustered(1.0)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    assert loss(h[perm], y[perm]).item() == pytest.approx(loss(h, y).item(), abs=1e-12)


# In-batch losses give exactly 0 when the batch has nothing to compare (npairs: its L2 penalty alone);
# the proxy losses still compare each example with the proxies.
NOTHING_TO_COMPARE = {"every class once": [0, 1, 2, 3], "one class": [2, 2, 2, 2, 2], "one example": [1]}


@pytest.mark.parametrize("batch", NOTHING_TO_COMPARE)
@pytest.mark.parametrize("name", IN_BATCH)
def test_degenerate_batches_are_finite(name, batch):
    loss = make(name)
    y = torch.tensor(NOTHING_TO_COMPARE[batch])
    h = torch.randn(len(y), D, dtype=torch.float64, requires_grad=True)
    value = loss(h, y)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(h.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in loss.parameters())
    in_batch = name in ("triplet", "supcon", "contrastive", "mnrl")
    if name in ("triplet", "mnrl") or (name == "supcon" and batch != "one class") or (in_batch and batch == "one example"):
        assert value.item() == 0  # (supcon still pulls a one-class batch together; contrastive pushes classes apart)
    if name == "npairs":
        assert value.item() == pytest.approx(loss.l2_reg * h.detach().pow(2).sum(1).mean().item())


# ---- ProxyNCA's scale: 1 leaves the softmax almost flat, ProxyNCA++'s T = 1/9 does not ----

def test_proxynca_at_scale_1_has_a_floor():
    """d lies in [0, 4], so at s = 1 no embedding gets a term below log(1 + (C-1) e^-4): reached with
    h on its proxy and every other proxy opposite, and far above it with random proxies."""
    floor = math.log(1 + (C - 1) * math.exp(-4))
    loss = ProxyNCALoss(C, D, scale=1.0).double()
    with torch.no_grad():
        loss.proxies[1:] = -loss.proxies[0]
    on_its_proxy = loss(loss.proxies[:1].detach(), torch.tensor([0]))
    torch.testing.assert_close(on_its_proxy.item(), floor, rtol=1e-12, atol=0,
                               msg="ProxyNCA at s = 1, h on its proxy, the others opposite: not the floor")
    for seed in range(5):
        torch.manual_seed(seed)
        loss = ProxyNCALoss(C, 64, scale=1.0).double()
        perfect = loss(loss.proxies.detach(), torch.arange(C)).item()  # each h on its own proxy
        anywhere = loss(torch.randn(20, 64, dtype=torch.float64), torch.randint(0, C, (20,))).item()
        assert floor < perfect and floor < anywhere, f"seed {seed}: a ProxyNCA loss at s = 1 below the floor"
        assert perfect > 0.2, f"seed {seed}: {perfect}; nearly orthogonal proxies give log(1 + 3 e^-2) = 0.37 each"


def test_proxynca_default_is_proxynca_pp_temperature():
    """The default scale 9 is ProxyNCA++'s T = 1/9; the loss, transcribed with T written out:
    L = -1/B sum_i log( exp(-d(x_i, p_y) / T) / sum_c exp(-d(x_i, p_c) / T) ), d = ||x/|x| - p/|p|||^2."""
    T = 1 / 9
    torch.manual_seed(0)
    loss = ProxyNCALoss(C, D).double()
    h, y = torch.randn(10, D, dtype=torch.float64), torch.tensor(BATCHES["mixed"])
    terms = []
    for x, c in zip(h, y):
        d = [(unit(x) - unit(p)).pow(2).sum() for p in loss.proxies]
        terms.append(-torch.log(torch.exp(-d[c] / T) / sum(torch.exp(-dk / T) for dk in d)))
    torch.testing.assert_close(loss(h, y), sum(terms) / len(terms), rtol=1e-12, atol=1e-12,
                               msg="ProxyNCA at its default scale: differs from ProxyNCA++'s T = 1/9")
    for seed in range(5):  # each h on its own proxy, the proxies random in 64 dimensions: near 3 e^-18
        torch.manual_seed(seed)
        loss = ProxyNCALoss(C, 64).double()
        perfect = loss(loss.proxies.detach(), torch.arange(C)).item()
        assert perfect < 1e-4, f"seed {seed}: at the default scale a perfectly placed example still costs {perfect}"


def test_objective_mixes_ce_and_metric():
    torch.manual_seed(0)
    logits, h, y = torch.randn(6, C), torch.randn(6, D), torch.tensor([0, 1, 0, 1, 2, 2])
    out = Output(logits=logits, embeddings=h)
    ce = F.cross_entropy(logits, y)
    metric = Objective("supcon", C, D).metric(h, y)
    assert Objective("ce", C, D)(out, y)[0] == ce
    assert Objective("supcon", C, D, lam=0)(out, y)[0] == ce
    assert Objective("supcon", C, D, lam=1)(out, y)[0] == metric
    total, parts = Objective("supcon", C, D, lam=0.25)(out, y)
    assert total.item() == pytest.approx(0.75 * ce.item() + 0.25 * metric.item())
    assert parts == {"ce": ce, "metric": metric}
    assert Objective("supcon", C, D).lam == 0.1 and Objective("proxyanchor", C, D).lam == 0.5


# ---- the memory losses (knnbert, moco): the query batch against a labelled memory of keys ----
# Each key carries the training-set row of its example (ids); rows are the batch's rows. A key
# whose id is a query's own row is that query's older key: neither a negative nor a positive.

def knnbert_oracle(h, y, rows, keys, key_labels, ids, loss):
    """KNN-BERT eq. 3, one query and one positive at a time; S(q) by sorting the positives."""
    per_query = []
    for i in range(len(h)):
        q = unit(h[i])
        s = [q @ k / loss.tau for k in keys]
        positives = [j for j in range(len(keys)) if key_labels[j] == y[i] and ids[j] != rows[i]]
        negatives = [j for j in range(len(keys)) if key_labels[j] != y[i]]
        if not positives:
            continue  # no positive in memory: this query contributes nothing
        ranked = sorted(positives, key=lambda j: -s[j].item())
        if len(ranked) <= loss.m_most + loss.m_least:
            selected = ranked
        else:
            selected = ranked[:loss.m_most] + ranked[len(ranked) - loss.m_least:]
        terms = [-torch.log(torch.exp(s[j]) / (torch.exp(s[j]) + sum(torch.exp(s[n]) for n in negatives)))
                 for j in selected]
        per_query.append(sum(terms) / len(terms))
    return mean(per_query)


def moco_oracle(h, y, rows, batch_keys, keys, ids, loss):
    """MoCo eq. 1: the query's own key against every key in memory but its own example's."""
    terms = []
    for i in range(len(h)):
        q = unit(h[i])
        positive = torch.exp(q @ batch_keys[i] / loss.tau)
        negatives = sum(torch.exp(q @ keys[j] / loss.tau) for j in range(len(keys)) if ids[j] != rows[i])
        terms.append(-torch.log(positive / (positive + negatives)))
    return mean(terms)


def wu_oracle(h, rows, bank, loss):
    """Wu et al. 2018 eq. 2, -log P(i | f_i), P(i | f) = exp(v_i.f / tau) / sum_{j=1..n} exp(v_j.f / tau):
    the memory bank's entry v_i once in the sum, every other entry a negative."""
    terms = []
    for i, row in enumerate(rows):
        f = unit(h[i])
        terms.append(-torch.log(torch.exp(bank[row] @ f / loss.tau) / sum(torch.exp(v @ f / loss.tau) for v in bank)))
    return mean(terms)


MEMORY_ORACLES = {"knnbert": knnbert_oracle, "moco": moco_oracle}


def memory(n, classes, seed, n_examples=None):
    """n unit keys, their labels, and their examples' ids: rows of a training set of n_examples
    (default n: each example once, as after the fill); fewer rows than keys repeat some examples."""
    g = torch.Generator().manual_seed(seed)
    keys = F.normalize(torch.randn(n, D, dtype=torch.float64, generator=g), dim=1)
    ids = torch.randperm(n, generator=g) % (n_examples or n)
    return keys, torch.randint(0, classes, (n,), generator=g), ids


@pytest.mark.parametrize("m_most, m_least", [(2, 3), (1, 0), (0, 2), (50, 100)])
@pytest.mark.parametrize("seed", range(3))
def test_knnbert_matches_equation_3(m_most, m_least, seed):
    loss = KNNBertLoss(m_most=m_most, m_least=m_least, tau=0.5)  # a mild tau keeps exp() in float64 range
    keys, key_labels, ids = memory(30, C - 1, seed, n_examples=20)  # class C - 1 has no key: its queries have no positive
    y, rows = torch.tensor([0, 1, 2, 3, 0, 3, 1]), torch.tensor([0, 5, 9, 11, 19, 3, 7])
    key_labels[ids == 5] = 1  # query 1's own keys are of its class (older keys of the same example)
    h = torch.randn(len(y), D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 10))
    expected = knnbert_oracle(h, y, rows, keys, key_labels, ids, loss)
    torch.testing.assert_close(loss(h, y, None, keys, key_labels, rows, ids), expected, atol=1e-9, rtol=0,
                               msg=f"knnbert (M_m={m_most}, M_l={m_least}) differs from eq. 3")


def test_knnbert_selects_the_most_and_least_similar_positives_by_hand():
    # one query along e0; five positives at decreasing similarity, one negative
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    angles = torch.tensor([0.1, 0.5, 0.9, 1.3, 1.7, 2.5], dtype=torch.float64)
    keys = torch.stack([angles.cos(), angles.sin()], 1)
    key_labels, ids = torch.tensor([0, 0, 0, 0, 0, 1]), torch.arange(1, 7)
    loss = KNNBertLoss(m_most=1, m_least=2, tau=1.0)
    s = keys @ q[0]
    term = lambda j: -(s[j] - torch.log(torch.exp(s[j]) + torch.exp(s[5])))
    expected = (term(0) + term(3) + term(4)) / 3  # the most similar (0) and the two least similar (3, 4)
    torch.testing.assert_close(loss(q, torch.tensor([0]), None, keys, key_labels, torch.tensor([0]), ids),
                               expected, atol=1e-12, rtol=0)
    # the same memory where key 0 is the query's own older key (id 0 = its row): it leaves the
    # positives, so the most similar positive is now key 1 and the least similar stay 3, 4
    ids[0] = 0
    torch.testing.assert_close(loss(q, torch.tensor([0]), None, keys, key_labels, torch.tensor([0]), ids),
                               (term(1) + term(3) + term(4)) / 3, atol=1e-12, rtol=0,
                               msg="knnbert must not count the query's own older key as a positive")


@pytest.mark.parametrize("seed", range(3))
def test_moco_matches_its_formula(seed):
    loss = METRIC_LOSSES["moco"](tau=0.5)
    keys, key_labels, ids = memory(20, C, seed, n_examples=12)  # some examples have two keys in memory
    y, rows = torch.tensor([0, 1, 2, 3, 0]), torch.tensor([0, 3, 5, 11, 7])
    g = torch.Generator().manual_seed(seed + 10)
    h = torch.randn(len(y), D, dtype=torch.float64, generator=g)
    batch_keys = F.normalize(torch.randn(len(y), D, dtype=torch.float64, generator=g), dim=1)
    expected = moco_oracle(h, y, rows, batch_keys, keys, ids, loss)
    torch.testing.assert_close(loss(h, y, batch_keys, keys, key_labels, rows, ids), expected, atol=1e-9, rtol=0,
                               msg="moco differs from eq. 1 with the query's own keys left out")


def test_moco_leaves_the_querys_own_older_key_out_of_its_negatives():
    # the queue holds the whole training set: 4 examples, the query is example 2, its older key
    # (id 2) sits at cosine 0.995 to its fresh key
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    fresh = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    angles = torch.tensor([2.0, 2.5, math.acos(0.995), 3.0], dtype=torch.float64)
    keys, ids = torch.stack([angles.cos(), angles.sin()], 1), torch.tensor([0, 1, 2, 3])
    loss = METRIC_LOSSES["moco"](tau=0.07)
    value = loss(q, torch.tensor([0]), fresh, keys, torch.zeros(4, dtype=torch.long), torch.tensor([2]), ids)
    s = keys[[0, 1, 3]] @ q[0] / 0.07
    expected = torch.log1p(torch.exp(s - 1 / 0.07).sum())  # -log(e^{1/tau} / (e^{1/tau} + sum over ids 0, 1, 3))
    torch.testing.assert_close(value, expected, msg="the query's own older key counted as a negative")
    assert value.item() < 0.01  # with its own key as a negative it would be about log 2


@pytest.mark.parametrize("seed", range(3))
def test_moco_over_a_memory_bank_is_wu_et_al_softmax(seed):
    """--memory bank: the positive is the example's own bank entry v_i; it appears once in the
    denominator, as in Wu et al.'s P(i | f_i), never again as a negative."""
    loss = METRIC_LOSSES["moco"](tau=0.5)
    bank, bank_labels, _ = memory(10, C, seed)
    ids = torch.arange(10)  # MemoryBank: entry i is example i
    rows = torch.tensor([4, 0, 9])
    h = torch.randn(3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 10))
    value = loss(h, None, bank[rows], bank, bank_labels, rows, ids)  # as MoCo.batch_keys gives them
    torch.testing.assert_close(value, wu_oracle(h, rows, bank, loss), atol=1e-9, rtol=0,
                               msg="moco over the bank differs from Wu et al. eq. 2")


def test_moco_over_a_memory_bank_can_fall_below_log_2():
    # the query on its own entry, the others far away: Wu et al.'s loss is near 0; with the
    # positive counted twice it could never go below log 2
    bank = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    rows = torch.tensor([0])
    value = METRIC_LOSSES["moco"](tau=0.07)(bank[:1], None, bank[rows], bank, torch.zeros(4), rows, torch.arange(4))
    torch.testing.assert_close(value, wu_oracle(bank[:1], rows, bank, METRIC_LOSSES["moco"](tau=0.07)))
    assert value.item() < 1e-5 < math.log(2)


@pytest.mark.parametrize("name", MEMORY_LOSSES)
def test_memory_losses_gradcheck(name):
    loss = METRIC_LOSSES[name](tau=0.5) if name == "moco" else KNNBertLoss(m_most=2, m_least=2, tau=0.5)
    keys, key_labels, ids = memory(15, C, 0)
    y, rows = torch.tensor([0, 1, 2, 3, 1]), torch.tensor([0, 1, 2, 3, 4])
    batch_keys = F.normalize(torch.randn(len(y), D, dtype=torch.float64), dim=1)
    h = torch.randn(len(y), D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: loss(h, y, batch_keys, keys, key_labels, rows, ids), (h,))


@pytest.mark.parametrize("case", ["no query has a positive", "no negatives in memory", "only its own key"])
def test_memory_losses_degenerate_memories_are_finite(case):
    keys, _, ids = memory(6, C, 0)
    y, rows = (torch.tensor([0, 1, 0]) if case == "no query has a positive" else torch.tensor([2, 2, 2])), torch.tensor([0, 1, 2])
    key_labels = torch.full((6,), 3) if case == "no query has a positive" else torch.full((6,), 2)
    if case == "only its own key":  # a memory of one key, query 0's own: no positive, no negative
        keys, key_labels, ids = keys[:1], key_labels[:1], torch.tensor([0])
    h = torch.randn(3, D, dtype=torch.float64, requires_grad=True)
    value = KNNBertLoss(tau=0.07)(h, y, None, keys, key_labels, rows, ids)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(h.grad).all()
    if case == "no negatives in memory":  # with no negative each term is -log(e^s / e^s) = 0
        assert value.item() == pytest.approx(0, abs=1e-12)
    else:
        assert value.item() == 0
    h.grad = None
    value = METRIC_LOSSES["moco"](tau=0.07)(h, y, F.normalize(h.detach(), dim=1), keys, key_labels, rows, ids)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(h.grad).all()


def test_knnbert_says_once_when_a_class_uses_every_positive(capsys):
    """A class with no more than M_m + M_l keys in memory has S(q) = P(q) (few-shot runs): one
    warning line on the first call, none after, none when every class is larger."""
    keys, _, ids = memory(12, C, 0)
    key_labels, y, rows = torch.tensor([0] * 8 + [1] * 4), torch.tensor([0, 1]), torch.tensor([0, 8])
    h = torch.randn(2, D, dtype=torch.float64)
    loss = KNNBertLoss(m_most=2, m_least=2)
    loss(h, y, None, keys, key_labels, rows, ids)
    loss(h, y, None, keys, key_labels, rows, ids)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "1 of 2 classes" in lines[0] and "fewest 4" in lines[0], lines
    KNNBertLoss(m_most=2, m_least=1)(h, y, None, keys, key_labels, rows, ids)
    assert capsys.readouterr().out == ""


def test_objective_passes_the_memory_and_runs_outside_autocast():
    torch.manual_seed(0)
    queue = Queue(12, D)
    queue.fill(torch.randn(12, D), torch.arange(12) % C, torch.arange(12))
    out, y = Output(logits=torch.randn(4, C), embeddings=torch.randn(4, D)), torch.tensor([0, 1, 2, 3])
    rows = torch.tensor([0, 5, 6, 11])  # each query's own older key is in the queue
    objective = Objective("knnbert", C, D, m_most=1, m_least=1)
    assert (objective.metric.m_most, objective.metric.m_least, objective.lam) == (1, 1, 0.1)
    total, parts = objective(out, y, None, queue, rows)
    expected = knnbert_oracle(out.embeddings.double(), y, rows, queue.keys.double(), queue.labels, queue.ids,
                              objective.metric)
    assert parts["metric"].item() == pytest.approx(expected.item(), rel=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 autocast must not reach q.k / tau
        assert objective(out, y, None, queue, rows)[1]["metric"].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("name", [*IN_BATCH, "mlcon", "pair_loss mnrl", "pair_loss contrastive"])
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
        labels = F.one_hot(labels, C).float() if name == "mlcon" else labels
    out = Output(logits=torch.randn(6, 2 if name.startswith("pair_loss") else C), embeddings=h)
    fp32 = objective(out, labels)[1]["metric"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = objective(out, labels)[1]["metric"]
    torch.testing.assert_close(bf16, fp32, rtol=1e-6, atol=1e-6, msg=f"{name}: the metric term under bf16 autocast")

# ---- the multi-label contrastive loss (Su et al. eqs. 2-3): pairs weighted by the labels they share ----


def mlcon_oracle(h, y, loss):
    """L_con = sum_i sum_{j != i} -beta_ij log( exp(-d_ij / tau) / sum_{k != i} exp(-d_ik / tau) ),
    beta_ij = C_ij / sum_{k != i} C_ik, C_ij = y_i . y_j; a row with no shared label adds 0."""
    B, tau, total = len(h), loss.tau, torch.tensor(0.0, dtype=h.dtype)
    d = lambda i, j: (h[i] - h[j]).pow(2).sum().sqrt()
    for i in range(B):
        shared = {j: float(y[i] @ y[j]) for j in range(B) if j != i}
        if sum(shared.values()) == 0:
            continue
        denominator = sum(torch.exp(-d(i, k) / tau) for k in range(B) if k != i)
        for j, c in shared.items():
            total = total - c / sum(shared.values()) * torch.log(torch.exp(-d(i, j) / tau) / denominator)
    return total


MULTILABEL_ORACLES = {"mlcon": mlcon_oracle}
MULTI_HOT = {  # rows of label sets over C = 4 classes
    "overlapping": [[1, 1, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 1]],
    "one shares no label": [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]],  # the last is alone
    "an all-zero row": [[1, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 1, 0]],
    "no pair shares a label": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]],
}


@pytest.mark.parametrize("batch", MULTI_HOT)
def test_mlcon_matches_the_formula(batch):
    loss = METRIC_LOSSES["mlcon"](C, D)
    y = torch.tensor(MULTI_HOT[batch], dtype=torch.float64)
    for seed in range(3):
        h = 3 * torch.randn(len(y), D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(loss(h, y), mlcon_oracle(h, y, loss), rtol=1e-9, atol=1e-9,
                                   msg=f"mlcon on the '{batch}' batch: differs from eqs. 2-3 transcribed")
    if batch == "no pair shares a label":
        assert loss(h, y).item() == 0  # every beta row is 0/0, taken as 0


@pytest.mark.parametrize("batch", MULTI_HOT)
def test_mlcon_gradcheck(batch):
    y = torch.tensor(MULTI_HOT[batch], dtype=torch.float64)
    h = torch.randn(len(y), D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: mlcon(h, y, tau=10.0), (h,))


def test_mlcon_weighs_a_pair_by_its_shared_labels():
    """beta: i = 0 shares 2 labels with j = 1 and 1 with j = 2, so its target is (2/3, 1/3) on them."""
    y = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float64)
    h = torch.zeros(4, 2, dtype=torch.float64)  # all distances 0: softmax uniform over the 3 others
    # rows 0 and 1: targets (2/3, 1/3) and log(1/3) each: -log(1/3) per row; row 2: the same; row 3 shares nothing
    assert mlcon(h, y).item() == pytest.approx(3 * math.log(3), abs=1e-6)
    assert mlcon(h[:1], y[:1]).item() == 0  # one example: no pair


def test_mlcon_falls_as_label_sharers_come_together():
    y = torch.tensor([[1, 0, 0, 0]] * 3 + [[0, 1, 0, 0]] * 3 + [[0, 0, 1, 1]] * 3, dtype=torch.float64)
    centres = torch.eye(3, D, dtype=torch.float64) * 30
    g = torch.Generator().manual_seed(0)
    h = lambda spread: centres.repeat_interleave(3, 0) + spread * torch.randn(9, D, dtype=torch.float64, generator=g)
    values = [mlcon(h(s), y).item() for s in (30.0, 10.0, 3.0, 1.0)]
    assert values == sorted(values, reverse=True), values


def test_multilabel_objective_adds_gamma_mlcon_to_an_unweighted_bce():
    """Su et al.: L = BCE + gamma L_con (not (1 - gamma) BCE + gamma L_con)."""
    torch.manual_seed(0)
    logits, h = torch.randn(4, C), torch.randn(4, D)
    y = torch.tensor(MULTI_HOT["one shares no label"], dtype=torch.float)
    out = Output(logits=logits, embeddings=h)
    bce = F.binary_cross_entropy_with_logits(logits, y)
    total, parts = Objective("mlcon", C, D)(out, y)
    torch.testing.assert_close(total, bce + 0.1 * mlcon(h, y), msg="mlcon objective: BCE + 0.1 L_con")
    assert set(parts) == {"bce", "metric"} and Objective("mlcon", C, D).lam == 0.1
    torch.testing.assert_close(Objective("bce", C, D)(out, y)[0], bce, msg="--loss bce: BCE alone")


# ---- each kind's loss, as train.py builds it per task (task_loss) ----

def test_task_losses_follow_their_formulas():
    torch.manual_seed(0)
    score, gold = torch.rand(6) * 5, torch.rand(6) * 5
    for sts_loss, reduce in (("mse", lambda d: d.pow(2).mean()), ("l1", lambda d: d.abs().mean())):
        loss = task_loss(TASKS["sts"], D, {"sts_loss": sts_loss})
        torch.testing.assert_close(loss(Output(logits=score, embeddings=None), gold)[0], reduce(score - gold),
                                   msg=f"sts --sts_loss {sts_loss}")
    # a paraphrase task is 2-class classification: cross-entropy over two logits
    logits, labels = torch.randn(6, 2), torch.tensor([1, 0, 1, 1, 0, 1])
    u, v = torch.randn(6, D), torch.randn(6, D)
    out = Output(logits=logits, embeddings=torch.cat([u, v]))  # siamese: the 6 first texts, then the 6 second
    ce = F.cross_entropy(logits, labels)
    torch.testing.assert_close(task_loss(TASKS["mrpc"], D, {"loss": "supcon"}, siamese=True)(out, labels)[0], ce,
                               msg="a siamese pair task gets CE: --loss needs one vector per example")
    d = (F.normalize(u, dim=-1) - F.normalize(v, dim=-1)).norm(dim=-1)
    with_contrastive = task_loss(TASKS["mrpc"], D, {"pair_loss": "contrastive"}, siamese=True)  # lam 0.1, margin 0.5
    torch.testing.assert_close(with_contrastive(out, labels)[0], 0.9 * ce + 0.1 * contrastive(d, 1 - labels, 0.5).mean(),
                               msg="--pair_loss contrastive: non-paraphrases (label 0) are the dissimilar pairs")
    with_mnrl = task_loss(TASKS["mrpc"], D, {"pair_loss": "mnrl", "lam": 0.3}, siamese=True)
    positive = labels == 1
    torch.testing.assert_close(with_mnrl(out, labels)[0], 0.7 * ce + 0.3 * mnrl_pairs(u[positive], v[positive], 20.0),
                               msg="--pair_loss mnrl: over the paraphrase pairs")
    assert torch.isfinite(with_mnrl(out, torch.zeros_like(labels))[0])  # no paraphrase in the batch
    # a loss of another kind leaves a task its kind's base loss
    assert task_loss(TASKS["reuters"], D, {"loss": "supcon"}).metric is None
    assert task_loss(TASKS["sst"], D, {"loss": "mlcon"}).metric is None
    assert task_loss(TASKS["rte"], D, {"loss": "knnbert", "m_most": 3, "m_least": 2}).metric.m_most == 3


def test_a_multilabel_task_under_another_kinds_loss_keeps_bce():
    """In a run mixing kinds, --loss supcon reaches the classification tasks; a multi-label task
    keeps BCE (cross-entropy would silently read its multi-hot rows as soft labels)."""
    torch.manual_seed(0)
    logits, h = torch.randn(4, 90), torch.randn(4, 8)
    y = torch.zeros(4, 90)
    y[[0, 1, 2, 3], [0, 5, 5, 7]] = 1
    total, _ = task_loss(TASKS["reuters"], 8, {"loss": "supcon"})(Output(logits=logits, embeddings=h), y)
    torch.testing.assert_close(total, F.binary_cross_entropy_with_logits(logits, y),
                               msg="reuters under --loss supcon (a multitask run): BCE alone")


def test_bce_is_the_mean_over_every_cell():
    logits = torch.tensor([[2.0, -1.0, 0.0], [0.5, 0.5, -3.0]])
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    p = torch.sigmoid(logits)
    expected = -(y * p.log() + (1 - y) * (1 - p).log()).mean()  # over the 2 x 3 (example, class) cells
    got = Objective("bce", 3, D)(Output(logits=logits, embeddings=None), y)[0]
    torch.testing.assert_close(got, expected, msg="--loss bce: the mean over every (example, class) cell")
    assert METRIC_LOSSES["mlcon"]().tau == 10.0 and METRIC_LOSSES["mlcon"].lam == 0.1, "Su et al.: tau' 10, gamma 0.1"


def test_mlcon_by_hand_sums_over_the_batch():
    """Three examples sharing one label, all at distance 0: each row is -log(1/2) (its two others
    equally likely); the batch's loss is their sum, 3 log 2, not their mean."""
    y = torch.tensor([[1.0, 0.0]] * 3, dtype=torch.float64)
    assert mlcon(torch.zeros(3, 2, dtype=torch.float64), y).item() == pytest.approx(3 * math.log(2), abs=1e-6)


def test_mlcon_by_hand_uses_the_unsquared_distance():
    """z = 0, 2 and 3 on a line; 0 and 1 share a label, 2 shares none (its row adds nothing)."""
    z = torch.tensor([[0.0], [2.0], [3.0]], dtype=torch.float64)
    y = torch.tensor([[1.0], [1.0], [0.0]], dtype=torch.float64)
    e = lambda d: math.exp(-d / 10)  # tau' = 10, d the Euclidean distance (not its square)
    expected = -math.log(e(2) / (e(2) + e(3))) - math.log(e(2) / (e(2) + e(1)))
    assert mlcon(z, y).item() == pytest.approx(expected, abs=1e-9)
