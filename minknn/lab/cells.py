"""A grid's cells (minknn/lab/runner.py): each trained by train.py (or resumed), then every
inference rule its methods ask for scored on it from one prediction pass per split
(minknn/tools/inference.py): the linear head, proxy inference at each alpha, kNN mixed and alone at
each (K, phi), and the probe (a logistic regression, minknn/probe.py, fit on the training set's
z); the result lines written to the cell's cell.json (record).
Each method's result line holds, for every value of its inference grid, the scores on the
selection split and on the test split (minknn/lab/report.py chooses on the first), plus what the
plots draw: the learning curve, the kNN sweep over phi x K, and for the first seed a 2-D map.
"""
import json
import os
import shutil
import sys
import time

import torch

import train  # a cell is trained by train.py's own main, in this process
from minknn import MinknnError, backbones
from minknn.kinds import kind_of
from minknn.knn import SWEEP_KS, SWEEP_PHIS
from minknn.lab import setfit_package
from minknn.lab.grid import knn_grid, size_flags
from minknn.lab.report import impossible_score
from minknn.model import Model
from minknn.tasks.data import (eval_subset, examples_fingerprint, labelled, load_split,
                               split_recipe, training_examples)
from minknn.tasks.own_task import check_flags, file_argv, files_task
from minknn.tasks.registry import get_task
from minknn.tools import options
from minknn.tools.checkpoint import load_checkpoint, rebuild
from minknn.tools.engine import pick_device, predict
from minknn.tools.files import read_json, read_jsonl, remove_leftovers, write_json
from minknn.tools.inference import knn_scores, probe_probabilities, rule_probabilities, scores_of
from minknn.tools.run import run_status

MAP_POINTS = 300                                   # test examples in the 2-D map of a cell


# ------------------------------------------------------------------------------- a cell, run

def train_argv(cell, ctx, folder):
    """train.py's flags for a cell: the pass-through ones, then the cell's own."""
    save = "last" if ctx.select == "none" else "best"  # none: the last epoch, chosen by nothing
    argv = list(ctx.train_flags) + ctx.task_flags(cell.task) + [
        "--loss", cell.loss, "--seed", str(cell.seed), "--out", folder, "--save", save]
    argv += size_flags(cell.size)
    for flag, value in cell.params:
        argv += [f"--{flag}", str(value)]
    if ctx.data_dir:
        argv += ["--data_dir", ctx.data_dir]
    selection = selection_size(ctx, len(ctx.train_examples(cell)))
    if selection:
        argv += ["--max_eval", str(selection)]
    return argv


def selection_size(ctx, n_train):
    """How many dev examples choose the epoch and the hyper-parameters (None: all); under
    --select none, the dev sample each epoch is scored on for the learning curve alone."""
    if ctx.select in ("sample", "none"):
        return n_train if not ctx.max_eval else min(n_train, ctx.max_eval)
    return ctx.max_eval


