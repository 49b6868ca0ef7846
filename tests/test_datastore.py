"""The kNN datastore (minknn/datastore.py): faiss search against brute force, self-exclusion, the
datastore's errors and reuse, and the approximate indexes (IVF, HNSW) against the exact one."""
import dataclasses

import faiss
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minknn import MinknnError
import minknn.datastore
from minknn.datastore import Datastore
from minknn.index import (INDEX_DEFAULTS, built_with, default_nlist, index_settings, recall_at_k,
                          search_parameters)
import minknn.tools.files



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
        saved = minknn.tools.files.sealed({k: v for k, v in saved.items() if k != minknn.tools.files.CHECKSUM})
    torch.save(saved, path)
    with pytest.raises(MinknnError) as e:
        Datastore.load(path, "abc", n=10, dim=16, num_classes=4)
        pytest.fail("Datastore.load accepted it")
    assert str(e.value) == path + says, str(e.value)


def test_the_datastore_fingerprint_covers_checkpoint_key_and_every_field_of_the_examples(tmp_path):
    """A datastore is rebuilt when the checkpoint, the key, or any training example's id, text, second text or
    label changes: each edit below must change the fingerprint."""
    from minknn.tasks.data import Example
    from minknn.datastore import fingerprint
    (tmp_path / "a.pt").write_bytes(b"checkpoint a")
    (tmp_path / "b.pt").write_bytes(b"checkpoint b")
    examples = [Example(text="a good film", text_b="yes", label=1, id="x1"), Example(text="bad", label=0, id="x2")]
    base = fingerprint(str(tmp_path / "a.pt"), "mean", examples)
    edits = {"checkpoint": (str(tmp_path / "b.pt"), "mean", examples), "key": (str(tmp_path / "a.pt"), "cls", examples)}
    for field, value in (("id", "x9"), ("text", "a good movie"), ("text_b", "no"), ("label", 0)):
        changed = [dataclasses.replace(examples[0], **{field: value}), examples[1]]
        edits[field] = (str(tmp_path / "a.pt"), "mean", changed)
    for what, args in edits.items():
        assert fingerprint(*args) != base, f"datastore.fingerprint ignores the {what}: a stale datastore would be reused"


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
    monkeypatch.setattr(minknn.datastore, "build_index", no_build)
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
