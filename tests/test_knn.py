"""The kNN classifier: faiss search against brute force, each voting rule by hand, interpolation,
self-exclusion, the datastore's errors and reuse, and the approximate indexes (IVF, HNSW) against
the exact one. Part knn (minknn/assignment.py): its sanity check is
test_sanity_check_the_votes_and_the_mix; the tests after it diagnose each vote and the mix."""
import dataclasses

import faiss
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import minknn.checkpoint
import minknn.knn
from minknn import MinknnError
from minknn.index import INDEX_DEFAULTS, built_with, default_nlist, index_settings, recall_at_k, search_parameters
from minknn.knn import TEMPERATURES, VOTES, Datastore, interpolate, settings

from grading import as_mix, check, close, graded, matches_reference


def random_datastore(n=200, d=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, d, generator=g) * 3
    return Datastore(keys, torch.randint(0, classes, (n,), generator=g), [f"id{i}" for i in range(n)], classes), keys


@pytest.mark.parametrize("vote", ["cosine", "distance", "euclidean"])
def test_faiss_search_equals_brute_force_top_k(vote):
    """cosine: the largest cosine similarities; distance and euclidean: the smallest squared L2
    distances (the euclidean vote takes their root itself)."""
    datastore, keys = random_datastore()
    queries = torch.randn(30, 16, generator=torch.Generator().manual_seed(1)) * 3
    scores, rows = datastore.search(queries, 10, vote)
    if vote == "cosine":
        brute = F.normalize(queries, dim=1) @ F.normalize(keys, dim=1).T
        expected_scores, expected_rows = brute.topk(10, dim=1)
    else:
        brute = torch.cdist(queries.double(), keys.double()) ** 2
        expected_scores, expected_rows = brute.topk(10, dim=1, largest=False)
    assert torch.equal(rows, expected_rows), f"--vote {vote}: not the 10 nearest keys"  # no ties here
    torch.testing.assert_close(scores.double(), expected_scores.double(), rtol=1e-4, atol=1e-3,
                               msg=f"--vote {vote}: the search's scores")


# --- part knn: the vote weights, the vote and the mix, on fixed inputs and by hand ---
PART = "knn"


def fmt(t):
    return "[" + ", ".join(f"{x:.3g}" for x in t.tolist()) + "]"


def datastore_of(labels, num_classes):
    """A datastore whose row j has label labels[j] (a class, or a multi-hot row); the keys do not
    matter to a vote."""
    ids = [str(j) for j in range(len(labels))]
    return Datastore(torch.zeros(len(labels), 2), labels, ids, num_classes)


def check_weights(vote, scores, temperature, expected, rule):
    weights = graded(PART, f"vote_{vote}", VOTES[vote], scores, temperature)
    check(PART, tuple(weights.shape) == tuple(scores.shape),
          f"vote_{vote} gives weights of shape {tuple(weights.shape)} for scores of shape "
          f"{tuple(scores.shape)}: one weight per query and neighbour")
    for q in range(len(scores)):
        check(PART, torch.allclose(weights[q].double(), expected[q].double(), atol=1e-6),
              f"the {vote} vote: {rule}; got weights {fmt(weights[q])} for query {q} "
              f"(scores {fmt(scores[q])}), expected {fmt(expected[q])}")


