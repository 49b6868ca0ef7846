"""train.py's flags: declared (make_parser; the flags several commands share, once: add_flags)
and read (get_args), which holds them to minknn/tools/checks.py's rules: the defaults that depend on
the run's tasks and loss filled in, and what cannot work refused with one line, before any
training data is read; with --resume, the run's own flags read back from its run.json.
parts_run: the assignment's parts a run calls. The inference rules' settings, which evaluate.py,
predict and the attack share (add_run_flags, add_rule_flags, check_rule_flags, rule_settings),
are at the end.
"""
import math
import os

from minknn import MinknnError
from minknn.assignment.parts import BY_NAME
from minknn.bert import ATTENTION, ATTENTIONS
from minknn.index import INDEX_FLAGS, INDEX_HELP, INDEXES
from minknn.knn import VOTES
from minknn.losses import LOSS_FLAGS, LOSSES, MEMORY_LOSSES, PROXY_LOSSES, need
from minknn.losses.pairs import PAIR_LOSSES
from minknn.losses.regression import STS_LOSSES
from minknn.memory import QUEUE_SIZE
from minknn.model import KNN_KEYS, POOLINGS
from minknn.tasks.own_task import FLAGS as FILE_FLAGS
from minknn.tasks.registry import TASKS
from minknn.tools.checks import DEFAULT_TASKS, TYPE_NAMES, check_args, resumed_args
from minknn.tools.cli import Parser, below_one
from minknn.tools.engine import PRECISIONS, default_precision, pick_device

# The flags several commands take, declared once; add_flags(parser, name, ..., name=changes)
SHARED = {
    "data_dir": {"help": "dataset root (default: $MINKNN_DATA, else ./data)"},
    "max_eval": {"type": int, "help": "score a fixed subset of N dev examples per task (default: "
                                      "all)"},
    "batch_size": {"type": int, "default": 32, "help": "examples per batch"},
    "device": {"default": "auto", "help": "auto (CUDA if available), cpu or cuda"},
    "precision": {"choices": PRECISIONS, "help": "bf16 autocast or plain fp32 (default: bf16 on "
                                                 "CUDA, fp32 on the CPU)"},
    "attention": {"default": ATTENTION, "choices": ATTENTIONS, "help": "attention() as written "
                  "in minknn/bert.py; PyTorch's fused kernel over the padded batch; or, on a GPU, "
                  "PyTorch's kernels over the packed tokens (slower with MiniLM: RESULTS.md)"},
    # your own files as a task (minknn/tasks/own_task.py): train.py's and the runner's
    "train_file": {"help": "train on your own file: .csv, .tsv (a header row) or .jsonl; the "
                           "task is named by --task (train.py) or --tasks (the runner), else by "
                           "the file's name (default: none, a registered --task)"},
    "dev_file": {"help": "your dev file (default: a fixed 10%% of --train_file)"},
    "test_file": {"help": "your test file, labelled or not (default: none)"},
    "text_column": {"help": "the text's column, or two comma-separated for pairs (default: "
                            "text)"},
    "label_column": {"help": "the labels' column (default: label)"},
    "task_kind": {"choices": ["classify", "similarity", "multilabel"], "help": "classify: a "
                  "class a row (names, or integers); similarity: a number; multilabel: a list "
                  "(JSON Lines) or a string cut at --label_sep (default: classify)"},
    "label_names": {"help": "integer labels 0..C-1: their class names, comma-separated "
                            "(default: the integers)"},
    "label_sep": {"help": "--task_kind multilabel in CSV and TSV: what separates a row's classes "
                          "(default: ,)"},
}
assert set(SHARED) >= set(FILE_FLAGS), "every flag of your own files needs its declaration"


def add_flags(parser, *names, **changes):
    """The shared flags `names` added to a parser (or an argument group); changes: a flag's name
    -> what differs here (its default, its help text)."""
    for name in names:
        parser.add_argument(f"--{name}", **{**SHARED[name], **changes.get(name, {})})


def get_args(argv=None):
    """The run's arguments: the command line's, checked (minknn/tools/checks.py check_args), or with
    --resume the run's own (resumed_args)."""
    p = make_parser()
    args = p.parse_args(argv)
    if args.resume is not None:
        return resumed_args(p, args)
    check_args(p, args)
    # resolved here, so that the run's args (saved in the checkpoint) say which ones it used
    args.precision = args.precision or default_precision(pick_device(args.device))
    return args


