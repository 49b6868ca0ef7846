"""The experiment runner: a grid of trainings, every inference rule on each trained model, and the
table the papers print (minknn/lab/report.py) with its plots (minknn/lab/plots.py).

    python -m minknn.lab.runner --tasks mr,cr --methods 'ce,supcon,proxyanchor+proxy,knnbert+knn' \\
        --sizes 20,100 --seeds 0-4 --out grids/fewshot --epochs 10 --batch_size 16
    python -m minknn.lab.runner --table grids/fewshot     # redraw table.md and the plots from
                                                      # results.jsonl alone

The grid (minknn/lab/grid.py): methods (a training loss, an inference rule, either with a grid of
values in brackets), sizes and seeds make cells, each (task, size, training, seed). A cell is
trained once by train.py's own code, and every rule its methods ask for is scored on that one
model (minknn/lab/cells.py). A seed draws the same training examples for every method, so the
comparisons are paired. Any flag the runner does not know (--epochs, --batch_size, --lr,
--max_len, --model, ...) is train.py's and goes to every cell. One method is no train.py run:
`setfit-package` trains the real SetFit on its cell's draw, with the package's defaults, and
`setfit-package[setting=paper]` with the paper's settings (minknn/lab/setfit_package.py); its
head is scored, or with +knn / +knn-only minknn's kNN vote over its trained body.

A search per method at equal budget (--search 'lr=1e-5,3e-5,1e-4;lam=0.1,0.5'): every method is
trained with each combination of the values that apply to it, as if they were written in its
brackets (`method[lr=...;lam=...]`), and chosen on the selection split like any other value.
A value applies to a method when train.py takes its flag with the method's loss (its own
checks.check_args decides: lam only for a loss with a metric term, m_most only for knnbert; lr,
epochs, warmup for every loss); a method's own bracketed values win over --search's for the same
flag. The table says each method's budget, the trainings per task, size and seed, and why two
differ.

Selection (--select): `sample` (default, the strict few-shot practice) picks the best epoch and
every hyper-parameter on a fixed sample of dev as large as the training set; `dev` on the whole
dev set (as the DML paper did; capped by --max_eval); `none` uses no labelled data beyond the
training set: a fixed recipe, the last epoch (train.py --save last) and each value given once,
so a grid with anything to choose is refused. Under `none` each epoch is still scored on the dev
sample, for the learning curve only; the result lines carry no selection scores. Why a fixed
recipe and not k-fold cross-validation inside the few-shot set: Perez, Kiela and Cho 2021 ("True
Few-Shot Learning with Language Models", NeurIPS) found that cross-validation and minimum
description length on the few-shot set chose prompts and hyper-parameters barely better than at
random, at k times the cost; SetFit too trains with fixed defaults. The scores reported are on
the task's labelled test split; a task without one is scored on dev less the selection sample
(and refuses --select dev). --max_eval caps the test split too (a fixed draw, the same for every
cell).

A claim is confirmed where nothing was chosen (--chosen_on): the tasks the methods and their
settings were chosen on are the development tasks; the others, fixed before any result on them was
seen, are held out. grid.json records them, and the table shows the held-out tasks in their own
table, with their own mean, apart from the development ones; a comparison with a baseline holds
on a task only where the baseline ran there too, on the same draws (the p-values pair seeds).

Each cell is a train.py run folder, <out>/runs/<cell>; its scores go to <cell>/cell.json
once evaluated, and then its checkpoint is deleted (--keep keeps it, for later runs too: only
--drop_kept deletes it; minknn/lab/kept.py). Running the same command again skips the finished
cells and resumes a killed one (train.py --resume): a grid killed at any point loses at most the
epoch in progress. A damaged cell.json (a full disk, a copy cut
short, emptied) is that cell's alone: it is scored again, or trained again if its checkpoint is
gone; one holding a figure no score can be (an accuracy of 2.5, NaN) is refused in one line.
Writes <out>/results.jsonl (one line per cell and method: every figure on both splits for each
value of its grid, the learning curve, the kNN sweep, times; rewritten whole from the cells'
cell.json after each cell), <out>/table.md and <out>/plots/*.png.

One runner per grid: it holds <out>/grid.lock while it works, and a second one on the same --out
stops in one line (it would retrain the cells the first is training). --table reads a grid in
use: results.jsonl is only ever replaced whole, so it shows the cells finished so far.

Where the cells run (--launcher): `local` (default), here, one at a time, or --jobs N at once in
N processes, each with its share of the CPU cores (torch threads) and, on a machine with several
GPUs, its own GPU. `slurm`: each unfinished cell a job of one SLURM array job, through submitit
(minknn/lab/slurm.py: time limits, preemption, failed jobs, a runner killed while its jobs run).
"""
import concurrent.futures
import contextlib
import io
import json
import multiprocessing
import os
import sys
import time

