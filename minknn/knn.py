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
This file holds the formulas: the votes' weights, the vote itself and the mix. The search, over
a faiss index of the training set's keys, is minknn/datastore.py's.
"""
from typing import NamedTuple

import torch

from minknn import MinknnError


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


class Settings(NamedTuple):
    k: int              # neighbours per query
    phi: float          # the vote's share in the mix
    vote: str           # its weights: VOTES
    temperature: float  # T (tau) of the distance and euclidean votes; None for cosine


def settings(kind, k=None, phi=None, vote=None, temperature=None):
    """Settings (K, phi, vote, temperature) for a task of this kind: the values given, else its
    defaults."""
    defaults = KNN_DEFAULTS[kind]
    vote = vote or defaults["vote"]
    return Settings(k or defaults["k"], defaults["phi"] if phi is None else phi, vote,
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


def knn_vote(scores, rows, values, vote, temperature):
    """KNN(q) = sum_j alpha_j y_j (Q, C), summed one neighbour rank at a time: gathering every
    neighbour's row at once, (Q, K, C), would not fit for K = 1024 and 90 classes."""
    weights = VOTES[vote](scores, temperature)  # (Q, K): alpha_j, each neighbour's weight
    knn = torch.zeros(len(rows), values.shape[1], dtype=torch.float64)
    # rows (Q, K): each query's neighbours as rows of the datastore, whose values (N, C) are the
    # one-hot (or multi-hot) labels y. For each rank j, add alpha_j y_j to every query's row:
    # values[rows[:, j]] is (Q, C), and weights[:, j] must broadcast over C.
    # BEGIN part knn
    for j in range(rows.shape[1]):
        knn += weights[:, j, None] * values[rows[:, j]]
    # END part knn
    return knn
