"""The kNN classifier: faiss search against brute force, each voting rule by hand, interpolation,
self-exclusion, and the datastore's errors and reuse."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minknn import MinknnError
from minknn.knn import Datastore, interpolate, vote_cosine, vote_distance


def random_datastore(n=200, d=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, d, generator=g) * 3
    return Datastore(keys, torch.randint(0, classes, (n,), generator=g), [f"id{i}" for i in range(n)], classes), keys


@pytest.mark.parametrize("vote", ["cosine", "distance"])
def test_faiss_search_equals_brute_force_top_k(vote):
    datastore, keys = random_datastore()
    queries = torch.randn(30, 16, generator=torch.Generator().manual_seed(1)) * 3
    scores, rows = datastore.search(queries, 10, vote)
    if vote == "cosine":
        brute = F.normalize(queries, dim=1) @ F.normalize(keys, dim=1).T
        expected_scores, expected_rows = brute.topk(10, dim=1)
    else:
        brute = torch.cdist(queries.double(), keys.double()) ** 2
        expected_scores, expected_rows = brute.topk(10, dim=1, largest=False)
    assert torch.equal(rows, expected_rows)  # random data: no ties
    assert torch.allclose(scores.double(), expected_scores.double(), rtol=1e-4, atol=1e-3)


def test_cosine_vote_by_hand():
    labels = torch.tensor([[0, 2, 2, 1], [1, 1, 1, 1]])
    votes = vote_cosine(torch.zeros(2, 4), labels, 3)
    assert votes.tolist() == [[0.25, 0.25, 0.5], [0.0, 1.0, 0.0]]


def test_distance_vote_by_hand():
    d = torch.tensor([[0.0, 10.0, 20.0]])
    labels = torch.tensor([[1, 0, 1]])
    w = np.exp([0.0, -1.0, -2.0])  # exp(-d / T) with T = 10
    expected = [w[1] / w.sum(), (w[0] + w[2]) / w.sum()]
    assert vote_distance(d, labels, 2, temperature=10.0)[0].tolist() == pytest.approx(expected)
    # a small temperature hands the vote to the nearest neighbour
    assert vote_distance(d, labels, 2, temperature=0.01)[0].tolist() == pytest.approx([0.0, 1.0])


def test_interpolation_ends():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    knn = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(interpolate(logits, knn, 0.0), torch.softmax(logits.double(), 1))  # the linear head
    assert torch.equal(interpolate(logits, knn, 1.0), knn)  # kNN alone
    assert torch.allclose(interpolate(logits, knn, 0.25), 0.75 * torch.softmax(logits.double(), 1) + 0.25 * knn)


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
    loaded = Datastore.load(str(tmp_path / "ds.pt"), "abc")
    assert np.array_equal(loaded.keys, datastore.keys) and loaded.ids == datastore.ids
    assert torch.equal(loaded.labels, datastore.labels)
    assert Datastore.load(str(tmp_path / "ds.pt"), "another checkpoint") is None
    (tmp_path / "junk.pt").write_bytes(b"not a datastore")
    with pytest.raises(MinknnError, match="not a minknn datastore"):
        Datastore.load(str(tmp_path / "junk.pt"), "abc")