import torch

from minknn import MinknnError, Terminated, options
from minknn.cli import Parser, below_one, run
from minknn.data import load_split
from minknn.engine import pick_device
from minknn.files import read_json, write_json, write_jsonl
from minknn.lab import report, setfit_package
from minknn.lab.cells import (Context, has_labelled_test, missing_scores, run_cell, saved_lines,
                              selection_size, train_argv, training_status)
from minknn.lab.kept import check_flags, drop_kept, kept_cells
from minknn.lab.grid import (cells_of, parse_grid, parse_method, parse_seeds, parse_sizes,
                             search_text, size_flags, split_top, with_search)
from minknn.losses import PROXY_LOSSES
from minknn.own_task import FLAGS as FILE_FLAGS, file_argv, given, task_name
from minknn.own_task import check_flags as check_file_flags
from minknn.runs import lock_folder, make_folder
from minknn.status import missing_checkpoint
from minknn.tasks import TASKS

RUNNER_OWNS = ("task", "tasks", "loss", "seed", "max_train", "per_class", "max_eval", "out",
               "resume", "save", "data_dir")       # train.py flags each cell sets itself
SLURM_FLAGS = ("slurm_partition", "slurm_time", "gpus_per_cell", "slurm_max_parallel",
               "slurm_param", "slurm_cluster")      # --launcher slurm's


# ----------------------------------------------------------------------------------- the grid

