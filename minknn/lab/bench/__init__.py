"""What minknn's work costs, one subcommand each, every figure a ratio measured side by side in one run.

    python -m minknn.lab.bench model        # the hand-written encoder (BERT, RoBERTa, DistilBERT) against Hugging Face's
    python -m minknn.lab.bench epoch        # one epoch of train.py against the plain transformers loop, real SST
    python -m minknn.lab.bench ddp          # one epoch of train.py in 2 processes (torchrun) against 1 process
    python -m minknn.lab.bench grid         # the runner's 20 cells with --jobs 2 against --jobs 1
    python -m minknn.lab.bench knn          # a knnbert step against a ce step; what the kNN vote adds to evaluation
    python -m minknn.lab.bench multitask    # a PCGrad step against a summed-loss step, and where PCGrad's time goes
    python -m minknn.lab.bench index        # faiss flat, IVF and HNSW datastores up to 1M keys: build, memory, recall, search
    python -m minknn.lab.bench epoch --write RESULTS.md   # also writes the table into RESULTS.md's speed section

(epoch, ddp, grid, knn, multitask and index read real data: $MINKNN_DATA or --data_dir; data/README.md.)
Every subcommand prints one line saying what ran where, then one Markdown table. With --write FILE
that output also replaces the block between `<!-- bench.py NAME -->` and `<!-- /bench.py NAME -->`
in FILE, so the speed tables in RESULTS.md are this script's output, never typed by hand.

How things are timed (Timer): the contestants of a comparison alternate over --rounds rounds and
each keeps its best round. On a shared 2-core machine one round can move by 10-20%, and a slow
moment then hits one round, not one contestant. On CUDA the clock waits for the GPU
(torch.cuda.synchronize) before it reads the time. CUDA runs bf16 autocast, as train.py does, the
CPU fp32. `knn` and `multitask` build their runs as train.py does (minknn/trainer.py's build) and
step them with train.py's own train_step, so the code timed is the code that trains, not a copy;
`epoch` runs `python train.py` itself and reads the epoch time it reports. Hugging Face
transformers is the reference in `model` and `epoch`; it is not a dependency (pip install
transformers), and those comparisons are skipped without it.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

from minknn import MinknnError
from minknn.cli import run
from minknn import backbones
from minknn.backbones import read_config
from minknn.weights import resolve_model_path
from minknn.data import load_split, training_examples
from minknn.engine import TrainBatches, autocast, pick_device, predict, to_device
from minknn.lab.grid import parse_seeds, parse_sizes
from minknn.kinds import kind_of
from minknn.model import Model
from minknn.cli import Parser
from minknn import options
from minknn.lab.report import write_block
from minknn.tasks import TASKS, get_task
from minknn.tokenizer import Tokenizer
from minknn.trainer import batch, build
import train as train_py  # the code that trains, timed as it is


# ---------------------------------------------------------------------------------------------
# the shared scaffolding: a clock, alternating rounds, the machine's peak, a Markdown table

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
    """The best FLOP/s of a large square matmul in the dtype the model runs in: MFU's denominator."""
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


def check_transformers():
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()  # no note about the new classifier's weights
    transformers.logging.disable_progress_bar()
    return transformers


# ---------------------------------------------------------------------------------------------
# model: the hand-written BERT against Hugging Face's, step for step, on random tokens

class Reference(nn.Module):
    """Hugging Face's model of the folder's architecture (BertModel, RobertaModel or
    DistilBertModel) behind the same call signature as ours."""

    def __init__(self, transformers, path):
        super().__init__()
        self.config = read_config(path)  # ours: Model reads its hidden size and dropout
        kind = self.config.model_type
        name = {"bert": "BertModel", "roberta": "RobertaModel", "distilbert": "DistilBertModel"}
        pooler = {} if kind == "distilbert" else {"add_pooling_layer": False}  # minknn has none
        self.hf = getattr(transformers, name[kind]).from_pretrained(path, **pooler)
        self.types = kind != "distilbert"  # DistilBERT takes no token types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        types = {"token_type_ids": token_type_ids} if self.types else {}
        return self.hf(input_ids=input_ids, attention_mask=attention_mask,
                       **types).last_hidden_state


