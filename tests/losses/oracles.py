"""The oracles: a slow, literal transcription of each metric-learning loss's formula, as its file's
docstring writes it (plain Python loops over the examples, pairs and triplets, one at a time).
Every loss is compared with its oracle (check_matches_its_oracle in tests/losses/checks.py), which
its own test file, tests/losses/test_<loss>.py, runs.

An oracle sits in the table of how its loss is called: ORACLES (a loss called as loss(h, labels)),
MEMORY_ORACLES (a loss over the MoCo memory), MULTILABEL_ORACLES (multi-hot labels) or
PAIR_ORACLES (a loss of pair batches: setfit) or TRIPLET_ORACLES (triplets anchored at a class's
statement: ancsetfit). A loss registered in METRIC_LOSSES
(minknn/losses/__init__.py) fails tests/losses/test_objective.py until its oracle is here and
tests/losses/test_<loss>.py runs the checks every loss goes through.
"""
import torch

from minknn.losses import METRIC_LOSSES, loss_kind


def unit(v):
    return v / v.norm()


def units(h, how=True):
    """The rows of h as the formula normalises them (True: each vector, v / ||v||), or another
    reading: False, as they are; "columns", each feature over the batch (dim 0)."""
    if how == "columns":
        return list(h / h.norm(dim=0, keepdim=True))
    return [unit(v) for v in h] if how else list(h)


def by(x, t, how):
    """x / t, as the formulas divide by a temperature; or another reading: "times" x t, "none" x."""
    return x / t if how == "divided" else x * t if how == "times" else x


def mean(terms):
    return sum(terms) / len(terms) if terms else torch.tensor(0.0, dtype=torch.float64)


# ---- the oracles: each file's docstring formula, one example at a time ----
# Each takes keyword-only readings (defaults: the formula itself), the other ways its steps can be
# read; READINGS below names them, for checks.readings_that_fit.

def reduce(terms, how, cells=None, batch=None):
    """The mean of the terms (the formulas' 1/|T| sum), or: "sum" their sum, "nonzero" the mean
    over the nonzero ones, "cells" the sum divided by the count of every cell the terms were
    picked from (valid or not), "batch" the sum divided by the batch size."""
    total = sum(terms, torch.tensor(0.0, dtype=torch.float64))
    if how == "sum":
        return total
    if how == "nonzero":
        return mean([t for t in terms if t != 0])
    if how in ("cells", "batch"):
        return total / (cells if how == "cells" else batch)
    return mean(terms)


def triplet_oracle(h, y, loss, *, normalise=True, squared=True, hinge=True, swap=False,
                   self_positive=False, margin_outside=False, reduction="mean"):
    z, B, m = units(h, normalise), len(h), loss.margin
    d = [[(zi - zj).pow(2).sum() ** (1 if squared else 0.5) for zj in z] for zi in z]
    terms = []
    for a in range(B):
        for p in range(B):
            for n in range(B):
                if y[a] == y[p] and (a != p or self_positive) and y[n] != y[a]:
                    gap = d[a][n] - d[a][p] if swap else d[a][p] - d[a][n]
                    terms.append(torch.clamp(gap, min=0) + m if margin_outside else
                                 torch.clamp(gap + m, min=0) if hinge else gap + m)
    return reduce(terms, reduction, B ** 3, B)


def npairs_oracle(h, y, loss, *, cosine=False, one_plus=True, negatives="others",
                  ordered=True, reduction="mean", penalty="mean squared", empty_penalty=True):
    f, B, terms = units(h, cosine), len(h), []
    for a in range(B):
        neg = [n for n in range(B) if (y[n] != y[a] if negatives == "others" else n != a)]
        for p in range(B):
            if p != a and y[p] == y[a] and neg and (ordered or a < p):
                s = sum(torch.exp(f[a] @ f[n] - f[a] @ f[p]) for n in neg)
                terms.append(torch.log(1 + s if one_plus else s))
    norms = [v @ v if "squared" in penalty else v.norm() for v in h]
    reg = 0 if penalty == "none" else sum(norms) if "sum" in penalty else mean(norms)
    if not terms and not empty_penalty:
        return torch.tensor(0.0, dtype=torch.float64)
    return reduce(terms, reduction, B * B, B) + loss.l2_reg * reg