def get_args(argv=None):
    p = Parser(allow_abbrev=False,  # --seed is train.py's (refused below), not --seeds
               description="Run a grid of trainings and write the papers' table (see the module "
                           "docstring: python -c 'import minknn.lab.runner; "
                           "help(minknn.lab.runner)'). "
                           "Any other flag is train.py's and goes to every cell.")
    p.add_argument("--tasks", help="comma-separated task names")
    p.add_argument("--methods", default="ce", help="comma-separated: "
                   "loss[param=v,v]+rule[param=v]; rules: proxy, knn, knn-only")
    p.add_argument("--sizes", default="full", help="comma-separated: full, N examples, Npc (N "
                   "per class)")
    p.add_argument("--seeds", default="0", help="e.g. 0-4 or 0,3,7")
    p.add_argument("--out", help="the grid's folder (its cells, results.jsonl, table.md, plots/)")
    p.add_argument("--search", metavar="FLAG=V,V;...", help="train every method with each "
                   "combination of these train.py values that apply to it, e.g. "
                   "'lr=1e-5,3e-5,1e-4;lam=0.1,0.5' (a method's own [values] win)")
    p.add_argument("--chosen_on", metavar="TASKS", help="comma-separated: the development "
                   "tasks, those the methods and their settings were chosen on (in this grid or "
                   "before it); the table shows the grid's other tasks apart, as held out")
    p.add_argument("--select", default="sample", choices=["sample", "dev", "none"], help="choose "
                   "the epoch and hyper-parameters on a dev sample as large as the training set, "
                   "or all dev; none: no dev labels, the last epoch and the values given")
    options.add_flags(p, "max_eval", "data_dir", max_eval={
        "help": "at most N test (and --select dev) examples"})
    g = p.add_argument_group("your own files as a task (minknn/own_task.py), as train.py takes "
                             "them")
    options.add_flags(g, *FILE_FLAGS, train_file={
        "help": "a task of your own file: .csv, .tsv or .jsonl; its name is the name of --tasks "
                "that the registry does not hold (default: the file's name, and --tasks that "
                "task alone)"})
    p.add_argument("--keep", action="store_true", help="keep each cell's checkpoint.pt (a "
                   "setfit-package cell: the body the package saved), so that a rule added later "
                   "is scored from it; kept for later runs too (grid.json records it)")
    p.add_argument("--drop_kept", action="store_true", help="delete the checkpoints an earlier "
                   "--keep kept, once this grid's cells are scored")
    p.add_argument("--launcher", default="local", choices=["local", "slurm"], help="where the "
                   "cells run: here, or each a job on a SLURM cluster (minknn/lab/slurm.py)")
    p.add_argument("--jobs", type=int, help="local: N cells at once, each with cores/N torch "
                   "threads (on several GPUs, each its own GPU); default 1")
    s = p.add_argument_group("--launcher slurm (pip install -e '.[slurm]')")
    s.add_argument("--slurm_partition", help="the partition (default: the cluster's)")
    s.add_argument("--slurm_time", type=int, help="each job's time limit in minutes; "
                   "a cell out of time is requeued and resumes from its last epoch (default 60)")
    s.add_argument("--gpus_per_cell", type=int, help="GPUs per job (default 1)")
    s.add_argument("--slurm_max_parallel", type=int, help="at most N jobs of the grid at once "
                   "(the array's parallelism)")
    s.add_argument("--slurm_param", action="append", metavar="KEY=VALUE",
                   help="any other submitit parameter, the value read as JSON where it is, e.g. "
                   "cpus_per_task=8, mem_gb=32, slurm_constraint=a100, "
                   "slurm_additional_parameters='{\"qos\": \"high\"}'; repeatable")
    s.add_argument("--slurm_cluster", choices=["slurm", "local"], help="local: "
                   "for testing without a cluster, each job a process on this machine, all at once "
                   "(submitit's LocalExecutor)")
    g = p.add_argument_group("the table")
    g.add_argument("--table", metavar="OUT", help="only redraw OUT's table and plots from its "
                   "results.jsonl")
    g.add_argument("--metric", help="comma-separated; the first chooses the hyper-parameters "
                   "(default: each task's first metric)")
    g.add_argument("--baseline", help="the method the p-values compare with (default: the first)")
    g.add_argument("--test", default="t", choices=["t", "signflip"], help="paired t-test, or the "
                   "exact sign-flip test (minknn/lab/stats.py)")
    g.add_argument("--write", metavar="FILE", help="also write the table into FILE between "
                   "<!-- runner NAME --> and <!-- /runner NAME --> (NAME: --out's folder name)")
    args, rest = p.parse_known_args(argv)
    if args.table:
        if args.tasks or rest or given(args):
            p.error("--table redraws a finished grid's table; give only --metric, --baseline, "
                    "--test, --write with it")
        return args, []
    check_own_flags(args)  # before --tasks: your files' task may be the grid's only one
    for name in ("tasks", "out"):
        if not getattr(args, name):
            p.error(f"--{name} is required (or --table OUT to redraw a table)")
    for message in below_one(args, ("max_eval", "jobs", "slurm_time", "slurm_max_parallel")):
        p.error(message)
    slurm_given = [name for name in SLURM_FLAGS if getattr(args, name) not in (None, [])]
    if args.launcher == "local" and slurm_given:
        p.error(f"--{slurm_given[0]} is for --launcher slurm")
    if args.gpus_per_cell is not None and args.gpus_per_cell < 0:
        p.error(f"--gpus_per_cell must be at least 0, got {args.gpus_per_cell}")
    if args.launcher == "slurm":
        if args.jobs is not None:
            p.error("--jobs is --launcher local's; a SLURM grid runs --slurm_max_parallel jobs at "
                    "once")
        from minknn.lab.slurm import import_submitit
        import_submitit()  # one line on how to install it, before the grid is checked
    check_flags(args)  # --keep with --drop_kept
    args.jobs, args.slurm_time = args.jobs or 1, args.slurm_time or 60
    args.slurm_cluster = args.slurm_cluster or "slurm"
    args.gpus_per_cell = 1 if args.gpus_per_cell is None else args.gpus_per_cell
    args.slurm_params = dict(slurm_param(p, text) for text in args.slurm_param or [])
    owned = [f for f in rest if f.startswith("--") and f[2:].split("=")[0] in RUNNER_OWNS]
    if owned:
        p.error(f"{', '.join(owned)}: the runner sets {'it' if len(owned) == 1 else 'them'} "
                f"for each cell (--tasks, --methods, --sizes, --seeds, --out, --max_eval)")
    args.task_list = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if given(args):
        args.own_name = task_name(args, args.task_list)
        if args.own_name not in args.task_list:
            args.task_list.append(args.own_name)
    args.chosen_on = chosen_on(args.chosen_on, getattr(args, "own_name", None))
    if not args.task_list:  # `--tasks ,` would make a grid of no cells, and claim it done
        raise MinknnError(f"--tasks '{args.tasks}': names no task; give comma-separated task "
                          f"names, e.g. --tasks mr,cr")
    if not args.methods.replace(",", "").strip():
        raise MinknnError(f"--methods '{args.methods}': names no method; give comma-separated "
                          f"methods, e.g. --methods ce,supcon")
    args.method_list = [parse_method(m) for m in split_top(args.methods, ",")]
    for i, m in enumerate(args.method_list):  # the same method twice would be two table rows
        twin = next((o for o in args.method_list[:i] if (o.loss, o.train_grid, o.rule, o.rule_grid)
                     == (m.loss, m.train_grid, m.rule, m.rule_grid)), None)
        if twin:
            also = "" if twin.name == m.name else f" (also as {twin.name})"
            raise MinknnError(f"--methods: {m.name} is given twice{also}; give each method once")
    args.size_list = parse_sizes(args.sizes)
    args.seed_list = parse_seeds(args.seeds)
    args.search_grid = parse_grid(args.search or "", args.search, flag="--search")
    if args.search is not None and not args.search_grid:  # --search '' searches nothing
        raise MinknnError(f"--search '{args.search}': names no value to search; give "
                          f"flag=value,value;..., e.g. --search 'lr=1e-5,3e-5', or leave it out")
    owned = [name for name in args.search_grid if name in RUNNER_OWNS]
    if owned:
        raise MinknnError(f"--search {args.search}: {', '.join(owned)} is the runner's to set for "
                          f"each cell (--tasks, --sizes, --seeds, ...), not a search's")
    if args.select == "none":
        check_nothing_to_choose(args)
    return args, rest