class Context:
    """What every cell shares: the grid's flags, and the data it reads (cached per process)."""

    def __init__(self, args, train_flags):
        self.out, self.select, self.max_eval = args.out, args.select, args.max_eval
        self.keep, self.data_dir, self.train_flags = args.keep, args.data_dir, train_flags
        self.seeds, self.search = args.seed_list, args.search_grid
        self.kept = set()  # the cells an earlier --keep run kept (minknn/lab/kept.py: grid.json)
        # your own files' task (minknn/tasks/own_task.py): its name, and the file flags its cells
        # take
        self.own, self.files = getattr(args, "own_name", None), file_argv(args)
        self._cache = {}

    def __getstate__(self):  # sent to a pool's process or a cluster's job: the flags; the data
        return {**self.__dict__, "_cache": {}}  # is read there, not shipped in every pickle

    def cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def task(self, name):
        if name == self.own:  # your files, read and checked once a process
            files = options.make_parser().parse_args(self.files + ["--task", name])
            check_flags(files)
            return self.cached(("task", name), lambda: files_task(files, name))
        return self.cached(("task", name), lambda: get_task(name, self.data_dir))

    def task_flags(self, name):
        """train.py's flags that name a cell's task: --task, and your files' flags."""
        return ["--task", name] + (self.files if name == self.own else [])

    def train_examples(self, cell):
        per_class = int(cell.size[:-2]) if cell.size.endswith("pc") else None
        max_train = int(cell.size) if cell.size.isdigit() else None
        return self.cached(("train", cell.task, cell.size, cell.seed), lambda: training_examples(
            self.task(cell.task), self.data_dir, max_train, cell.seed, per_class))

    def splits(self, task_name, n_train):
        """(selection examples, test examples, the test split's name)."""
        def make():
            task = self.task(task_name)
            dev = load_split(task, "dev", self.data_dir)
            selection = eval_subset(dev, selection_size(self, n_train))
            if has_labelled_test(task, self.data_dir):
                return selection, eval_subset(load_split(task, "test", self.data_dir),
                                              self.max_eval), "test"
            chosen = {e.id for e in selection}
            rest = [e for e in dev if e.id not in chosen]
            return selection, eval_subset(rest, self.max_eval), "dev less the selection sample"
        return self.cached(("splits", task_name, n_train), make)


def has_labelled_test(task, data_dir):
    try:
        split_recipe(task, "test")
    except MinknnError:
        return False
    return labelled(load_split(task, "test", data_dir))


# ------------------------------------------------------------------------------------ one cell

def run_cell(cell, methods, ctx):
    """Trains (or resumes) one cell, scores its methods' rules, and returns their result lines;
    a finished cell's lines are read back from its cell.json (scored again, from its kept
    checkpoint, for a method added to the grid since)."""
    folder = os.path.join(ctx.out, "runs", cell.name)
    if cell.loss == setfit_package.METHOD:  # not train.py's: the package trains it
        saved = saved_lines(folder) or {}
        wanted = [m for m in methods if m.name not in saved]
        trained = next((ln["seconds"]["train"] for ln in saved.values() if "seconds" in ln), None)
        new = (setfit_package.run_cell(cell, wanted, ctx, folder, trained, keeps(ctx, folder))
               if wanted else [])
        return record(cell, methods, ctx, folder, saved,
                      [{**line_head(cell, m, ctx), **line} for m, line in zip(wanted, new)])
    done = os.path.join(folder, "cell.json")
    saved = saved_lines(folder)
    if saved is not None:
        if all(m.name in saved for m in methods):
            drop_checkpoints(folder, ctx)  # a kill may have come between the two
            return [saved[m.name] for m in methods]
    else:
        saved = {}
        status = training_status(folder)
        if os.path.exists(done):  # damaged: score the model again, or train it if it is gone
            gone = status == "done" and not os.path.exists(os.path.join(folder, "checkpoint.pt"))
            status = "new" if gone else status
            print(f"warning: {done}: damaged (cut short, emptied, or not a cell's result "
                  f"lines); {'training' if gone else 'scoring'} the cell again", file=sys.stderr)
        if status == "done" and damaged_metrics(folder):  # the learning curve is lost with it
            print(f"warning: {cell.name}: its metrics.jsonl is damaged; training the cell again",
                  file=sys.stderr)
            status = "new"
        if status == "new" and os.path.isdir(folder):  # killed before its first epoch ended
            shutil.rmtree(folder)
        if status != "done":
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            try:  # train.py turns a divergence into one line, after saving summary.json
                train.main(["--resume", folder] if status == "resume" else
                           train_argv(cell, ctx, folder))
            except MinknnError as e:
                if training_status(folder) != "diverged":
                    raise
                print(f"{cell.name}: {e}; recorded as diverged", file=sys.stderr)
    wanted = [m for m in methods if m.name not in saved]
    if training_status(folder) == "diverged":
        stopped = read_json(os.path.join(folder, "summary.json"))["stopped"]
        new = [dict(line_head(cell, m, ctx), diverged=stopped) for m in wanted]
    else:
        new = score_cell(cell, wanted, ctx, folder)
    return record(cell, methods, ctx, folder, saved, new)