def check_vote(datastore, vote, scores, rows, temperature, expected, rule):
    got = graded(PART, "Datastore.vote", datastore.vote, scores, rows, vote, temperature)
    check(PART, tuple(got.shape) == tuple(expected.shape),
          f"Datastore.vote gives shape {tuple(got.shape)}, expected (Q, C) = "
          f"{tuple(expected.shape)}")
    for q in range(len(rows)):
        check(PART, torch.allclose(got[q].double(), expected[q].double(), atol=1e-6),
              f"the {vote} vote KNN(q) = sum_j alpha_j y_j: {rule}; got {fmt(got[q])} for "
              f"query {q} (its neighbours: datastore rows {rows[q].tolist()}), expected "
              f"{fmt(expected[q])}")


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
                  "a squared distance of -1e-7 (rounding) is a distance of 0: clamp before the "
                  "root")


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
    for phi in (0.0, 0.25, 1.0):
        mixed = graded(PART, "interpolate", interpolate, probabilities, knn, phi)
        a, b, off = as_mix(mixed, probabilities, knn)
        check(PART, off < 1e-6, f"with phi = {phi}, the mix is not a weighted sum of the model's "
              f"probabilities P and the kNN vote KNN (off by {off:.3g}): mix the two "
              f"distributions as they are")
        check(PART, abs(a - (1 - phi)) < 1e-6 and abs(b - phi) < 1e-6, f"with phi = {phi}, the "
              f"mix must be {1 - phi:.3g} P + {phi:.3g} KNN (1 - phi on the model, phi on the kNN "
              f"vote); it is {a:.3g} P + {b:.3g} KNN")


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


@pytest.mark.parametrize("vote", ["cosine", "distance"])
def test_self_exclusion(vote):
    datastore, keys = random_datastore(n=50)
    keys = torch.cat([keys, keys[:1]])  # row 50 duplicates row 0: a duplicate is a neighbour, not the query
    datastore = Datastore(keys, torch.arange(51) % 4, [f"id{i}" for i in range(51)], 4)
    exclude = datastore.rows_of([f"id{i}" for i in range(51)])
    scores, rows = datastore.search(keys, 5, vote, exclude)
    assert not (rows == torch.arange(51)[:, None]).any()
    full_scores, full_rows = datastore.search(keys, 6, vote)
    for q in range(51):  # the same neighbours as a search of 6, less the query itself
        expected = [r for r in full_rows[q].tolist() if r != q][:5]
        assert sorted(rows[q].tolist()) == sorted(expected)
    assert 50 in rows[0].tolist() and 0 in rows[50].tolist()
    # queries that are not in the datastore (-1) keep their k nearest
    _, rows_none = datastore.search(keys[:3] + 0.01, 5, vote, np.array([-1, -1, -1]))
    assert torch.equal(rows_none, datastore.search(keys[:3] + 0.01, 5, vote)[1])


def test_k_larger_than_the_datastore_and_empty_datastore_are_errors():
    datastore, keys = random_datastore(n=20)
    with pytest.raises(MinknnError, match=r"--k 21: the datastore holds 20 training examples; use --k 20 or less"):
        datastore.search(keys, 21, "cosine")
    with pytest.raises(MinknnError, match=r"one of them the query itself; use --k 19 or less"):
        datastore.search(keys, 20, "cosine", datastore.rows_of(datastore.ids))
    with pytest.raises(MinknnError, match="datastore is empty"):
        Datastore(torch.zeros(0, 4), [], [], 2)


def test_saved_datastore_is_reused_only_with_the_same_fingerprint(tmp_path):
    datastore, keys = random_datastore(n=10)
    datastore.save(str(tmp_path / "ds.pt"), "abc")
    loaded = Datastore.load(str(tmp_path / "ds.pt"), "abc", n=10, dim=16, num_classes=4)  # as evaluate.py loads
    assert np.array_equal(loaded.keys, datastore.keys) and loaded.ids == datastore.ids
    assert torch.equal(loaded.labels, datastore.labels)
    assert Datastore.load(str(tmp_path / "ds.pt"), "another checkpoint") is None
    (tmp_path / "junk.pt").write_bytes(b"not a datastore")
    with pytest.raises(MinknnError, match="not a minknn datastore"):
        Datastore.load(str(tmp_path / "junk.pt"), "abc")


def flat_index_of(keys):
    index = faiss.IndexFlatIP(keys.shape[1])
    index.add(np.ascontiguousarray(keys.numpy()))
    return torch.from_numpy(faiss.serialize_index(index))


def flip_exponents(t, n=8):
    bits = t.clone().view(torch.int32)
    bits.view(-1)[:n] ^= 1 << 30  # bit rot: 1.5 becomes 5e38
    return bits.view(torch.float32)