def supcon_oracle(h, y, loss, *, normalise=True, tau="divided", self_in_denominator=False,
                  self_positive=False, denominator="all", positives="mean", anchors="with",
                  reduction="mean"):
    z, B, t, terms = units(h, normalise), len(h), loss.temperature, []

    def s(i, j):
        return by(z[i] @ z[j], t, tau)
    for i in range(B):
        P = [p for p in range(B) if (p != i or self_positive) and y[p] == y[i]]
        A = [a for a in range(B) if (a != i or self_in_denominator)
             and (denominator == "all" or y[a] != y[i])]
        if P:
            denominator_ = sum(torch.exp(s(i, a)) for a in A)
            if positives == "log of mean":  # Khosla et al.'s L_in
                terms.append(-torch.log(sum(torch.exp(s(i, p)) for p in P) / len(P)
                                        / denominator_))
                continue
            total = -sum(torch.log(torch.exp(s(i, p)) / denominator_) for p in P)
            terms.append(total if positives == "sum" else total / len(P))
        elif anchors == "all":
            terms.append(torch.tensor(0.0, dtype=torch.float64))
    return reduce(terms, reduction)


def contrastive_oracle(h, y, loss, *, normalise=True, squared_d=False, hinge_squared=True,
                       halves=True, hinge=True, swap=False, self_pairs=False, reduction="mean"):
    z, B, m, terms = units(h, normalise), len(h), loss.margin, []
    for i in range(B):
        for j in range(i if self_pairs else i + 1, B):
            d = (z[i] - z[j]).norm() ** (2 if squared_d else 1)
            dissimilar = float(y[i] != y[j])
            pull, push = 1 - dissimilar, dissimilar
            if swap:
                pull, push = push, pull
            gap = torch.clamp(m - d, min=0) if hinge else m - d
            terms.append((0.5 if halves else 1.0) * (pull * d ** 2 + push * gap ** (
                2 if hinge_squared else 1)))
    return reduce(terms, reduction, batch=B)


def mnrl_oracle(h, y, loss, *, scale="times", cosine=True, same_class_negatives=False,
                self_pairs=False, reduction="mean"):
    z, B, terms = units(h, cosine), len(h), {}
    c = {"times": loss.scale, "none": 1.0, "divided": 1 / loss.scale}[scale]
    S = [[c * zi @ zj for zj in z] for zi in z]   # S[i][j] = scale cos(x_i, x_j)
    for i in range(B):
        for p in range(B):
            if (p != i or self_pairs) and y[p] == y[i]:
                candidates = [p] + [n for n in range(B) if (y[n] != y[i] if not
                                                            same_class_negatives else n != p)]
                terms.setdefault(i, []).append(-torch.log(
                    torch.exp(S[i][p]) / sum(torch.exp(S[i][c]) for c in candidates)))
    if reduction == "anchors":  # each anchor's mean over its positives, then over the anchors
        return mean([mean(t) for t in terms.values()])
    return reduce([t for ts in terms.values() for t in ts], reduction, batch=B)


def proxynca_oracle(h, y, loss, *, sign=-1, normalise=True, normalise_proxies=True, scale=True,
                    squared=True, positive_in_denominator=True, log_softmax=True,
                    reduction="mean"):
    P = units(loss.proxies, normalise_proxies)
    s, terms = (loss.scale if scale else 1.0), []
    for x, c in zip(units(h, normalise), y):
        d = [(x - p).pow(2).sum() ** (1 if squared else 0.5) for p in P]
        logits = [sign * s * dk for dk in d]
        if not log_softmax:
            terms.append(-logits[c])
            continue
        others = sum(torch.exp(lk) for k, lk in enumerate(logits)
                     if positive_in_denominator or k != c)
        terms.append(-torch.log(torch.exp(logits[c]) / others))
    return reduce(terms, reduction)


