"""Your own files as a task, with nothing of minknn's code changed: train.py, the runner,
evaluate.py, the export and predict read it as they read a task of the registry
(minknn/tasks/registry.py).

    python train.py --train_file my/reviews.csv                    # columns text, label
    python train.py --train_file my/nli.jsonl --text_column premise,hypothesis --task nli
    python train.py --train_file my/tags.csv --task_kind multilabel --label_sep '|'

The files (minknn/tasks/own_files.py reads their rows): CSV (.csv), TSV (.tsv) or JSON Lines
(.jsonl), by the name's extension, each file its own; CSV and TSV with a header row. A row's id, in
the predictions files and kNN's explanations, is the file's name and its line: reviews.csv:17.

The columns: --text_column (default text), or two of them comma-separated for pairs of texts
(premise,hypothesis: encoded as minknn encodes RTE's pairs); --label_column (default label).

The kinds (--task_kind, minknn/kinds.py):
    classify     (default) a class a row. Names ('positive'): the classes are the training
                 file's names, sorted. Integers: the classes are its values, sorted, named by
                 their values ('1' .. '5' for stars), or, with --label_names neg,pos, the
                 integers 0 .. C-1 index those names. The names are what --proxy_init names and
                 AncSetFit's statements read ("This sentence is positive."): integers without
                 --label_names have none.
    similarity   a number a row (or a pair: STS's scores), any range; --pair_mode siamese only
                 for scores in [0, 5], the scaled cosine's range (minknn/model.py)
    multilabel   a list of classes a row: a JSON list in JSON Lines, a string cut at
                 --label_sep (default ',') in CSV and TSV; an empty list is a row of no class
The order of the classes is recorded in the run (run.json's arguments and checkpoint.pt's tasks).

The splits: train is --train_file; dev --dev_file, else a fixed 10% of train (the rows at
[0.9 n, n) of one fixed shuffle, as minknn/tasks/registry.py cuts TREC's and IMDB's); test
--test_file, else none (train.py's first line says so, and evaluate.py --split test is refused). A
test file without the label column is read unlabelled: predictions only.

What is refused, in one line naming the file, the line and the column, before any model is read
(train.py's checks, minknn/tools/checks.py): a missing column, a header that names a column twice or
none of the columns (no header), a row with too few or too many fields, an empty text, a missing
label, a float label where classes are wanted, a similarity that is not a number, labels of two
types (names and integers), a class of dev or test that train never has, one class only, no rows,
a line that is not UTF-8, and one file given under two flags.

Records. The run keeps each file's absolute path and sha256 (run.json's data, checkpoint.pt's
tasks): --resume, evaluate.py, predict and kNN's datastore refuse a file that changed since, in
one line, and a run folder copied without the files still predicts (predict needs no data).
"""
import functools
import os
import re

import torch.nn as nn

from minknn import MinknnError, warn
from minknn.tasks.data import DataError, Example, Task, check_every_class_present, load_split
from minknn.tasks.own_files import FORMATS, label_type, parsed
from minknn.tasks.registry import TASKS, get_task
from minknn.tools.files import file_sha256

SOURCES = ("train", "dev", "test")
FLAGS = ("train_file", "dev_file", "test_file", "text_column", "label_column", "task_kind",
         "label_names", "label_sep")  # train.py's and the runner's (minknn/tools/options.py SHARED)
NAME = re.compile(r"[^\W_][\w-]*")  # a task's name: folders, files, a head's key (any script)
# names a task cannot take: keys beside the tasks' in dev_scores and evaluate.py's metrics
RESERVED = ("multitask", "overall", "checkpoint", "epoch", "split", "data_root", "max_eval")


# ---------------------------------------------------------------------------------------------
# the flags

def given(args):
    """Whether the command line (or run.json) names your files: --train_file."""
    return getattr(args, "train_file", None) is not None


