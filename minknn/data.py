"""Datasets: a registry of tasks, their file readers, downloads and few-shot sampling.

An `Example` holds one text (or two, for sentence-pair tasks) and a label of any type: a class
index here; later a real number (STS) or a list of classes (multi-label). A `Task` says where its
files are, how to read them and what its labels are called. Adding a task is one entry in TASKS.

Files live under <root>/<dataset>/, where root is --data_dir, else $MINKNN_DATA, else ./data.
A missing file is downloaded from the dataset's official distribution, to a temporary name that
is renamed only once the whole file has arrived (and its git blob id checked), so an interrupted
download never leaves a half file that looks whole.
"""
import hashlib
import http.client
import os
import random
import tempfile
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from tqdm import tqdm

from minknn import MinknnError


class DataError(MinknnError):
    pass


@dataclass
class Example:
    text: str
    text_b: str | None = None  # the second sentence of a pair task
    label: object = None       # None where the split ships without labels (e.g. test-student)
    id: str = ""


@dataclass
class Task:
    name: str
    dataset: str     # the folder under the data root
    files: dict      # split -> file name
    reader: object   # reader(path, task) -> list[Example]
    labels: list     # class names, in label-index order
    url: str = ""    # the official distribution; file names are appended
    blobs: dict = field(default_factory=dict)  # file name -> git blob id, to check downloads


# ---------------------------------------------------------------------------------- readers

