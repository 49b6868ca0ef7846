"""Datasets: examples, tasks, splits, downloads, few-shot draws and evaluation subsets.

An `Example` holds one text (two for a sentence-pair task) and a label: a class index
(classify), a real number (similarity) or a tuple of class indices (multilabel). A `Task` is one
entry of the registry in minknn/tasks/registry.py: where its official files are, how to read them
(minknn/tasks/readers.py), its labels, its kind (minknn/kinds.py), and how its splits are made.

Sources and splits. A task's `files` name its official files by the source they hold ("train",
"dev", "test", or "all" for a dataset that ships without a split). Its `splits` say what
minknn trains on (train), picks the best epoch on (dev) and reports (test):
    "train": "train"              the source as it is
    "dev": ("train", 0.9, 1.0)    a slice of the source: the rows at positions [0.9 n, 1.0 n) of
                                  one fixed shuffle of its n rows (random.Random(0), whatever
                                  --seed is), so the same rows every run, disjoint from the
                                  slice (0.0, 0.9) of the same shuffle
Each source's number of examples is checked against the official number its entry lists; a
mismatch is a one-line warning naming the file, not an error (a user's copy may differ).

Files live under <root>/<dataset>/, root being --data_dir, else $MINKNN_DATA, else ./data (a root
named by the flag or the variable must exist). A missing file is downloaded from the task's
official address, where it has one, to a temporary name that is renamed only once the whole file
has arrived (and its git blob id checked), so an interrupted download never leaves a half file
that looks whole, nor the folders it made.
"""
import hashlib
import http.client
import json
import os
import random
import tempfile
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from minknn import MinknnError, progress_bar, warn


class DataError(MinknnError):
    pass


@dataclass
class Example:
    text: str
    text_b: str | None = None  # the second text of a pair task
    label: object = None       # None where a split ships without labels (GLUE's test, test-student)
    id: str = ""


@dataclass
class Task:
    name: str
    dataset: str            # its folder under the data root
    reader: object          # reader(paths, task, source) -> list[Example] (minknn/tasks/readers.py)
    files: dict             # source -> file name, or a tuple of names read together
    labels: list            # class names in index order; [] for a similarity task
    kind: str = "classify"  # classify, similarity or multilabel (minknn/kinds.py)
    pair: bool = False      # two texts per example
    splits: dict = None     # split -> source or (source, start, end); None: the sources as they are
    counts: dict = field(default_factory=dict)  # source -> its official number of examples
    metrics: tuple = ()     # scores to report, the first picks the best epoch (default: the kind's)
    positive: int = None    # pair tasks: the class meaning "the two texts match" (for --pair_loss)
    url: str = ""           # the official distribution; file names are appended
    blobs: dict = field(default_factory=dict)  # file name -> git blob id, to check downloads
    # Readable class names, in labels' order, for what reads a class as text (train.py
    # --proxy_init names, AncSetFit's statements): the dataset's documented meaning where its
    # files use codes (TREC's 'HUM' is 'human being'). None: the task has none (a similarity
    # task; codes no documentation here spells out). Never saved: `labels` is what files and
    # checkpoints hold.
    names: list = None
    # AncSetFit's statement of each class (losses/ancsetfit.py): template.format(description),
    # one description a class (default: its name).
    descriptions: list = None
    template: str = "This sentence is {}."
    # A task of your own files (minknn/tasks/own_task.py): their absolute paths, sha256s, columns
    # and how their labels read; None for a task of the registry.
    own: dict = None


def class_statements(task):
    """AncSetFit's anchor texts of a task, one a class in labels' order, or None (no names)."""
    words = task.descriptions or task.names
    return None if words is None else [task.template.format(w) for w in words]


def data_root(data_dir=None):
    """--data_dir, else $MINKNN_DATA, else ./data. A root given by the flag or the variable must be
    a folder that exists: downloads fill in missing files, never a missing root (a mistyped path
    would download into a new folder)."""
    if data_dir:
        given = f"--data_dir {data_dir}"
    elif os.environ.get("MINKNN_DATA"):
        data_dir, given = os.environ["MINKNN_DATA"], f"MINKNN_DATA={os.environ['MINKNN_DATA']}"
    else:
        return "data"
    if not os.path.isdir(data_dir):
        what = "is a file, not a folder" if os.path.exists(data_dir) else "not found"
        raise DataError(f"{given}: {what}; the data root is a folder holding <dataset>/<file>, "
                        f"e.g. minbert/ids-sst-train.csv (data/README.md)")
    return data_dir


