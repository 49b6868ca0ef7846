"""Whole runs, timed from outside: `epoch` runs `python train.py` itself and reads the time it
reports for an epoch (its second: the first pays the start-up costs), against the loop a user
would write with transformers (or the train.py of another checkout, --compare); `ddp` the same
epoch in N processes under torchrun against one process; `grid` the runner's cells N at once
(--jobs N) against one at a time.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import torch

from minknn import MinknnError
from minknn import backbones
from minknn.kinds import kind_of
from minknn.lab.bench.shared import (NO_REFERENCE, Table, check_transformers, device_name,
                                     flops_per_token, peak_matmul_flops, precision_of,
                                     times_itself)
from minknn.lab.grid import parse_seeds
from minknn.tasks.data import training_examples
from minknn.tasks.registry import get_task
from minknn.tokenizer import Tokenizer
from minknn.tools.engine import TrainBatches, autocast
from minknn.tools.weights import resolve_model_path


# ---------------------------------------------------------------------------------------------
# epoch: `python train.py` against the loop a user would write with transformers

def bench_epoch(args, device, timer, out, peak_matmul_flops=peak_matmul_flops,
                check_transformers=check_transformers):
    """The `epoch` table; main passes peak_matmul_flops and check_transformers as the package
    has them (model.py's bench_model says why)."""
    task = get_task(args.task, args.data_dir)
    path = resolve_model_path(args.model)
    examples = training_examples(task, args.data_dir, args.examples, args.seed)
    tokenizer = Tokenizer.from_folder(path, args.max_len)
    config = backbones.from_pretrained(path).config
    # train.py's first pass: the same shuffled batches of the same examples (its rng, its seed)
    batches = [rows for rows, _ in zip(TrainBatches(len(examples), args.batch_size,
                                                    random.Random(args.seed)),
                                       range(-(-len(examples) // args.batch_size)))]
    lengths = [len(ids) for ids, _ in tokenizer.encode([e.text for e in examples])]
    real = sum(lengths)
    padded = sum(len(rows) * max(lengths[i] for i in rows) for rows in batches)
    flops = 3 * sum(n * flops_per_token(config, n) for n in lengths)  # real tokens only
    peak = peak_matmul_flops(device)
    transformers = check_transformers()
    # Each contestant returns (its first epoch's seconds, its second's). The best round counts the
    # second: train.py's second epoch, the loop's pass in a later round, on shapes already seen.
    # The first round's first epoch is kept too: a fresh process's first epoch, against the loop's
    # first pass (on a GPU each new shape loads kernels and may plan them: most of a short epoch).
    first = {}

    def contestant(name, run):
        def second():
            seconds = run()
            first.setdefault(name, seconds[0])
            return seconds[1]
        return times_itself(second)
    contestants = {"train.py": contestant("train.py", lambda: train_py_epoch(args, device, "."))}
    if device.type == "cuda":  # attention over the packed tokens, against the padded call
        contestants["train.py --attention packed"] = contestant(
            "train.py --attention packed",
            lambda: train_py_epoch(args, device, ".", flags=("--attention", "packed")))
    if args.compare:
        contestants[f"train.py of {args.compare}"] = contestant(
            f"train.py of {args.compare}", lambda: train_py_epoch(args, device, args.compare))
    if transformers:
        contestants["transformers loop"] = contestant("transformers loop", lambda: (
            transformers_epoch(transformers, path, task, examples, batches, args, device, timer),
            transformers_epoch(transformers, path, task, examples, batches, args, device, timer)))
    out.append(f"`python -m minknn.lab.bench epoch`: {device_name(device)}, "
               f"{precision_of(device)}; one epoch of {len(examples)} {task.name} training "
               f"examples (--seed {args.seed}; train.py's second, as its first pays the start-up "
               f"costs, which the first-epoch columns compare: the first round's first epoch "
               f"against the loop's first pass), batches of {args.batch_size}; {real} real "
               f"tokens, {padded / real:.2f} "
               f"padded tokens per real one when each batch is padded to its longest; best of "
               f"{args.rounds} alternating rounds; measured peak matmul {peak / 1e12:.3f} TFLOP/s"
               f"{'' if transformers else NO_REFERENCE}\n")
    print(out[-1])
    seconds = timer.best_of_rounds(contestants)
    reference, cold = seconds.get("transformers loop"), first.get("transformers loop")
    table = Table(out, "what", "seconds per epoch", "real tokens/s", "MFU on real tokens",
                  "time / transformers loop", "first epoch, s", "first / the loop's first")
    for name, s in seconds.items():
        cold_ratio = f"{first[name] / cold:.2f}" if cold and first[name] > 0 else ""
        if s <= 0:  # train.py reports tenths of a second: a tiny epoch (the README's test) reads 0
            table.row(f"`{name}`", f"{s:.1f}", "too fast to time", "", "", f"{first[name]:.1f}",
                      cold_ratio)
            continue
        table.row(f"`{name}`", f"{s:.1f}", f"{real / s:.0f}", f"{flops / s / peak:.2f}",
                  f"{s / reference:.2f}" if reference else "", f"{first[name]:.1f}", cold_ratio)


def train_py_epoch(args, device, checkout, processes=1, threads=None, flags=()):
    """Runs `python train.py` (of the checkout: a folder holding train.py) for two epochs on
    --examples examples and returns both epochs' seconds as it reports them (the training loop
    alone: no model loading, dev scoring or saving); the second is the one compared. The first
    epoch of a fresh process pays
    the start-up costs (on a GPU, loading each kernel at its first call: the first steps take
    about a second each), which the in-process transformers loop pays in its first round only,
    and the best of the rounds leaves out. processes > 1: under torchrun, on one machine;
    threads: each process's torch threads (OMP_NUM_THREADS; default: torch's); flags: more of
    train.py's."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, *(torchrun if processes > 1 else []), "train.py",
                   "--task", args.task, "--epochs", "2",
                   "--max_train", str(args.examples), "--max_eval", "16", "--seed", str(args.seed),
                   "--batch_size", str(args.batch_size), "--max_len", str(args.max_len),
                   "--model", args.model, "--device", str(device),
                   "--out", os.path.join(tmp, "run"), *flags]
        if args.data_dir:
            command += ["--data_dir", os.path.abspath(args.data_dir)]
        done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise MinknnError(f"{checkout}/train.py failed: {why_failed(done)}")
        with open(os.path.join(tmp, "run", "metrics.jsonl")) as f:
            return [json.loads(line)["epoch_seconds"] for line in f]


def transformers_epoch(transformers, path, task, examples, batches, args, device, timer):
    """The plain loop: Hugging Face's tokenizer and BertForSequenceClassification on the same
    weights, each batch padded to its longest, AdamW with train.py's settings, clipping at 1, a
    linear schedule. Returns the seconds of the loop."""
    torch.manual_seed(args.seed)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=len(task.labels)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(0.06 * len(batches)),
                                                            len(batches))
    timer.sync()
    start = time.perf_counter()
    for rows in batches:
        batch = [examples[i] for i in rows]
        inputs = hf_tokenizer([e.text for e in batch], padding=True, truncation=True,
                              max_length=args.max_len, return_tensors="pt").to(device)
        labels = kind_of(task).targets(task, batch, device)
        with autocast(device):
            loss = model(**inputs, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    timer.sync()
    return time.perf_counter() - start


def why_failed(done):
    """A failed command's own `error:` line (torchrun adds its report after it), or its last
    line."""
    lines = done.stderr.strip().splitlines() or ["no output"]
    return ([line for line in lines if line.startswith("error:")] or lines)[-1]


# ---------------------------------------------------------------------------------------------
# ddp: one run in N processes under torchrun against one process

def bench_ddp(args, device, timer, out):
    n = args.processes
    if device.type == "cuda":  # a GPU each, against one GPU
        if n > torch.cuda.device_count():
            raise MinknnError(f"--processes {n}: this machine has {torch.cuda.device_count()} "
                              f"GPUs")
        one, many, threads = "1 process, 1 GPU", f"{n} processes, {n} GPUs (torchrun)", (None, None)
    else:  # the same cores, shared out two ways
        one, many = f"1 process x {n} threads", f"{n} processes x 1 thread (torchrun)"
        threads = (n, 1)
    contestants = {one: times_itself(lambda: train_py_epoch(args, device, ".", 1, threads[0])[1]),
                   many: times_itself(lambda: train_py_epoch(args, device, ".", n, threads[1])[1])}
    cpu = ("; on a CPU the processes share its cores, which says little of GPUs" if threads[0]
           else "")
    out.append(f"`python -m minknn.lab.bench ddp`: {device_name(device)}, {precision_of(device)}; "
               f"one epoch of train.py (its second) on {args.examples} {args.task} training "
               f"examples (--seed {args.seed}), global batches of {args.batch_size}, --max_len "
               f"{args.max_len}, the same steps either way; best of {args.rounds} alternating "
               f"rounds{cpu}\n")
    print(out[-1])
    seconds = timer.best_of_rounds(contestants)
    table = Table(out, "what", "seconds per epoch", "examples/s", f"time / {one}")
    for name, s in seconds.items():
        if s <= 0 or seconds[one] <= 0:  # tenths of a second: a tiny epoch reads 0
            table.row(name, f"{s:.1f}", "too fast to time", "")
            continue
        table.row(name, f"{s:.1f}", f"{args.examples / s:.1f}", f"{s / seconds[one]:.2f}")


# ---------------------------------------------------------------------------------------------
# grid: the runner's cells N at once (--jobs N) against one at a time

def bench_grid(args, device, timer, out):
    def grid(jobs):
        def wall():
            with tempfile.TemporaryDirectory() as tmp:
                command = [sys.executable, "-m", "minknn.lab.runner", "--tasks", args.tasks,
                           "--methods", args.methods, "--sizes", args.sizes, "--seeds",
                           args.seeds, "--out", os.path.join(tmp, "grid"), "--jobs", str(jobs),
                           "--model", args.model, "--device", str(device), *args.train_flags]
                if args.data_dir:
                    command += ["--data_dir", os.path.abspath(args.data_dir)]
                start = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True)
                seconds = time.perf_counter() - start
            if done.returncode != 0:
                raise MinknnError(f"the runner failed: {why_failed(done)}")
            return seconds
        return times_itself(wall)
    cells = len(args.tasks.split(",")) * len(args.sizes.split(",")) * len(parse_seeds(args.seeds))
    contestants = {"--jobs 1": grid(1), f"--jobs {args.jobs}": grid(args.jobs)}
    out.append(f"`python -m minknn.lab.bench grid`: {device_name(device)}, "
               f"{precision_of(device)}; the runner's whole command (python -m minknn.lab.runner "
               f"--tasks {args.tasks} --methods "
               f"'{args.methods}' --sizes {args.sizes} --seeds {args.seeds} "
               f"{' '.join(args.train_flags)}): {cells} trainings, wall time from start to the "
               f"table; best of {args.rounds} alternating rounds\n")
    print(out[-1])
    seconds = timer.best_of_rounds(contestants)
    table = Table(out, "what", "wall seconds", "cells/min", "time / --jobs 1")
    for name, s in seconds.items():
        table.row(name, f"{s:.1f}", f"{60 * cells / s:.1f}", f"{s / seconds['--jobs 1']:.2f}")