def check_flags(args):
    """The file flags filled in (absolute paths; the columns' and the kind's defaults) and refused
    in one line where they cannot work. Without --train_file every other file flag is refused."""
    if not given(args):
        extra = [f"--{f}" for f in FLAGS if getattr(args, f, None) is not None]
        if extra:
            are = "is a flag" if len(extra) == 1 else "are flags"
            raise MinknnError(f"{', '.join(extra)} {are} of your own files' task; give "
                              f"--train_file too")
        return
    args.task_kind = args.task_kind or "classify"
    args.text_column = args.text_column or "text"
    args.label_column = args.label_column or "label"
    for flag in ("train_file", "dev_file", "test_file"):
        path = getattr(args, flag)
        if path is None:
            continue
        if os.path.isdir(path):
            raise MinknnError(f"--{flag} {path}: a folder; give a file")
        if os.path.splitext(path)[1].lower() not in FORMATS:
            raise MinknnError(f"--{flag} {path}: minknn reads .csv, .tsv and .jsonl (JSON Lines) "
                              f"files, by their extension")
        if not os.path.isfile(path):
            raise MinknnError(f"--{flag} {path}: not found; give a file")
        setattr(args, flag, os.path.abspath(path))
    files = [(f, getattr(args, f)) for f in ("train_file", "dev_file", "test_file")
             if getattr(args, f)]
    for i, (flag, path) in enumerate(files):
        twin = next((f for f, p in files[:i] if os.path.samefile(p, path)), None)
        if twin:
            raise MinknnError(f"--{flag} {path} is --{twin}'s file too; each split needs a file of "
                              f"its own (leave out --dev_file: dev is then 10% of train)")
    columns = text_columns(args.text_column)
    if not 1 <= len(columns) <= 2 or "" in columns:
        raise MinknnError(f"--text_column '{args.text_column}': give one column, or two "
                          f"comma-separated for pairs of texts (premise,hypothesis)")
    if args.label_column in columns:
        raise MinknnError(f"--label_column {args.label_column} is a text column too")
    if args.label_names is not None and args.task_kind == "similarity":
        raise MinknnError("--label_names names the classes of integer labels; --task_kind "
                          "similarity has scores, not classes")
    if args.label_names is not None:
        names = [n.strip() for n in args.label_names.split(",")]
        twice = next((n for n in names if names.count(n) > 1), None)
        if "" in names or len(names) < 2 or twice:
            raise MinknnError(f"--label_names '{args.label_names}': give each class's name once, "
                              f"comma-separated in the order of the integers 0, 1, ..."
                              + (f" ('{twice}' is there twice)" if twice else ""))
    if args.label_sep is not None and args.task_kind != "multilabel":
        raise MinknnError(f"--label_sep cuts a multi-label row's classes; --task_kind "
                          f"{args.task_kind} has one label a row")
    if args.task_kind == "multilabel":
        args.label_sep = args.label_sep or ","


def text_columns(flag):
    return [c.strip() for c in flag.split(",")]


GENERIC = {"train", "training", "train_set", "trainset", "train-set", "train_data"}


def task_name(args, named):
    """The name of your files' task: the one name given that the registry does not hold (named:
    train.py's --task, or the names of --tasks), else the train file's name less its extension
    (reviews.csv: reviews), or its folder's where the file is just train.csv (my/train.csv: my),
    cut to letters, digits, '-' and '_'."""
    own = [n for n in named if n not in TASKS and n != "multitask"]
    if len(own) > 1:
        raise MinknnError(f"--tasks names {', '.join(own)}, none of them registered; your files "
                          f"make one task: name it once")
    if own:
        why = bad_name(own[0])
        if why:
            raise MinknnError(f"task name '{own[0]}': {why}")
        return own[0]
    path = os.path.abspath(args.train_file)
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem.lower() in GENERIC:
        stem = os.path.basename(os.path.dirname(path))
    name = re.sub(r"[^\w-]+", "-", stem).strip("-_")
    why = bad_name(name) if name else "it has no letter or digit"
    if why:
        raise MinknnError(f"--train_file {args.train_file}: it would name the task "
                          f"'{name or stem}', and {why}; give your task a name (train.py --task "
                          f"NAME, the runner's --tasks NAME)")
    return name


