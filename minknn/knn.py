"""k-nearest-neighbour classification over a faiss datastore of the training set, mixed with the
model's own prediction (KNN-BERT, Li et al., eq. 1; Liang et al., "Retrieval-Augmented
Classification with Decoupled Representation", eq. 2-3; Su et al., "Contrastive Learning-Enhanced
Nearest Neighbor Mechanism for Multi-Label Text Classification", eq. 1).

Datastore: one forward pass over the training set gives a key per example (its representation,
--knn_key) and a value: its label as a one-hot row y_j (C,), or, for a multi-label task, its
multi-hot row. A query q (a dev or test example's representation) retrieves its K nearest keys
with faiss (exact search):
    --vote cosine     cosine similarity: inner product of unit vectors (faiss.IndexFlatIP)
    --vote distance   squared L2 distance d(k, q) = ||k - q||^2 on the raw vectors
                      (faiss.IndexFlatL2)
    --vote euclidean  Euclidean distance d(k, q) = ||k - q||, the square root of the same search
and the neighbours' values vote, each with a weight alpha_j:
    KNN(q) = sum_j alpha_j y_j        (Q, C): for one-hot values, each class's share of the vote
    cosine     (KNN-BERT)            alpha_j = 1/K, one vote each
    distance   (Khandelwal et al. 2020; Liang et al. eq. 2)   alpha = softmax_j(-d_j / T),   T = 10
    euclidean  (Su et al. eq. 1)     alpha = softmax_j(-d_j / tau), tau = 1: multi-label's vote
The prediction mixes the kNN vote with the model's own probabilities P (minknn/kinds.py: the
softmax of the logits, or for a multi-label task each class's sigmoid):
    s = (1 - phi) P(q) + phi KNN(q)    phi = 1 is kNN alone
and is read as the model's is: the arg max, or each class with s > 0.5 (multi-label).
Defaults, by kind (KNN_DEFAULTS): classify K = 64 (Liang et al.'s; KNN-BERT uses 100 to 1000 and
finds K matters little once large), phi = 0.25 (KNN-BERT's), the cosine vote; multilabel K = 5,
phi = 0.5 (Su et al.'s lambda), the euclidean vote (Su et al.'s, on AAPD). T = 10 (Liang et
al.'s) for the distance vote and tau = 1 (Su et al.'s) for the euclidean one.
When the queries are training examples themselves (evaluate.py --split train), each query's own
entry is left out of its neighbours, or every example would find itself first.
"""
import hashlib

import faiss
import numpy as np
import torch
import torch.nn.functional as F

from minknn import MinknnError
from minknn.checkpoint import atomic_save, load_tagged
from minknn.data import examples_fingerprint

FORMAT = "minknn-datastore-1"


def vote_cosine(scores, temperature=None):
    """One vote each, whatever the similarity: alpha_j = 1/K."""
    return torch.full(scores.shape, 1 / scores.shape[1], dtype=torch.float64)


def vote_distance(scores, temperature=10.0):
    """alpha = softmax_j(-d_j / T); the scores are the squared L2 distances d_j."""
    return torch.softmax(-scores.double() / temperature, dim=1)


def vote_euclidean(scores, temperature=1.0):
    """alpha = softmax_j(-d_j / tau) with d_j = ||k_j - q||, the root of the squared distances."""
    return torch.softmax(-scores.double().clamp(min=0).sqrt() / temperature, dim=1)


VOTES = {"cosine": vote_cosine, "distance": vote_distance, "euclidean": vote_euclidean}
KNN_DEFAULTS = {  # the task's kind -> its default K, phi and vote
    "classify": {"k": 64, "phi": 0.25, "vote": "cosine"},
    "multilabel": {"k": 5, "phi": 0.5, "vote": "euclidean"},
}
TEMPERATURES = {"cosine": None, "distance": 10.0, "euclidean": 1.0}  # each vote's default T (tau)


def settings(kind, k=None, phi=None, vote=None, temperature=None):
    """(K, phi, vote, temperature) for a task of this kind: the values given, else its defaults."""
    defaults = KNN_DEFAULTS[kind]
    vote = vote or defaults["vote"]
    return (k or defaults["k"], defaults["phi"] if phi is None else phi, vote,
            TEMPERATURES[vote] if temperature is None else temperature)


