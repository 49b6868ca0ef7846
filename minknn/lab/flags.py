"""The runner's flags (python -m minknn.lab.runner --help), and everything it checks before any
cell trains: the grid against train.py's own checks, --search, --select and --chosen_on, the
tasks' splits, SLURM's flags, and a rerun against the grid it continues (grid.json). Each refusal
is one line, before any model or data is read where it can be (minknn/lab/runner.py's docstring
says what the flags mean).
"""
import contextlib
import io
import json
import os

from minknn import MinknnError
from minknn.lab import report, setfit_package
from minknn.lab.cells import (Context, has_labelled_test, missing_scores, saved_lines,
                              selection_size, train_argv, training_status)
from minknn.lab.grid import (parse_grid, parse_method, parse_seeds, parse_sizes, search_text,
                             size_flags, split_top, with_search)
from minknn.lab.kept import check_flags
from minknn.losses import PROXY_LOSSES
from minknn.tasks.data import load_split
from minknn.tasks.own_task import FLAGS as FILE_FLAGS, file_argv, given, task_name
from minknn.tasks.own_task import check_flags as check_file_flags
from minknn.tasks.registry import TASKS
from minknn.tools import options
from minknn.tools.cli import Parser, below_one
from minknn.tools.engine import pick_device
from minknn.tools.files import read_json, write_json
from minknn.tools.run import missing_checkpoint

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
    g = p.add_argument_group("your own files as a task (minknn/tasks/own_task.py), as train.py "
                             "takes them")
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
    """Your files' flags (minknn/tasks/own_task.py check_flags); with --train_file, --tasks defaults
    to the task of your files alone."""
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
