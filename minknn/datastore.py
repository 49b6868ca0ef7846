"""The kNN datastore: the training set's keys and labels, searched by faiss (minknn/index.py: an
exact or approximate index), saved beside the run with a checksum and reused while the
checkpoint, the key and the training set are unchanged (run_datastore: as evaluate.py's flags
ask). The vote over what a search finds is minknn/knn.py's.

A query's K nearest keys, by the vote's metric: cosine similarity (an inner product of unit
vectors, faiss.IndexFlatIP) or the squared L2 distance (faiss.IndexFlatL2). When the queries are
training examples themselves (evaluate.py --split train), each query's own entry is left out of
its neighbours, or every example would find itself first.
"""
import hashlib
import os
import time

import faiss
import numpy as np
import torch
import torch.nn.functional as F

from minknn import MinknnError
from minknn.index import (INDEX_FLAGS, INDEXES, build_index, built_with, describe_index,
                          index_settings, metric_of, search_parameters)
from minknn.kinds import kind_of
from minknn.knn import check_k, knn_vote, settings
from minknn.tasks.data import (data_root, examples_fingerprint, source_paths, split_recipe,
                               training_examples)
from minknn.tools.engine import predict
from minknn.tools.files import atomic_save, hash_file, load_tagged, sealed

FORMAT = "minknn-datastore-2"  # -2: the index's settings and the built approximate indexes
FORMAT_1 = "minknn-datastore-1"  # flat indexes only, built on loading: still read, as flat
AGAIN = "delete it, and evaluate.py --knn builds it again"  # a damaged datastore's remedy


def read_file(path):
    """A saved datastore's dict, whole (its format tag and checksum), else one line naming it."""
    return load_tagged(path, (FORMAT, FORMAT_1), (path, "datastore"), AGAIN)


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
        """KNN(q) of the neighbours found by search() (minknn/knn.py, knn_vote)."""
        return knn_vote(scores, rows, self.values, vote, temperature)

    def save(self, path, fingerprint):
        """The keys, labels and ids, the index's settings and the approximate indexes built so
        far, serialised by faiss (a flat index is the keys themselves: rebuilt on loading), with
        the checksum of it all (files.sealed)."""
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
        saved = read_file(path)
        missing = [k for k in ("fingerprint", "keys", "labels", "ids", "num_classes")
                   if k not in saved]
        if missing:
            raise MinknnError(f"{path}: has no {', '.join(missing)}; it is not a whole datastore "
                              f"({AGAIN})")
        if saved["fingerprint"] != fingerprint:
            return None

        def refused(what):
            return MinknnError(f"{path}: {what}; it is not a whole datastore of this checkpoint "
                               f"({AGAIN})")
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
    h = hash_file(hashlib.sha256(), checkpoint_path)
    h.update(key.encode())
    h.update(examples_fingerprint(examples).encode())  # ids, texts and labels
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# the run's datastore, as evaluate.py's flags (and the attack's) ask for it

def run_training_set(args, ckpt, task):
    """The examples the run trained on (its --max_train or --per_class draw), for the kNN
    datastore: refused when their fingerprint is not the one the checkpoint recorded (another
    data root, or a file changed since the run read it)."""
    train = training_examples(task, args.data_dir, ckpt["args"]["max_train"], ckpt["args"]["seed"],
                              ckpt["args"].get("per_class"))
    recorded = ckpt.get("data", {}).get("train_fingerprint", {})
    if task.name in recorded and examples_fingerprint(train) != recorded[task.name]:
        root, here = ckpt["data"]["root"], os.path.abspath(data_root(args.data_dir))
        files = ", ".join(source_paths(task, split_recipe(task, "train")[0], args.data_dir))
        why = "changed since the run read it" if here == root else \
            f"the run read {root}: use --data_dir {root}"
        raise MinknnError(f"{files}: not the {task.name} training examples the run trained on "
                          f"({why}); --knn builds its datastore from the run's own")
    return train


def knn_settings(args, task):
    """K, phi, the vote and its temperature for this task: the flags, else its kind's defaults."""
    return settings(task.kind, args.k, args.phi, args.vote, args.temperature)


def knn_index(args, n):
    """The faiss index's settings over n training examples: the flags, else the defaults."""
    return index_settings(args.index or "flat", n, **{name: getattr(args, name) for flags in
                                                      INDEX_FLAGS.values() for name in flags})


