"""k-nearest-neighbour classification over a faiss datastore of the training set, mixed with the
model's own prediction (KNN-BERT, Li et al., eq. 1; Liang et al., "Retrieval-Augmented
Classification with Decoupled Representation", eq. 2-3; Su et al., "Contrastive Learning-Enhanced
Nearest Neighbor Mechanism for Multi-Label Text Classification", eq. 1).

Datastore: one forward pass over the training set gives a key per example (its representation,
--knn_key) and a value: its label as a one-hot row y_j (C,), or, for a multi-label task, its
multi-hot row. A query q (a dev or test example's representation) retrieves its K nearest keys
with faiss (exactly, or approximately: the index, below):
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

The search runs over a faiss index, exact or approximate (--index: minknn/index.py).
"""
import hashlib

import faiss
import numpy as np
import torch
import torch.nn.functional as F

from minknn import MinknnError
from minknn.checkpoint import atomic_save, load_tagged, sealed
from minknn.data import examples_fingerprint
from minknn.index import build_index, built_with, index_settings, metric_of, search_parameters

FORMAT = "minknn-datastore-2"  # -2: the index's settings and the built approximate indexes
FORMAT_1 = "minknn-datastore-1"  # flat indexes only, built on loading: still read, as flat


def vote_cosine(scores, temperature=None):
    """One vote each, whatever the similarity: alpha_j = 1/K."""
    # scores (Q, K): each query's K cosine similarities, nearest first. They chose the neighbours;
    # they do not weigh them (KNN-BERT counts votes). The weights (Q, K), in float64.
    # BEGIN part knn
    return torch.full(scores.shape, 1 / scores.shape[1], dtype=torch.float64)
    # END part knn


def vote_distance(scores, temperature=10.0):
    """alpha = softmax_j(-d_j / T); the scores are the squared L2 distances d_j."""
    # scores (Q, K): squared distances, nearest first. The softmax runs over each query's K
    # neighbours (dim 1), and the minus gives the nearest the largest weight. In float64.
    # BEGIN part knn
    return torch.softmax(-scores.double() / temperature, dim=1)
    # END part knn


def vote_euclidean(scores, temperature=1.0):
    """alpha = softmax_j(-d_j / tau) with d_j = ||k_j - q||, the root of the squared distances."""
    # faiss's scores are squared distances (Q, K): take the root first. Rounding can leave a
    # squared distance a hair below 0, so clamp it at 0 before the root (else NaN).
    # BEGIN part knn
    return torch.softmax(-scores.double().clamp(min=0).sqrt() / temperature, dim=1)
    # END part knn


VOTES = {"cosine": vote_cosine, "distance": vote_distance, "euclidean": vote_euclidean}
KNN_DEFAULTS = {  # the task's kind -> its default K, phi and vote
    "classify": {"k": 64, "phi": 0.25, "vote": "cosine"},
    "multilabel": {"k": 5, "phi": 0.5, "vote": "euclidean"},
}
TEMPERATURES = {"cosine": None, "distance": 10.0, "euclidean": 1.0}  # each vote's default T (tau)
SWEEP_PHIS = sorted([i / 10 for i in range(11)] + [0.25])  # KNN-BERT's Figure 2 (its phi 0.25)
SWEEP_KS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]  # evaluate.py --sweep, the runner's sweep


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
    # phi is the kNN vote's share: phi = 0 is the model alone, phi = 1 kNN alone.
    # BEGIN part knn
    return (1 - phi) * probabilities + phi * knn_probs
    # END part knn


