"""What asking a run about your texts costs. `predict`: `python -m minknn.tools.predict` against
`evaluate.py` on the same texts, in one process, alternating: both read a run of your own files
(minknn/tasks/own_task.py) trained one step on 256 other sentences, whose dev file holds the texts,
evaluate.py scoring that split and predict answering that file's column; the head alone, then
with kNN over the run's datastore (built once, before the clock, then loaded by both). Each reads
the file, tokenises, encodes in length-sorted batches and writes its answers: the whole command,
less Python's start.
"""
import contextlib
import csv
import io
import os
import tempfile
import time

import evaluate
import train as train_py
from minknn import MinknnError
from minknn.lab.bench.shared import Table, device_name, precision_of, times_itself
from minknn.tasks.data import load_split
from minknn.tasks.registry import get_task
from minknn.tools.predict import main as predict


def texts_of(task, data_dir, n):
    """n (text, label name) of a task's train and dev sentences, cycled to n where fewer."""
    found = [(e.text, task.labels[e.label]) for split in ("train", "dev")
             for e in load_split(task, split, data_dir)]
    return [found[i % len(found)] for i in range(n)]


def write_rows(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)
    return path


def quiet(fn):
    """fn's seconds, its printed lines kept off the screen."""
    @times_itself
    def timed():
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            fn()
        return time.perf_counter() - start
    return timed


def bench_predict(args, device, timer, out):
    task = get_task(args.task, args.data_dir)
    if task.kind != "classify" or task.pair:
        raise MinknnError(f"--task {task.name}: predict's texts here are a classification task's "
                          f"single sentences (sst, mr, ...), and {task.name} is "
                          f"{'a task of pairs' if task.pair else 'a ' + task.kind + ' task'}")
    rows = texts_of(task, args.data_dir, args.texts + 256)
    with tempfile.TemporaryDirectory() as tmp:
        train_file = write_rows(os.path.join(tmp, "train.csv"), rows[args.texts:])
        dev_file = write_rows(os.path.join(tmp, "texts.csv"), rows[:args.texts])
        run = os.path.join(tmp, "run")
        with contextlib.redirect_stdout(io.StringIO()):  # a run to ask: one step is enough
            train_py.main(["--train_file", train_file, "--dev_file", dev_file, "--task", "texts",
                           "--model", args.model, "--device", str(device), "--epochs", "1",
                           "--steps", "1", "--max_eval", "8", "--max_len", str(args.max_len),
                           "--out", run])
        common = ["--device", str(device), "--batch_size", str(args.batch_size)]
        knn = ["--knn", "--k", str(args.k)]
        with contextlib.redirect_stdout(io.StringIO()):  # the datastore, built before the clock
            evaluate.main(["--checkpoint", run, *common, *knn, "--max_eval", "8"])
        lengths = [len(t) for t, _ in rows[:args.texts]]
        out.append(f"`python -m minknn.lab.bench predict`: {device_name(device)}, "
                   f"{precision_of(device)}; {args.model}, --max_len {args.max_len}, batches of "
                   f"{args.batch_size}; the same {args.texts:,} {task.name} sentences (train and "
                   f"dev, {sum(lengths) / len(lengths):.0f} characters on average) answered by "
                   f"each command in this process, best of {args.rounds} alternating rounds\n")
        print(out[-1])
        table = Table(out, "rules", "`evaluate.py` (the split)", "`predict` (the file)", "ratio")
        for name, rules in (("the head", []), (f"the head and kNN (K {args.k})", knn)):
            seconds = timer.best_of_rounds({
                "evaluate": quiet(lambda r=rules: evaluate.main(
                    ["--checkpoint", run, *common, *r, "--out", os.path.join(tmp, "e.csv")])),
                "predict": quiet(lambda r=rules: predict(
                    [run, "--file", dev_file, *common, *r, "--out", os.path.join(tmp, "p.csv")]))})
            rate = {k: args.texts / s for k, s in seconds.items()}
            table.row(name, f"{seconds['evaluate']:.1f} s ({rate['evaluate']:.0f} texts/s)",
                      f"{seconds['predict']:.1f} s ({rate['predict']:.0f} texts/s)",
                      f"{rate['predict'] / rate['evaluate']:.2f}x evaluate.py's throughput")