def check_own_flags(args):
    """Your files' flags (minknn/own_task.py check_flags); with --train_file, --tasks defaults to
    the task of your files alone."""
    check_file_flags(args)
    if given(args) and not args.tasks:
        args.tasks = task_name(args, [])


def chosen_on(text, own=None):
    """--chosen_on: the development tasks, as a sorted list of registry names, or your files'
    task's name (own) (None: not said)."""
    if text is None:
        return None
    tasks = sorted({t.strip() for t in text.split(",") if t.strip()})
    unknown = [t for t in tasks if t not in TASKS and t != own]
    if not tasks or unknown:
        raise MinknnError(f"--chosen_on '{text}': "
                          + (f"no task '{unknown[0]}'; choose from: {', '.join(TASKS)}" if unknown
                             else "names no task; give the development tasks, e.g. sst5,cr"))
    return tasks


def check_nothing_to_choose(args):
    """--select none has no labels to choose with: one value of every parameter."""
    grids = [("--search", args.search, args.search_grid)]
    grids += [("--methods", m.name, g) for m in args.method_list for g in (m.train_grid,
                                                                           m.rule_grid)]
    for flag, where, grid in grids:
        many = next((k for k, v in grid.items() if len(v) > 1), None)
        if many:
            raise MinknnError(f"{flag} {where}: {len(grid[many])} values of {many}, and --select "
                              f"none has no dev labels to choose one; give one value (or "
                              f"--select sample)")