def record(cell, methods, ctx, folder, saved, new):
    """A cell's new result lines marked for the table, written with its saved ones to its
    cell.json (then its checkpoints go); returns the methods' lines."""
    for line in new:
        if ctx.search:  # the table's budget note: what was searched, and what did not apply
            line["search"] = ctx.search
        if ctx.select == "none":  # scored for nothing: no dev label chooses under --select none
            for entry in line.get("grid", []):
                entry.pop("select", None)
    lines = {**saved, **{line["method"]: line for line in new}}
    write_json(os.path.join(folder, "cell.json"), {"cell": cell.name,
                                                   "lines": list(lines.values())})
    drop_checkpoints(folder, ctx)
    return [lines[m.name] for m in methods]


def damaged_metrics(folder):
    """Whether a trained cell's metrics.jsonl (its epochs' records: the learning curve and the
    best epoch's scores) cannot be read back; a finished run keeps them nowhere else."""
    try:
        read_jsonl(os.path.join(folder, "metrics.jsonl"))
    except (MinknnError, OSError):
        return True
    return False


def saved_lines(folder):
    """A scored cell's result lines by method, from its cell.json; None when it has none, or a
    damaged one (cut short by a full disk, a copy, emptied, not a cell's): the cell is then done
    again. A whole file with a figure no score can be (an accuracy of 2.5, NaN: an edit by hand)
    is refused in one line naming the file and the figure, before any cell trains."""
    path = os.path.join(folder, "cell.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            lines = json.load(f)["lines"]
    except (ValueError, KeyError, TypeError):  # not JSON, not UTF-8, or not a cell's
        return None
    except OSError as e:
        raise MinknnError(f"{path}: cannot be read ({e.strerror})") from None
    if not isinstance(lines, list) or not lines or not all(map(whole_line, lines)):
        return None
    for line in lines:
        wrong = impossible_score(line)
        if wrong:
            raise MinknnError(f"{path}: {wrong}; put the figure back, or delete the file and "
                              f"the same command scores the cell again (or trains it, if its "
                              f"checkpoint is gone)")
    return {line["method"]: line for line in lines}


def whole_line(line):
    """Whether a cell.json line is a method's whole result: its name, and its scores (a grid of
    test scores) or the divergence that left it none."""
    if not isinstance(line, dict) or not isinstance(line.get("method"), str):
        return False
    grid = line.get("grid")
    return "diverged" in line or isinstance(grid, list) and bool(grid) and all(
        isinstance(entry, dict) and isinstance(entry.get("test"), dict) and entry["test"]
        for entry in grid)


def training_status(folder):
    """'done' (summary.json of a finished run), 'diverged' (its summary says so), 'resume'
    (stopped after an epoch: last.pt) or 'new'."""
    status = run_status(folder)
    if status != "stopped":
        return {"finished": "done", "diverged": "diverged"}[status]
    return "resume" if os.path.exists(os.path.join(folder, "last.pt")) else "new"


def drop_checkpoints(folder, ctx):
    """A scored cell keeps its scores, not its 91 MB checkpoint (unless it is kept: keeps)."""
    for name in ("checkpoint.pt", "last.pt"):
        path = os.path.join(folder, name)
        if os.path.exists(path) and (name == "last.pt" or not keeps(ctx, folder)):
            os.remove(path)


def keeps(ctx, folder):
    """Whether the cell of `folder` keeps its checkpoint: this run's --keep, or an earlier one's
    (sticky; only --drop_kept deletes it)."""
    return ctx.keep or os.path.basename(folder) in ctx.kept


def missing_scores(cells, ctx):
    """Cells scored before a method was added to the grid, whose checkpoint is gone."""
    lacking = []
    for cell, methods in cells.items():
        folder = os.path.join(ctx.out, "runs", cell.name)
        if cell.loss == setfit_package.METHOD:  # scored from the body it kept, or trained again
            continue
        have = saved_lines(folder)
        if have is not None and not os.path.exists(os.path.join(folder, "checkpoint.pt")):
            lacking += [f"{cell.name} {m.name}" for m in methods if m.name not in have]
    return lacking


# ------------------------------------------------------------------------ a cell's rules, scored

def line_head(cell, method, ctx):
    return {"task": cell.task, "size": cell.size, "seed": cell.seed, "method": method.name,
            "label": method.label, "rule": method.rule, "cell": cell.name,
            "train_params": dict(cell.params), "select": ctx.select}


def score_cell(cell, methods, ctx, folder):
    """Every rule the methods ask for, on the selection and test examples, for each value of its
    inference grid: one prediction pass per split (and one over the training set for kNN)."""
    start = time.time()
    ckpt = load_checkpoint(os.path.join(folder, "checkpoint.pt"))
    remove_leftovers(folder)  # a killed save's temporary files, as every command that opens a run
    device, precision = pick_device(ckpt["args"]["device"]), ckpt["args"]["precision"]
    model, losses, tokenizer = rebuild(ckpt)
    model.to(device)
    task, loss = model.tasks[cell.task], losses[cell.task]
    kind, batch = kind_of(task), 2 * ckpt["args"]["batch_size"]
    train_set = ctx.train_examples(cell)
    if examples_fingerprint(train_set) != ckpt["data"]["train_fingerprint"][cell.task]:
        raise MinknnError(f"{folder}: its run trained on other {cell.task} examples than the "
                          f"grid's draw (size {cell.size}, seed {cell.seed}); a --methods grid "
                          f"may not set the runner's own flags")
    selection, test, test_name = ctx.splits(cell.task, len(train_set))
    examples = {"select": selection, "test": test}
    outputs, z = {}, {}
    for split, ex in examples.items():
        outputs[split], z[split] = predict(model, tokenizer, task, ex, batch, device,
                                           precision=precision)
    gold = {split: kind.gold(task, ex) for split, ex in examples.items()}

    def scores(probabilities):  # {"select": {...}, "test": {...}}
        return {s: scores_of(task, probabilities[s], gold[s]) for s in examples}
    base = {s: kind.probabilities(outputs[s]) for s in examples}
    vectors = {}  # key -> the training set's vectors: one prediction pass each, shared by rules

    def training_vectors(key):
        if key not in vectors:
            vectors[key] = predict(model, tokenizer, task, train_set, batch, device, key=key,
                                   precision=precision)[1]
        return vectors[key]
    if any(m.rule.startswith("knn") for m in methods):
        key = model.knn_key()
        k_most = max([*SWEEP_KS, *(k for m in methods for k in m.rule_grid.get("k", []))])
        knn = knn_tables(task, model, tokenizer, train_set, training_vectors(key), examples, key,
                         z, base, batch, device, precision, k_most)
    records = read_jsonl(os.path.join(folder, "metrics.jsonl"))
    common = {"test_split": test_name, "n_train": len(train_set), "n_select": len(selection),
              "n_test": len(test), "best_epoch": ckpt["epoch"],
              "curve": [{"epoch": r["epoch"], "train_loss": r["train_loss"][cell.task],
                         "dev": r["dev"][cell.task]} for r in records],
              "seconds": {"train": round(sum(r["epoch_seconds"] for r in records), 1),
                          "evaluate": round(time.time() - start, 1)}}
    lines = []
    for method in methods:
        line = line_head(cell, method, ctx)
        if method.rule.startswith("knn"):
            line["sweep"] = knn["sweep"]
        grid = method_grid(method, task, loss, outputs, z, base, scores, knn if method.rule
                           .startswith("knn") else None, len(train_set),
                           lambda: probe_probabilities(task, train_set,
                                                       training_vectors(model.pooling), z))
        lines.append({**line, "grid": grid, **common})
    if cell.seed == ctx.seeds[0] and z["test"] is not None:  # a 2-D map, before and after
        lines[0]["map"] = representation_map(ctx, task, ckpt, tokenizer, test, z["test"], device,
                                             precision)
    return lines


def method_grid(method, task, loss, outputs, z, base, scores, knn, n_train, probe):
    """A method's rule at each value of its inference grid: [{"params", "select", "test"}].
    base: each split's head probabilities; scores(split -> probabilities) scores them; knn: the
    cell's knn_tables; probe(): the probe's probabilities (fit only when asked for)."""
    if method.rule == "linear":
        return [{"params": {}, **scores(base)}]
    if method.rule == "probe":  # the head refit: scikit-learn's LogisticRegression()
        if z["test"] is None:
            raise MinknnError(f"{task.name}: the probe rule fits a vector per example, and a "
                              f"siamese pair has two; use --pair_mode cross")
        return [{"params": {}, **scores(probe())}]
    if method.rule == "proxy":  # p(c|x) = softmax((1 - alpha) F(z) + alpha s cos(z, P_c))
        return [{"params": {"alpha": alpha}, **scores({
            s: rule_probabilities("proxy", task, outputs[s], z[s], loss, alpha) for s in z})}
            for alpha in method.rule_grid.get("alpha", [0.5])]
    return knn_grid(method, task.kind, n_train, knn["at"])  # s = (1 - phi) P(q) + phi KNN(q)


def knn_tables(task, model, tokenizer, train_set, keys, examples, key, z, base, batch, device,
               precision, k_most):
    """The kNN scores at any (K <= k_most, phi) from one search per split at the largest K, over
    a datastore of the training set's keys: {"at": function (k, phi) -> {"select":, "test":},
    "sweep": the phi x K table}."""
    queries = z if key == model.pooling else {
        s: predict(model, tokenizer, task, ex, batch, device, key=key, precision=precision)[1]
        for s, ex in examples.items()}
    gold = {s: kind_of(task).gold(task, ex) for s, ex in examples.items()}
    at, sweeps = knn_scores(task, train_set, keys, queries, base, gold, k_most)
    sweep = [{"k": k, "phi": phi, **at(k, phi)} for k in sweeps["test"].ks() for phi in SWEEP_PHIS]
    return {"at": at, "sweep": sweep}


def representation_map(ctx, task, ckpt, tokenizer, test, z_after, device, precision):
    """PCA to 2-D (the top two principal directions, from an SVD of the centred vectors) of up to
    MAP_POINTS test representations, from the base model and from the trained one."""
    rows = eval_subset(list(range(len(test))), MAP_POINTS)
    sample = [test[i] for i in rows]

    def before():
        bert = backbones.from_pretrained(ckpt["args"]["model"])  # 'minilm' or a folder
        base = Model(bert, [task], ckpt["args"]["pooling"], ckpt["args"]["pair_mode"]).to(device)
        return predict(base, tokenizer, task, sample, 64, device, precision=precision)[1]
    z_before = ctx.cached(("before", task.name, len(test)), before)
    gold = kind_of(task).gold(task, sample)
    labels = [int(g) if gold.ndim == 1 else int(g.argmax()) for g in gold]
    return {"labels": labels, "label_names": list(task.labels),
            "before": pca_2d(z_before), "after": pca_2d(z_after[rows])}


def pca_2d(x):
    x = x.double() - x.double().mean(0)
    _, _, v = torch.linalg.svd(x, full_matrices=False)
    return [[round(a, 4), round(b, 4)] for a, b in (x @ v[:2].T).tolist()]
