"""The kNN vote, part knn (minknn/assignment/parts.py): each voting rule and the mix by hand. Its sanity
check is test_sanity_check_the_votes_and_the_mix; the tests after it diagnose each vote and the
mix. The search the vote reads (faiss, the datastore's files, the indexes): tests/test_datastore.py.
No second-device test (tests/elsewhere.py) here: the part runs on the CPU by design, on faiss's
scores and the datastore's labels, and mixes the predictions evaluate.py has brought back to it."""
import numpy as np
import torch

from minknn.datastore import Datastore
from minknn.knn import TEMPERATURES, VOTES, interpolate, settings

from formula import unchanged
from grading import as_formula, as_mix, check, close, graded, matches_reference


PART = "knn"


def fmt(t):
    return "[" + ", ".join(f"{x:.3g}" for x in t.tolist()) + "]"


def datastore_of(labels, num_classes):
    """A datastore whose row j has label labels[j] (a class, or a multi-hot row); the keys do not
    matter to a vote."""
    ids = [str(j) for j in range(len(labels))]
    return Datastore(torch.zeros(len(labels), 2), labels, ids, num_classes)


def _softmax(x, dim=1):
    return torch.softmax(x.double(), dim)


# The other ways each vote's weights can be read (s: the scores (Q, K), T: the temperature): a
# failure names those whose weights the vote's are, on the test's scores.
VOTE_READINGS = {
    "cosine": {
        "the raw similarities": lambda s, T: s.double(),
        "the similarities divided by their sum": lambda s, T: s.double() / s.double().sum(1,
                                                                                          True),
        "a softmax of the similarities": lambda s, T: _softmax(s),
        "1/Q each, Q the number of queries, not 1/K": lambda s, T: torch.full(
            s.shape, 1 / s.shape[0], dtype=torch.float64),
        "1 each: counts, not shares of the vote": lambda s, T: torch.ones(s.shape,
                                                                          dtype=torch.float64)},
    "distance": {
        "softmax(+d / T), the minus left out: the farthest weighs most":
            lambda s, T: _softmax(s / T),
        "a softmax over the queries (dim 0), not over each query's neighbours":
            lambda s, T: _softmax(-s / T, 0),
        "softmax(-d T), the temperature multiplied": lambda s, T: _softmax(-s * T),
        "softmax(-d), no temperature": lambda s, T: _softmax(-s),
        "softmax(-sqrt(d) / T), the root taken": lambda s, T: _softmax(-s.clamp(min=0).sqrt()
                                                                       / T)},
    "euclidean": {
        "softmax(-d / tau) on the squared distances, the root not taken":
            lambda s, T: _softmax(-s / T),
        "softmax(+sqrt(d) / tau), the minus left out":
            lambda s, T: _softmax(s.clamp(min=0).sqrt() / T),
        "softmax(-sqrt(d / tau)), tau inside the root": lambda s, T: _softmax(
            -(s.clamp(min=0) / T).sqrt()),
        "softmax(-sqrt(d) tau), the temperature multiplied": lambda s, T: _softmax(
            -s.clamp(min=0).sqrt() * T),
        "a softmax over the queries (dim 0)": lambda s, T: _softmax(-s.clamp(min=0).sqrt() / T,
                                                                    0)},
}


def check_weights(vote, scores, temperature, expected, rule):
    weights = graded(PART, f"vote_{vote}", VOTES[vote], scores, temperature)
    check(PART, tuple(weights.shape) == tuple(scores.shape),
          f"vote_{vote} gives weights of shape {tuple(weights.shape)} for scores of shape "
          f"{tuple(scores.shape)}: one weight per query and neighbour")
    if not torch.allclose(weights.double(), expected.double(), atol=1e-6):
        fits = [what for what, f in VOTE_READINGS[vote].items()
                if torch.allclose(weights.double(), f(scores, temperature), atol=1e-6)
                and not torch.allclose(f(scores, temperature), expected.double(), atol=1e-6)]
        check(PART, not fits, f"the {vote} vote: {rule}; got weights {fmt(weights[0])} for query "
              f"0 (scores {fmt(scores[0])}), expected {fmt(expected[0])}: the weights of every "
              f"query are {' or '.join(fits)}")
    for q in range(len(scores)):
        check(PART, torch.allclose(weights[q].double(), expected[q].double(), atol=1e-6),
              f"the {vote} vote: {rule}; got weights {fmt(weights[q])} for query {q} "
              f"(scores {fmt(scores[q])}), expected {fmt(expected[q])}")