def bench_model(args, device, timer, out):
    path = resolve_model_path(args.model)
    positions = read_config(path).max_tokens
    if max(args.lengths) > positions:
        raise MinknnError(f"--lengths {max(args.lengths)}: longer than the model's {positions} "
                          f"positions")
    sst = [TASKS["sst"]]  # a 5-class head, as on SST
    torch.manual_seed(0)
    models = {"minknn": Model(backbones.from_pretrained(path), sst, "mean")}
    # --attention explicit, the student edition's default: attention() as written, same weights
    models["minknn explicit"] = Model(backbones.from_pretrained(path).set_attention("explicit"),
                                      sst, "mean")
    models["minknn explicit"].heads.load_state_dict(models["minknn"].heads.state_dict())
    transformers = check_transformers()
    if transformers:
        models["transformers"] = Model(Reference(transformers, path), sst, "mean")
        models["transformers"].heads.load_state_dict(models["minknn"].heads.state_dict())
    for m in models.values():
        m.to(device)
    peak = peak_matmul_flops(device)
    out.append(f"`python -m minknn.lab.bench model`: {device_name(device)}, {precision_of(device)}; batch "
               f"{args.batch_size} of random tokens, no padding; best of {args.rounds} alternating "
               f"rounds of {args.steps} steps; measured peak matmul {peak / 1e12:.3f} TFLOP/s"
               f"{'' if transformers else '; transformers not installed: no reference'}\n")
    print(out[-1])
    table = Table(out, "length", "step", *[f"{m} examples/s" for m in models],
                  *[f"{m} MFU" for m in models], "explicit / fused attention",
                  *(["minknn / transformers"] if transformers else []))
    config = models["minknn"].bert.config
    for T in args.lengths:
        g = torch.Generator().manual_seed(T)
        low = 1000 if config.vocab_size > 2000 else 0  # past BERT's special and [unused] ids
        batch = {"input_ids": torch.randint(low, config.vocab_size, (args.batch_size, T), generator=g),
                 "attention_mask": torch.ones(args.batch_size, T, dtype=torch.long),
                 "token_type_ids": torch.zeros(args.batch_size, T, dtype=torch.long)}
        batch = to_device(batch, device)
        labels = torch.randint(0, 5, (args.batch_size,), generator=g).to(device)
        for train in (True, False):
            steps = {name: model_step(m, batch, labels, device, train) for name, m in models.items()}
            seconds = timer.best_of_rounds(steps, args.steps, warmup=2)
            flops = args.batch_size * T * flops_per_token(config, T) * (3 if train else 1)
            ratio = [f"{seconds['transformers'] / seconds['minknn']:.2f}"] if transformers else []
            table.row(T, "train" if train else "inference",
                      *[f"{args.batch_size / s:.1f}" for s in seconds.values()],
                      *[f"{flops / s / peak:.2f}" for s in seconds.values()],
                      f"{seconds['minknn explicit'] / seconds['minknn']:.2f}", *ratio)