WHOLE = "; it is not a whole datastore of this checkpoint (delete it, and evaluate.py --knn builds it again)"
DAMAGED = [  # (id, edit of the saved dict, saved with a new checksum (a writer's bug) or the old one (bit rot), says)
    ("bits-flipped", lambda s: s.update(keys=flip_exponents(s["keys"])), False,
     ": its contents do not match the checksum saved with it (the file was damaged after it was written); delete "
     "it, and evaluate.py --knn builds it again"),
    ("keys-of-another-dimension", lambda s: s.update(keys=s["keys"][:, :8]), True,
     ": its keys have dimension 8, but the model's representations have 16" + WHOLE),
    ("too-few-labels", lambda s: s.update(labels=s["labels"][:-1]), True,
     ": its labels are shape (9,), torch.int64, not 10 class indices or a (10, 4) multi-hot array, one per key" + WHOLE),
    ("labels-beyond-the-classes", lambda s: s.update(labels=s["labels"] + 4), True,
     ": its labels are not class indices in [0, 4)" + WHOLE),
    ("another-number-of-classes", lambda s: s.update(num_classes=5), True, ": it has 5 classes, but the task has 4" + WHOLE),
    ("too-few-ids", lambda s: s.update(ids=s["ids"][:-1]), True, ": it has 9 ids for 10 keys" + WHOLE),
    ("too-few-keys", lambda s: s.update(keys=s["keys"][:-1], labels=s["labels"][:-1], ids=s["ids"][:-1]), True,
     ": it holds 9 keys, but the training set has 10 examples" + WHOLE),
    ("no-keys", lambda s: s.pop("keys"), True,
     ": has no keys; it is not a whole datastore (delete it, and evaluate.py --knn builds it again)"),
    ("an-index-of-other-keys", lambda s: s.update(faiss={"cosine": flat_index_of(s["keys"][:5])}), True,
     ": its cosine index holds 5 keys of dimension 16, but its keys are (10, 16)" + WHOLE),
    ("an-index-that-is-no-index", lambda s: s.update(faiss={"l2": torch.zeros(40, dtype=torch.uint8)}), True,
     ": its l2 index cannot be read (RuntimeError)" + WHOLE),
]


@pytest.mark.parametrize("edit, sealed, says", [c[1:] for c in DAMAGED], ids=[c[0] for c in DAMAGED])
def test_a_damaged_or_misshapen_datastore_is_one_line(tmp_path, edit, sealed, says):
    """A datastore file whose fingerprint is this checkpoint's, but whose bytes rotted (its checksum no longer
    matches) or whose entries do not fit the model and the task (10 keys of dimension 16, 4 classes): one line
    naming the file and what is wrong, never a datastore that votes with the wrong keys or labels."""
    datastore, _ = random_datastore(n=10)
    path = str(tmp_path / "ds.pt")
    datastore.save(path, "abc")
    saved = torch.load(path, weights_only=True)
    edit(saved)
    if sealed:
        saved = minknn.checkpoint.sealed({k: v for k, v in saved.items() if k != minknn.checkpoint.CHECKSUM})
    torch.save(saved, path)
    with pytest.raises(MinknnError) as e:
        Datastore.load(path, "abc", n=10, dim=16, num_classes=4)
        pytest.fail("Datastore.load accepted it")
    assert str(e.value) == path + says, str(e.value)