def search_methods(args, train_flags):
    """--methods with --search's values added to each method they apply to (grid.with_search).
    A flag applies to a method when train.py takes it with that method's loss on every task of the
    grid; a flag that no method takes, or one that train.py takes at some values only, is one
    line."""
    verdicts = {(m.name, flag): search_applies(args, train_flags, m, flag)
                for m in args.method_list for flag in args.search_grid
                if flag not in m.train_grid}
    for flag in args.search_grid:
        said = [verdicts[m.name, flag] for m in args.method_list if (m.name, flag) in verdicts]
        if said and not any(ok for ok, _ in said):
            why = " | ".join(dict.fromkeys(why for _, why in said))  # each refusal once
            hint = ("; alpha, k and phi are inference values: give them in a method's brackets, "
                    "e.g. ce+knn[k=16,64]" if flag in ("alpha", "k", "phi") else "")
            raise MinknnError(f"--search {flag}: no method of --methods takes it ({why}){hint}")
    return [with_search(m, args.search_grid, lambda flag: verdicts[m.name, flag][0])
            for m in args.method_list]


def search_applies(args, train_flags, method, flag):
    """(whether train.py takes --flag at each of its --search values with this method's loss and
    own values, on every task; train.py's refusal where it does not)."""
    if method.loss == setfit_package.METHOD:
        return False, "setfit-package trains with the package's own arguments"
    refused, tried = [], 0
    for task in args.task_list:
        base = [*train_flags, *task_flags(args, task), "--loss", method.loss,
                *size_flags(args.size_list[0]),
                *(["--data_dir", args.data_dir] if args.data_dir else [])]
        base += [a for f, v in method.train_grid.items() for a in (f"--{f}", str(v[0]))]
        if train_refusal(base):  # the method fails without the flag too: check_grid says why
            return True, None
        for value in args.search_grid[flag]:
            tried += 1
            why = train_refusal([*base, f"--{flag}", str(value)])
            if why:
                refused.append((value, why))
    if refused and len(refused) < tried:  # taken at other values: this value is wrong
        value, why = refused[0]
        raise MinknnError(f"--search {flag}={value}: {why} (with --methods {method.name})")
    return not refused, refused[0][1] if refused else None


def task_flags(args, task):
    """train.py's flags naming a task of the grid: --task, and your files' flags for theirs."""
    return ["--task", task] + (file_argv(args) if task == getattr(args, "own_name", None) else [])


def train_refusal(argv):
    """train.py's one-line refusal of these flags (its check_args), or None if it takes them."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            options.get_args(argv)
    except SystemExit:
        return captured.getvalue().strip().removeprefix("error: ")
    except MinknnError as e:
        return str(e)
    return None


def slurm_param(p, text):
    """--slurm_param key=value: (key, value), the value read as JSON where it parses."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        p.error(f"--slurm_param {text}: give key=value, e.g. cpus_per_task=8")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def check_grid(args, train_flags, cells):
    """Everything that can fail before the first cell trains: the tasks, their data and sizes,
    each cell's train.py flags (train.py's own checks), the rules against the tasks, the methods
    a finished cell lacks, the --write file, --jobs on this device. Returns the Context and the
    train.py flags given, as parsed."""
    ctx = Context(args, train_flags)
    for method in args.method_list:
        owned = [name for name in method.train_grid if name in RUNNER_OWNS]
        if owned:
            raise MinknnError(f"--methods {method.name}: {', '.join(owned)} is the runner's to set "
                              f"for each cell (--tasks, --sizes, --seeds, ...), not a grid's")
    seen = set()
    for cell, methods in cells.items():
        task = ctx.task(cell.task)
        if (cell.task, cell.size, cell.seed) not in seen:
            seen.add((cell.task, cell.size, cell.seed))
            n_train = len(ctx.train_examples(cell))  # a size too large for a class stops here
            check_splits(ctx, task, n_train)
        if cell.loss == setfit_package.METHOD:  # the package trains it, with its own arguments
            setfit_package.check(cell, methods, task)
            continue
        parsed = parse_train_args(train_argv(cell, ctx, os.path.join(args.out, "runs",
                                                                     cell.name)), methods)
        siamese = parsed.pair_mode == "siamese" and task.pair
        for m in methods:
            if m.rule == "proxy" and m.loss not in PROXY_LOSSES:
                raise MinknnError(f"--methods {m.name}: proxy inference needs a proxy loss "
                                  f"({', '.join(PROXY_LOSSES)}), not {m.loss}")
            if m.rule != "linear" and (task.kind not in ("classify", "multilabel") or siamese):
                raise MinknnError(f"--methods {m.name}: {m.rule} needs one vector per example of a "
                                  f"classification or multi-label task; {cell.task} is a "
                                  f"{'siamese pair' if siamese else task.kind} task")
    # the flags given, as train.py reads them (in any order or spelling), for grid.json
    p = options.make_parser()
    given = vars(p.parse_args(train_flags))
    shared = {k: v for k, v in given.items() if v != p.get_default(k)}
    lacking = missing_scores(cells, ctx)
    if lacking:
        raise MinknnError(f"--out {args.out}: {len(lacking)} finished cells were scored before "
                          f"some of these methods were added, and their checkpoints are gone "
                          f"(e.g. {lacking[0]}); run them with another --out (or --keep next time)")
    if args.write:  # found now, not after the grid has trained
        report.block_file(args.write, report.runner_tag(args.out))
    ctx.device = pick_device(given["device"])  # --jobs: split the cores, or give each cell a GPU
    return ctx, shared