def check_k(k, n, excluding_self=False):
    """K must fit in a datastore of n keys (one fewer when each query's own entry is left out)."""
    if not 1 <= k <= n - excluding_self:
        raise MinknnError(f"--k {k}: the datastore holds {n} training examples"
                          f"{', one of them the query itself' if excluding_self else ''}; "
                          f"use --k {n - excluding_self} or less")


def interpolate(probabilities, knn_probs, phi):
    """s = (1 - phi) P(q) + phi KNN(q), (Q, C)."""
    return (1 - phi) * probabilities + phi * knn_probs


class Datastore:
    """The training set's keys (N, d) and labels (N,) class indices, or (N, C) multi-hot rows, with
    their example ids, searchable by faiss; values (N, C) are the labels as one-hot or multi-hot
    rows."""

    def __init__(self, keys, labels, ids, num_classes):
        if len(keys) == 0:
            raise MinknnError("the kNN datastore is empty: the training set has no examples")
        self.keys = np.ascontiguousarray(keys.numpy() if torch.is_tensor(keys) else keys,
                                         dtype=np.float32)
        self.labels = torch.as_tensor(labels)
        self.values = (F.one_hot(self.labels.long(), num_classes) if self.labels.ndim == 1
                       else self.labels).double()
        self.ids, self.num_classes = list(ids), num_classes
        self._indexes = {}

    def __len__(self):
        return len(self.keys)

    def index(self, vote):
        """The faiss index a vote searches: inner product on unit keys (cosine), or squared L2 on
        raw keys."""
        metric = "cosine" if vote == "cosine" else "l2"  # distance and euclidean share one search
        if metric not in self._indexes:
            keys = self.keys.copy()
            if metric == "cosine":
                faiss.normalize_L2(keys)
            index = (faiss.IndexFlatIP(keys.shape[1]) if metric == "cosine"
                     else faiss.IndexFlatL2(keys.shape[1]))
            index.add(keys)
            self._indexes[metric] = index
        return self._indexes[metric]

    def search(self, queries, k, vote, exclude=None):
        """The k nearest keys of each query: (scores (Q, k), rows (Q, k)), nearest first; scores are
        cosine similarities or squared distances. exclude: (Q,) a datastore row to leave out per
        query (its own entry), -1 for none."""
        check_k(k, len(self), exclude is not None)
        q = np.ascontiguousarray(queries.numpy() if torch.is_tensor(queries) else queries,
                                 dtype=np.float32)
        if vote == "cosine":
            q = q.copy()
            faiss.normalize_L2(q)
        extra = int(exclude is not None)
        scores, rows = self.index(vote).search(q, k + extra)
        if exclude is not None:
            # drop each query's own entry (or, when it is not among them, the last hit)
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
        """KNN(q) = sum_j alpha_j y_j (Q, C), summed one neighbour rank at a time: gathering every
        neighbour's row at once, (Q, K, C), would not fit for K = 1024 and 90 classes."""
        alpha = VOTES[vote](scores, temperature)
        knn = torch.zeros(len(rows), self.num_classes, dtype=torch.float64)
        for j in range(rows.shape[1]):
            knn += alpha[:, j, None] * self.values[rows[:, j]]
        return knn

    def save(self, path, fingerprint):
        atomic_save({"format": FORMAT, "fingerprint": fingerprint,
                     "keys": torch.from_numpy(self.keys), "labels": self.labels, "ids": self.ids,
                     "num_classes": self.num_classes}, path)

    @classmethod
    def load(cls, path, fingerprint):
        """The datastore saved at path, or None when it was built from another checkpoint or
        data."""
        saved = load_tagged(path, FORMAT, (path, "datastore"))
        if saved["fingerprint"] != fingerprint:
            return None
        return cls(saved["keys"], saved["labels"], saved["ids"], saved["num_classes"])


def fingerprint(checkpoint_path, key, examples):
    """What a datastore depends on: the checkpoint file's bytes, the key, and the training
    examples."""
    h = hashlib.sha256()
    with open(checkpoint_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(key.encode())
    h.update(examples_fingerprint(examples).encode())  # ids, texts and labels
    return h.hexdigest()