def test_the_datastore_fingerprint_covers_checkpoint_key_and_every_field_of_the_examples(tmp_path):
    """A datastore is rebuilt when the checkpoint, the key, or any training example's id, text, second text or
    label changes: each edit below must change the fingerprint."""
    from minknn.data import Example
    from minknn.knn import fingerprint
    (tmp_path / "a.pt").write_bytes(b"checkpoint a")
    (tmp_path / "b.pt").write_bytes(b"checkpoint b")
    examples = [Example(text="a good film", text_b="yes", label=1, id="x1"), Example(text="bad", label=0, id="x2")]
    base = fingerprint(str(tmp_path / "a.pt"), "mean", examples)
    edits = {"checkpoint": (str(tmp_path / "b.pt"), "mean", examples), "key": (str(tmp_path / "a.pt"), "cls", examples)}
    for field, value in (("id", "x9"), ("text", "a good movie"), ("text_b", "no"), ("label", 0)):
        changed = [dataclasses.replace(examples[0], **{field: value}), examples[1]]
        edits[field] = (str(tmp_path / "a.pt"), "mean", changed)
    for what, args in edits.items():
        assert fingerprint(*args) != base, f"knn.fingerprint ignores the {what}: a stale datastore would be reused"


def test_knn_defaults_by_kind():
    assert settings("multilabel") == (5, 0.5, "euclidean", 1.0), "Su et al.: K 5, lam 0.5, tau 1"
    assert settings("classify") == (64, 0.25, "cosine", None), "K 64, KNN-BERT's phi 0.25, one vote each"
    assert settings("classify", vote="distance")[3] == 10.0, "Liang et al.'s T = 10"
    assert settings("multilabel", k=3, phi=0.0, temperature=2.0) == (3, 0.0, "euclidean", 2.0)


# --- approximate indexes: IVF and HNSW against flat, on 2,000 keys of dim 32 in 20 Gaussian clusters ---
N, D = 2000, 32
FAST_HNSW = {"hnsw_m": 16, "ef_construction": 40}  # a quicker build than the defaults, for the tests