def parse_train_args(argv, methods):
    """train.py's parsed arguments for a cell; its one-line error names the methods at fault."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return options.get_args(argv)
    except SystemExit:
        message = captured.getvalue().strip().removeprefix("error: ")
        raise MinknnError(f"--methods {','.join(m.name for m in methods)}: {message}") from None


def check_splits(ctx, task, n_train):
    """A task scored on dev less the selection sample must keep at least as many to score."""
    if has_labelled_test(task, ctx.data_dir):
        return
    if ctx.select == "dev":
        raise MinknnError(f"--select dev: {task.name} has no labelled test split, so it is scored "
                          f"on dev, and dev cannot also choose; use --select sample")
    n_dev = len(load_split(task, "dev", ctx.data_dir))
    n_select = min(selection_size(ctx, n_train) or n_dev, n_dev)
    if 2 * n_select > n_dev:
        raise MinknnError(f"{task.name} has no labelled test split: it is scored on dev less the "
                          f"selection sample, and {n_select} of its {n_dev} dev examples would "
                          f"leave too few to score; use a smaller --sizes or --max_eval")


def check_same_grid(args, shared, train_flags, ctx):
    """A grid folder's cells must all come from the same train.py flags and selection."""
    path = os.path.join(args.out, "grid.json")
    grid = {"train_args": shared, "select": args.select, "max_eval": args.max_eval,
            "search": search_text(args.search_grid) or None, "chosen_on": args.chosen_on}
    if given(args):  # your files: the same paths and bytes, or another grid
        own = ctx.task(ctx.own).own
        grid["files"] = ", ".join(f"{s} {p} (sha256 {own['sha256'][s][:12]})"
                                  for s, p in own["files"].items())
    if not os.path.exists(path):
        write_json(path, grid)
        return
    saved = read_json(path)
    if "train_args" not in saved:  # a grid.json written before train_args: the flags as typed
        same = saved.get("train_flags") == train_flags
        saved["train_args"] = shared if same else {"flags": " ".join(saved.get("train_flags", []))}
    was = saved["train_args"]
    changed = [f"--{k} {was.get(k, '(not given)')}" for k in sorted(set(was) | set(shared))
               if was.get(k) != shared.get(k)]
    changed += [f"--{k} {shown(saved.get(k))}"
                for k in ("select", "max_eval", "search",  # a grid.json from before --search
                          "chosen_on", "files")            # or --chosen_on has none: as none given
                if saved.get(k) != grid.get(k)]
    if changed:
        raise MinknnError(f"--out {args.out} holds a grid run with {', '.join(changed)}; use the "
                          f"same flags to go on with it, or another --out")


def shown(value):
    """A grid.json value as its flag was given: '(not given)', a list comma-separated."""
    return "(not given)" if value is None else ",".join(value) if isinstance(value, list) \
        else value


