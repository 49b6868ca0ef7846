"""Datasets: a registry of tasks, their file readers, downloads and few-shot sampling.

An `Example` holds one text (or two, for sentence-pair tasks) and a label of any type: a class
index here; later a real number (STS) or a list of classes (multi-label). A `Task` says where its
files are, how to read them and what its labels are called. Adding a task is one entry in TASKS.

Files live under <root>/<dataset>/, where root is --data_dir, else $MINKNN_DATA, else ./data.
A missing file is downloaded from the dataset's official distribution, to a temporary name that
is renamed only once the whole file has arrived (and its git blob id checked), so an interrupted
download never leaves a half file that looks whole.
"""
import csv
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


# what a task predicts, and so its head and loss (minknn/multitask.py)
KINDS = {
    "classify": "one sentence -> one of C classes (linear head, cross-entropy or a --loss)",
    "paraphrase": "a sentence pair -> paraphrase or not (one logit, binary cross-entropy)",
    "similarity": "a sentence pair -> a similarity score in [0, 5] (one output, MSE or L1)",
}


@dataclass
class Task:
    name: str
    dataset: str     # the folder under the data root
    files: dict      # split -> file name
    reader: object   # reader(path, task) -> list[Example]
    labels: list     # class names, in label-index order; [] for a similarity task (real-valued labels)
    kind: str = "classify"  # one of KINDS
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


def read_minbert_pairs(path, task):
    """The CS224N minBERT pair files (quora-*.csv, sts-*.csv): tab-separated with CSV quoting (a
    field may be wrapped in double quotes, with "" for a quote mark inside), a header row, columns
    found by name: id, sentence1, sentence2 and (not in test-student files) is_duplicate (0.0 or
    1.0) or similarity (a real number in [0, 5]).
    One exception to "a bad row stops the run": quora-dev.csv has two rows whose second sentence
    swallowed the rest of the line, leaving the label empty. The starter code drops them silently;
    we drop rows with an empty label and say which lines."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    if not rows:
        raise DataError(f"{path}: the file is empty")
    header = rows[0]
    for column in ("id", "sentence1", "sentence2"):
        if column not in header:
            raise DataError(f"{path}:1: header {header} has no '{column}' column")
    i_id, i_a, i_b = header.index("id"), header.index("sentence1"), header.index("sentence2")
    label_column = "similarity" if task.kind == "similarity" else "is_duplicate"
    i_label = header.index(label_column) if label_column in header else None
    examples, dropped = [], []
    for row_number, row in enumerate(rows[1:], start=2):  # quoted fields hold no newlines, so row = line
        where = f"{path}:{row_number}"
        if len(row) != len(header):
            raise DataError(f"{where}: expected {len(header)} tab-separated fields, got {len(row)}")
        label = None
        if i_label is not None:
            if not row[i_label].strip():
                dropped.append(str(row_number))
                continue
            label = parse_label(row[i_label], task, where)
        examples.append(Example(text=row[i_a].strip(), text_b=row[i_b].strip(), label=label, id=row[i_id]))
    if dropped:
        print(f"{path}: dropped {len(dropped)} rows with an empty {label_column} label (lines {', '.join(dropped)})")
    return examples


def read_glue_pairs(path, task):
    """A GLUE sentence-pair file (MRPC/{train,dev,test}.tsv): tab-separated, no quoting (texts
    hold bare quote marks, so GLUE's loaders read them with QUOTE_NONE; we split on tabs), a
    header row that may start with a byte-order mark: Quality, #1 ID, #2 ID, #1 String, #2 String.
    test.tsv has an index column in place of Quality and no labels."""
    with open(path, encoding="utf-8-sig") as f:  # utf-8-sig drops the byte-order mark
        lines = f.read().splitlines()
    if not lines:
        raise DataError(f"{path}: the file is empty")
    header = lines[0].split("\t")
    for column in ("#1 ID", "#2 ID", "#1 String", "#2 String"):
        if column not in header:
            raise DataError(f"{path}:1: header {header} has no '{column}' column")
    i_a, i_b = header.index("#1 String"), header.index("#2 String")
    i_ids = header.index("#1 ID"), header.index("#2 ID")
    i_label = header.index("Quality") if "Quality" in header else None
    examples = []
    for lineno, line in enumerate(lines[1:], start=2):
        row = line.split("\t")
        if len(row) != len(header):
            raise DataError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, got {len(row)}")
        label = None if i_label is None else parse_label(row[i_label], task, f"{path}:{lineno}")
        examples.append(Example(text=row[i_a].strip(), text_b=row[i_b].strip(), label=label,
                                id="-".join(row[i] for i in i_ids)))
    return examples


def parse_label(value, task, where):
    """A similarity score (a float in [0, 5]) or a class index; quora writes its classes as 0.0 and 1.0."""
    if task.kind == "similarity":
        try:
            score = float(value)
        except ValueError:
            score = -1.0
        if not 0 <= score <= 5:
            raise DataError(f"{where}: similarity '{value}' is not a number in [0, 5]")
        return score
    if task.kind == "paraphrase" and value.strip() in ("0.0", "1.0"):
        value = value.strip()[0]
    return parse_class(value, task, where)


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
    # quora-train.csv (22 MB) and quora-test-student.csv are missing from our reference copy
    # (../shared/data/SOURCES.md): their blob ids come from the repository's listing, unchecked here
    "quora": Task(
        name="quora", dataset="minbert", reader=read_minbert_pairs, url=MINBERT_URL, kind="paraphrase",
        files={"train": "quora-train.csv", "dev": "quora-dev.csv", "test": "quora-test-student.csv"},
        labels=["not duplicate", "duplicate"],
        blobs={"quora-train.csv": "a3b5546f6a0e65b60a328a5d294d1038f5bed1da",
               "quora-dev.csv": "de7cfa32428fd470b93f778fccc45a619e01336f",
               "quora-test-student.csv": "f257ef00558555afb50819578a58205732b16354"}),
    "sts": Task(
        name="sts", dataset="minbert", reader=read_minbert_pairs, url=MINBERT_URL, kind="similarity",
        files={"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test-student.csv"}, labels=[],
        blobs={"sts-train.csv": "12b17760e7795fee35aeeabc290d5651de02622a",
               "sts-dev.csv": "9392860e584717976b8d817cc40c9e6ceeec27e0",
               "sts-test-student.csv": "25f0cf8fafdd1f82b9e2bb460c708af34341ce60"}),
    # GLUE's MRPC has no single official download of the tsv files (download_glue_data.py builds
    # them from Microsoft's .msi), so there is no url: point --data_dir at a copy
    "mrpc": Task(
        name="mrpc", dataset="glue/MRPC", reader=read_glue_pairs, kind="paraphrase",
        files={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
        labels=["not paraphrase", "paraphrase"]),
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
    """The examples a run trains on: the train split, or its draw of max_train (--max_train,
    --seed): stratified by class, or uniform for a similarity task. evaluate.py --knn calls it
    again to build the run's datastore."""
    train = load_split(task, "train", data_dir)
    if not max_train or max_train >= len(train):
        return train
    if task.kind == "similarity":
        return random.Random(seed).sample(train, max_train)
    return stratified_sample(train, max_train, seed)


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