def run_datastore(args, ckpt, model, tokenizer, task, train, key, device, several=False):
    """The run's datastore of its training set (train) and its index for this vote, as evaluate.py's
    flags (args) ask: loaded from disk when still valid, else built and saved (datastore_path: one
    file per index kind; several: the run has several tasks). A kind's first file takes its keys
    from another kind's file of this checkpoint when there is one, without encoding the training
    set again. Returns (datastore, seconds encoding its keys or None, seconds building its index
    or None)."""
    stamp, wanted = fingerprint(ckpt["file"], key, train), knn_index(args, len(train))
    path = datastore_path(args, ckpt, task, key, several, wanted["index"])
    shape = (len(train), model.bert.config.hidden_size, len(task.labels))  # n keys, d, classes
    datastore, seconds, stale = None, None, False
    if os.path.exists(path):
        datastore = Datastore.load(path, stamp, *shape)
        if datastore is None and args.datastore:
            raise MinknnError(f"--datastore {path} was built by a different checkpoint, key or "
                              f"training set; leave out --datastore to build one for this "
                              f"checkpoint")
        if datastore is None:
            print(f"datastore: {path} is from an older checkpoint, key or training set; "
                  f"rebuilding it")
        elif built_with(datastore.settings) != built_with(wanted):
            saved, asked = describe_index(datastore.settings), describe_index(wanted)
            if args.datastore:
                raise MinknnError(f"--datastore {path} holds index {saved}, but the flags ask for "
                                  f"{asked}; give its flags, or leave out --datastore")
            print(f"datastore: {path} holds index {saved}, not {asked}; building that over its "
                  f"keys")
            keep_other_kind(path, datastore, args, ckpt, task, key, several)
            stale = True
        else:
            print(f"datastore: {len(datastore)} keys ({key}), index {describe_index(wanted)}, "
                  f"loaded from {path}")
    elif not args.datastore:  # the keys of this checkpoint's datastore of another index kind
        for other in (datastore_path(args, ckpt, task, key, several, kind) for kind in INDEXES):
            if other != path and os.path.exists(other):
                datastore = Datastore.load(other, stamp, *shape)
            if datastore is not None:
                print(f"datastore: {len(datastore)} keys ({key}) loaded from {other}; index "
                      f"{describe_index(wanted)} goes to {path}")
                stale = True
                break
    if datastore is None:
        start = time.time()
        _, keys = predict(model, tokenizer, task, train, args.batch_size, device,
                          progress="datastore", key=key, precision=args.precision)
        labels = kind_of(task).targets(task, train, "cpu")  # class indices, or multi-hot rows
        datastore = Datastore(keys, labels, [e.id for e in train], len(task.labels), wanted)
        datastore.save(path, stamp)  # now, before any index: a failed build keeps the keys
        seconds = time.time() - start
        print(f"datastore: {len(datastore)} keys ({key}) built in {seconds:.1f} s, saved to {path}")
    datastore.use_index(wanted)  # nprobe and ef_search: the flags', whatever was saved
    vote = knn_settings(args, task).vote
    index_seconds = None
    if not datastore.has_index(vote):  # a flat index is never saved: the keys are all it holds
        start = time.time()
        datastore.index(vote)
        index_seconds = time.time() - start
        stale = stale or wanted["index"] != "flat"
    if stale:  # the next evaluate loads this index instead of building it
        datastore.save(path, stamp)
        built = "" if index_seconds is None else f" built in {index_seconds:.1f} s,"
        print(f"datastore: index {describe_index(wanted)}{built} saved to {path}")
    return datastore, seconds, index_seconds


def keep_other_kind(path, datastore, args, ckpt, task, key, several):
    """A default datastore file holding another kind of index than its name's (written by a
    minknn that kept every kind in one file) is moved to that kind's own file, where there is
    none yet, before path is rewritten: its built index is not lost."""
    kind = datastore.settings["index"]
    own = datastore_path(args, ckpt, task, key, several, kind)
    if own != path and not os.path.exists(own):
        os.replace(path, own)
        print(f"datastore: {path} held index {kind}; moved to {own}")


def datastore_path(args, ckpt, task, key, several, index="flat"):
    """--datastore, else <run>/datastore-<key>.pt for the flat index and
    <run>/datastore-<key>-<index>.pt for an approximate one (datastore-<task>-<key>... in a
    multi-task run): one file per index kind, so building one never replaces another."""
    name = f"datastore-{task.name + '-' if several else ''}{key}" \
           f"{'' if index == 'flat' else '-' + index}.pt"
    return args.datastore or os.path.join(os.path.dirname(ckpt["file"]), name)