def _summed(alpha, rows, values, ranks=None, weight=None):
    """sum over the ranks j (all, or `ranks`) of alpha_j y_j, alpha_j read as `weight(alpha, j)`."""
    knn = torch.zeros(len(rows), values.shape[1], dtype=torch.float64)
    for j in (range(rows.shape[1]) if ranks is None else ranks):
        knn = knn + (weight or (lambda a, j: a[:, j]))(alpha, j)[:, None] * values[rows[:, j]]
    return knn


# The other ways the vote's sum over the K neighbours can be read (alpha: the weights (Q, K),
# rows (Q, K), values (N, C)): a failure names those whose vote the part's is, on the test's case.
SUM_READINGS = {
    "the last (farthest) neighbour's vote left out": lambda a, r, v: _summed(
        a, r, v, range(r.shape[1] - 1)),
    "each rank's vote written over the sum, not added to it: only the last neighbour's counts":
        lambda a, r, v: _summed(a, r, v, [r.shape[1] - 1]),
    "the nearest neighbour's vote alone": lambda a, r, v: _summed(a, r, v, [0]),
    "every neighbour weighted by the nearest one's weight alpha_1": lambda a, r, v: _summed(
        a, r, v, weight=lambda a, j: a[:, 0]),
    "each neighbour's label counted without its weight (1 each)": lambda a, r, v: _summed(
        a, r, v, weight=lambda a, j: torch.ones(len(a), dtype=torch.float64)),
}


def check_vote(datastore, vote, scores, rows, temperature, expected, rule):
    got = graded(PART, "Datastore.vote", datastore.vote, scores, rows, vote, temperature)
    check(PART, tuple(got.shape) == tuple(expected.shape),
          f"Datastore.vote gives shape {tuple(got.shape)}, expected (Q, C) = "
          f"{tuple(expected.shape)}")
    if not torch.allclose(got.double(), expected.double(), atol=1e-6):
        alpha, values = VOTES[vote](scores, temperature).double(), datastore.values.double()
        fits = [what for what, f in SUM_READINGS.items()
                if torch.allclose(got.double(), f(alpha, rows, values), atol=1e-6)
                and not torch.allclose(f(alpha, rows, values), expected.double(), atol=1e-6)]
        check(PART, not fits, f"the {vote} vote KNN(q) = sum_j alpha_j y_j: {rule}; got "
              f"{fmt(got[0])} for query 0 (its neighbours: datastore rows {rows[0].tolist()}), "
              f"expected {fmt(expected[0])}: every query's vote is the sum with "
              f"{' or with '.join(fits)}")
    for q in range(len(rows)):
        check(PART, torch.allclose(got[q].double(), expected[q].double(), atol=1e-6),
              f"the {vote} vote KNN(q) = sum_j alpha_j y_j: {rule}; got {fmt(got[q])} for "
              f"query {q} (its neighbours: datastore rows {rows[q].tolist()}), expected "
              f"{fmt(expected[q])}")


def test_knn_leaves_its_inputs_as_they_were():
    """Each function of the part computes a new tensor: the scores, the datastore's rows and
    labels, and the probabilities it mixes stay as the caller gave them (tests/formula.py)."""
    scores = torch.tensor([[0.9, 0.5, 0.1], [2.0, 1.0, 0.5]], dtype=torch.float64)
    for vote in VOTES:
        unchanged(PART, f"vote_{vote}", lambda scores: VOTES[vote](scores, 1.0), {"scores": scores})
    probabilities = torch.softmax(torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]]), 1).double()
    knn = torch.tensor([[0.0, 0.0, 1.0], [0.25, 0.75, 0.0]], dtype=torch.float64)
    unchanged(PART, "interpolate(P, KNN, 0.25)", lambda P, KNN: interpolate(P, KNN, 0.25),
              {"P": probabilities, "KNN": knn})
    store = datastore_of(torch.tensor([0, 2, 1, 1]), 3)
    values = store.values.clone()
    unchanged(PART, "Datastore.vote", lambda s, r: store.vote(s, r, "distance", 10.0),
              {"s": scores, "r": torch.tensor([[0, 1, 2], [3, 2, 1]])})
    check(PART, torch.equal(store.values, values), "Datastore.vote changed the datastore's "
          "label rows (its values) in place: a vote reads them, and every later vote with them")


def test_cosine_vote_is_one_vote_each():
    """KNN-BERT: alpha_j = 1/K. A test whose similarities were all equal could not tell this from a
    softmax or a share of the similarities."""
    scores = torch.tensor([[0.9, 0.5, 0.1, -0.3], [0.8, 0.8, 0.2, 0.1]])  # 2 queries, K = 4
    check_weights("cosine", scores, None, torch.full((2, 4), 0.25),
                  "it gives each of the K neighbours weight 1/K whatever its similarity")


