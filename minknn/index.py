"""The faiss indexes a kNN datastore searches (minknn/knn.py; evaluate.py --index).

An index (--index, INDEX_DEFAULTS) is how faiss finds the K nearest keys:
    flat  exact: the query is compared with every key, N d multiply-adds a query.
    ivf   an inverted file (faiss.IndexIVFFlat): k-means splits the keys into nlist cells, and
          a query is compared only with the keys of the nprobe cells whose centroids are
          nearest, about nprobe / nlist of them. A neighbour in a cell not visited is missed:
          nprobe trades recall for time (nprobe >= nlist is exact). nlist defaults to
          4 sqrt(N), the low end of faiss's 4 sqrt(N) to 16 sqrt(N) cells for up to 1M keys,
          and the k-means is trained on at most 64 keys a cell (faiss asks for 30 to 256), with
          at least 39 a cell (fewer and faiss's k-means warns) (faiss wiki, "Guidelines to
          choose an index").
    hnsw  a hierarchical navigable small-world graph (Malkov & Yashunin 2018;
          faiss.IndexHNSWFlat): each key is linked to hnsw_m neighbours, found while building
          with a candidate list of ef_construction; a query walks the graph greedily, keeping
          the ef_search best candidates: ef_search trades recall for time. It must be at least
          the hits asked for (K, or K + 1 when the query's own entry is dropped); a smaller one
          is raised to that (faiss's own HNSW search does likewise).
Both find the true scores of the keys they return (cosine similarities, squared L2), so the votes
are unchanged; they may miss some of the K nearest: recall_at_k measures how many. When an
approximate search finds fewer than K keys (faiss's row -1), the search is refused, naming the
flag to raise. The built index is saved with the datastore: an IVF or HNSW build over 1M keys
can take minutes.
"""
import math

import faiss
import numpy as np
import torch

from minknn import MinknnError

INDEXES = ("flat", "ivf", "hnsw")
# The approximate indexes' defaults, chosen by measurement (`python -m minknn.lab.bench index`,
# RESULTS.md): on 152k real MiniLM keys queried by SST's dev sentences, recall@64 is 0.93 for IVF
# at nprobe 128 and 0.97 for HNSW at ef_search 256, each at 8 to 17% of the encoder's time per
# query on a 2-core CPU; the cheaper nprobe 32 and ef_search 128 found only 0.80 and 0.93. nlist
# and the k-means sample follow the faiss wiki's guidelines, hnsw_m (32) is within its 4 to 64.
# Change them here and nowhere else.
INDEX_DEFAULTS = {
    "flat": {},
    "ivf": {"nlist_per_sqrt_n": 4, "nprobe": 128, "max_train_per_cell": 64},
    "hnsw": {"hnsw_m": 32, "ef_construction": 64, "ef_search": 256},
}
MIN_TRAIN_PER_CELL = 39  # faiss's k-means warns with fewer training keys a centroid
INDEX_FLAGS = {"flat": (), "ivf": ("nlist", "nprobe"),  # evaluate.py's flags of each index
               "hnsw": ("hnsw_m", "ef_construction", "ef_search")}
_ivf, _hnsw = INDEX_DEFAULTS["ivf"], INDEX_DEFAULTS["hnsw"]
INDEX_HELP = {  # each flag's --help
    "nlist": f"ivf: k-means cells (default: {_ivf['nlist_per_sqrt_n']} sqrt(N), at least "
             f"{MIN_TRAIN_PER_CELL} keys a cell)",
    "nprobe": f"ivf: cells searched per query (default: {_ivf['nprobe']})",
    "hnsw_m": f"hnsw: links per key (default: {_hnsw['hnsw_m']})",
    "ef_construction": f"hnsw: candidates kept while building (default: "
                       f"{_hnsw['ef_construction']})",
    "ef_search": f"hnsw: candidates kept per query, raised to K (K + 1 on --split train) when "
                 f"smaller (default: {_hnsw['ef_search']})",
}
BUILT_WITH = {"flat": (), "ivf": ("nlist", "max_train_per_cell"),  # what the built index depends
              "hnsw": ("hnsw_m", "ef_construction")}               # on; nprobe, ef_search do not
