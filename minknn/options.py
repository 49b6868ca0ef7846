"""train.py's flags that depend on each other: defaults filled in from the run's tasks and loss,
and the combinations that cannot work refused with one line, before any training data is read.
Each value's own bounds (bad_values) also hold for a resumed run's run.json (check_saved), which
resumed_args reads back for --resume.
"""
import argparse
import json
import math
import os

from minknn import MinknnError, distributed
from minknn.kinds import KINDS
from minknn.losses import BASE_LOSSES, LOSSES, MEMORY_LOSSES, check_loss_name, loss_kind
from minknn.losses.knnbert import M_LEAST, M_MOST
from minknn.losses.setfit import ITERATIONS as SETFIT_ITERATIONS
from minknn.memory import MOMENTUM
from minknn.proxy import PROXY_LOSSES
from minknn.runs import saved_args
from minknn.tasks import get_task

# the minBERT trio; quora-train.csv is 22 MB, so sst,mrpc,sts runs on our copy
DEFAULT_TASKS = "sst,quora,sts"
KIND_NAMES = {"classify": "classification", "similarity": "similarity", "multilabel": "multi-label"}


def check_args(p, args):
    """Fills in the defaults that depend on other flags and refuses what cannot work (p.error:
    one line, exit status 2). Sets args.tasks to the run's task names."""
    proxy_lr_given = args.proxy_lr is not None  # before it is filled
    if args.lr is None:
        args.lr = 5e-5 if args.option == "finetune" else 1e-3
    if args.proxy_lr is None:
        args.proxy_lr = 100 * args.lr
    if args.lr == 0:
        p.error("--lr 0 would train nothing; give a positive learning rate")
    for name, must in bad_values(args):
        p.error(f"--{name} must be {must}, got {getattr(args, name)}")
    if args.steps is not None and args.steps_per_epoch is not None:
        p.error("--steps N makes each epoch N / --epochs steps; leave out --steps_per_epoch")
    if args.max_train and args.per_class:
        p.error("--max_train and --per_class both choose the training examples; give one")
    for name in ("data_dir", "out", "model"):
        if getattr(args, name) == "":
            p.error(f"--{name} is empty; give a path")
    if args.loss is not None:
        check_loss_name(args.loss)  # a wrong name fails before any slow work
    tasks = check_tasks(p, args)
    kinds = {t.kind for t in tasks}
    if args.loss is None:  # each task gets its kind's base loss; the run is named after one of them
        base = [KINDS[k].default_loss for k in ("classify", "multilabel") if k in kinds]
        args.loss = base[0] if base else None  # a similarity-only run: --sts_loss
    elif loss_kind(args.loss) not in kinds:
        p.error(f"--loss {args.loss} trains {KIND_NAMES[loss_kind(args.loss)]} tasks, and "
                f"{','.join(args.tasks)} has none")
    if args.decoupled and "classify" not in kinds:
        p.error(f"--decoupled trains a retrieval head for a classification task, and "
                f"{','.join(args.tasks)} has none")
    if args.decoupled and args.loss != "ce":
        p.error(f"--decoupled trains its own triplet loss on the retrieval head; use it with "
                f"--loss ce, not {args.loss}")
    if args.lam is not None and args.loss in (*BASE_LOSSES, None) and not args.decoupled \
            and not args.pair_loss:
        p.error(f"--lam weighs a metric-learning loss against the base loss; --loss "
                f"{args.loss or args.sts_loss} is the base loss alone")
    siamese = args.pair_mode == "siamese"
    one_vector = [t for t in tasks if t.kind == loss_kind(args.loss) and not (t.pair and siamese)]
    if args.loss not in (*BASE_LOSSES, None) and not one_vector:
        p.error(f"--loss {args.loss} compares one vector per example, and with --pair_mode "
                f"siamese a pair has two: use --pair_mode cross (a siamese paraphrase task takes "
                f"--pair_loss)")
    if (args.loss in MEMORY_LOSSES or args.decoupled) and (len(tasks) > 1 or not one_vector):
        what = "--decoupled" if args.decoupled else f"--loss {args.loss}"
        p.error(f"{what} is for runs of one classification task (with --pair_mode cross for a pair "
                f"task), not multi-task ones")
    check_memory_flags(p, args)
    check_head_init(p, args, tasks)
    if args.mlcon_reduction is not None and args.loss != "mlcon":
        p.error(f"--mlcon_reduction is a flag of --loss mlcon, not of --loss "
                f"{args.loss or args.sts_loss}")
    if args.loss == "mlcon" and args.mlcon_reduction is None:
        args.mlcon_reduction = "sum"  # the paper's equations as written (minknn/losses/mlcon.py)
    check_setfit_flags(p, args, tasks)
    if proxy_lr_given and args.loss not in PROXY_LOSSES:
        p.error(f"--proxy_lr is the learning rate of a proxy loss's proxies "
                f"({', '.join(PROXY_LOSSES)}); --loss {args.loss or args.sts_loss} has none")
    if args.pcgrad and len(tasks) < 2:
        p.error("--pcgrad resolves conflicts between tasks' gradients; it needs --task multitask "
                "with two tasks or more")
    if args.pair_loss and (not siamese or not any(t.positive is not None for t in tasks)):
        p.error("--pair_loss compares the two texts' vectors: it needs --pair_mode siamese and a "
                "paraphrase task (one whose Task.positive names the class of matching pairs)")