def load_split(task, split, data_dir=None):
    """One split of a task, its source files downloaded first where missing."""
    source, start, end = split_recipe(task, split)
    examples = read_source(task, source, data_dir)
    if (start, end) != (0.0, 1.0):
        order = list(range(len(examples)))
        random.Random(0).shuffle(order)
        rows = sorted(order[round(start * len(order)):round(end * len(order))])
        examples = [examples[i] for i in rows]
    if not examples:
        raise DataError(f"{source_paths(task, source, data_dir)[0]}: the {split} split "
                        f"has no examples")
    return examples


def split_recipe(task, split):
    """(source, start, end): the split is the rows [start n, end n) of the source's shuffle."""
    splits = task.splits or {s: s for s in task.files}
    if split not in splits:
        given = f" (the run was given no --{split}_file)" if task.own else ""
        raise MinknnError(f"{task.name} has no '{split}' split{given}; it has: "
                          f"{', '.join(splits)}")
    recipe = splits[split]
    return (recipe, 0.0, 1.0) if isinstance(recipe, str) else recipe


def source_paths(task, source, data_dir=None):
    if task.own:  # your own files: absolute paths, wherever the data root is
        return [task.files[source]]
    names = task.files[source]
    names = (names,) if isinstance(names, str) else names
    return [os.path.join(data_root(data_dir), task.dataset, name) for name in names]


def read_source(task, source, data_dir=None):
    if task.labels is None:
        raise MinknnError(f"{task.name} reads its labels from its data: get the task with "
                          f"tasks.get_task(name, data_dir)")
    paths = source_paths(task, source, data_dir)
    for path in paths if not task.own else []:  # your files' reader says what is wrong with them
        if os.path.isdir(path):
            raise DataError(f"{path}: a folder, where {task.name}'s {source} file belongs")
        if not os.path.exists(path):
            if not task.url:
                raise DataError(f"{path}: not found, and {task.name} has no download address; "
                                f"point --data_dir or MINKNN_DATA at a copy (data/README.md)")
            download(task.url + os.path.basename(path), path,
                     task.blobs.get(os.path.basename(path)))
    examples = task.reader(paths, task, source)
    seen = set()
    for e in examples:  # ids key the predictions files and kNN's self-exclusion: one each
        if e.id in seen:
            raise DataError(f"{', '.join(paths)}: the id '{e.id}' is used twice; every example "
                            f"needs its own")
        seen.add(e.id)
    expected = task.counts.get(source)
    if expected is not None and len(examples) != expected:
        warn(f"{', '.join(paths)}: read {len(examples)} examples, but the official {task.name} "
             f"{source} split has {expected}")
    return examples


def eval_subset(examples, n):
    """--max_eval: a fixed draw of n examples (random.Random(0), whatever --seed is, so every run
    is scored on the same ones), kept in file order."""
    if not n or n >= len(examples):
        return examples
    return [examples[i] for i in sorted(random.Random(0).sample(range(len(examples)), n))]


def labelled(examples):
    """Whether every example has its gold label (test-student and GLUE test files have none)."""
    return all(e.label is not None for e in examples)


def require_labels(examples, where):
    if not labelled(examples):
        raise DataError(f"{where}: has examples without labels; training and scoring need "
                        f"labelled data")


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
    """The id git gives this file's content (`git hash-object`):
    sha1 of "blob <size>\\0" + bytes."""
    h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(url, path, blob=None, timeout=60):
    """Downloads url to path with a progress bar. The bytes go to a temporary file in the same
    folder, renamed to `path` only when complete (and, if `blob` is given, when its git blob id
    matches), so `path` either does not exist or is whole. A failed download also removes the
    folders it created (no empty data/minbert/ left behind)."""
    folder = os.path.dirname(path) or "."
    created = new_folders(folder)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".part")
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with progress_bar(total=total, unit="B", unit_scale=True,
                              desc=f"downloading {os.path.basename(path)}") as bar:
                for chunk in iter(lambda: response.read(1 << 16), b""):
                    out.write(chunk)
                    bar.update(len(chunk))
        got = os.path.getsize(tmp)
        if total is not None and got != total:
            raise DataError(f"download of {url} stopped after {got} of {total} bytes; "
                            f"run again to retry")
        if blob is not None and git_blob_id(tmp) != blob:
            raise DataError(f"download of {url} does not match its known content (git blob {blob})")
        os.replace(tmp, path)
    except (OSError, http.client.HTTPException) as e:
        # a refused connection, an HTTP error, a cut-off body, a folder that cannot be made
        raise DataError(f"cannot download {url} to {path}: {e}. "
                        f"Point --data_dir or MINKNN_DATA at a copy") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        for made in created if not os.path.exists(path) else []:
            if os.path.isdir(made) and not os.listdir(made):
                os.rmdir(made)