def model_step(model, batch, labels, device, train):
    """One step of the classifier: forward, cross-entropy, backward, AdamW (train); or a forward
    under torch.inference_mode() (inference)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():
        model.train(train)
        if train:
            with autocast(device):
                loss = nn.functional.cross_entropy(model("sst", **batch).logits.float(), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        else:
            with torch.inference_mode(), autocast(device):
                model("sst", **batch)
    return step


# ---------------------------------------------------------------------------------------------
# epoch: `python train.py` against the loop a user would write with transformers

def bench_epoch(args, device, timer, out):
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
    contestants = {"train.py": times_itself(lambda: train_py_epoch(args, device, "."))}
    if args.compare:
        contestants[f"train.py of {args.compare}"] = times_itself(
            lambda: train_py_epoch(args, device, args.compare))
    if transformers:
        contestants["transformers loop"] = times_itself(
            lambda: transformers_epoch(transformers, path, task, examples, batches, args, device, timer))
    out.append(f"`python -m minknn.lab.bench epoch`: {device_name(device)}, {precision_of(device)}; one epoch "
               f"of {len(examples)} {task.name} training examples (--seed {args.seed}), batches of "
               f"{args.batch_size}; {real} real tokens, {padded / real:.2f} padded tokens per real "
               f"one when each batch is padded to its longest; best of {args.rounds} alternating "
               f"rounds; measured peak matmul {peak / 1e12:.3f} TFLOP/s"
               f"{'' if transformers else '; transformers not installed: no reference'}\n")
    print(out[-1])
    seconds = timer.best_of_rounds(contestants)
    reference = seconds.get("transformers loop")
    table = Table(out, "what", "seconds per epoch", "real tokens/s", "MFU on real tokens",
                  "time / transformers loop")
    for name, s in seconds.items():
        if s <= 0:  # train.py reports tenths of a second: a tiny epoch (the README's test) reads 0
            table.row(f"`{name}`", f"{s:.1f}", "too fast to time", "", "")
            continue
        table.row(f"`{name}`", f"{s:.1f}", f"{real / s:.0f}", f"{flops / s / peak:.2f}",
                  f"{s / reference:.2f}" if reference else "")


def train_py_epoch(args, device, checkout, processes=1, threads=None):
    """Runs `python train.py` (of the checkout: a folder holding train.py) for one epoch on
    --examples examples and returns the epoch's seconds as it reports them (the training loop
    alone: no model loading, dev scoring or saving). processes > 1: under torchrun, on one
    machine; threads: each process's torch threads (OMP_NUM_THREADS; default: torch's)."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, *(torchrun if processes > 1 else []), "train.py",
                   "--task", args.task, "--epochs", "1",
                   "--max_train", str(args.examples), "--max_eval", "16", "--seed", str(args.seed),
                   "--batch_size", str(args.batch_size), "--max_len", str(args.max_len),
                   "--model", args.model, "--device", str(device), "--out", os.path.join(tmp, "run")]
        if args.data_dir:
            command += ["--data_dir", os.path.abspath(args.data_dir)]
        done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise MinknnError(f"{checkout}/train.py failed: {why_failed(done)}")
        with open(os.path.join(tmp, "run", "metrics.jsonl")) as f:
            return json.loads(f.readline())["epoch_seconds"]


# ---------------------------------------------------------------------------------------------
# ddp: one run in N processes under torchrun against one process

def bench_ddp(args, device, timer, out):
    n = args.processes
    if device.type == "cuda":  # a GPU each, against one GPU
        if n > torch.cuda.device_count():
            raise MinknnError(f"--processes {n}: this machine has {torch.cuda.device_count()} GPUs")
        one, many, threads = "1 process, 1 GPU", f"{n} processes, {n} GPUs (torchrun)", (None, None)
    else:  # the same cores, shared out two ways
        one, many, threads = f"1 process x {n} threads", f"{n} processes x 1 thread (torchrun)", (n, 1)
    contestants = {one: times_itself(lambda: train_py_epoch(args, device, ".", 1, threads[0])),
                   many: times_itself(lambda: train_py_epoch(args, device, ".", n, threads[1]))}
    cpu = "; on a CPU the processes share its cores, which says little of GPUs" if threads[0] else ""
    out.append(f"`python -m minknn.lab.bench ddp`: {device_name(device)}, {precision_of(device)}; one epoch of "
               f"train.py on {args.examples} {args.task} training examples (--seed {args.seed}), "
               f"global batches of {args.batch_size}, --max_len {args.max_len}, the same steps "
               f"either way; best of {args.rounds} alternating rounds{cpu}\n")
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
    out.append(f"`python -m minknn.lab.bench grid`: {device_name(device)}, {precision_of(device)}; the "
               f"runner's whole command (python -m minknn.lab.runner --tasks {args.tasks} --methods "
               f"'{args.methods}' --sizes {args.sizes} --seeds {args.seeds} "
               f"{' '.join(args.train_flags)}): {cells} trainings, wall time from start to the "
               f"table; best of {args.rounds} alternating rounds\n")
    print(out[-1])
    seconds = timer.best_of_rounds(contestants)
    table = Table(out, "what", "wall seconds", "cells/min", "time / --jobs 1")
    for name, s in seconds.items():
        table.row(name, f"{s:.1f}", f"{60 * cells / s:.1f}", f"{s / seconds['--jobs 1']:.2f}")


def why_failed(done):
    """A failed command's own `error:` line (torchrun adds its report after it), or its last line."""
    lines = done.stderr.strip().splitlines() or ["no output"]
    return ([line for line in lines if line.startswith("error:")] or lines)[-1]


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


# ---------------------------------------------------------------------------------------------
# knn: KNN-BERT's step against a ce step; the kNN vote against the encoder at evaluation

def built(args, argv, train, device):
    """The parts of train.py's run with the flags argv (a minknn/trainer.py Trainer), built as
    train.py builds them, on training examples already read (train: task name -> examples)."""
    argv = argv + ["--model", args.model, "--device", str(device)]
    argv += ["--data_dir", args.data_dir] if args.data_dir else []
    trainer, _ = build(options.get_args(argv), train_py.make_optimizer, (train, {}))
    return trainer