def bad_name(name):
    """Why a name cannot be your task's, or None: it names its folder, files and head (a key of
    torch's ModuleDict, which a Module's own attributes, train or eval, cannot be)."""
    if not NAME.fullmatch(name):
        return "use letters, digits, '-' and '_' (it names the run's folder and files)"
    if name in TASKS:
        return "a registered task's name"
    if name in RESERVED:
        return f"'{name}' is a name minknn keeps for itself (a run's {name} score or setting)"
    if hasattr(nn.ModuleDict(), name):
        return f"'{name}' is a name PyTorch's modules keep for themselves"
    return None


def classes_of(path, rows, spec):
    """The training file's classes, in their recorded order, and how a written class finds its
    index ("name": its name, or an integer's digits, in the list; "index": an integer indexing
    --label_names). One type of label in the file, two classes at least."""
    first = next(((n, v[0]) for n, _, v in rows if v), None)
    if first is None:
        raise DataError(f"{path}: no row has a class in column '{spec['label_column']}'")
    kind = type(first[1])
    for lineno, _, values in rows:
        for v in values:
            if type(v) is not kind:
                raise DataError(f"{path}:{lineno}: column '{spec['label_column']}' holds "
                                f"{label_type(v)} ({v!r}), where line {first[0]} holds "
                                f"{label_type(first[1])} ({first[1]!r}): labels of one type only")
    seen = sorted({v for _, _, values in rows for v in values})
    names = spec.get("label_names")
    if names is not None:
        if kind is str:
            raise DataError(f"{path}: --label_names names integer labels 0, 1, ..., and column "
                            f"'{spec['label_column']}' holds names already ({seen[0]!r}, ...)")
        wrong = [v for v in seen if not 0 <= v < len(names)]
        if wrong:
            line = next(n for n, _, values in rows if wrong[0] in values)
            raise DataError(f"{path}:{line}: column '{spec['label_column']}' holds {wrong[0]}, "
                            f"and --label_names has {len(names)} names, for 0..{len(names) - 1}")
        absent = [n for i, n in enumerate(names) if i not in seen]
        if absent and spec["kind"] == "classify":
            raise DataError(f"{path}: no row of class '{absent[0]}' (--label_names' number "
                            f"{names.index(absent[0])}); every class needs a training example")
        return list(names), "index"
    if len(seen) < 2 and spec["kind"] == "classify":
        raise DataError(f"{path}: column '{spec['label_column']}' holds one class only "
                        f"({seen[0]!r}); classification needs two at least")
    folded = {}
    for v in seen if kind is str else []:  # 'Positive' and 'positive': a slip, not two classes
        twin = folded.setdefault(v.casefold(), v)
        if twin != v:
            (first, one), (then, other) = sorted(  # each spelling's first line, in file order
                (next(n for n, _, values in rows if c in values), c) for c in (twin, v))
            raise DataError(f"{path}:{then}: column '{spec['label_column']}' holds {other!r}, "
                            f"where line {first} holds {one!r}: classes that differ only in case; "
                            f"write each class one way")
    return [str(v) for v in seen], "name"


def index_of(value, task, where):
    """A written class's index in the task's classes, or one line naming it."""
    own = task.own
    if own["labels_by"] == "index":
        if isinstance(value, int) and 0 <= value < len(task.labels):
            return value
    elif isinstance(value, int) == (own["label_type"] == "int") and str(value) in task.labels:
        return task.labels.index(str(value))
    shown = ", ".join(task.labels[:8]) + (", ..." if len(task.labels) > 8 else "")
    if isinstance(value, int) != (own["label_type"] == "int"):
        why = (f"{label_type(value)} ({value!r}), where the training file's labels are "
               f"{'integers' if own['label_type'] == 'int' else 'names'}: labels of one type only")
    else:
        why = f"{value!r}, a class the training file never has (its classes: {shown})"
    raise DataError(f"{where}: column '{own['label_column']}' holds {why}")


