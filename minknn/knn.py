"""k-nearest-neighbour classification over a faiss datastore of the training set, mixed with the
linear head (KNN-BERT, Li et al., eq. 1; Liang et al., "Retrieval-Augmented Classification with
Decoupled Representation", eq. 2-3).

Datastore: one forward pass over the training set gives a key per example (its representation,
--knn_key) and a value (its label). A query q (a dev or test example's representation) retrieves
its K nearest keys with faiss (exact search):
    --vote cosine    cosine similarity: inner product of unit vectors (faiss.IndexFlatIP)
    --vote distance  squared L2 distance d(k, q) = ||k - q||^2 on the raw vectors (faiss.IndexFlatL2)
and the neighbours' labels vote (VOTES below):
    cosine   (KNN-BERT)  KNN(q)_y = 1/K #{neighbours j with y_j = y}, one vote each
    distance (Khandelwal et al. 2020; Liang et al. eq. 2)
                         KNN(q)_y = sum_{j: y_j = y} exp(-d_j / T) / sum_j exp(-d_j / T),   T = 10
The prediction mixes the two classifiers' distributions:
    s = (1 - phi) softmax(F(q)) + phi KNN(q)      phi = 0.25 (--phi); phi = 1 is kNN alone
Defaults: K = 64 (Liang et al.'s; KNN-BERT uses 100 to 1000 and finds K matters little once large),
phi = 0.25 (KNN-BERT's), T = 10 (Liang et al.'s).
When the queries are training examples themselves (evaluate.py --split train), each query's own
entry is left out of its neighbours, or every example would find itself first.
A vote is a function (scores, neighbour labels, num_classes, temperature) -> (Q, C) distribution;
a multi-label vote (Su et al.) is one more entry in VOTES.
"""
import hashlib

import faiss
import numpy as np
import torch

from minknn import MinknnError
from minknn.checkpoint import atomic_save, load_tagged

FORMAT = "minknn-datastore-1"


def add_votes(neighbour_labels, weights, num_classes):
    """(Q, C): for each query, the sum of its neighbours' weights (Q, K) per label."""
    return torch.zeros(len(weights), num_classes, dtype=torch.float64).scatter_add_(1, neighbour_labels, weights)


def vote_cosine(scores, neighbour_labels, num_classes, temperature=None):
    """One vote each, whatever the similarity: KNN(q)_y = the share of the K neighbours with label y."""
    K = neighbour_labels.shape[1]
    return add_votes(neighbour_labels, torch.full(neighbour_labels.shape, 1 / K, dtype=torch.float64), num_classes)


def vote_distance(scores, neighbour_labels, num_classes, temperature=10.0):
    """Each neighbour votes with softmax_j(-d_j / T); the scores are the squared L2 distances d_j."""
    return add_votes(neighbour_labels, torch.softmax(-scores.double() / temperature, dim=1), num_classes)


VOTES = {"cosine": vote_cosine, "distance": vote_distance}


def check_k(k, n, excluding_self=False):
    """K must fit in a datastore of n keys (one fewer when each query's own entry is left out)."""
    if not 1 <= k <= n - excluding_self:
        raise MinknnError(f"--k {k}: the datastore holds {n} training examples"
                          f"{', one of them the query itself' if excluding_self else ''}; use --k {n - excluding_self} or less")


def interpolate(logits, knn_probs, phi):
    """s = (1 - phi) softmax(F(q)) + phi KNN(q), (Q, C)."""
    return (1 - phi) * torch.softmax(logits.double(), dim=1) + phi * knn_probs


class Datastore:
    """The training set's keys (N, d) and labels (N,), with their example ids, searchable by faiss."""

    def __init__(self, keys, labels, ids, num_classes):
        if len(keys) == 0:
            raise MinknnError("the kNN datastore is empty: the training set has no examples")
        self.keys = np.ascontiguousarray(keys.numpy() if torch.is_tensor(keys) else keys, dtype=np.float32)
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self.ids, self.num_classes = list(ids), num_classes
        self._indexes = {}

    def __len__(self):
        return len(self.keys)

    def index(self, vote):
        """The faiss index a vote searches: inner product on unit keys (cosine), or squared L2 on raw keys."""
        if vote not in self._indexes:
            keys = self.keys.copy()
            if vote == "cosine":
                faiss.normalize_L2(keys)
            index = faiss.IndexFlatIP(keys.shape[1]) if vote == "cosine" else faiss.IndexFlatL2(keys.shape[1])
            index.add(keys)
            self._indexes[vote] = index
        return self._indexes[vote]

    def search(self, queries, k, vote, exclude=None):
        """The k nearest keys of each query: (scores (Q, k), rows (Q, k)), nearest first; scores are
        cosine similarities or squared distances. exclude: (Q,) a datastore row to leave out per
        query (its own entry), -1 for none."""
        check_k(k, len(self), exclude is not None)
        q = np.ascontiguousarray(queries.numpy() if torch.is_tensor(queries) else queries, dtype=np.float32)
        if vote == "cosine":
            q = q.copy()
            faiss.normalize_L2(q)
        extra = int(exclude is not None)
        scores, rows = self.index(vote).search(q, k + extra)
        if exclude is not None:  # drop each query's own entry (or, when it is not among them, the last hit)
            own = rows == np.asarray(exclude)[:, None]
            own[~own.any(1), -1] = True
            keep = ~own
            scores, rows = scores[keep].reshape(len(q), k), rows[keep].reshape(len(q), k)
        return torch.from_numpy(scores), torch.from_numpy(rows)

    def rows_of(self, ids):
        """Each id's datastore row, -1 for ids not in it."""
        row = {i: r for r, i in enumerate(self.ids)}
        return np.array([row.get(i, -1) for i in ids])

    def vote(self, scores, rows, vote, temperature):
        return VOTES[vote](scores, self.labels[rows], self.num_classes, temperature)

    def save(self, path, fingerprint):
        atomic_save({"format": FORMAT, "fingerprint": fingerprint, "keys": torch.from_numpy(self.keys),
                     "labels": self.labels, "ids": self.ids, "num_classes": self.num_classes}, path)

    @classmethod
    def load(cls, path, fingerprint):
        """The datastore saved at path, or None when it was built from another checkpoint or data."""
        saved = load_tagged(path, FORMAT, (path, "datastore"))
        if saved["fingerprint"] != fingerprint:
            return None
        return cls(saved["keys"], saved["labels"], saved["ids"], saved["num_classes"])


def fingerprint(checkpoint_path, key, examples):
    """What a datastore depends on: the checkpoint file's bytes, the key, and the training examples."""
    h = hashlib.sha256()
    with open(checkpoint_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(key.encode())
    for e in examples:
        h.update(f"\0{e.id}\0{e.label}".encode())
    return h.hexdigest()