def step(trainer, batches):
    """One step of train.py's own train_step (batches: minknn/trainer.py's batch()); returns what
    it returns (each task's loss, ...)."""
    return train_py.train_step(trainer, batches)


def fixed_batches(train, tasks, batch_size, steps, seed=0):
    """`steps` steps' rows, as train.py's streams draw them (one generator for all): [{task: rows}]."""
    rng = random.Random(seed)
    streams = {t.name: TrainBatches(len(train[t.name]), batch_size, rng) for t in tasks}
    return [{t.name: next(streams[t.name]) for t in tasks} for _ in range(steps)]


def bench_knn(args, device, timer, out):
    from minknn.datastore import Datastore
    task, path = get_task(args.task, args.data_dir), resolve_model_path(args.model)
    train = {task.name: load_split(task, "train", args.data_dir)}
    dev = load_split(task, "dev", args.data_dir)
    tokenizer = Tokenizer.from_folder(path, 128)
    rows = fixed_batches(train, [task], 32, args.steps)
    trainers = {loss: built(args, ["--task", task.name, "--loss", loss], train, device)
                for loss in ("ce", "knnbert")}
    steps = {loss: [batch(t, r) for r in rows] for loss, t in trainers.items()}
    seconds = timer.best_of_rounds({loss: (lambda t=t, b=steps[loss]: [step(t, x) for x in b])
                                    for loss, t in trainers.items()})
    per_step = {loss: s / len(rows) for loss, s in seconds.items()}
    epoch_steps = -(-len(train[task.name]) // 32)
    knnbert = trainers["knnbert"]
    out.append(f"`python -m minknn.lab.bench knn`: {device_name(device)}, {precision_of(device)}; train.py's "
               f"train_step on the same {args.steps} real {task.name} batches of 32, best of "
               f"{args.rounds} alternating rounds; knnbert's queue holds {len(knnbert.moco.memory.keys)} "
               f"keys; kNN at K {args.k} over the {len(train[task.name])} training examples, "
               f"queried by the {len(dev)} dev examples\n")
    print(out[-1])
    table = Table(out, "what", "measured", "ratio")
    for loss, s in per_step.items():
        table.row(f"`{loss}` step", f"{1000 * s:.0f} ms ({s * epoch_steps:.0f} s per epoch of {epoch_steps} steps)",
                  f"{s / per_step['ce']:.2f}x `ce`")
    table.row("the queue fill, once per run", f"{knnbert.fill_seconds:.1f} s",
              f"{knnbert.fill_seconds / (per_step['ce'] * epoch_steps):.2f}x one `ce` epoch")
    for piece, s in knnbert_pieces(knnbert, steps["knnbert"][0], timer, args.steps).items():
        table.row(f"of which {piece}", f"{1000 * s:.1f} ms", f"{s / per_step['ce']:.2f}x `ce`")
    del trainers, steps

    torch.manual_seed(0)
    model = Model(backbones.from_pretrained(path), [task], "mean").to(device)
    start = time.perf_counter()
    _, keys = predict(model, tokenizer, task, train[task.name], 64, device)
    datastore = Datastore(keys, [e.label for e in train[task.name]], [e.id for e in train[task.name]],
                          len(task.labels))
    for vote in ("cosine", "distance"):
        datastore.index(vote)
    build = time.perf_counter() - start
    encoded = []  # the dev set's representations, the queries below: one pass, timed
    encode = timer.seconds(lambda: encoded.append(predict(model, tokenizer, task, dev, 64, device)[1]),
                           warmup=0) / len(dev)
    table.row("datastore build (a forward pass over the training set, both faiss indexes)", f"{build:.1f} s", "")
    table.row("encoding the dev set", f"{1000 * encode:.2f} ms per query", "")
    queries = encoded[0]
    for vote in ("cosine", "distance"):
        def knn(vote=vote):
            scores, rows = datastore.search(queries, args.k, vote)
            datastore.vote(scores, rows, vote, 10.0)
        s = timer.seconds(knn, 3) / len(dev)
        table.row(f"kNN search and vote, `--vote {vote}`", f"{1000 * s:.3f} ms per query",
                  f"+{100 * s / encode:.1f}% on the encoder")


def knnbert_pieces(trainer, batches, timer, repeats):
    """Seconds per step of each piece knnbert adds to a ce step."""
    moco, model, loss = trainer.moco, trainer.model, trainer.losses[trainer.tasks[0].name]
    inputs, labels, rows = next(iter(batches.values()))
    with autocast(trainer.device, trainer.args.precision):
        keys = moco.key_encoder(trainer.tasks[0].name, inputs)
    z = torch.randn(len(labels), keys.shape[1], device=trainer.device, requires_grad=True)

    def key_forward():
        with autocast(trainer.device, trainer.args.precision):
            moco.key_encoder(trainer.tasks[0].name, inputs)

    def key_forward_inference_mode():  # what the issue asked to try: no autograd bookkeeping at all
        with torch.inference_mode(), autocast(trainer.device, trainer.args.precision):
            moco.key_encoder.encoder(trainer.tasks[0].name, **inputs).embeddings.float().clone()

    def loss_over_queue():
        loss.metric(z, labels, keys, moco.memory.keys, moco.memory.labels, rows, moco.memory.ids).backward()

    return timer.best_of_rounds({
        "the key encoder's forward pass (under torch.no_grad, as train.py runs it)": key_forward,
        "the same under torch.inference_mode (not used)": key_forward_inference_mode,
        "the momentum update": lambda: moco.key_encoder.update(model),
        "the loss over the queue (forward and backward)": loss_over_queue,
        "the enqueue": lambda: moco.memory.enqueue(keys, labels, rows)}, repeats)


# ---------------------------------------------------------------------------------------------
# multitask: a PCGrad step against a summed-loss step, and PCGrad's pieces

def bench_multitask(args, device, timer, out):
    from minknn.pcgrad import pcgrad_coefficients
    tasks = [get_task(name, args.data_dir) for name in args.tasks.split(",")]
    train = {t.name: load_split(t, "train", args.data_dir) for t in tasks}
    rows = fixed_batches(train, tasks, 32, args.steps)
    argv = ["--task", "multitask", "--tasks", args.tasks, "--pair_mode", args.pair_mode, "--max_len", "64"]
    trainers = {pcgrad: built(args, argv + (["--pcgrad"] if pcgrad else []), train, device)
                for pcgrad in (False, True)}
    steps = [batch(trainers[False], r) for r in rows]
    seconds = timer.best_of_rounds({pcgrad: (lambda t=t: [step(t, b) for b in steps])
                                    for pcgrad, t in trainers.items()})
    summed, pcgrad = seconds[False] / len(steps), seconds[True] / len(steps)
    out.append(f"`python -m minknn.lab.bench multitask`: {device_name(device)}, {precision_of(device)}; "
               f"train.py's train_step on the same {args.steps} steps of one real batch of 32 from "
               f"each of {args.tasks} ({args.pair_mode} pairs, --max_len 64), from the same weights, "
               f"best of {args.rounds} alternating rounds\n")
    print(out[-1])
    table = Table(out, "what", "ms per step", "ratio")
    table.row("step, summed losses (one backward)", f"{1000 * summed:.0f}", "1.00")
    table.row("step, `--pcgrad`", f"{1000 * pcgrad:.0f}", f"{pcgrad / summed:.2f}")
    trainer, batches = trainers[True], steps[0]
    shared = [p for p in trainer.model.bert.parameters() if p.requires_grad]

    def losses():
        out = []
        for name, (inputs, targets, _) in batches.items():
            with autocast(device, trainer.args.precision):
                out.append(trainer.losses[name](trainer.model(name, **inputs), targets)[0])
        return out

    def per_task_backward():
        for loss in losses():
            loss.backward()
    grads = torch.stack([torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)  # the pooler
                                    for g, p in zip(torch.autograd.grad(loss, shared, allow_unused=True), shared)])
                         for loss in losses()])
    forward = timer.seconds(losses, args.steps)
    pieces = {"the forward passes and losses": forward,
              "backward of the summed loss": timer.seconds(lambda: sum(losses()).backward(), args.steps) - forward,
              "one backward per task": timer.seconds(per_task_backward, args.steps) - forward,
              "the surgery: Gram matrix, Algorithm 1 on it, the weighted sum": timer.seconds(
                  lambda: pcgrad_coefficients(grads @ grads.T, random.Random(0)).sum(0).float() @ grads,
                  args.steps),
              "(not run in training: Algorithm 1 on the gradients themselves)": timer.seconds(
                  lambda: on_gradients(grads, random.Random(0)), args.steps)}
    trainer.optimizer.zero_grad(set_to_none=True)
    for piece, s in pieces.items():
        table.row(f"of which {piece}", f"{1000 * s:.0f}", "")