def read_own(paths, task, source):
    """The reader of your files' task (Task.reader, minknn/tasks/data.py read_source): one file's
    rows as Examples, each checked; the file refused first when it is not the one the run
    recorded."""
    path, own = paths[0], task.own
    if not os.path.isfile(path):
        raise DataError(f"{path}: not found; the run read its {source} examples from it")
    recorded, sha = own.get("sha256", {}).get(source), file_sha256(path)
    if recorded is not None and sha != recorded:
        raise DataError(f"{path}: changed since the run read it (its sha256 is not the one "
                        f"recorded, {recorded[:12]}...); put the run's file back, or train a new "
                        f"run on this one")
    return examples_of(path, rows_of(path, sha, own_spec(task), source), task, source)


def rows_of(path, sha, spec, source):
    """own_files.parsed(path, spec, source), parsed once a process for the file's content (sha):
    train.py's checks, its build and its splits, and the runner's cells, read the same file."""
    return _parsed(path, sha, tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                           for k, v in spec.items())), source)


@functools.lru_cache(maxsize=8)
def _parsed(path, sha, spec, source):
    return parsed(path, {k: list(v) if isinstance(v, tuple) else v for k, v in spec}, source)


def examples_of(path, rows, task, source):
    name = os.path.basename(path)
    examples = []
    for lineno, texts, value in rows:
        where = f"{path}:{lineno}"
        if value is not None and task.kind == "classify":
            value = index_of(value[0], task, where)
        elif value is not None and task.kind == "multilabel":
            value = tuple(sorted({index_of(v, task, where) for v in value}))
        examples.append(Example(text=texts[0], text_b=texts[1] if len(texts) > 1 else None,
                                label=value, id=f"{name}:{lineno}"))
    return examples


def own_spec(task):
    """What reading a file needs of the task: its kind, columns and classes."""
    return {"kind": task.kind, **{k: task.own.get(k) for k in ("text_columns", "label_column",
                                                               "label_sep", "label_names")}}


# ---------------------------------------------------------------------------------------------
# the task

def files_task(args, name):
    """Your files' Task, named `name`, from the file flags (check_flags: filled in): every file
    read and checked, its classes taken from the training file, each file's sha256 recorded."""
    files = {s: getattr(args, f"{s}_file") for s in SOURCES if getattr(args, f"{s}_file")}
    names = [n.strip() for n in args.label_names.split(",")] if args.label_names else None
    spec = {"kind": args.task_kind, "text_columns": text_columns(args.text_column),
            "label_column": args.label_column, "label_sep": args.label_sep, "label_names": names}
    sha = {s: file_sha256(p) for s, p in files.items()}
    rows = {s: rows_of(path, sha[s], spec, s) for s, path in files.items()}
    own = {**spec, "files": files, "sha256": sha}
    labels, readable = [], None
    if args.task_kind == "similarity":
        scores = [value for _, _, value in rows["train"]]
        own["score_range"] = [min(scores), max(scores)]
    else:
        labels, own["labels_by"] = classes_of(files["train"], rows["train"], spec)
        first = next(v[0] for _, _, v in rows["train"] if v)
        own["label_type"] = "int" if isinstance(first, int) else "str"
        readable = labels if own["label_type"] == "str" or names else None
    task = make_task(name, args.task_kind, labels, readable, own)
    for source, path in files.items():  # every class of dev and test is one train has
        examples_of(path, rows[source], task, source)
    n = len(rows["train"])
    if "dev" not in files and round(0.9 * n) == n:
        raise DataError(f"{files['train']}: {n} rows, and a dev split of 10% of them would be "
                        f"empty; give --dev_file, or more rows")
    if task.kind == "classify":  # the 90% cut may leave a class out of train
        check_every_class_present(load_split(task, "train"), task, f"{name}'s train split (of "
                                  f"{files['train']})")
    dev = n - round(0.9 * n)
    if "dev" not in files and dev < 10 and files["train"] not in _WARNED:
        _WARNED.add(files["train"])  # once a process: the runner reads it for every cell
        warn(f"{files['train']}: dev is 10% of its {n} rows, {dev} example{'s' * (dev > 1)}, "
             f"which choose{'s' * (dev == 1)} the best epoch alone; give --dev_file for more")
    return task