def make_parser():
    p = Parser(description="Fine-tune BERT on one task, or on several at once.")
    g = p.add_argument_group("data")
    g.add_argument("--task", help=f"one of: {', '.join(TASKS)}; or multitask; with --train_file, "
                   f"your task's name (default: sst)")
    add_flags(g, "data_dir")
    g.add_argument("--max_train", type=int, help="train on N examples per task (classes kept) "
                   "(default: all)")
    g.add_argument("--per_class", type=int, help="train on N examples of each class (default: all)")
    add_flags(g, "max_eval")
    g = p.add_argument_group("your own files (minknn/tasks/own_task.py)")
    add_flags(g, *FILE_FLAGS)
    g = p.add_argument_group("model")
    g.add_argument("--model", default="minilm", help="minilm (the default weights), mpnet "
                   "(all-mpnet-base-v2, from its five optional packages), or a Hugging Face BERT, "
                   "RoBERTa, DistilBERT or MPNet folder")
    g.add_argument("--option", default="finetune", choices=["finetune", "pretrain"],
                   help="finetune trains everything; pretrain freezes BERT, trains the heads")
    g.add_argument("--pooling", default="mean", choices=POOLINGS, help="z from the hidden states")
    g.add_argument("--max_len", type=int, default=128, help="longer texts are truncated")
    add_flags(g, "attention")
    g.add_argument("--pair_mode", default="cross", choices=["cross", "siamese"],
                   help="pair tasks: [CLS] a [SEP] b [SEP] as one sequence, or each text alone")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=3, help="passes over the (largest) training set; "
                   "with --steps, how many times the dev set is scored")
    g.add_argument("--steps", type=int, help="train N optimiser steps in all, whatever the "
                   "training set's size (Zhang et al. 2021), a multiple of --epochs: each epoch is "
                   "N / --epochs steps (default: --epochs passes over the largest task)")
    add_flags(g, "batch_size", batch_size={"help": "examples per batch, per task; under torchrun "
                                           "the global batch, split between the processes"})
    g.add_argument("--lr", type=float, help="learning rate (default: 5e-5, pretrain 1e-3)")
    g.add_argument("--proxy_lr", type=float, help="the proxies' (default: 100 x --lr)")
    # its example is the registry's (tests/test_options.py holds it there)
    g.add_argument("--proxy_init", default="random", choices=["random", "names"], help="the "
                   "proxies' start (proxyanchor, proxynca): random, or names: each at the "
                   "encoder's z of its class's name, as loaded, before the first step (AncSetFit; "
                   "minknn/proxy.py). The names are the task's class names in "
                   "minknn/tasks/registry.py: readable words, also where its files hold codes "
                   "(TREC's ABBR is 'abbreviation', HUM 'human being'); your own files' integer "
                   "labels need --label_names")
    g.add_argument("--weight_decay", type=float, default=0.01,
                   help="AdamW's, in [0, 1); not on biases and LayerNorm")
    g.add_argument("--warmup", type=float, default=0.06, help="share of the steps warming up")
    g.add_argument("--head_init", choices=["random", "probe"], help="the classification and "
                   "multi-label heads' start: random, or probe: a logistic regression fit on the "
                   "encoder as loaded, before the first step (LP-FT, minknn/probe.py) (default: "
                   "random; probe with --option pretrain, whose head starts as that regression)")
    g.add_argument("--seed", type=int, default=0, help="the init, batches, dropout, the draw")
    add_flags(g, "device", "precision")
    g = p.add_argument_group("losses")
    g.add_argument("--loss", help=f"one of: {', '.join(LOSSES)} (default: ce; multi-label: bce)")
    g.add_argument("--lam", type=float, help="the metric loss's weight (default: the loss's own)")
    g.add_argument("--decoupled", action="store_true", help="add Liang et al.'s retrieval head")
    g.add_argument("--sts_loss", default="mse", choices=list(STS_LOSSES), help="similarity tasks")
    g.add_argument("--pair_loss", choices=list(PAIR_LOSSES), help="siamese paraphrase tasks: "
                   "this metric loss on the two texts' vectors (default: none)")
    for flag, spec in LOSS_FLAGS.items():  # each loss's own (its class's `flags`)
        owners = [name for name in LOSSES if flag in need(name, "flags")]
        g.add_argument(f"--{flag}", type=spec.get("type"), choices=spec.get("choices"),
                       help=f"{', '.join(owners)}: {spec['help']} (default: {spec['default']})")
    g = p.add_argument_group(f"memory ({', '.join(MEMORY_LOSSES)})")
    g.add_argument("--memory", choices=["queue", "bank"], help="MoCo's queue or a memory bank "
                   "(default: queue)")
    g.add_argument("--queue_size", type=int, help=f"(default: min({QUEUE_SIZE}, training set))")
    g.add_argument("--momentum", type=float, help="the key encoder's m (default: 0.999)")
    g = p.add_argument_group("multi-task")
    g.add_argument("--tasks", help=f"--task multitask: comma-separated (default: {DEFAULT_TASKS})")
    g.add_argument("--pcgrad", action="store_true", help="combine the gradients with PCGrad")
    g.add_argument("--steps_per_epoch", type=int, help="(default: a pass over the largest task)")
    p.add_argument("--out", help="run folder, new or empty (default: "
                   "runs/<task>-<loss>-seed<seed>-<time>)")
    p.add_argument("--save", default="best", choices=["best", "last", "none"], help="best: "
                   "checkpoint.pt of the best epoch by the dev score; last: of the last epoch, "
                   "written every epoch; none: no checkpoint, only the scores (grids of runs)")
    p.add_argument("--tensorboard", action="store_true", help="also write the run's curves as "
                   "TensorBoard event files in RUN/tensorboard/, each epoch: every step's losses "
                   "and lr (and --pcgrad's conflicts), every epoch's metrics.jsonl figures "
                   "(minknn/tools/curves.py; writing them needs no package; to view them: pip "
                   "install tensorboard, then tensorboard --logdir runs/)")
    p.add_argument("--resume", metavar="RUN", help="continue a stopped run from its last "
                   "completed epoch, with its own flags (only --device may change) (default: start "
                   "a new run)")
    return p