def test_distance_vote_by_hand():
    d = torch.tensor([[0.0, 10.0, 20.0], [5.0, 5.0, 35.0]])
    w = np.exp(-d.double().numpy() / 10)  # exp(-d / T) with T = 10
    check_weights("distance", d, 10.0, torch.from_numpy(w / w.sum(1, keepdims=True)),
                  "alpha_j = softmax_j(-d_j / T) over each query's K neighbours, T = 10: the "
                  "nearest weighs most")
    # a small temperature hands the vote to the nearest neighbours
    check_weights("distance", d, 0.01, torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]),
                  "with T = 0.01 the nearest neighbours take the whole vote (T divides the "
                  "distances)")


def test_euclidean_vote_by_hand():
    """Su et al. eq. 1: alpha = softmax(-d / tau) with d the Euclidean distance, the root of
    faiss's squared one; tau = 1, their default, and tau = 2."""
    squared = torch.tensor([[1.0, 4.0, 9.0], [0.0, 16.0, 16.0]])  # d = 1, 2, 3 and 0, 4, 4
    d = squared.double().sqrt()
    for tau in (1.0, 2.0):
        check_weights("euclidean", squared, tau, torch.softmax(-d / tau, dim=1),
                      f"alpha_j = softmax_j(-||k_j - q|| / tau), the root of the squared "
                      f"distances, tau = {tau}")
    # rounding can leave a squared distance a hair below 0: it is a distance of 0, not NaN
    check_weights("euclidean", torch.tensor([[-1e-7, 1.0]]), 1.0,
                  torch.softmax(torch.tensor([[0.0, -1.0]]), dim=1),
                  "a squared distance of -1e-7 (rounding) is a distance of 0 (clamped at 0 "
                  "before the root)")


def test_each_vote_weighs_in_float64():
    """The weights (Q, K) are float64 whatever the scores' dtype (faiss gives float32): the vote
    sums them into float64 rows."""
    scores = torch.tensor([[0.9, 0.5, 0.1], [0.8, 0.8, 0.2]])  # float32, as faiss returns them
    for vote, temperature in TEMPERATURES.items():
        weights = graded(PART, f"vote_{vote}", VOTES[vote], scores, temperature)
        check(PART, weights.dtype == torch.float64, f"vote_{vote} gives weights in "
              f"{weights.dtype} for float32 scores; the weights are float64 (dtype=torch.float64, "
              f"or scores.double())")


def test_vote_sums_each_neighbours_label_by_hand():
    """KNN(q) = sum_j alpha_j y_j, y_j the one-hot label of the datastore row of q's j-th
    neighbour (rows (Q, K), any rows, not 0 .. K - 1)."""
    datastore = datastore_of(torch.tensor([0, 2, 2, 1, 0]), 3)
    rows = torch.tensor([[3, 1, 2, 0], [4, 0, 1, 3]])  # labels 1 2 2 0 and 0 0 2 1
    similarities = torch.tensor([[0.9, 0.5, 0.1, -0.3], [0.8, 0.8, 0.2, 0.1]])
    check_vote(datastore, "cosine", similarities, rows, None,
               torch.tensor([[0.25, 0.25, 0.5], [0.5, 0.25, 0.25]]), "one vote each")
    d = torch.tensor([[0.0, 10.0, 20.0, 30.0], [0.0, 0.0, 10.0, 10.0]])
    w = torch.softmax(-d.double() / 10, dim=1)
    expected = torch.zeros(2, 3, dtype=torch.float64)
    for q in range(2):  # the sum, written out
        for j in range(4):
            expected[q, datastore.labels[rows[q, j]]] += w[q, j]
    check_vote(datastore, "distance", d, rows, 10.0, expected,
               "each neighbour adds its weight to its own class")


def test_the_mix_weighs_the_model_by_1_minus_phi_and_knn_by_phi():
    """The mix read back as a P + b KNN (grading.as_mix): at each phi, a must be 1 - phi and b phi;
    a mix that is no such sum mixes something else than the two distributions."""
    probabilities = torch.softmax(torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]]), 1).double()
    knn = torch.tensor([[0.0, 0.0, 1.0], [0.25, 0.75, 0.0]], dtype=torch.float64)
    for phi in (0.3, 0.0, 1.0):  # 0.3 first: there phi, 1 - phi, 0 and 1 all differ
        mixed = graded(PART, "interpolate", interpolate, probabilities, knn, phi)
        a, b, off = as_mix(mixed, probabilities, knn)
        check(PART, off < 1e-6, f"with phi = {phi}, the mix is not a weighted sum of the model's "
              f"probabilities P and the kNN vote KNN (off by {off:.3g}): mix the two "
              f"distributions as they are")
        said = as_formula((a, b), {"phi": phi, "1 - phi": 1 - phi, "1": 1.0, "0": 0.0},
                          ("P", "KNN")) if phi == 0.3 else None
        check(PART, abs(a - (1 - phi)) < 1e-6 and abs(b - phi) < 1e-6, f"with phi = {phi}, the "
              f"mix must be {1 - phi:.3g} P + {phi:.3g} KNN (1 - phi on the model, phi on the kNN "
              f"vote); it is {a:.3g} P + {b:.3g} KNN"
              + (f": the code computes {said}, the formula (1 - phi) P + phi KNN" if said else ""))