def proxyanchor_oracle(h, y, loss, *, normalise=True, normalise_proxies=True, positive_margin=-1,
                       negative_margin=1, positive_over="P+", negative_over="P",
                       negatives="others", one_plus=True, reduction="mean", scale="inside",
                       positive_sign=-1, detached=None):
    a, delta = (1.0 if scale in ("none", "outside") else loss.scale), loss.delta
    outside = loss.scale if scale == "outside" else 1.0
    pos, neg, z = [], [], units(h, normalise)
    for c, p in enumerate(units(loss.proxies, normalise_proxies)):
        X_pos = [x for x, yi in zip(z, y) if yi == c]
        X_neg = [x for x, yi in zip(z, y) if yi != c or negatives == "all"]
        one = 1 if one_plus else 0
        if X_pos or positive_over == "P":
            pos.append(outside * torch.log(one + sum((torch.exp(
                positive_sign * a * (x @ p + positive_margin * delta)) for x in X_pos),
                torch.tensor(0.0, dtype=h.dtype))))
        if X_pos or negative_over == "P":
            neg.append(outside * torch.log(1 + sum((torch.exp(
                a * (x @ p + negative_margin * delta)) for x in X_neg),
                torch.tensor(0.0, dtype=h.dtype))))
    pos, neg = reduce(pos, reduction), reduce(neg, reduction)
    return (pos.detach() if detached == "positive" else pos) + (
        neg.detach() if detached == "negative" else neg)


def softtriple_oracle(h, y, loss, *, normalise=True, weights_over="centres", gamma_="divided",
                      hard=False, reduction="mean",
                      normalise_centres=True, regulariser="normalised", squared=False,
                      pairs="ordered", margin="inside", margin_sign=-1):
    W = [units(centres, normalise_centres) for centres in loss.centres]
    C, K, lam, gamma, delta = len(W), len(W[0]), loss.scale, loss.gamma, loss.delta
    terms = []
    for x, yi in zip(units(h, normalise), y):
        sims = [[x @ w for w in W[c]] for c in range(C)]   # sims[c][k] = x.w_c^k
        e = [[torch.exp(by(v, gamma, gamma_)) for v in row] for row in sims]
        S = []
        for c in range(C):
            if hard:
                S.append(max(sims[c], key=lambda v: v.item()))
            elif weights_over == "classes":  # for each centre k, a softmax over the classes
                S.append(sum(e[c][k] / sum(e[d][k] for d in range(C)) * sims[c][k]
                             for k in range(K)))
            else:  # a softmax over class c's K centres
                S.append(sum(e[c][k] / sum(e[c]) * sims[c][k] for k in range(K)))
        m = [margin_sign * delta if c == yi else 0.0 for c in range(C)]
        logits = [lam * S[c] + m[c] if margin == "outside" else lam * (S[c] + m[c])
                  for c in range(C)]
        terms.append(-torch.log(torch.exp(logits[yi]) / sum(torch.exp(v) for v in logits)))
    if regulariser == "none":
        return reduce(terms, reduction)
    V = W if regulariser == "normalised" else [list(centres) for centres in loss.centres]
    R = sum(((V[c][s] - V[c][t]).pow(2).sum()) ** (1 if squared else 0.5)
            for c in range(C) for s in range(K) for t in range(s + 1, K))
    return reduce(terms, reduction) + loss.reg_weight * R / (C * K * (K - 1) / (
        2 if pairs == "unordered" else 1))


ORACLES = {"triplet": triplet_oracle, "npairs": npairs_oracle, "supcon": supcon_oracle,
           "contrastive": contrastive_oracle, "mnrl": mnrl_oracle, "proxynca": proxynca_oracle,
           "proxyanchor": proxyanchor_oracle, "softtriple": softtriple_oracle}


# The memory losses are called as loss(h, labels, batch_keys, keys, key_labels, rows, ids), and
# their oracles with the same arguments and the loss. Each key carries the training-set row of its
# example (ids); rows are the batch's rows. A key whose id is a query's own row is that query's
# older key: neither a negative nor a positive.