def check_resumable(cells, ctx):
    """Every cell a killed grid left half-trained must be one train.py --resume takes (its
    run.json, and the checkpoint.pt beside its last.pt): found now, not when its turn comes after
    hours of other cells (or in a pool process, under --jobs). One line on how to go on in a
    grid: delete the cell's folder, and the same command trains it from its first epoch."""
    for cell in cells:
        folder = os.path.join(ctx.out, "runs", cell.name)
        if saved_lines(folder) is not None or training_status(folder) != "resume":
            continue
        save = "last" if ctx.select == "none" else "best"  # cells.train_argv's --save
        why = train_refusal(["--resume", folder]) or missing_checkpoint(folder, save)
        if why:
            raise MinknnError(f"{folder}: this stopped cell cannot be resumed ({why}); delete "
                              f"its folder (rm -r {folder}) and run the same command again: it "
                              f"trains the cell from its first epoch")


def lock_grid(out):
    """Creates `out` if needed and locks <out>/grid.lock (flock, as train.py locks a run
    folder's run.lock): held while the returned file stays open, and released by the OS when the
    runner ends, even by kill -9. The file stays behind, harmless: deleting it would let a
    runner that had just opened it lock a file no later runner sees."""
    make_folder(out)
    return lock_folder(out, "grid.lock", "runner", what=f"--out {out}")


def main(argv=None):
    args, train_flags = get_args(argv)
    if args.table:  # allowed while a runner works: results.jsonl is only ever replaced whole
        return table_and_plots(args.table, args)
    args.method_list = search_methods(args, train_flags)
    cells = cells_of(args.task_list, args.method_list, args.size_list, args.seed_list)
    ctx, shared = check_grid(args, train_flags, cells)
    with lock_grid(args.out):  # one runner per grid: a second would retrain the first's cells
        check_same_grid(args, shared, train_flags, ctx)
        ctx.kept = kept_cells(args.out, cells, args.keep)  # --keep is sticky (minknn/lab/kept.py)
        check_resumable(cells, ctx)
        failed = run_cells(args, cells, ctx)
        if args.drop_kept:
            drop_kept(args.out, cells, ctx.kept)
        finished = os.path.exists(os.path.join(args.out, "results.jsonl"))  # not if all failed
        text = table_and_plots(args.out, args) if finished else ""
    if failed:  # a SLURM grid's other cells went on; the table holds them
        print(f"error: {len(failed)} of {len(cells)} cells failed (run the same command again to "
              f"retry them): {' | '.join(failed)}", file=sys.stderr)
        sys.exit(1)
    return text


def run_cells(args, cells, ctx):
    """Every cell of the grid, the finished ones read back, into <out>/results.jsonl. Returns
    the cells that failed on SLURM, each '<cell>: <why>; log <path>' (a local failure stops
    the grid)."""
    finished = {c: None for c in cells}
    start, todo = time.time(), [c for c in cells
                                if saved_lines(os.path.join(args.out, "runs", c.name)) is None]
    print(f"grid: {len(cells)} cells ({len(args.task_list)} tasks x {len(args.size_list)} sizes "
          f"x {len(args.seed_list)} seeds x their trainings), {len(cells) - len(todo)} finished "
          f"before; {args.out}")
    results = os.path.join(args.out, "results.jsonl")

    def record(cell, lines):
        finished[cell] = lines
        write_jsonl(results, [line for ls in finished.values() if ls for line in ls])
        done = sum(ls is not None for ls in finished.values())
        summary = describe_cell(lines)
        ran, left = done - (len(cells) - len(todo)), len(cells) - done  # ran: this time
        minutes = (time.time() - start) / 60
        when = f"{minutes:.0f} min" + (f", about {minutes / ran * left:.0f} min left"
                                       if ran > 0 and left else "")  # none while reading back
        print(f"[{done}/{len(cells)}, {when}] {cell.name}: {summary}", flush=True)
    failed = []
    try:
        for cell in cells:  # the finished ones first: results.jsonl holds them from the start
            if cell not in todo:
                record(cell, run_cell(cell, cells[cell], ctx))
        if args.launcher == "slurm":
            from minknn.lab import slurm
            failed = slurm.run_jobs(args, cells, todo, ctx, record)
        elif args.jobs == 1:
            for cell in todo:
                record(cell, run_cell(cell, cells[cell], ctx))
        else:
            with cell_pool(args.jobs, ctx.device) as pool:
                futures = {pool.submit(run_cell, c, cells[c], ctx): c for c in todo}
                try:
                    for future in concurrent.futures.as_completed(futures):
                        record(futures[future], future.result())
                except BaseException:  # a failed cell stops the grid, not after the queue
                    pool.shutdown(cancel_futures=True)
                    raise
    except (KeyboardInterrupt, SystemExit) as e:
        # train.py turns Ctrl-C into exit 130 and SIGTERM (minknn.Terminated) into 143
        status = e.code if isinstance(e, SystemExit) else 143 if isinstance(e, Terminated) else 130
        if status not in (130, 143):
            raise
        jobs = "; its jobs go on, and the rerun waits for them" if args.launcher == "slurm" else ""
        print(f"\n{'terminated' if status == 143 else 'interrupted'}; run the same command again "
              f"to go on (finished cells are kept in {args.out}/runs){jobs}", file=sys.stderr)
        sys.exit(status)
    print(f"grid done in {(time.time() - start) / 60:.1f} min; results in {results}")
    return failed


