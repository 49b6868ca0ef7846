"""The kNN classifier: faiss search against brute force, each voting rule by hand, interpolation,
self-exclusion, and the datastore's errors and reuse."""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minknn import MinknnError
from minknn.knn import Datastore, interpolate, settings


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


def vote_of(vote, scores, neighbour_labels, num_classes, temperature=None, labels=None):
    """The vote of a datastore whose row j has label neighbour_labels' j-th entry (one query row)."""
    labels = neighbour_labels[0] if labels is None else labels
    datastore = Datastore(torch.zeros(len(labels), 2), labels, [str(j) for j in range(len(labels))], num_classes)
    return datastore.vote(scores, torch.arange(len(labels))[None].expand(len(scores), -1), vote, temperature)


def test_cosine_vote_by_hand():
    votes = torch.cat([vote_of("cosine", torch.zeros(1, 4), torch.tensor([[0, 2, 2, 1]]), 3),
                       vote_of("cosine", torch.zeros(1, 4), torch.tensor([[1, 1, 1, 1]]), 3)])
    assert votes.tolist() == [[0.25, 0.25, 0.5], [0.0, 1.0, 0.0]]
    # one vote each, whatever the similarity: a test with equal scores could not tell
    assert vote_of("cosine", torch.tensor([[0.9, 0.1, 0.0, -0.5]]), torch.tensor([[0, 2, 2, 1]]), 3).tolist() == \
        [[0.25, 0.25, 0.5]]


def test_distance_vote_by_hand():
    d = torch.tensor([[0.0, 10.0, 20.0]])
    w = np.exp([0.0, -1.0, -2.0])  # exp(-d / T) with T = 10
    expected = [w[1] / w.sum(), (w[0] + w[2]) / w.sum()]
    assert vote_of("distance", d, torch.tensor([[1, 0, 1]]), 2, 10.0)[0].tolist() == pytest.approx(expected)
    # a small temperature hands the vote to the nearest neighbour
    assert vote_of("distance", d, torch.tensor([[1, 0, 1]]), 2, 0.01)[0].tolist() == pytest.approx([0.0, 1.0])


def test_multilabel_vote_by_hand():
    """Su et al. eq. 1: y_kNN = sum_i alpha_i y_i, alpha = softmax(-d / tau) with d the Euclidean
    distance (the root of faiss's squared one), tau = 1."""
    neighbours = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float)  # three label sets
    squared = torch.tensor([[1.0, 4.0, 9.0]])  # d = 1, 2, 3
    a = np.exp([-1.0, -2.0, -3.0]) / np.exp([-1.0, -2.0, -3.0]).sum()
    expected = [a[0] + a[1], a[0], a[2]]
    got = vote_of("euclidean", squared, None, 3, 1.0, labels=neighbours)
    assert got[0].tolist() == pytest.approx(expected)
    # mixed with the model's sigmoids (lam = 0.5), then each class kept where the mix is > 0.5
    model = torch.tensor([[0.2, 0.9, 0.4]], dtype=torch.float64)
    mixed = interpolate(model, got, 0.5)
    assert mixed[0].tolist() == pytest.approx([0.5 * 0.2 + 0.5 * expected[0], 0.5 * 0.9 + 0.5 * expected[1],
                                                0.5 * 0.4 + 0.5 * expected[2]])
    assert (mixed > 0.5).tolist() == [[True, True, False]]  # 0.1 + 0.45, 0.45 + 0.33, 0.2 + 0.045


def test_interpolation_ends():
    probabilities = torch.softmax(torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]], dtype=torch.float64), 1)
    knn = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(interpolate(probabilities, knn, 0.0), probabilities, rtol=0, atol=0,
                               msg="phi = 0 must be the model alone")
    torch.testing.assert_close(interpolate(probabilities, knn, 1.0), knn, rtol=0, atol=0,
                               msg="phi = 1 must be kNN alone")
    torch.testing.assert_close(interpolate(probabilities, knn, 0.25), 0.75 * probabilities + 0.25 * knn)


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
