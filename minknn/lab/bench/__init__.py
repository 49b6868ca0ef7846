"""What minknn's work costs, one subcommand each, every figure a ratio measured side by side in
one run.

    python -m minknn.lab.bench model      # the hand-written encoder against Hugging Face's
    python -m minknn.lab.bench epoch      # one epoch of train.py against the transformers loop
    python -m minknn.lab.bench ddp        # one epoch in 2 processes (torchrun) against 1 process
    python -m minknn.lab.bench grid       # the runner's 20 cells with --jobs 2 against --jobs 1
    python -m minknn.lab.bench knn        # a knnbert step against a ce step; the kNN vote's share
    python -m minknn.lab.bench multitask  # a PCGrad step against a summed-loss step
    python -m minknn.lab.bench index      # faiss flat, IVF and HNSW datastores up to 1M keys
    python -m minknn.lab.bench profile    # where a step of train.py goes: launches, syncs, kernels
    python -m minknn.lab.bench predict    # predict against evaluate.py on the same 10,000 texts
    python -m minknn.lab.bench onnx       # onnxruntime on the exported classifier against minknn
    python -m minknn.lab.bench epoch --write RESULTS.md   # the table into RESULTS.md too

All but `model` read real data ($MINKNN_DATA or --data_dir; data/README.md). Each prints one line
saying what ran where, then one Markdown table; with --write FILE that output also replaces the
block between `<!-- bench.py NAME -->` and `<!-- /bench.py NAME -->` in FILE, so the speed tables
in RESULTS.md are this package's output, never typed by hand. The contestants of a comparison
alternate over --rounds rounds and each keeps its best (shared.py says how things are timed).
Hugging Face transformers, the reference in `model` and `epoch`, is not a dependency: without it
those comparisons are skipped.

The files: shared.py the scaffolding (Timer, Table, the peak matmul, train.py's run and step);
model.py `model`; epoch.py `epoch`, `ddp` and `grid`; knn.py `knn` and `index`; multitask.py
`multitask`; profile.py `profile`; predict.py `predict`; onnx.py `onnx`; here the flags
(make_parser) and main, and every name of the others. The scaffolding is not here so that the
subcommands' files need not import this package, which imports them (tests/test_layout.py: no circle
of imports).
"""
import argparse
import os

from minknn import backbones
from minknn.lab.bench.epoch import bench_ddp, bench_epoch, bench_grid
from minknn.lab.bench.knn import NOISE, bench_index, bench_knn, clustered_keys
from minknn.lab.bench.model import Reference, bench_model
from minknn.lab.bench.multitask import bench_multitask
from minknn.lab.bench.onnx import bench_onnx
from minknn.lab.bench.predict import bench_predict
from minknn.lab.bench.profile import bench_profile
from minknn.lab.bench.shared import (Table, Timer, built, check_transformers, device_name,
                                     fixed_batches, flops_per_token, peak_matmul_flops,
                                     precision_of, step, times_itself)
from minknn.lab.grid import parse_seeds, parse_sizes
from minknn.lab.report import write_block
from minknn.tools.cli import Parser, below_one
from minknn.tools.engine import pick_device
from minknn.tools.options import add_flags

__all__ = ["make_parser", "main", "whole_numbers",
           "bench_model", "bench_epoch", "bench_ddp", "bench_grid", "bench_knn",
           "bench_multitask", "bench_index", "bench_profile", "bench_predict", "bench_onnx", "Reference",
           "NOISE",
           "clustered_keys",
           "Timer", "times_itself", "Table", "device_name", "precision_of", "peak_matmul_flops",
           "flops_per_token", "check_transformers", "built", "step", "fixed_batches",
           "backbones"]  # minknn.backbones: tests/test_bench.py stops its loading through here