_WARNED = set()  # the training files whose small dev split this process has warned of


def make_task(name, kind, labels, names, own):
    """The Task of your files (own: their record, Task.own)."""
    files = own["files"]
    splits = {"train": "train" if "dev" in files else ("train", 0.0, 0.9),
              "dev": "dev" if "dev" in files else ("train", 0.9, 1.0)}
    if "test" in files:
        splits["test"] = "test"
    return Task(name, "", read_own, dict(files), list(labels), kind=kind,
                pair=len(own["text_columns"]) == 2, splits=splits, names=names and list(names),
                own=own)


def from_record(name, saved):
    """A checkpoint's record of your files' task (checkpoint.py: its tasks entry, "own"
    added) as its Task; nothing is read: a run copied without its files still predicts."""
    own = saved["own"]
    names = saved["labels"] if saved["labels"] and (own.get("label_type") == "str"
                                                   or own.get("label_names")) else None
    return make_task(name, saved["kind"], saved["labels"], names, own)


def describe(task):
    """The line that says where your files' task comes from, its splits and its classes."""
    files = task.own["files"]
    dev = files["dev"] if "dev" in files else "a fixed 10% of train (no --dev_file)"
    test = files.get("test", "none (--test_file to score one)")
    what = (f"{len(task.labels)} classes: {', '.join(task.labels[:10])}"
            f"{', ...' if len(task.labels) > 10 else ''}" if task.labels else
            "scores from {:g} to {:g}".format(*task.own["score_range"]))
    return (f"task {task.name} ({task.kind}{', pairs' if task.pair else ''}), from your files: "
            f"train {files['train']}, dev {dev}, test {test}; {what}")


def check_unchanged(recorded, where):
    """--resume: each file the run recorded (run.json's data["files"]: task -> source -> {path,
    sha256}) still there and unchanged, before anything is read."""
    for task, files in recorded.items():
        for source, entry in files.items():
            path = entry.get("path") if isinstance(entry, dict) else None
            if not isinstance(path, str) or not isinstance(entry.get("sha256"), str):
                raise MinknnError(f"{where}: data.files.{task}.{source} is not a file's path and "
                                  f"sha256 (was the file edited?)")
            if not os.path.isfile(path):
                raise MinknnError(f"{where}: the run's {source} file {path} is gone; put it back "
                                  f"to resume")
            if file_sha256(path) != entry["sha256"]:
                raise MinknnError(f"{where}: the run's {source} file {path} changed since it "
                                  f"started; put the run's file back, or start a new run")


def files_record(tasks):
    """What run.json and checkpoint.pt keep of your files: task -> source -> {path, sha256}."""
    return {t.name: {s: {"path": p, "sha256": t.own["sha256"][s]} for s, p in
                     t.own["files"].items()} for t in tasks if t.own}


def tasks_of(args):
    """The run's Tasks in args.tasks' order (train.py's, checked: minknn/tools/checks.py
    check_tasks): your files' task where its name is (the one name the registry does not hold), read
    and checked; the registry's for the others."""
    return [files_task(args, name) if given(args) and name not in TASKS
            else get_task(name, args.data_dir) for name in args.tasks]


def file_argv(args):
    """The file flags as train.py's command line takes them (the runner gives them to each cell
    of your files' task)."""
    return [a for f in FLAGS if getattr(args, f, None) is not None
            for a in (f"--{f}", str(getattr(args, f)))]
