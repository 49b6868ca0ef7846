"""The scaffolding the benchmarks share: a clock whose contestants alternate (Timer), the machine's
peak matmul (MFU's denominator), a Markdown table printed a row at a time, the optional
transformers reference, and train.py's own run and step (built, step, fixed_batches).

How things are timed (Timer): the contestants of a comparison alternate over --rounds rounds and
each keeps its best round. On a shared 2-core machine one round can move by 10-20%, and a slow
moment then hits one round, not one contestant. On CUDA the clock waits for the GPU
(torch.cuda.synchronize) before it reads the time. CUDA runs bf16 autocast, as train.py does, the
CPU fp32. `knn` and `multitask` build their runs as train.py does (minknn/tools/trainer.py's build)
and step them with train.py's own train_step, so the code timed is the code that trains, not a copy.
"""
import os
import random
import time

import torch

from minknn.tools import options
from minknn.tools.engine import TrainBatches
from minknn.tools.trainer import build, fill_memory
import train as train_py  # the code that trains, timed as it is


# ---------------------------------------------------------------------------------------------
# a clock, alternating rounds, the machine's peak, a Markdown table

class Timer:
    def __init__(self, device, rounds):
        self.device, self.rounds = device, rounds

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def seconds(self, fn, repeats=1, warmup=1):
        """Seconds per call of fn(), after `warmup` untimed calls."""
        for _ in range(warmup):
            fn()
        self.sync()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        self.sync()
        return (time.perf_counter() - start) / repeats

    def best_of_rounds(self, contestants, repeats=1, warmup=1):
        """{name: seconds per call}: the contestants (name -> fn) take turns, --rounds times; each
        keeps its best round. A contestant that times itself returns its seconds (a float) and
        gets repeats=1, warmup=0."""
        best = dict.fromkeys(contestants, float("inf"))
        for _ in range(self.rounds):
            for name, fn in contestants.items():
                if getattr(fn, "times_itself", False):
                    seconds = fn()
                else:
                    seconds = self.seconds(fn, repeats, warmup)
                best[name] = min(best[name], seconds)
        return best


def times_itself(fn):
    """Marks a contestant that returns its own seconds (e.g. read from a run it started)."""
    fn.times_itself = True
    return fn


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def precision_of(device):
    return "bf16 autocast" if device.type == "cuda" else "fp32"


def peak_matmul_flops(device, repeats=5):
    """The best FLOP/s of a large square matmul in the dtype the model runs in: MFU's
    denominator."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n = 8192 if device.type == "cuda" else 2048  # large enough to reach the peak on either
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    timer = Timer(device, repeats)
    return 2 * n ** 3 / min(timer.seconds(lambda: a @ b, repeats=4) for _ in range(repeats))


def flops_per_token(config, T):
    """Forward FLOPs per token of a sequence of T tokens, as nanoGPT counts them: 2 N for the
    matmul weights N (embeddings excluded) and 4 L T H for Q K^T and (attention) V. A training
    step costs three times this (the backward pass twice the forward)."""
    H, L, I = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    N = L * (4 * H * H + 2 * H * I)  # Q, K, V, O projections and the two feed-forward matmuls
    return 2 * N + 4 * L * T * H


class Table:
    """A Markdown table, printed a row at a time (so a long run shows its progress)."""

    def __init__(self, out, *columns):
        self.out, self.columns = out, columns
        self.line("| " + " | ".join(columns) + " |")
        self.line("|" + "|".join(" --- " for _ in columns) + "|")

    def row(self, *cells):
        self.line("| " + " | ".join(str(c) for c in cells) + " |")

    def line(self, text):
        self.out.append(text)
        print(text, flush=True)


# what `model` and `epoch` say above their tables when check_transformers finds none
NO_REFERENCE = "; transformers not installed: no reference (pip install -e '.[bench]')"


def check_transformers():
    """Hugging Face transformers, the reference of `model` and `epoch`, or None: it is not a
    dependency (the bench extra: pip install -e '.[bench]'), and those comparisons are skipped
    without it (their line says so: NO_REFERENCE)."""
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()  # no note about the new classifier's weights
    transformers.logging.disable_progress_bar()
    return transformers


# ---------------------------------------------------------------------------------------------
# train.py's run and step, as train.py builds and takes them (knn, multitask)

def built(args, argv, train, device):
    """The parts of train.py's run with the flags argv (a minknn/tools/trainer.py Trainer), built as
    train.py builds them, on training examples already read (train: task name -> examples)."""
    argv = argv + ["--model", args.model, "--device", str(device)]
    argv += ["--data_dir", args.data_dir] if args.data_dir else []
    trainer, _ = build(options.get_args(argv), train_py.make_optimizer, (train, {}))
    if trainer.moco:  # as train.py's begin() fills it
        fill_memory(trainer)
    return trainer


def step(trainer, batches):
    """One step of train.py's own train_step (batches: minknn/tools/step.py's batch()); returns what
    it returns (each task's loss, ...)."""
    return train_py.train_step(trainer, batches)


def fixed_batches(train, tasks, batch_size, steps, seed=0):
    """`steps` steps' rows, as train.py's streams draw them (one generator for all):
    [{task: rows}]."""
    rng = random.Random(seed)
    streams = {t.name: TrainBatches(len(train[t.name]), batch_size, rng) for t in tasks}
    return [{t.name: next(streams[t.name]) for t in tasks} for _ in range(steps)]