def knnbert_oracle(h, y, batch_keys, keys, key_labels, rows, ids, loss, *, normalise=True,
                   tau="divided", own_keys="left out", negatives="other classes",
                   positive_in_denominator=True, per_query="mean", queries="with",
                   swap_m=False, denominator="own", reduction="mean"):
    """KNN-BERT eq. 3, one query and one positive at a time; S(q) by sorting the positives."""
    per_query_, m_most, m_least, z = [], loss.m_most, loss.m_least, units(h, normalise)
    if swap_m:
        m_most, m_least = m_least, m_most
    for i in range(len(h)):
        q = z[i]
        s = [by(q @ k, loss.temperature, tau) for k in keys]
        positives = [j for j in range(len(keys)) if key_labels[j] == y[i]
                     and (ids[j] != rows[i] or own_keys == "positives")]
        negatives_ = [j for j in range(len(keys)) if (key_labels[j] != y[i] if negatives ==
                                                      "other classes" else j not in positives)]
        if not positives:
            if queries == "all":
                per_query_.append(torch.tensor(0.0, dtype=torch.float64))
            continue  # no positive in memory: this query contributes nothing
        ranked = sorted(positives, key=lambda j: -s[j].item())
        if len(ranked) <= m_most + m_least:
            selected = ranked
        else:
            selected = ranked[:m_most] + ranked[len(ranked) - m_least:]
        own = [[j] if positive_in_denominator else [] for j in selected]
        if denominator == "selected":  # every selected positive in each term's denominator
            own = [selected for _ in selected]
        terms = [-torch.log(torch.exp(s[j]) / (sum(torch.exp(s[k]) for k in mine)
                                               + sum(torch.exp(s[n]) for n in negatives_)))
                 for j, mine in zip(selected, own)]
        per_query_.append(sum(terms) / (1 if per_query == "sum" else len(terms)))
    return reduce(per_query_, reduction)


def moco_oracle(h, y, batch_keys, keys, key_labels, rows, ids, loss, *, normalise=True,
                positive_tau=True, own_keys="left out", class_keys="negatives",
                positive_in_denominator=True, reduction="mean", tau="divided"):
    """MoCo eq. 1: the query's own key against every key in memory but its own example's."""
    terms, z = [], units(h, normalise)
    for i in range(len(h)):
        q = z[i]
        positive = torch.exp(by(q @ batch_keys[i], loss.temperature, tau if positive_tau else
                                "none"))
        negatives = sum(torch.exp(by(q @ keys[j], loss.temperature, tau))
                        for j in range(len(keys))
                        if (ids[j] != rows[i] or own_keys == "negatives")
                        and (class_keys == "negatives" or key_labels[j] != y[i]))
        terms.append(-torch.log(positive / ((positive if positive_in_denominator else 0)
                                            + negatives)))
    return reduce(terms, reduction)


MEMORY_ORACLES = {"knnbert": knnbert_oracle, "moco": moco_oracle}


def mlcon_oracle(h, y, loss, *, squared=False, normalise=False, self_in_denominator=False,
                 tau="divided", diagonal_in_c=False, beta="normalised", reduction="sum"):
    """L_con = sum_i sum_{j != i} -beta_ij log( exp(-d_ij / tau) / sum_{k != i} exp(-d_ik / tau) ),
    beta_ij = C_ij / sum_{k != i} C_ik, C_ij = y_i . y_j; a row with no shared label adds 0."""
    B, t, total = len(h), loss.temperature, torch.tensor(0.0, dtype=h.dtype)
    z = units(h, normalise)
    d = [[(zi - zj).pow(2).sum() ** (1 if squared else 0.5) for zj in z] for zi in z]

    def e(i, j):
        return torch.exp(by(-d[i][j], t, tau))
    for i in range(B):
        shared = {j: float(y[i] @ y[j]) for j in range(B) if j != i}
        weight = sum(shared.values()) + (float(y[i] @ y[i]) if diagonal_in_c else 0.0)
        if sum(shared.values()) == 0:
            continue
        denominator = sum(e(i, k) for k in range(B) if k != i or self_in_denominator)
        for j, c in shared.items():
            column = sum(float(y[k] @ y[j]) for k in range(B) if k != j)
            b = {"normalised": c / weight, "counts": c,
                 "columns": c / column if column else 0.0}[beta]
            total = total - b * torch.log(e(i, j) / denominator)
    return total / (B * B) if reduction == "cells" else total


