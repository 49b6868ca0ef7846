"""The oracles: a slow, literal transcription of each metric-learning loss's formula, as its file's
docstring writes it (plain Python loops over the examples, pairs and triplets, one at a time).
Every loss is compared with its oracle (check_matches_its_oracle in tests/losses/checks.py), which
its own test file, tests/losses/test_<loss>.py, runs.

An oracle sits in the table of how its loss is called: ORACLES (a loss called as loss(h, labels)),
MEMORY_ORACLES (a loss over the MoCo memory), MULTILABEL_ORACLES (multi-hot labels) or
PAIR_ORACLES (a loss of pair batches: setfit). A loss registered in METRIC_LOSSES
(minknn/losses/__init__.py) fails tests/losses/test_objective.py until its oracle is here and
tests/losses/test_<loss>.py runs the checks every loss goes through.
"""
import torch

from minknn.losses import METRIC_LOSSES, loss_kind


def unit(v):
    return v / v.norm()


def mean(terms):
    return sum(terms) / len(terms) if terms else torch.tensor(0.0, dtype=torch.float64)


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