class Datastore:
    """The training set's keys (N, d) and labels (N,) class indices, or (N, C) multi-hot rows, with
    their example ids, searchable by faiss; values (N, C) are the labels as one-hot or multi-hot
    rows. index: index_settings(...) (default: flat). Each metric's index is built on its first
    search; the approximate ones are saved with the datastore."""

    def __init__(self, keys, labels, ids, num_classes, index=None):
        if len(keys) == 0:
            raise MinknnError("the kNN datastore is empty: the training set has no examples")
        self.keys = np.ascontiguousarray(keys.numpy() if torch.is_tensor(keys) else keys,
                                         dtype=np.float32)
        self.labels = torch.as_tensor(labels)
        self.values = (F.one_hot(self.labels.long(), num_classes) if self.labels.ndim == 1
                       else self.labels).double()
        self.ids, self.num_classes = list(ids), num_classes
        self.settings = index or index_settings("flat", len(self.keys))
        self._indexes = {}  # metric ("cosine" or "l2") -> its faiss index, built or loaded

    def __len__(self):
        return len(self.keys)

    def use_index(self, settings):
        """Search with these settings from now on: the indexes already built are kept if they
        were built with the same ones (nprobe or ef_search may differ), else dropped."""
        if built_with(settings) != built_with(self.settings):
            self._indexes = {}
        self.settings = settings

    def has_index(self, vote):
        return metric_of(vote) in self._indexes

    def index(self, vote):
        """The faiss index a vote searches, built on first use."""
        metric = metric_of(vote)
        if metric not in self._indexes:
            self._indexes[metric] = build_index(self.keys, metric, self.settings)
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
        hits = k + int(exclude is not None)
        scores, rows = self.index(vote).search(q, hits, params=search_parameters(self.settings,
                                                                                 hits))
        if exclude is not None:
            # drop each query's own entry (or, when it is not among them, the last hit); an
            # approximate index pads with row -1, which is nobody's own entry
            own = (rows == np.asarray(exclude)[:, None]) & (rows >= 0)
            own[~own.any(1), -1] = True
            keep = ~own
            scores, rows = scores[keep].reshape(len(q), k), rows[keep].reshape(len(q), k)
        if (rows < 0).any():  # row -1 would vote with the last key: refused instead
            raise MinknnError(self.too_few_hits(int((rows < 0).any(1).sum()), len(q), k))
        return torch.from_numpy(scores), torch.from_numpy(rows)

    def too_few_hits(self, short, queries, k):
        """The error of an approximate search that found fewer than k keys for some queries."""
        s = self.settings
        raise_ = (f"--nprobe (now {s['nprobe']} of {s['nlist']} cells)" if s["index"] == "ivf"
                  else f"--ef_search (now {s['ef_search']})")
        return (f"--index {s['index']}: {short} of {queries} queries found fewer than {k} "
                f"neighbours; raise {raise_}")

    def rows_of(self, ids):
        """Each id's datastore row, -1 for ids not in it."""
        row = {i: r for r, i in enumerate(self.ids)}
        return np.array([row.get(i, -1) for i in ids])

    def vote(self, scores, rows, vote, temperature):
        """KNN(q) = sum_j alpha_j y_j (Q, C), summed one neighbour rank at a time: gathering every
        neighbour's row at once, (Q, K, C), would not fit for K = 1024 and 90 classes."""
        alpha = VOTES[vote](scores, temperature)  # (Q, K)
        knn = torch.zeros(len(rows), self.num_classes, dtype=torch.float64)
        # rows (Q, K): each query's neighbours as rows of the datastore, whose values (N, C) are
        # the one-hot (or multi-hot) labels y. For each rank j, add alpha_j y_j to every query's
        # row: self.values[rows[:, j]] is (Q, C), and alpha[:, j] must broadcast over C.
        # BEGIN part knn
        for j in range(rows.shape[1]):
            knn += alpha[:, j, None] * self.values[rows[:, j]]
        # END part knn
        return knn

    def save(self, path, fingerprint):
        """The keys, labels and ids, the index's settings and the approximate indexes built so
        far, serialised by faiss (a flat index is the keys themselves: rebuilt on loading), with
        the checksum of it all (checkpoint.sealed)."""
        built = {} if self.settings["index"] == "flat" else \
            {metric: torch.from_numpy(faiss.serialize_index(index))
             for metric, index in self._indexes.items()}
        atomic_save(sealed({"format": FORMAT, "fingerprint": fingerprint,
                            "keys": torch.from_numpy(self.keys), "labels": self.labels,
                            "ids": self.ids, "num_classes": self.num_classes,
                            "index": built_with(self.settings), "faiss": built}), path)

    @classmethod
    def load(cls, path, fingerprint, n=None, dim=None, num_classes=None):
        """The datastore saved at path, with its index's settings (nprobe and ef_search: the
        defaults; use_index sets others) and its saved indexes, or None when it was built from
        another checkpoint or data. n, dim, num_classes: what it must hold when it is this
        checkpoint's (n keys of dimension dim, labels of num_classes classes); a file whose
        contents or shapes are not whole is refused in one line."""
        again = "delete it, and evaluate.py --knn builds it again"
        saved = load_tagged(path, (FORMAT, FORMAT_1), (path, "datastore"), again)
        missing = [k for k in ("fingerprint", "keys", "labels", "ids", "num_classes")
                   if k not in saved]
        if missing:
            raise MinknnError(f"{path}: has no {', '.join(missing)}; it is not a whole datastore "
                              f"({again})")
        if saved["fingerprint"] != fingerprint:
            return None

        def refused(what):
            return MinknnError(f"{path}: {what}; it is not a whole datastore of this checkpoint "
                               f"({again})")
        keys, labels, ids, classes = (saved[k] for k in ("keys", "labels", "ids", "num_classes"))
        faulty = check_saved(keys, labels, ids, classes, n, dim, num_classes)
        if faulty:
            raise refused(faulty)
        indexes = {}  # metric -> the faiss index saved for it
        for metric, serialized in saved.get("faiss", {}).items():
            try:
                index = faiss.deserialize_index(serialized.numpy())
            except Exception as e:  # faiss raises RuntimeError on bytes that are not an index
                raise refused(f"its {metric} index cannot be read ({type(e).__name__})") from None
            if (index.ntotal, index.d) != tuple(keys.shape):
                raise refused(f"its {metric} index holds {index.ntotal} keys of dimension "
                              f"{index.d}, but its keys are {tuple(keys.shape)}")
            indexes[metric] = index
        built = dict(saved.get("index", {"index": "flat"}))  # minknn-datastore-1: flat
        datastore = cls(keys, labels, ids, classes,
                        index_settings(built.pop("index"), len(keys), **built))
        datastore._indexes = indexes
        return datastore