def test_multilabel_vote_by_hand():
    """Su et al. eq. 1: y_kNN = sum_i alpha_i y_i over multi-hot rows, alpha = softmax(-d / tau)
    with d the Euclidean distance (the root of faiss's squared one), tau = 1."""
    # three label sets
    neighbours = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float)
    squared = torch.tensor([[1.0, 4.0, 9.0]])  # d = 1, 2, 3
    a = np.exp([-1.0, -2.0, -3.0]) / np.exp([-1.0, -2.0, -3.0]).sum()
    expected = torch.tensor([[a[0] + a[1], a[0], a[2]]])
    datastore = datastore_of(neighbours, 3)
    check_vote(datastore, "euclidean", squared, torch.tensor([[0, 1, 2]]), 1.0, expected,
               "each neighbour adds its weight to each of its labels")
    # mixed with the model's sigmoids (lam = 0.5), then each class kept where the mix is > 0.5
    model = torch.tensor([[0.2, 0.9, 0.4]], dtype=torch.float64)
    mixed = graded(PART, "interpolate", interpolate, model, expected, 0.5)
    close(PART, mixed, 0.5 * model + 0.5 * expected,
          "the mix of the sigmoids and the kNN vote with phi 0.5")
    # 0.1 + 0.45, 0.45 + 0.33, 0.2 + 0.045
    check(PART, (mixed > 0.5).tolist() == [[True, True, False]],
          f"the mix {fmt(mixed[0])} should keep classes 0 and 1 (> 0.5)")


def test_the_mix_by_hand():
    """s = (1 - phi) P + phi KNN: phi = 0 is the model alone, phi = 1 kNN alone."""
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    probabilities = torch.softmax(logits, 1)
    knn = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    for phi, expected, what in ((0.0, probabilities, "with phi = 0, the model alone: the mix"),
                                (1.0, knn, "with phi = 1, kNN alone: the mix"),
                                (0.25, 0.75 * probabilities + 0.25 * knn, "with phi = 0.25, "
                                 "0.75 P + 0.25 KNN (phi is the kNN vote's share): the mix")):
        mixed = graded(PART, "interpolate", interpolate, probabilities, knn, phi)
        close(PART, mixed, expected, what)


def test_sanity_check_the_votes_and_the_mix():
    """The sanity check: each vote and the mix on fixed inputs, against the solution's stored
    outputs (tests/fixtures/references/knn.pt): 3 queries, 5 neighbours each, 8 rows of 4
    classes."""
    g = torch.Generator().manual_seed(0)
    datastore = datastore_of(torch.tensor([0, 1, 2, 3, 1, 2, 0, 1]), 4)
    rows = torch.stack([torch.randperm(8, generator=g)[:5] for _ in range(3)])  # (3, 5)
    similarities = (torch.rand(3, 5, generator=g) * 2 - 1).sort(dim=1, descending=True).values
    distances = (torch.rand(3, 5, generator=g) * 20).sort(dim=1).values
    for vote, scores in (("cosine", similarities), ("distance", distances),
                         ("euclidean", distances)):
        knn = graded(PART, f"the {vote} vote", datastore.vote, scores, rows, vote,
                     TEMPERATURES[vote])
        matches_reference(PART, f"{vote} vote", knn)
    probabilities = torch.softmax(torch.randn(3, 4, generator=g, dtype=torch.float64), dim=1)
    mixed = graded(PART, "interpolate", interpolate, probabilities, knn, 0.25)
    matches_reference(PART, "mix with phi 0.25", mixed)


def test_knn_defaults_by_kind():
    assert settings("multilabel") == (5, 0.5, "euclidean", 1.0), "Su et al.: K 5, lam 0.5, tau 1"
    assert settings("classify") == (64, 0.25, "cosine", None), "K 64, KNN-BERT's phi 0.25, one vote each"
    assert settings("classify", vote="distance")[3] == 10.0, "Liang et al.'s T = 10"
    assert settings("multilabel", k=3, phi=0.0, temperature=2.0) == (3, 0.0, "euclidean", 2.0)


# --- approximate indexes: IVF and HNSW against flat, on 2,000 keys of dim 32 in 20 Gaussian clusters ---
N, D = 2000, 32