def on_gradients(grads, rng):
    """Algorithm 1 as written, on the (K, P) gradients themselves: what the Gram form saves."""
    adjusted = grads.clone()
    for i in range(len(grads)):
        others = [j for j in range(len(grads)) if j != i]
        rng.shuffle(others)
        for j in others:
            dot = adjusted[i] @ grads[j]
            if dot < 0:
                adjusted[i] -= dot / (grads[j] @ grads[j]) * grads[j]
    return adjusted.sum(0)


# ---------------------------------------------------------------------------------------------
# index: flat, IVF and HNSW datastores, from real keys to a million synthetic ones

NOISE = 0.5  # clustered_keys' noise


def clustered_keys(n, d, seed, clusters=None, noise=NOISE):
    """(keys (n, d), labels (n,)): synthetic keys, the stand-in for encoder outputs where we have
    none that many. A mixture of Gaussians: n / 20 centres of norm about 1 (about 1.4 apart), each
    key its centre plus noise of norm `noise`; a key's label is its cluster's, mod 5. The noise
    sets how hard the search is (at 0.6 every key's 64 nearest share its cluster and any index
    finds them; at 2 neighbourhoods are nearly random). NOISE = 0.5 was chosen so that the
    approximate indexes find no more of the true neighbours in 100k synthetic keys than in the
    152k real ones of `--real` (recall@64 measured: HNSW 0.88 against 0.93 at ef_search 128, IVF
    0.63 against 0.80 at nprobe 32), so the synthetic figures do not flatter them."""
    g = torch.Generator().manual_seed(seed)
    clusters = clusters or max(1, n // 20)
    centres = torch.randn(clusters, d, generator=torch.Generator().manual_seed(0)) / d ** 0.5
    which = torch.randint(0, clusters, (n,), generator=g)
    keys = centres[which] + noise * torch.randn(n, d, generator=g) / d ** 0.5
    return keys, which % 5


def real_keys(args, model, tokenizer, device):
    """(keys, labels, queries): the model's mean-pooled vectors of the --real tasks' training
    sentences pooled into one datastore, queried by SST's dev sentences. Encoding takes minutes on
    a CPU: --cache FILE keeps them for the next run."""
    if args.cache and os.path.exists(args.cache):
        saved = torch.load(args.cache, weights_only=True)
        if saved["real"] == args.real and len(saved["queries"]) >= args.queries:
            return saved["keys"], saved["labels"], saved["queries"][:args.queries]
    keys, labels, sst = [], [], get_task("sst", args.data_dir)  # the model's one head is SST's
    for name in args.real:
        task = get_task(name, args.data_dir)
        train = [e for e in load_split(task, "train", args.data_dir) if e.text_b is None]
        keys.append(predict(model, tokenizer, sst, train, 64, device, progress=f"{name} keys")[1])
        labels.append(torch.zeros(len(train), dtype=torch.long))  # one class: the vote's cost only
    queries = predict(model, tokenizer, sst, load_split(sst, "dev", args.data_dir)[:args.queries], 64, device)[1]
    keys, labels = torch.cat(keys), torch.cat(labels)
    if args.cache:
        torch.save({"real": args.real, "keys": keys, "labels": labels, "queries": queries}, args.cache)
    return keys, labels, queries


def bench_index(args, device, timer, out):
    import faiss
    from minknn.index import describe_index, index_settings, recall_at_k
    from minknn.datastore import Datastore
    path = resolve_model_path(args.model)
    tokenizer = Tokenizer.from_folder(path, 128)
    task = get_task("sst", args.data_dir)
    torch.manual_seed(0)
    model = Model(backbones.from_pretrained(path), [task], "mean").to(device)
    dev = load_split(task, "dev", args.data_dir)
    encode = timer.seconds(lambda: predict(model, tokenizer, task, dev, 64, device), warmup=0) / len(dev)
    sets = []
    if args.real:
        real = real_keys(args, model, tokenizer, device)
        sets.append((f"{len(real[0]):,} real ({'+'.join(args.real)})", *real))
    sets += [(f"{n:,} clustered synthetic", *clustered_keys(n, args.dim, seed=1),
              clustered_keys(args.queries, args.dim, seed=2, clusters=n // 20)[0]) for n in args.sizes]
    out.append(f"`python -m minknn.lab.bench index`: {device_name(device)}, faiss {faiss.__version__} on "
               f"{faiss.omp_get_max_threads()} threads; {args.queries} queries, K {args.k}, the cosine "
               f"vote; the encoder takes {1000 * encode:.2f} ms per query (SST dev, batches of 64); "
               f"search-and-vote time is the best of {args.rounds} rounds over all queries at once; "
               f"recall@{args.k} against the flat (exact) search of the same keys\n")
    print(out[-1])
    table = Table(out, "keys", "index", "build s", "size MB", f"recall@{args.k}", "search + vote ms/query",
                  "share of the encoder's time")
    for name, keys, labels, queries in sets:
        exact = None
        for index, knob, values in (("flat", None, [None]), ("ivf", "nprobe", args.nprobe),
                                    ("hnsw", "ef_search", args.ef_search)):
            settings = index_settings(index, len(keys))
            store = Datastore(keys, labels, range(len(keys)), 5, settings)
            start = time.perf_counter()
            store.index("cosine")  # trained (IVF's k-means) and filled
            build = time.perf_counter() - start
            size = faiss.serialize_index(store.index("cosine")).nbytes / 2 ** 20
            for value in values:  # the search-time knob: one build serves every value
                if knob:
                    store.use_index({**settings, knob: value})

                def search_and_vote(store=store):
                    scores, rows = store.search(queries, args.k, "cosine")
                    store.vote(scores, rows, "cosine", None)
                seconds = timer.best_of_rounds({index: search_and_vote})[index] / len(queries)
                rows = store.search(queries, args.k, "cosine")[1]
                exact = rows if index == "flat" else exact
                table.row(name, describe_index(settings) + (f", {knob} {value}" if knob else ""),
                          f"{build:.1f}", f"{size:.0f}", f"{recall_at_k(rows, exact):.3f}",
                          f"{1000 * seconds:.3f}", f"{100 * seconds / encode:.1f}%")


# ---------------------------------------------------------------------------------------------

def make_parser():
    p = Parser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="{model,epoch,ddp,grid,knn,multitask,index}")

    def command(name, help, rounds, **steps):
        c = sub.add_parser(name, help=help, description=help)  # a Parser too: one-line errors
        c.add_argument("--model", default="minilm", help="minilm (the default weights), or a folder")
        c.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
        c.add_argument("--rounds", type=int, default=rounds, help="alternating rounds; the best counts")
        c.add_argument("--write", metavar="FILE", help="also write the table into FILE's block "
                       f"<!-- bench.py {name} --> ... <!-- /bench.py {name} -->")
        if steps:
            c.add_argument("--steps", type=int, default=steps["steps"], help="timed steps per round")
        if name != "model" and name != "index":
            c.add_argument("--data_dir", help="dataset root (default: $MINKNN_DATA, else ./data)")
        return c

    c = command("model", "the hand-written BERT against Hugging Face's, random tokens", 3, steps=5)
    c.add_argument("--batch_size", type=int, default=32, help="sequences per step")
    c.add_argument("--lengths", type=whole_numbers, default="64,128",
                   help="sequence lengths in tokens, each a row pair (train, inference)")
    c = command("epoch", "one epoch of train.py against the plain transformers loop", 2)
    c.add_argument("--task", default="sst", help="the task trained on")
    c.add_argument("--examples", type=int, default=1024, help="training examples (train.py --max_train)")
    c.add_argument("--batch_size", type=int, default=32, help="train.py --batch_size")
    c.add_argument("--max_len", type=int, default=128, help="train.py --max_len")
    c.add_argument("--seed", type=int, default=0, help="train.py --seed (the examples drawn)")
    c.add_argument("--compare", metavar="CHECKOUT", help="also time the train.py of another minknn "
                   "folder (e.g. a git worktree of an older commit)")
    c = command("ddp", "one epoch of train.py in N processes (torchrun) against one", 2)
    c.add_argument("--processes", type=int, default=2, help="torchrun's --nproc_per_node; on the "
                   "CPU the one process gets as many threads")
    c.add_argument("--task", default="sst", help="the task trained on")
    c.add_argument("--examples", type=int, default=1024, help="training examples (train.py --max_train)")
    c.add_argument("--batch_size", type=int, default=32, help="train.py --batch_size (the global batch)")
    c.add_argument("--max_len", type=int, default=128, help="train.py --max_len")
    c.add_argument("--seed", type=int, default=0, help="train.py --seed (the examples drawn)")
    c = command("grid", "the runner's grid with --jobs N against --jobs 1", 1)
    c.add_argument("--jobs", type=int, default=2, help="the runner's --jobs against 1")
    c.add_argument("--tasks", default="mr,cr", help="the runner's --tasks")
    c.add_argument("--methods", default="ce", help="the runner's --methods")
    c.add_argument("--sizes", default="16", help="the runner's --sizes")
    c.add_argument("--seeds", default="0-9", help="the runner's --seeds")
    c.add_argument("--train_flags", type=str.split, default="--epochs 1 --batch_size 16 "
                   "--max_len 64 --max_eval 64", help="train.py's flags for every cell, one string")
    c = command("knn", "a knnbert step against a ce step; kNN's share of evaluation", 3, steps=10)
    c.add_argument("--task", default="sst", help="the task trained and evaluated on")
    c.add_argument("--k", type=int, default=64, help="neighbours per query")
    c = command("multitask", "a PCGrad step against a summed-loss step", 3, steps=5)
    c.add_argument("--tasks", default="sst,mrpc,sts", help="comma-separated, as train.py --tasks")
    c.add_argument("--pair_mode", default="cross", choices=["cross", "siamese"], help="train.py --pair_mode")
    c = command("index", "flat, IVF and HNSW datastores: build, size, recall, search", 3)
    c.add_argument("--sizes", type=whole_numbers, default="100000,1000000",
                   help="synthetic datastore sizes (after SST's real keys)")
    c.add_argument("--dim", type=int, default=384, help="the synthetic keys' dimension (MiniLM's)")
    c.add_argument("--queries", type=int, default=1000, help="queries searched per round (SST dev "
                   "sentences for the real keys)")
    c.add_argument("--k", type=int, default=64, help="neighbours per query (recall@k)")
    c.add_argument("--real", type=lambda s: s.split(",") if s else [],
                   default="sst5,sst2,goemotions,mr,subj,mpqa,cr,trec",
                   help="tasks whose training sentences, encoded, make the real datastore ('' for none)")
    c.add_argument("--nprobe", type=whole_numbers, default="32,128,512",
                   help="IVF's cells searched per query, each value a row")
    c.add_argument("--ef_search", type=whole_numbers, default="128,256,512",
                   help="HNSW's candidates kept per query, each value a row")
    c.add_argument("--cache", metavar="FILE", help="keep the encoded real keys in FILE for the next run")
    c.add_argument("--data_dir", help="dataset root, for SST (default: $MINKNN_DATA, else ./data)")
    return p


def whole_numbers(text):
    """A comma-separated list of whole numbers of at least 1 (--lengths 64,128)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': give whole numbers of at least 1, "
                                         f"comma-separated")
    return values


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    for name in ("rounds", "steps", "examples", "batch_size", "k", "dim", "queries", "processes", "jobs"):
        if getattr(args, name, 1) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if getattr(args, "max_len", 8) < 8:
        p.error(f"--max_len must be at least 8, as train.py's, got {args.max_len}")
    if not 0 <= getattr(args, "seed", 0) < 2 ** 32:
        p.error(f"--seed must be in [0, 2**32), as train.py's, got {args.seed}")
    if args.command == "index" and min(args.sizes) < args.k:
        p.error(f"--sizes {min(args.sizes)}: a datastore of fewer keys than --k {args.k} has no "
                f"{args.k} neighbours to find")
    if args.command == "grid":  # the runner's own grammar, read here before any grid runs
        parse_sizes(args.sizes)
        parse_seeds(args.seeds)
    if args.write and not os.path.isfile(args.write):
        p.error(f"--write {args.write}: no such file")
    device = pick_device(args.device)
    out = []
    {"model": bench_model, "epoch": bench_epoch, "ddp": bench_ddp, "grid": bench_grid,
     "knn": bench_knn,
     "multitask": bench_multitask, "index": bench_index}[args.command](args, device, Timer(device, args.rounds), out)
    if args.write:
        write_block(args.write, f"bench.py {args.command}", out)


if __name__ == "__main__":
    run(main)