def check_saved(keys, labels, ids, num_classes, n=None, dim=None, expected_classes=None):
    """What is wrong with a saved datastore's entries, in words, or None: keys (N, d), labels N
    class indices in [0, C) or (N, C) multi-hot rows, N ids, C = num_classes; n, dim and
    expected_classes (when given): the N, d and C it must have."""
    if not torch.is_tensor(keys) or keys.ndim != 2 or not keys.is_floating_point():
        return f"its keys are not a (N, d) float tensor ({describe_value(keys)})"
    N, d = keys.shape
    if N == 0:
        return "it holds no keys"
    if n is not None and N != n:
        return f"it holds {N} keys, but the training set has {n} examples"
    if dim is not None and d != dim:
        return f"its keys have dimension {d}, but the model's representations have {dim}"
    if not isinstance(num_classes, int) or num_classes < 1:
        return f"num_classes is {num_classes!r}, not a number of classes"
    if expected_classes is not None and num_classes != expected_classes:
        return f"it has {num_classes} classes, but the task has {expected_classes}"
    if not torch.is_tensor(labels) or labels.ndim == 0 or len(labels) != N or \
            labels.shape[1:] not in ((), (num_classes,)):
        return (f"its labels are {describe_value(labels)}, not {N} class indices or a "
                f"({N}, {num_classes}) multi-hot array, one per key")
    if labels.ndim == 1 and (labels.is_floating_point() or
                             not 0 <= int(labels.min()) <= int(labels.max()) < num_classes):
        return f"its labels are not class indices in [0, {num_classes})"
    if not isinstance(ids, list) or len(ids) != N:
        return (f"it has {len(ids) if isinstance(ids, list) else describe_value(ids)} ids for "
                f"{N} keys")
    return None


def describe_value(x):
    return f"shape {tuple(x.shape)}, {x.dtype}" if torch.is_tensor(x) else type(x).__name__


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