def parts_run(args):
    """The parts of the assignment (minknn/assignment/parts.py) this run calls: BERT, pooling and
    the training step, and the parts of its losses (each loss's `part`), memory, PCGrad and proxy
    inference where it has them. In a student edition one not written yet stops the run before
    anything is read."""
    parts = ["embeddings", "layer", "pooling", "training"]
    parts += ["attention"] * (args.attention == "explicit")
    for name in (args.loss, args.pair_loss):  # ce, bce, mse and --decoupled's have no part
        if name is not None:
            parts += [need(name, "part")] * (need(name, "part") in BY_NAME)
    parts += ["memory"] * (args.loss in MEMORY_LOSSES) + ["pcgrad"] * args.pcgrad
    # a proxy loss at --lam 1 is scored by its proxies (minknn/tools/inference.py dev_scores)
    parts += ["proxy-inference"] * (args.lam == 1 and args.loss in PROXY_LOSSES)
    return parts


# ---------------------------------------------------------------------------------------------
# the inference rules' settings: evaluate.py's, predict's (minknn/tools/predict.py, the Python API
# of minknn/tools/inference.py) and the attack's, declared once

KNN_FLAGS = ("k", "phi", "vote", "temperature", "knn_key", "datastore", "index",
             *INDEX_FLAGS["ivf"], *INDEX_FLAGS["hnsw"])


def add_run_flags(p):
    """How a trained run predicts: its batches, device, precision, attention, and the data root
    its kNN datastore's training set is read from."""
    add_flags(p, "batch_size", "device", "precision", "attention", "data_dir",
              batch_size={"default": 64, "help": "examples per prediction batch"},
              data_dir={"help": "dataset root (default: the run's own, if a folder here, else "
                                "$MINKNN_DATA, else ./data)"})