WHOLE_NUMBERS = ("epochs", "batch_size", "max_len", "max_train", "per_class", "max_eval",
                 "steps", "steps_per_epoch", "queue_size", "setfit_iterations")  # each at least 1
BOUNDED = (("lr", 0, None), ("proxy_lr", 0, None), ("weight_decay", 0, None), ("warmup", 0, 1),
           ("lam", 0, 1))


def bad_values(args):
    """Each value out of its bounds, as (flag, what it must be); a flag left unset (None) passes.
    check_args words them for the command line, check_saved for a run.json."""
    for name in WHOLE_NUMBERS:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            yield name, "at least 1"
    for name, low, high in BOUNDED:
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and low <= value
                                      and (high is None or value <= high)):
            yield name, f"a finite number {f'in [{low}, {high}]' if high else f'>= {low}'}"
    if args.lr == 0:
        yield "lr", "positive (0 would train nothing)"
    if args.steps and args.epochs and args.epochs >= 1 and args.steps % args.epochs:
        yield "steps", f"a multiple of --epochs {args.epochs} (each epoch is N / --epochs steps)"
    if args.max_len is not None and args.max_len < 8:
        yield "max_len", "at least 8 ([CLS] a [SEP] b [SEP] and a few words)"
    if not 0 <= args.seed < 2 ** 32:  # numpy's seeds are 32-bit
        yield "seed", "in [0, 2**32)"
    if args.momentum is not None and not 0 <= args.momentum <= 1:
        yield "momentum", "in [0, 1]"
    for name in ("m_most", "m_least"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            yield name, ">= 0"


# a flag's type -> the JSON values it takes (a float flag's value may be written 5, an int)
SAVED_TYPES = {int: int, float: (int, float), str: str, bool: bool}
TYPE_NAMES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}


def check_saved(p, path, saved):
    """--resume: the arguments of a run.json (path), checked as the command line's are, since a
    hand-edited file may hold anything: each value of its flag's type (an int for an int flag,
    one of its choices, ...), then within its bounds (bad_values). One line naming the file and
    the key, before anything is read."""
    def refuse(name, must):
        raise MinknnError(f"{path}: {name} is {json.dumps(saved[name])}; it must be {must} "
                          f"(was the file edited?)")
    filled = ("lr", "proxy_lr", "precision", "head_init")  # check_args and get_args filled them
    for a in p._actions:
        name, value = a.dest, saved.get(a.dest)
        if name in ("help", "resume", "device", "out"):  # the command line's, not the run's
            continue
        if name == "tasks":  # check_tasks made it a list
            if not (isinstance(value, list) and value and all(isinstance(t, str) for t in value)):
                refuse(name, "a list of task names")
            continue
        if value is None and a.default is None and name not in filled:
            continue  # a flag not given
        kind = bool if a.nargs == 0 else a.type or str
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, SAVED_TYPES[kind]):
            refuse(name, TYPE_NAMES[kind])
        choices = LOSSES if name == "loss" else a.choices
        if choices is not None and value not in choices:
            refuse(name, f"one of: {', '.join(choices)}")
    for name, must in bad_values(argparse.Namespace(**saved)):
        refuse(name, must)


def check_tasks(p, args):
    """args.tasks: the run's task names, from --task T or --task multitask --tasks a,b,c."""
    if args.task == "multitask":
        args.tasks = (DEFAULT_TASKS if args.tasks is None else args.tasks).split(",")
        if "" in args.tasks:
            p.error(f"--tasks '{','.join(args.tasks)}' has an empty name; list tasks as a,b,c")
        if "multitask" in args.tasks:
            p.error("--tasks lists registered tasks; 'multitask' is not one")
        if len(set(args.tasks)) != len(args.tasks):
            p.error(f"--tasks {','.join(args.tasks)} names a task twice")
    elif args.tasks is not None:
        p.error("--tasks is for --task multitask")
    else:
        args.tasks = [args.task]
    return [get_task(name, args.data_dir) for name in args.tasks]