def new_folders(folder):
    """folder and those of its parents that do not exist yet, deepest first."""
    missing = []
    while folder and not os.path.exists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


# ---------------------------------------------------------------------------------- sampling

def training_examples(task, data_dir=None, max_train=None, seed=0, per_class=None):
    """The examples a run trains on: the train split, or its draw of max_train (--max_train,
    --seed): stratified by class for a classification task, uniform for the other kinds; or
    per_class examples of every class (--per_class, the few-shot benchmarks' "8 per class").
    evaluate.py --knn calls it again to build the run's datastore."""
    train = load_split(task, "train", data_dir)
    if per_class:
        return per_class_sample(train, task, per_class, seed)
    if not max_train or max_train >= len(train):
        return train
    if task.kind != "classify":
        return random.Random(seed).sample(train, max_train)
    return stratified_sample(train, max_train, seed)


def examples_fingerprint(examples):
    """sha256 of the examples' ids, texts and labels, in order: the same for the same examples,
    changed by any edited row, label or order."""
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.id, e.text, e.text_b, e.label]).encode() + b"\n")
    return h.hexdigest()


def run_data(data_dir, train):
    """What a checkpoint records of the data its run read (train: task name -> the training
    examples): the data root, absolute, and each task's training fingerprint. evaluate.py reads
    that root by default, and builds a kNN datastore only from examples with that fingerprint."""
    return {"root": os.path.abspath(data_root(data_dir)),
            "train_fingerprint": {name: examples_fingerprint(e) for name, e in train.items()}}


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
        raise MinknnError(f"--max_train {n} is smaller than the {len(classes)} classes; "
                          f"each class needs one example")
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


def per_class_sample(examples, task, n, seed):
    """Draws n examples of each class (a classification task), the same draw for the same seed."""
    if task.kind != "classify":
        raise MinknnError(f"--per_class draws N examples of each class; --task {task.name} is a "
                          f"{task.kind} task (use --max_train)")
    by_class = defaultdict(list)
    for e in examples:
        by_class[e.label].append(e)
    short = [f"'{task.labels[c]}' has {len(by_class[c])}" for c in range(len(task.labels))
             if len(by_class[c]) < n]
    if short:
        raise MinknnError(f"--per_class {n}: the {task.name} training split has too few examples "
                          f"of some classes ({', '.join(short)})")
    rng = random.Random(seed)
    sample = [e for c in range(len(task.labels)) for e in rng.sample(by_class[c], n)]
    rng.shuffle(sample)
    return sample


def read_examples(args, tasks):
    """(train, dev): each task's training examples (all, or a --max_train or --per_class draw)
    and dev ones (all, or a --max_eval subset), each labelled, every class in training."""
    train, dev = {}, {}
    for t in tasks:
        try:
            train[t.name] = training_examples(t, args.data_dir, args.max_train, args.seed,
                                              args.per_class)
        except DataError as e:  # minBERT's default trio: quora-train.csv is a 22 MB download
            if t.name == "quora" and args.task == "multitask":
                raise DataError(f"{e}; or train without Quora: --tasks sst,mrpc,sts") from None
            raise
        dev[t.name] = eval_subset(load_split(t, "dev", args.data_dir), args.max_eval)
        require_labels(train[t.name], f"--task {t.name} train split")
        require_labels(dev[t.name], f"--task {t.name} dev split")
        if t.kind == "classify":
            check_every_class_present(train[t.name], t, f"--task {t.name} train split")
    return train, dev