def make_parser():
    # prog: the name --help's usage line gave when this was bench.py (python -m runs __main__.py)
    p = Parser(prog="bench.py", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = p.add_subparsers(dest="command", required=True,
                           metavar="{model,epoch,ddp,grid,knn,multitask,index,profile,predict,onnx}")

    def command(name, help, rounds, **steps):
        c = sub.add_parser(name, help=help, description=help)  # a Parser too: one-line errors
        c.add_argument("--model", default="minilm",
                       help="minilm (the default weights), or a folder")
        add_flags(c, "device", device={"help": "auto, cpu, cuda or cuda:N"})
        c.add_argument("--rounds", type=int, default=rounds,
                       help="alternating rounds; the best counts")
        c.add_argument("--write", metavar="FILE", help="also write the table into FILE's block "
                       f"<!-- bench.py {name} --> ... <!-- /bench.py {name} -->")
        if steps:
            c.add_argument("--steps", type=int, default=steps["steps"],
                           help="timed steps per round")
        if name != "model" and name != "index":
            add_flags(c, "data_dir")
        return c

    c = command("model", "the hand-written BERT against Hugging Face's, random tokens", 3, steps=5)
    c.add_argument("--batch_size", type=int, default=32, help="sequences per step")
    c.add_argument("--lengths", type=whole_numbers, default="64,128",
                   help="sequence lengths in tokens, each a row pair (train, inference)")
    c.add_argument("--ragged", action="store_true", help="each sequence's length drawn from "
                   "T/4 to T (padded to T, as a batch of real sentences is), not all T")
    c.add_argument("--random", type=layers_and_width, metavar="LAYERS,HIDDEN",
                   help="a random BERT of these sizes (12,768: BERT-base's) with --model's "
                   "vocabulary, in place of --model's weights")
    c = command("epoch", "one epoch of train.py against the plain transformers loop", 2)
    c.add_argument("--task", default="sst", help="the task trained on")
    c.add_argument("--examples", type=int, default=1024,
                   help="training examples (train.py --max_train)")
    c.add_argument("--batch_size", type=int, default=32, help="train.py --batch_size")
    c.add_argument("--max_len", type=int, default=128, help="train.py --max_len")
    c.add_argument("--seed", type=int, default=0, help="train.py --seed (the examples drawn)")
    c.add_argument("--compare", metavar="CHECKOUT", help="also time the train.py of another minknn "
                   "folder (e.g. a git worktree of an older commit)")
    c = command("ddp", "one epoch of train.py in N processes (torchrun) against one", 2)
    c.add_argument("--processes", type=int, default=2, help="torchrun's --nproc_per_node; on the "
                   "CPU the one process gets as many threads")
    c.add_argument("--task", default="sst", help="the task trained on")
    c.add_argument("--examples", type=int, default=1024,
                   help="training examples (train.py --max_train)")
    c.add_argument("--batch_size", type=int, default=32,
                   help="train.py --batch_size (the global batch)")
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
    c.add_argument("--pair_mode", default="cross", choices=["cross", "siamese"],
                   help="train.py --pair_mode")
    c = command("index", "flat, IVF and HNSW datastores: build, size, recall, search", 3)
    c.add_argument("--sizes", type=whole_numbers, default="100000,1000000",
                   help="synthetic datastore sizes (after SST's real keys)")
    c.add_argument("--dim", type=int, default=384, help="the synthetic keys' dimension (MiniLM's)")
    c.add_argument("--queries", type=int, default=1000, help="queries searched per round (SST dev "
                   "sentences for the real keys)")
    c.add_argument("--k", type=int, default=64, help="neighbours per query (recall@k)")
    c.add_argument("--real", type=lambda s: s.split(",") if s else [],
                   default="sst5,sst2,goemotions,mr,subj,mpqa,cr,trec",
                   help="tasks whose training sentences, encoded, make the real datastore "
                   "('' for none)")
    c.add_argument("--nprobe", type=whole_numbers, default="32,128,512",
                   help="IVF's cells searched per query, each value a row")
    c.add_argument("--ef_search", type=whole_numbers, default="128,256,512",
                   help="HNSW's candidates kept per query, each value a row")
    c.add_argument("--cache", metavar="FILE",
                   help="keep the encoded real keys in FILE for the next run")
    add_flags(c, "data_dir", data_dir={"help": "dataset root, for SST (default: $MINKNN_DATA, "
                                               "else ./data)"})
    c = command("profile", "where a step of train.py goes: launches, syncs, kernels", 1,
                steps=10)
    c.add_argument("--task", default="sst", help="the task trained on")
    c.add_argument("--batch_size", type=int, default=32, help="train.py --batch_size")
    c.add_argument("--max_len", type=int, default=128, help="train.py --max_len")
    c.add_argument("--seed", type=int, default=0, help="the batches drawn")
    add_flags(c, "attention")
    c = command("predict", "predict against evaluate.py on the same texts", 2)
    c.add_argument("--task", default="sst", help="whose train and dev sentences are the texts")
    c.add_argument("--texts", type=int, default=10000, help="texts answered (cycled where the "
                   "task has fewer)")
    c.add_argument("--batch_size", type=int, default=64, help="both commands' --batch_size")
    c.add_argument("--max_len", type=int, default=128, help="the run's train.py --max_len")
    c.add_argument("--k", type=int, default=64, help="--knn's neighbours per query")
    c = command("onnx", "onnxruntime on the exported classifier against minknn, the same texts", 2)
    c.add_argument("--task", default="sst", help="whose train and dev sentences are the texts")
    c.add_argument("--texts", type=int, default=2000, help="texts answered (cycled where the "
                   "task has fewer)")
    c.add_argument("--batch_size", type=int, default=64, help="texts a batch, for both")
    c.add_argument("--max_len", type=int, default=128, help="tokens a text at most")
    return p


def layers_and_width(text):
    values = whole_numbers(text)
    if len(values) != 2 or values[1] % 64:
        raise argparse.ArgumentTypeError(f"'{text}': give LAYERS,HIDDEN, HIDDEN a multiple of 64 "
                                         f"(heads of 64, as BERT's)")
    return values


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
    for message in below_one(args, ("rounds", "steps", "examples", "batch_size", "k", "dim",
                                    "queries", "processes", "jobs", "texts")):
        p.error(message)
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
    # each name looked up here, as main runs, so that a stand-in a test sets on this package is
    # the one called; model and epoch get its peak_matmul_flops and check_transformers too
    bench = {"model": bench_model, "epoch": bench_epoch, "ddp": bench_ddp, "grid": bench_grid,
             "knn": bench_knn, "multitask": bench_multitask, "index": bench_index,
             "profile": bench_profile, "predict": bench_predict, "onnx": bench_onnx}[args.command]
    measures = {"peak_matmul_flops": peak_matmul_flops, "check_transformers": check_transformers}
    bench(args, device, Timer(device, args.rounds), out,
          **(measures if args.command in ("model", "epoch") else {}))
    if args.write:
        write_block(args.write, f"bench.py {args.command}", out)
