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
import multiprocessing
import os
import sys
import time

import torch

from minknn import Terminated
from minknn.lab import report
from minknn.lab.cells import run_cell, saved_lines
from minknn.lab.flags import check_grid, check_resumable, check_same_grid, get_args, search_methods
from minknn.lab.grid import cells_of
from minknn.lab.kept import drop_kept, kept_cells
from minknn.tools.cli import run
from minknn.tools.files import lock_folder, make_folder, write_jsonl


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