MULTILABEL_ORACLES = {"mlcon": mlcon_oracle}


# The pair losses' batches hold the B first texts of the pairs, then their B second ones
# (h (2B, dim), labels (2B,) the texts' classes)

def setfit_oracle(h, y, loss, *, pairs="halves", other_class_target=0.0, inverted=False,
                  rescaled=False, error="squared", reduction="mean"):
    B, terms = len(h) // 2, []
    for i in range(B):
        a, b = (i, B + i) if pairs == "halves" else (2 * i, 2 * i + 1)
        u, v = h[a], h[b]                           # pair i: text i and text B + i
        cos = (u @ v) / (u.norm() * v.norm())
        cos = (cos + 1) / 2 if rescaled else cos
        same = bool(y[a] == y[b]) != inverted
        target = 1.0 if same else other_class_target   # one class: 1; two classes: 0
        terms.append((cos - target) ** 2 if error == "squared" else (cos - target).abs())
    return reduce(terms, reduction)


PAIR_ORACLES = {"setfit": setfit_oracle}


# The anchored losses' batches hold B triplets: the B anchors (a class's statement), then the B
# texts, then the B negatives (h (3B, dim))

def ancsetfit_oracle(h, y, loss, *, roles="thirds", distance="cosine", swapped=False,
                     hinge=True, margin_outside=False, reduction="mean"):
    B, terms = len(h) // 3, []
    for i in range(B):
        a, p, n = (i, B + i, 2 * B + i) if roles == "thirds" else (3 * i, 3 * i + 1, 3 * i + 2)
        if swapped:
            p, n = n, p
        def d(u, v):
            cos = (u @ v) / (u.norm() * v.norm())
            return 1 - cos if distance == "cosine" else (u / u.norm() - v / v.norm()).norm()
        x = d(h[a], h[p]) - d(h[a], h[n])
        x = x + loss.margin if not margin_outside else x
        term = torch.clamp(x, min=0) if hinge else x
        terms.append(term + loss.margin if margin_outside else term)
    return reduce(terms, reduction)


TRIPLET_ORACLES = {"ancsetfit": ancsetfit_oracle}
# ---- the sentence-pair losses (--pair_loss, minknn/losses/pairs.py): z holds the B first texts'
# vectors u, then the B second texts' v; a pair matches when its label is the task's positive ----

def pair_contrastive_oracle(z, labels, positive, loss):
    """1/B sum_i [1/2 (1 - y_i) d_i^2 + 1/2 y_i max(0, m - d_i)^2], d_i = ||u_i/|u_i| - v_i/|v_i|||,
    y_i = 1 for a pair that does not match (Hadsell et al.)."""
    B, m = len(z) // 2, loss.margin
    terms = []
    for i in range(B):
        d = (unit(z[i]) - unit(z[B + i])).norm()
        y = 0.0 if labels[i] == positive else 1.0
        terms.append(0.5 * (1 - y) * d ** 2 + 0.5 * y * torch.clamp(m - d, min=0) ** 2)
    return mean(terms)


def pair_mnrl_oracle(z, labels, positive, loss):
    """Over the K matching pairs (a_k, p_k): -1/K sum_k log(exp(S_kk) / sum_j exp(S_kj)), S_kj =
    scale cos(a_k, p_j): each anchor against every matching pair's second text (Henderson et
    al.); no matching pair gives 0."""
    B = len(z) // 2
    pairs = [(z[i], z[B + i]) for i in range(B) if labels[i] == positive]
    terms = []
    for a, p in pairs:
        S = [loss.scale * unit(a) @ unit(q) for _, q in pairs]
        right = loss.scale * unit(a) @ unit(p)
        terms.append(-torch.log(torch.exp(right) / sum(torch.exp(x) for x in S)))
    return mean(terms)


PAIR_LOSS_ORACLES = {"contrastive": pair_contrastive_oracle, "mnrl": pair_mnrl_oracle}