def cell_pool(jobs, device):
    """--jobs N: N processes, each with cores / N torch threads (the cores torch would use here,
    split), and on a machine with several GPUs its own one: process i takes the i-th, round robin,
    through CUDA_VISIBLE_DEVICES (set before the process touches CUDA, so the cell's `cuda` is
    that GPU). A --device cuda:N given names one GPU for every cell, and is left alone."""
    spawn = multiprocessing.get_context("spawn")
    return concurrent.futures.ProcessPoolExecutor(
        jobs, mp_context=spawn, initializer=start_worker,
        initargs=(max(1, torch.get_num_threads() // jobs), gpus_to_share(device),
                  spawn.Value("i", 0)))


def gpus_to_share(device):
    """The GPUs --jobs spreads the cells over: those visible, when there are several and the
    cells' device is `cuda` (or auto) with no index; else none."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = listed.split(",") if listed else [str(i) for i in range(torch.cuda.device_count())]
    return gpus if device.type == "cuda" and device.index is None and len(gpus) > 1 else []


def start_worker(threads, gpus, started):
    """A pool process, before its first cell: its threads, and its GPU (started: how many
    processes took one before it)."""
    torch.set_num_threads(threads)
    if gpus:
        with started.get_lock():
            i, started.value = started.value, started.value + 1
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]


def table_and_plots(folder, args):
    """table.md (minknn/lab/report.py), then plots/ (minknn/lab/plots.py, when matplotlib is
    there)."""
    text = report.write_report(folder, args.metric, args.baseline, args.test, args.write)
    try:
        from minknn.lab import plots
    except ImportError as e:  # matplotlib is an optional extra
        print(f"no plots: {e}; pip install -e '.[plots]'")
        return text
    metric = args.metric.split(",")[0] if args.metric else None
    for path in plots.draw_all(report.read_results(folder), os.path.join(folder, "plots"), metric):
        print(f"plot: {path}")
    return text


def describe_cell(lines):
    """A cell's progress line: each method's first score at the first values of its grid, after
    the split they are on, named once (test, or the dev examples the selection sample left: the
    table chooses on that sample, minknn/lab/report.py)."""
    splits = sorted({line["test_split"] for line in lines if "grid" in line})
    return (f"on {', '.join(splits)}: " if splits else "") + "; ".join(map(describe_line, lines))


def describe_line(line):
    if "diverged" in line:
        return f"{line['method']} diverged"
    first = line["grid"][0]
    metric = next(iter(first["test"]))
    params = ", ".join(f"{k} {v}" for k, v in first["params"].items())
    text = f"{line['label']} {metric} {first['test'][metric]:.4f}"
    return text + (f" ({params})" if params else "")


if __name__ == "__main__":  # main of the module by its name, not of __main__: a SLURM job unpickles
    from minknn.lab import runner  # the cells' Context (and run_cell) from minknn.lab.runner
    run(runner.main)