def add_rule_flags(p, rules=True, sweep=False):
    """Proxy inference's and kNN's settings; rules: with --proxy and --knn, which ask for them;
    sweep: evaluate.py's --sweep."""
    g = p.add_argument_group("proxy inference")
    if rules:
        g.add_argument("--proxy", action="store_true", help="also score with proxy inference")
    g.add_argument("--proxy_alpha", type=float, default=0.5, help="the proxies' weight against "
                   "the linear head's")
    g = p.add_argument_group("kNN")
    if rules:
        g.add_argument("--knn", action="store_true", help="also classify by kNN, alone and mixed")
    g.add_argument("--k", type=int, help="neighbours per query (default: 64; multi-label 5)")
    g.add_argument("--phi", type=float, help="s = (1 - phi) P(q) + phi KNN(q) "
                   "(default: 0.25; multi-label 0.5)")
    g.add_argument("--vote", choices=list(VOTES), help="cosine (KNN-BERT), distance (Liang et "
                   "al.) or euclidean (Su et al.) (default: cosine; multi-label euclidean)")
    g.add_argument("--temperature", type=float, help="T of the distance and euclidean votes "
                   "(default: 10 and 1)")
    g.add_argument("--knn_key", choices=KNN_KEYS, help="the representation stored and searched "
                   "(default: the decoupled head's, else the run's --pooling)")
    if sweep:
        g.add_argument("--sweep", action="store_true", help="phi 0, 0.1, .., 1 and K 1, 2, 4, .., "
                       "1024")
    g.add_argument("--datastore", help="datastore file (default: <run>/datastore-<key>.pt, "
                   "datastore-<key>-<index>.pt for ivf and hnsw)")
    g.add_argument("--index", choices=INDEXES, help="faiss index: flat (exact), ivf or hnsw "
                   "(approximate; minknn/index.py) (default: flat)")
    for name, text in INDEX_HELP.items():  # minknn/index.py
        g.add_argument(f"--{name}", type=int, help=text)


def check_rule_flags(p, args, knn, counts=(), add_knn="add --knn"):
    """The rules' settings refused in one line where they cannot work (knn: whether kNN runs, and
    if not, add_knn says how; counts: more flags that must be at least 1)."""
    for name in ("proxy_alpha", "phi"):
        if getattr(args, name) is not None and not 0 <= getattr(args, name) <= 1:
            p.error(f"--{name} must be in [0, 1], got {getattr(args, name)}")
    for message in below_one(args, ["k", *counts, "batch_size", *INDEX_FLAGS["ivf"],
                                    *INDEX_FLAGS["hnsw"]]):
        p.error(message)
    t = args.temperature
    if t is not None and not (math.isfinite(t) and t > 0):
        p.error(f"--temperature must be a finite number > 0, got {t}")
    knn_only = [f"--{n}" for n in (*KNN_FLAGS, "sweep") if getattr(args, n, None) not in
                (None, False)]
    if knn_only and not knn:
        what = "is a kNN option" if len(knn_only) == 1 else "are kNN options"
        p.error(f"{', '.join(knn_only)} {what}; {add_knn}")
    index = args.index or "flat"
    for owner in ("ivf", "hnsw"):
        other = [f"--{n}" for n in INDEX_FLAGS[owner] if getattr(args, n) is not None]
        if other and index != owner:
            p.error(f"{', '.join(other)} {'sets' if len(other) == 1 else 'set'} --index {owner}, "
                    f"not --index {index}; add --index {owner}")
    if getattr(args, "out", None) is not None and (not args.out or os.path.isdir(args.out)):
        p.error(f"--out '{args.out}' names the predictions file (e.g. preds.csv), not a folder")


class SettingsParser(Parser):
    """The parser of rule_settings: its refusals raise MinknnError (a line for a script, an
    exception for the Python API), never exit the interpreter."""

    def error(self, message):
        raise MinknnError(message)


def rule_settings(**settings):
    """The settings of add_run_flags and add_rule_flags (evaluate.py's, at its defaults), with
    `settings` (by flag name, as Python values) in their place, checked as the flags are: the
    Python API's (minknn/tools/inference.py load)."""
    p = SettingsParser()
    add_run_flags(p)
    add_rule_flags(p, rules=False)
    args = p.parse_args([])
    actions = {a.dest: a for a in p._actions if a.dest != "help"}
    for name, value in settings.items():
        if name not in actions:
            raise MinknnError(f"unknown setting '{name}'; choose from: {', '.join(actions)}")
        kind, choices = actions[name].type or str, actions[name].choices
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, (int, float) if kind is float else kind)):
            raise MinknnError(f"{name}={value!r}: give {TYPE_NAMES[kind]}")
        if choices is not None and value is not None and value not in choices:
            raise MinknnError(f"{name}={value!r}: choose one of: {', '.join(choices)}")
        setattr(args, name, value)
    check_rule_flags(p, args, knn=True)
    return args