@pytest.fixture(scope="module")
def clustered():
    """(keys (N, D), queries (100, D), datastore(index, **params)): the queries drawn from the
    keys' clusters; datastore() a Datastore of the keys whose indexes are built once for this
    module and shared by every datastore built with the same settings (nprobe, ef_search aside)."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(20, D, generator=g) * 4
    keys = centres[torch.randint(0, 20, (N,), generator=g)] + torch.randn(N, D, generator=g)
    queries = centres[torch.randint(0, 20, (100,), generator=g)] + torch.randn(100, D, generator=g)
    built = {}

    def datastore(index="flat", **params):
        settings = index_settings(index, N, **params)
        store = Datastore(keys, torch.arange(N) % 4, [f"id{i}" for i in range(N)], 4, settings)
        store._indexes = built.setdefault(str(built_with(settings)), {})  # filled on first search
        return store
    return keys, queries, datastore


def true_scores(queries, keys, rows, vote):
    """Each returned row's cosine similarity (cosine) or squared L2 distance (distance) to its
    query, computed here from the raw vectors."""
    neighbours = keys.double()[rows]  # (Q, K, D)
    q = queries.double()[:, None, :]
    if vote == "cosine":
        return F.cosine_similarity(neighbours, q, dim=2)
    return ((neighbours - q) ** 2).sum(2)


@pytest.mark.parametrize("index,params", [("ivf", {}), ("hnsw", FAST_HNSW)])
@pytest.mark.parametrize("vote", ["cosine", "distance"])
def test_approximate_index_finds_the_nearest_keys_with_their_true_scores(clustered, index, params, vote):
    keys, queries, clustered_datastore = clustered
    _, exact = clustered_datastore().search(queries, 10, vote)
    datastore = clustered_datastore(index, **params)
    scores, rows = datastore.search(queries, 10, vote)
    recall = recall_at_k(rows, exact)
    assert recall >= 0.9, f"--index {index}, --vote {vote}: recall@10 {recall:.3f} against flat"
    torch.testing.assert_close(scores.double(), true_scores(queries, keys, rows, vote), rtol=1e-4, atol=1e-3,
                               msg=lambda m: f"--index {index}, --vote {vote}: the scores are not the returned "
                                             f"keys' {'cosine similarities' if vote == 'cosine' else 'squared distances'}\n{m}")
    expected = {"ivf": faiss.IndexIVFFlat, "hnsw": faiss.IndexHNSWFlat}[index]
    assert isinstance(datastore.index(vote), expected), f"--index {index}: searched a {type(datastore.index(vote))}"


@pytest.mark.parametrize("vote", ["cosine", "distance"])
def test_ivf_search_visits_nprobe_cells(clustered, vote):
    """nprobe = nlist visits every cell: the exact rows; one cell of 51 misses some neighbours."""
    keys, queries, clustered_datastore = clustered
    _, exact = clustered_datastore().search(queries, 10, vote)
    nlist = default_nlist(N)
    _, every_cell = clustered_datastore("ivf", nprobe=nlist).search(queries, 10, vote)
    assert torch.equal(every_cell, exact), f"--vote {vote}: IVF with nprobe = nlist = {nlist} is not flat's search"
    one_cell = clustered_datastore("ivf", nprobe=1)
    recall = recall_at_k(one_cell.search(queries, 5, vote)[1], exact[:, :5])
    assert recall < 0.95, f"--vote {vote}: nprobe 1 of {nlist} cells finds {recall:.3f} of the 5 nearest: nprobe ignored?"


def test_too_few_hits_are_refused_not_voted_with_row_minus_one(clustered):
    """One cell of ~39 keys cannot give 500 neighbours: faiss pads with row -1, which would vote
    with the last key; the search refuses and names the flag to raise, with or without exclusion."""
    keys, queries, clustered_datastore = clustered
    datastore = clustered_datastore("ivf", nprobe=1)
    with pytest.raises(MinknnError, match=r"--index ivf: 100 of 100 queries found fewer than 500 neighbours; "
                                          r"raise --nprobe \(now 1 of 51 cells\)"):
        datastore.search(queries, 500, "distance")
    with pytest.raises(MinknnError, match="raise --nprobe"):  # training queries, their own entry dropped
        datastore.search(keys[:50], 500, "distance", datastore.rows_of(datastore.ids[:50]))
    with pytest.raises(MinknnError, match="raise --nprobe"):  # queries not in the datastore (-1) among -1 rows
        datastore.search(queries, 500, "distance", np.full(len(queries), -1))
    hnsw = clustered_datastore("hnsw", **FAST_HNSW)
    hnsw._indexes = {"l2": PaddedIndex(hnsw.index("distance"))}  # this datastore's own
    with pytest.raises(MinknnError, match=r"--index hnsw: 100 of 100 queries found fewer than 10 neighbours; "
                                          rf"raise --ef_search \(now {INDEX_DEFAULTS['hnsw']['ef_search']}\)"):
        hnsw.search(queries, 10, "distance")


class PaddedIndex:
    """A faiss index whose last hit is missing (row -1), as when a graph search runs short."""

    def __init__(self, index):
        self.index = index

    def search(self, q, k, params=None):
        scores, rows = self.index.search(q, k, params=params)
        rows[:, -1] = -1
        return scores, rows


@pytest.mark.parametrize("index,params", [("flat", {}), ("ivf", {}), ("hnsw", FAST_HNSW)])
@pytest.mark.parametrize("vote", ["cosine", "distance"])
def test_self_exclusion_with_each_index(clustered, index, params, vote):
    keys, _, clustered_datastore = clustered
    datastore = clustered_datastore(index, **params)
    queries = keys[:200]
    _, rows = datastore.search(queries, 5, vote, datastore.rows_of(datastore.ids[:200]))
    assert not (rows == torch.arange(200)[:, None]).any(), f"--index {index}: a query found its own entry"
    _, full = datastore.search(queries, 6, vote)
    for q in range(200):  # the same index's 6 nearest, less the query itself
        assert sorted(rows[q].tolist()) == sorted([r for r in full[q].tolist() if r != q][:5]), \
            f"--index {index}, --vote {vote}, query {q}: not its 5 nearest other keys"


@pytest.mark.parametrize("index,params", [("ivf", {}), ("hnsw", FAST_HNSW)])
def test_saved_index_is_loaded_not_rebuilt(clustered, index, params, tmp_path, monkeypatch):
    keys, queries, clustered_datastore = clustered
    datastore = clustered_datastore(index, **params)
    datastore._indexes = {"cosine": datastore.index("cosine")}  # the cosine one built: the one saved
    before = datastore.search(queries, 10, "cosine")
    datastore.save(str(tmp_path / "ds.pt"), "abc")
    saved = torch.load(tmp_path / "ds.pt", weights_only=True)
    assert saved["format"] == "minknn-datastore-2" and set(saved["faiss"]) == {"cosine"}

    def no_build(*args):
        pytest.fail("the saved index was rebuilt")
    monkeypatch.setattr(minknn.knn, "build_index", no_build)
    loaded = Datastore.load(str(tmp_path / "ds.pt"), "abc")
    assert loaded.settings == datastore.settings, f"--index {index}: saved {datastore.settings}, loaded {loaded.settings}"
    after = loaded.search(queries, 10, "cosine")
    assert torch.equal(after[1], before[1]), f"--index {index}: the loaded index finds other rows"
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0, msg=f"--index {index}: the loaded index's scores")
    # another nprobe or ef_search keeps the built index and is used; another build setting drops it
    fewer = index_settings(index, N, **params, nprobe=1, ef_search=1)
    loaded.use_index(fewer)
    assert loaded.has_index("cosine") and loaded.settings == fewer
    if index == "ivf":
        assert recall_at_k(loaded.search(queries, 10, "cosine")[1], before[1]) < 0.95, "nprobe 1 was not used"
    loaded.use_index(index_settings(index, N, **{**params, "nlist": 30, "hnsw_m": 8}))
    assert not loaded.has_index("cosine"), f"--index {index}: an index built with other settings was kept"


def test_a_datastore_of_format_1_loads_as_flat(tmp_path):
    """minknn-datastore-1 files hold no index: their flat index is built on loading, as before."""
    datastore, keys = random_datastore(n=10)
    torch.save({"format": "minknn-datastore-1", "fingerprint": "abc", "keys": keys, "labels": datastore.labels,
                "ids": datastore.ids, "num_classes": 4}, tmp_path / "old.pt")
    loaded = Datastore.load(str(tmp_path / "old.pt"), "abc")
    assert loaded.settings == {"index": "flat"}
    assert torch.equal(loaded.search(keys, 3, "distance")[1], datastore.search(keys, 3, "distance")[1])


def test_recall_at_k_by_hand():
    approx = torch.tensor([[1, 2, 3], [4, 5, -1]])
    exact = torch.tensor([[3, 2, 9], [6, 5, 4]])
    assert recall_at_k(approx, exact) == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert recall_at_k(exact, exact) == 1.0 and recall_at_k(np.full((2, 3), -1), exact) == 0.0


def test_index_defaults_and_limits():
    """nlist: 4 sqrt(N), at most N / 39 (faiss's k-means wants 39 keys a cell), at least 1;
    ef_search is raised to the hits asked for."""
    assert [default_nlist(n) for n in (1_000_000, 2000, 40, 5)] == [4000, 51, 1, 1]
    assert index_settings("ivf", 2000) == {"index": "ivf", "nlist": 51, "nprobe": INDEX_DEFAULTS["ivf"]["nprobe"], "max_train_per_cell": 64}
    assert index_settings("hnsw", 10, ef_search=7) == {"index": "hnsw", "hnsw_m": 32, "ef_construction": 64,
                                                       "ef_search": 7}
    with pytest.raises(MinknnError, match=r"--nlist 11: the datastore holds 10 training examples .* use --nlist 10"):
        index_settings("ivf", 10, nlist=11)
    assert search_parameters(index_settings("hnsw", 10, ef_search=7), 11).efSearch == 11
    assert search_parameters(index_settings("hnsw", 10), 11).efSearch == INDEX_DEFAULTS["hnsw"]["ef_search"]
    assert search_parameters(index_settings("ivf", 2000, nprobe=3), 11).nprobe == 3