def check_memory_flags(p, args):
    """The memory losses' flags: refused with other losses, else filled with their defaults."""
    knnbert_flags, memory_flags = ("m_most", "m_least"), ("memory", "queue_size", "momentum")
    for name in knnbert_flags + memory_flags:
        allowed = ("knnbert",) if name in knnbert_flags else MEMORY_LOSSES
        if getattr(args, name) is not None and args.loss not in allowed:
            p.error(f"--{name} is a flag of --loss {' and '.join(allowed)}, "
                    f"not of --loss {args.loss}")
    if args.loss in MEMORY_LOSSES:
        args.memory = args.memory or "queue"
        if args.memory == "bank" and (args.queue_size is not None or args.momentum is not None):
            p.error("--memory bank keeps one entry per training example and no key encoder: "
                    "--queue_size and --momentum are for --memory queue")
        if args.memory == "queue" and args.momentum is None:
            args.momentum = MOMENTUM
    if args.loss == "knnbert":
        args.m_most = M_MOST if args.m_most is None else args.m_most
        args.m_least = M_LEAST if args.m_least is None else args.m_least
        if args.m_most < 0 or args.m_least < 0 or args.m_most + args.m_least < 1:
            p.error(f"--m_most and --m_least must be >= 0 and select at least one positive, "
                    f"got {args.m_most} and {args.m_least}")


def check_head_init(p, args, tasks):
    """--head_init: probe by default with --option pretrain where a head can be fit (the head
    alone trains there, and from the probe it starts at the frozen encoder's best linear fit),
    else random; probe refused where no task has a head on one vector per example."""
    fittable = [t for t in tasks if t.kind in ("classify", "multilabel")
                and not (t.pair and args.pair_mode == "siamese")]
    if args.head_init is None:
        args.head_init = "probe" if args.option == "pretrain" and fittable else "random"
    elif args.head_init == "probe" and not fittable:
        p.error(f"--head_init probe fits a classification or multi-label head on one vector per "
                f"example, and {','.join(args.tasks)} has none (a similarity task, or a pair task "
                f"under --pair_mode siamese)")


def check_setfit_flags(p, args, tasks):
    """--loss setfit (minknn/losses/setfit.py): one classification task, its pairs drawn from its
    own examples, the encoder trained, the head fit after each epoch in one process."""
    if args.loss != "setfit":
        if args.setfit_iterations is not None:
            p.error(f"--setfit_iterations is a flag of --loss setfit, not of --loss "
                    f"{args.loss or args.sts_loss}")
        return
    args.setfit_iterations = args.setfit_iterations or SETFIT_ITERATIONS
    if len(tasks) > 1:
        p.error("--loss setfit trains one classification task on pairs of its own examples, not "
                "a multi-task run")
    if args.lam is not None:
        p.error("--loss setfit is SetFit's pair loss alone (no cross-entropy to weigh it "
                "against): leave out --lam")
    if args.option == "pretrain":
        p.error("--loss setfit trains the encoder (the head is fit by logistic regression "
                "after); --option pretrain would freeze all it trains")
    if distributed.launched():
        p.error("--loss setfit fits its head in one process, after each epoch; run it without "
                "torchrun")


def resumed_args(p, args):
    """--resume RUN: the run's own arguments, checked as the command line's (a hand-edited
    run.json gets one line naming the key); any other flag but --device is refused."""
    given = [a.option_strings[0] for a in p._actions if a.dest not in ("help", "resume", "device")
             and getattr(args, a.dest) != a.default]
    if given:
        p.error(f"--resume continues a run with the flags it started with; leave out "
                f"{', '.join(given)} (or start a new run with another --out)")
    # runs from before --save kept the best; runs from before --per_class, --steps, --head_init,
    # --mlcon_reduction and --setfit_iterations had none (a random head; mlcon's sum, which a
    # None builds)
    saved = {"save": "best", "per_class": None, "steps": None, "head_init": "random",
             "mlcon_reduction": None, "setfit_iterations": None, **saved_args(args.resume)}
    missing = [a.dest for a in p._actions
               if a.dest not in saved and a.dest not in ("help", "resume")]
    if missing:
        p.error(f"--resume {args.resume}: run.json has no {', '.join(missing)}; it was not written "
                f"by this version of train.py")
    check_saved(p, os.path.join(args.resume, "run.json"), saved)
    return argparse.Namespace(**{**saved, "out": args.resume, "resume": args.resume,
                                 "device": args.device})