TABLES = {"ORACLES": ORACLES, "MEMORY_ORACLES": MEMORY_ORACLES,
          "MULTILABEL_ORACLES": MULTILABEL_ORACLES, "PAIR_ORACLES": PAIR_ORACLES,
          "TRIPLET_ORACLES": TRIPLET_ORACLES}


# The other ways each formula's steps can be read, as the oracles' keyword arguments: where a
# loss's value is off, checks.readings_that_fit names those that give the loss's value on every
# comparison batch (and only those). Each says what the loss then computes.
SUM = {"the terms summed over the batch, not averaged": {"reduction": "sum"}}
BATCH = {"the terms summed and divided by the batch size B, not by their number": {
    "reduction": "batch"}}
COLUMNS = {"h normalised over the batch (each feature, dim 0), not each vector (dim 1)": {
    "normalise": "columns"}}
READINGS = {
    "triplet": {
        "the raw vectors h, not L2-normalised": {"normalise": False},
        "the Euclidean distance ||u - v||, not its square": {"squared": False},
        "no hinge (max(0, .) left off): satisfied triplets give negative terms": {"hinge": False},
        "the positive's and the negative's distances exchanged, d(a, n) - d(a, p) + m (in the "
        "hinge, or in the order of the (a, p, n) mask's axes)": {"swap": True},
        "an anchor counted as its own positive (p = a kept)": {"self_positive": True},
        "the margin added outside the hinge, max(0, d(a, p) - d(a, n)) + m": {
            "margin_outside": True},
        "the mean over the active (nonzero) triplets only, not every valid one": {
            "reduction": "nonzero"},
        "the mean over all B^3 (a, p, n) cells, invalid ones included": {"reduction": "cells"},
        **SUM, **BATCH, **COLUMNS},
    "npairs": {
        "cosine similarities (normalised vectors) for the raw inner products": {"cosine": True},
        "log sum exp, without the 1 + inside the log": {"one_plus": False},
        "every other example a negative, the anchor's own class included": {"negatives": "all"},
        "each same-class pair taken once (a < p), not as both ordered pairs": {"ordered": False},
        "the mean over all B x B cells, not over the (anchor, positive) pairs": {
            "reduction": "cells"}, **BATCH,
        "the L2 penalty on ||f||, not ||f||^2": {"penalty": "mean norm"},
        "the L2 penalty summed over the batch, not averaged": {"penalty": "sum squared"},
        "no L2 penalty": {"penalty": "none"}, **SUM,
        "no L2 penalty on a batch without an (anchor, positive, negative)": {
            "empty_penalty": False}},
    "supcon": {
        "the raw vectors h, not L2-normalised": {"normalise": False},
        "z_i.z_j multiplied by tau, not divided": {"tau": "times"},
        "no temperature (z_i.z_j not divided by tau)": {"tau": "none"},
        "each anchor's own exp(z_i.z_i / tau) in its denominator (A(i) leaves i out)": {
            "self_in_denominator": True},
        "an anchor counted as its own positive": {"self_positive": True},
        "the denominator over the negatives only, the positives left out": {
            "denominator": "negatives"},
        "each anchor's -log p summed over its positives, not averaged": {"positives": "sum"},
        "the mean over every anchor, those without a positive counted as 0": {"anchors": "all"},
        "the log of each anchor's mean probability over its positives (Khosla et al.'s L_in), "
        "not the mean of the logs (L_out)": {"positives": "log of mean"}, **COLUMNS,
        "the anchors' terms summed, not averaged": {"reduction": "sum"}},
    "contrastive": {
        "the raw vectors h, not L2-normalised": {"normalise": False},
        "the squared distance where the formula takes the distance d": {"squared_d": True},
        "the hinge max(0, m - d) not squared": {"hinge_squared": False},
        "the factors 1/2 left out": {"halves": False},
        "no hinge: m - d, not max(0, m - d)": {"hinge": False},
        "the two halves exchanged: pairs of one class pushed to the margin and pairs of two "
        "pulled together": {"swap": True},
        "each example paired with itself too (i <= j)": {"self_pairs": True}, **SUM, **BATCH,
        **COLUMNS},
    "mnrl": {
        "S = cos, the scale left out": {"scale": "none"},
        "S = cos / scale, the scale taken for a temperature": {"scale": "divided"},
        "each anchor's mean over its positives, then the mean over the anchors, not one mean "
        "over the (i, p) pairs": {"reduction": "anchors"},
        "raw inner products, not cosines": {"cosine": False},
        "the anchor's other same-class examples among the negatives": {
            "same_class_negatives": True},
        "an example paired with itself as an (anchor, positive) pair": {"self_pairs": True},
        "h normalised over the batch (each feature, dim 0), not each vector (dim 1)": {
            "cosine": "columns"}, **BATCH, **SUM},
    "proxynca": {
        "the logits +s d (the sign dropped): the farthest proxy scores highest": {"sign": 1},
        "the raw vectors h, not L2-normalised": {"normalise": False}, **COLUMNS,
        "the proxies not normalised": {"normalise_proxies": False},
        "the proxies normalised over the classes (each feature, dim 0), not each proxy": {
            "normalise_proxies": "columns"},
        "the scale s left out": {"scale": False},
        "the distance ||x - p||, not its square": {"squared": False},
        "the positive proxy left out of the softmax's denominator": {
            "positive_in_denominator": False},
        "no log-softmax: minus the class's logit itself": {"log_softmax": False}, **SUM},
    "proxyanchor": {
        "the raw vectors h, not L2-normalised": {"normalise": False}, **COLUMNS,
        "the proxies not normalised": {"normalise_proxies": False},
        "the proxies normalised over the classes (each feature, dim 0), not each proxy": {
            "normalise_proxies": "columns"},
        "the positive term's margin with its sign flipped, -alpha (cos + delta)": {
            "positive_margin": 1},
        "the negative term's margin with its sign flipped, alpha (cos - delta)": {
            "negative_margin": -1},
        "the positive term averaged over all C proxies, not over P+": {"positive_over": "P"},
        "the negative term averaged over P+ only, not over all C proxies": {
            "negative_over": "P+"},
        "the negative term over every example, the proxy's own class included": {
            "negatives": "all"},
        "the positive term without the 1 + inside its log": {"one_plus": False},
        "both terms summed over the proxies, not averaged": {"reduction": "sum"},
        "the positive term's exponent without its minus, exp(alpha (cos - delta))": {
            "positive_sign": 1},
        "no scale alpha (alpha = 1)": {"scale": "none"},
        "alpha outside the logs, alpha log(1 + sum exp(...)), not inside the exponents": {
            "scale": "outside"},
        "the positive term detached: no gradient pulls a class towards its proxy": {
            "detached": "positive"},
        "the negative term detached: no gradient pushes the other classes away": {
            "detached": "negative"}},
    "softtriple": {
        "the centre weights a softmax over the classes, not over a class's K centres": {
            "weights_over": "classes"},
        "the similarities multiplied by gamma, not divided": {"gamma_": "times"},
        "no gamma (the similarities not divided by it)": {"gamma_": "none"},
        "the examples' terms summed, not averaged": {"reduction": "sum"},
        "a hard max over the centres, not the softmax-weighted similarity": {"hard": True},
        "the centres not normalised": {"normalise_centres": False},
        "the centres normalised across a class's K centres (each feature), not each centre": {
            "normalise_centres": "columns"},
        "the raw vectors h, not L2-normalised": {"normalise": False}, **COLUMNS,
        "the regulariser on the raw centres, not the normalised ones": {
            "regulariser": "raw"},
        "the regulariser on squared distances": {"squared": True},
        "the regulariser divided by C K (K - 1) / 2, the unordered pairs": {
            "pairs": "unordered"},
        "the margin outside the scale, lambda S_y - delta": {"margin": "outside"},
        "the margin added to the true class, not subtracted": {"margin_sign": 1},
        "no regulariser": {"regulariser": "none"}},
    "knnbert": {
        "the query not L2-normalised": {"normalise": False},
        "the queries normalised over the batch (each feature, dim 0), not each query": {
            "normalise": "columns"},
        "q.k multiplied by tau, not divided": {"tau": "times"},
        "no temperature (q.k not divided by tau)": {"tau": "none"},
        "every selected positive in each term's denominator, not k_j alone": {
            "denominator": "selected"},
        "the queries' terms summed, not averaged": {"reduction": "sum"},
        "the query's own older keys kept among its positives": {"own_keys": "positives"},
        "every key that is not a positive a negative, the query's own older keys included": {
            "negatives": "not positives"},
        "k_j left out of its own denominator": {"positive_in_denominator": False},
        "each query's terms summed over S(q), not averaged": {"per_query": "sum"},
        "queries without a selected positive averaged in as 0": {"queries": "all"},
        "M_m and M_l exchanged": {"swap_m": True}},
    "moco": {
        "the query not L2-normalised": {"normalise": False},
        "the queries normalised over the batch (each feature, dim 0), not each query": {
            "normalise": "columns"},
        "the positive's logit not divided by tau": {"positive_tau": False},
        "no temperature (no logit divided by tau)": {"tau": "none"},
        "the logits multiplied by tau, not divided": {"tau": "times"},
        "the query's own older keys among the negatives": {"own_keys": "negatives"},
        "the keys of the query's class left out of the negatives": {"class_keys": "excluded"},
        "the positive left out of the denominator": {"positive_in_denominator": False}, **SUM},
    "mlcon": {
        "the squared distance, not the distance": {"squared": True},
        "z L2-normalised first": {"normalise": True},
        "the example itself in its own softmax's denominator": {"self_in_denominator": True},
        "the distances multiplied by tau', not divided": {"tau": "times"},
        "no temperature (the distances not divided by tau')": {"tau": "none"},
        "C's diagonal kept in each row's total (beta's denominator counts the example itself)": {
            "diagonal_in_c": True},
        "beta not normalised over each row: the raw shared-label counts": {"beta": "counts"},
        "beta normalised over each column (the partner's total), not each row (the anchor's)": {
            "beta": "columns"},
        "the mean over the B x B cells, not the sum": {"reduction": "cells"}},
    "setfit": {
        "the pairs read as neighbouring rows (0, 1), (2, 3), ..., not the first half against "
        "the second": {"pairs": "interleaved"},
        "the targets inverted, 1 for a pair of two classes and 0 for one (or, the same "
        "function, 1 - cos regressed onto the right targets)": {"inverted": True},
        "a pair of two classes regressed onto -1, not 0": {"other_class_target": -1.0},
        "the cosine rescaled to [0, 1], (cos + 1) / 2": {"rescaled": True},
        "the absolute error, not the squared one": {"error": "absolute"}, **SUM},
    "ancsetfit": {
        "the triplets read as neighbouring rows (0, 1, 2), (3, 4, 5), ..., not the three thirds "
        "of the batch": {"roles": "interleaved"},
        "the text and the negative swapped (the anchor pulled to the negative)": {
            "swapped": True},
        "the Euclidean distance of the unit vectors, not 1 - cos": {"distance": "euclidean"},
        "no hinge (max(0, .) left out)": {"hinge": False},
        "the margin added after the hinge, not inside it": {"margin_outside": True}, **SUM},
}


def table_of(name):
    """Where loss `name`'s oracle belongs, by how the loss is called."""
    if getattr(METRIC_LOSSES[name], "uses_memory", False):
        return "MEMORY_ORACLES"
    if getattr(METRIC_LOSSES[name], "anchored", False):
        return "TRIPLET_ORACLES"
    if getattr(METRIC_LOSSES[name], "pairs", False):
        return "PAIR_ORACLES"
    return "MULTILABEL_ORACLES" if loss_kind(name) == "multilabel" else "ORACLES"


def oracle_of(name):
    return TABLES[table_of(name)].get(name)


WITH_ORACLE = [name for name in METRIC_LOSSES if oracle_of(name)]
IN_BATCH = [name for name in METRIC_LOSSES if table_of(name) == "ORACLES"]  # loss(h, labels)