FLAT = {"cosine": faiss.IndexFlatIP, "l2": faiss.IndexFlatL2}
FAISS_METRIC = {"cosine": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}


def metric_of(vote):
    """cosine: inner product on unit keys; distance and euclidean share one squared-L2 search."""
    return "cosine" if vote == "cosine" else "l2"


def default_nlist(n):
    """4 sqrt(N) cells, but at least 39 keys a cell (and one cell at least)."""
    per_sqrt_n = INDEX_DEFAULTS["ivf"]["nlist_per_sqrt_n"]
    return max(1, min(round(per_sqrt_n * math.sqrt(n)), n // MIN_TRAIN_PER_CELL))


def index_settings(index, n, **given):
    """{"index": index, and its parameters} for an index over n keys: each parameter the value
    given (evaluate.py's flags, by name; None or absent: INDEX_DEFAULTS's; the other indexes'
    parameters are ignored)."""
    settings = {"index": index}
    for name in (*INDEX_FLAGS[index], *BUILT_WITH[index]):
        value = given.get(name)
        if value is None:
            value = default_nlist(n) if name == "nlist" else INDEX_DEFAULTS[index][name]
        settings[name] = value
    if index == "ivf" and settings["nlist"] > n:
        raise MinknnError(f"--nlist {settings['nlist']}: the datastore holds {n} training examples "
                          f"and k-means needs one a cell at least; use --nlist {n} or less "
                          f"(default: {default_nlist(n)})")
    return settings


def built_with(settings):
    """The settings the built index depends on: the index and its build parameters."""
    return {name: settings[name] for name in ("index", *BUILT_WITH[settings["index"]])}


def describe_index(settings):
    """e.g. 'ivf (nlist 51, max_train_per_cell 64)': the index and its build parameters."""
    params = ", ".join(f"{k} {v}" for k, v in built_with(settings).items() if k != "index")
    return settings["index"] + (f" ({params})" if params else "")


def build_index(keys, metric, settings):
    """A faiss index over keys (N, d), trained and filled: metric "cosine" compares unit vectors
    by inner product (the keys are normalised here), "l2" the raw vectors by squared distance;
    settings: index_settings(...). Its search returns the same scores for either kind."""
    keys = np.array(keys.numpy() if torch.is_tensor(keys) else keys, dtype=np.float32,
                    order="C")  # a copy: normalised in place below
    if metric == "cosine":
        faiss.normalize_L2(keys)
    d, kind = keys.shape[1], settings["index"]
    if kind == "flat":
        index = FLAT[metric](d)
    elif kind == "ivf":
        index = faiss.IndexIVFFlat(FLAT[metric](d), d, settings["nlist"], FAISS_METRIC[metric])
        # k-means on a sample of at most max_train_per_cell keys a cell, drawn with a fixed seed
        # (faiss's default, written out): the same keys build the same index
        index.cp.max_points_per_centroid = settings["max_train_per_cell"]
        index.cp.seed = 1234
        index.train(keys)
    else:
        index = faiss.IndexHNSWFlat(d, settings["hnsw_m"], FAISS_METRIC[metric])
        index.hnsw.efConstruction = settings["ef_construction"]
    index.add(keys)
    return index


def search_parameters(settings, hits):
    """faiss's per-search parameters: the cells an IVF search visits; the candidates an HNSW
    search keeps, at least the hits asked for (a smaller ef_search is raised to that)."""
    if settings["index"] == "ivf":
        return faiss.SearchParametersIVF(nprobe=settings["nprobe"])
    if settings["index"] == "hnsw":
        return faiss.SearchParametersHNSW(efSearch=max(settings["ef_search"], hits))
    return None


def recall_at_k(approx_rows, exact_rows):
    """The fraction of the exact K nearest (exact_rows (Q, K), e.g. a flat index's rows) that an
    approximate search found (approx_rows (Q, K), -1 for no hit), averaged over the queries.
    Keys exactly as near as the K-th can make a correct hit count as a miss; with continuous
    keys such ties are rare."""
    approx, exact = np.asarray(approx_rows), np.asarray(exact_rows)
    found = [len(set(a.tolist()) & set(e.tolist())) for a, e in zip(approx, exact)]
    return float(np.mean(found)) / exact.shape[1]