def read_minbert_sentiment(path, task):
    """The CS224N minBERT sentiment files (ids-sst-*.csv, ids-cfimdb-*.csv): tab-separated, a
    header row, columns found by name: id, sentence and (not in test-student files) sentiment.
    Fields are split on tabs only: the CFIMDB texts hold quote marks that a CSV reader would eat."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines:
        raise DataError(f"{path}: the file is empty")
    header = lines[0].split("\t")
    for column in ("id", "sentence"):
        if column not in header:
            raise DataError(f"{path}:1: header {header} has no '{column}' column")
    i_id, i_text = header.index("id"), header.index("sentence")
    i_label = header.index("sentiment") if "sentiment" in header else None
    examples = []
    for lineno, line in enumerate(lines[1:], start=2):
        row = line.split("\t")
        if len(row) != len(header):
            raise DataError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, got {len(row)}")
        label = None
        if i_label is not None:
            label = parse_class(row[i_label], task, f"{path}:{lineno}")
        examples.append(Example(text=row[i_text].strip(), label=label, id=row[i_id]))
    return examples


def parse_class(value, task, where):
    try:
        label = int(value)
    except ValueError:
        label = -1
    if not 0 <= label < len(task.labels):
        raise DataError(f"{where}: unknown label '{value}'; {task.name} labels are 0..{len(task.labels) - 1}")
    return label


# ---------------------------------------------------------------------------------- registry

MINBERT_URL = "https://raw.githubusercontent.com/gpoesia/minbert-default-final-project/7ac8260577fc12a86c7aaf38918056c30054ef39/data/"

TASKS = {
    "sst": Task(
        name="sst", dataset="minbert", reader=read_minbert_sentiment, url=MINBERT_URL,
        files={"train": "ids-sst-train.csv", "dev": "ids-sst-dev.csv", "test": "ids-sst-test-student.csv"},
        labels=["very negative", "negative", "neutral", "positive", "very positive"],
        blobs={"ids-sst-train.csv": "9cb7333cb1dae49c2bd2a4b56a24882a6e8704b5",
               "ids-sst-dev.csv": "3171aa629a340809d2db4a50df8f6e5ec9420ab0",
               "ids-sst-test-student.csv": "bbd2313758825f86e24416d6aad64cd93370cf7a"}),
    "cfimdb": Task(
        name="cfimdb", dataset="minbert", reader=read_minbert_sentiment, url=MINBERT_URL,
        files={"train": "ids-cfimdb-train.csv", "dev": "ids-cfimdb-dev.csv", "test": "ids-cfimdb-test-student.csv"},
        labels=["negative", "positive"],
        blobs={"ids-cfimdb-train.csv": "cd57bcbd2f7214ea6dd1783d3e885d324b1f478d",
               "ids-cfimdb-dev.csv": "8a0f5dcf3d40189b96c801a12cd79bf8003e61de",
               "ids-cfimdb-test-student.csv": "1e789c709b3ca0511f027a309b6d8bd21cde41b2"}),
}


def get_task(name):
    if name not in TASKS:
        raise MinknnError(f"unknown --task '{name}'; choose one of: {', '.join(TASKS)}")
    return TASKS[name]


def data_root(data_dir=None):
    return data_dir or os.environ.get("MINKNN_DATA") or "data"


def load_split(task, split, data_dir=None):
    """Reads one split of a task, downloading its file first if it is missing."""
    if split not in task.files:
        raise MinknnError(f"{task.name} has no '{split}' split; it has: {', '.join(task.files)}")
    name = task.files[split]
    path = os.path.join(data_root(data_dir), task.dataset, name)
    if not os.path.exists(path):
        if not task.url:
            raise DataError(f"{path}: not found, and {task.name} has no download address")
        download(task.url + name, path, task.blobs.get(name))
    examples = task.reader(path, task)
    if not examples:
        raise DataError(f"{path}: the {split} split has no examples")
    return examples


def require_labels(examples, where):
    if any(e.label is None for e in examples):
        raise DataError(f"{where}: has examples without labels; training and scoring need labelled data")


def check_every_class_present(examples, task, where):
    require_labels(examples, where)
    counts = class_counts(examples, len(task.labels))
    empty = [task.labels[c] for c, n in enumerate(counts) if n == 0]
    if empty:
        raise DataError(f"{where}: no examples of class {', '.join(repr(e) for e in empty)} "
                        f"(counts {counts}); every class needs at least one to train")


def class_counts(examples, num_classes):
    counts = [0] * num_classes
    for e in examples:
        counts[e.label] += 1
    return counts


# ---------------------------------------------------------------------------------- download

def git_blob_id(path):
    """The id git gives this file's content (`git hash-object`): sha1 of "blob <size>\\0" + bytes."""
    h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(url, path, blob=None, timeout=60):
    """Downloads url to path with a progress bar. The bytes go to a temporary file in the same
    folder, renamed to `path` only when complete (and, if `blob` is given, when its git blob id
    matches), so `path` either does not exist or is whole."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=os.path.basename(path) + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {os.path.basename(path)}") as bar:
                for chunk in iter(lambda: response.read(1 << 16), b""):
                    out.write(chunk)
                    bar.update(len(chunk))
        got = os.path.getsize(tmp)
        if total is not None and got != total:
            raise DataError(f"download of {url} stopped after {got} of {total} bytes; run again to retry")
        if blob is not None and git_blob_id(tmp) != blob:
            raise DataError(f"download of {url} does not match its known content (git blob {blob})")
        os.replace(tmp, path)
    except (OSError, http.client.HTTPException) as e:  # a refused connection, an HTTP error, a cut-off body
        raise DataError(f"cannot download {url} to {path}: {e}. Point --data_dir or MINKNN_DATA at a copy") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ---------------------------------------------------------------------------------- sampling

def training_examples(task, data_dir=None, max_train=None, seed=0):
    """The examples a run trains on: the train split, or its stratified draw of max_train
    (--max_train, --seed). evaluate.py --knn calls it again to build the run's datastore."""
    train = load_split(task, "train", data_dir)
    return stratified_sample(train, max_train, seed) if max_train else train


def stratified_sample(examples, n, seed):
    """Draws n examples keeping each class's share of the training set (largest-remainder
    rounding, at least one per class), the same draw for the same seed."""
    if n >= len(examples):
        return list(examples)
    by_class = defaultdict(list)
    for e in examples:
        by_class[e.label].append(e)
    classes = sorted(by_class)
    if n < len(classes):
        raise MinknnError(f"--max_train {n} is smaller than the {len(classes)} classes; each class needs one example")
    exact = {c: n * len(by_class[c]) / len(examples) for c in classes}
    take = {c: max(1, int(exact[c])) for c in classes}
    by_remainder = sorted(classes, key=lambda c: exact[c] - int(exact[c]), reverse=True)
    i = 0
    while sum(take.values()) < n:  # hand out what rounding down left over
        c = by_remainder[i % len(classes)]
        if take[c] < len(by_class[c]):
            take[c] += 1
        i += 1
    while sum(take.values()) > n:  # the at-least-one rule can overshoot: take from the largest
        take[max(classes, key=lambda c: take[c])] -= 1
    rng = random.Random(seed)
    sample = [e for c in classes for e in rng.sample(by_class[c], take[c])]
    rng.shuffle(sample)
    return sample
