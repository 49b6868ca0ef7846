"""The rules train.py's flags are held to (the flags themselves: minknn/tools/options.py, whose
get_args calls check_args). Every refusal is one line naming the flag at fault, and its value where
the value is what is wrong (`error: ...`, exit status 2), given before any slow work: no training
data is read first. check_args fills in the defaults that depend on other flags (the learning rates,
the loss and its own flags, --head_init, --tasks: check_tasks), then refuses each value out of
its bounds (bad_values) and each combination that cannot work, one check_* per idea; one rule,
check_terms, read from what each loss declares, refuses every flag that leaves a loss's term
nothing to do (--lam 0, a frozen encoder under a loss that trains only it). --resume:
resumed_args reads a run's own flags back from its run.json, and check_saved holds each value to
its flag's type and to the same bounds, since a hand-edited file may hold anything.
"""
import argparse
import copy
import json
import math
import os

from minknn import MinknnError
from minknn.kinds import KINDS
from minknn.losses import (BASE_LOSSES, LOSS_FLAGS, LOSSES, MEMORY_LOSSES, METRIC_LOSSES,
                           NAMED_PROXY_LOSSES, PROXY_LOSSES, check_loss_name, loss_kind, need)
from minknn.losses.decoupled import DecoupledTripletLoss
from minknn.losses.pairs import PAIR_LOSSES
from minknn.memory import MOMENTUM
from minknn.tasks.own_task import (FLAGS as FILE_FLAGS, check_flags, check_unchanged, given,
                                   task_name, tasks_of)
from minknn.tasks.registry import TASKS
from minknn.tools import distributed
from minknn.tools.files import read_json
from minknn.tools.run import saved_args

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
    check_flags(args)  # your own files' flags (minknn/tasks/own_task.py)
    tasks = check_tasks(p, args)
    check_siamese_scores(p, args, tasks)
    check_loss(p, args, tasks)
    check_terms(p, args, tasks)
    check_loss_flags(p, args)
    check_head_init(p, args, tasks)
    check_proxy_init(p, args, tasks)
    check_whole_objective(p, args, tasks)
    if proxy_lr_given and args.loss not in PROXY_LOSSES:
        p.error(f"--proxy_lr is the learning rate of a proxy loss's proxies "
                f"({', '.join(PROXY_LOSSES)}); --loss {args.loss or args.sts_loss} has none")
    if args.pcgrad and len(tasks) < 2:
        p.error("--pcgrad resolves conflicts between tasks' gradients; it needs --task multitask "
                "with two tasks or more")
    if args.pair_loss and (args.pair_mode != "siamese" or
                           not any(t.positive is not None for t in tasks)):
        p.error("--pair_loss compares the two texts' vectors: it needs --pair_mode siamese and a "
                "paraphrase task (one whose Task.positive names the class of matching pairs)")


def check_loss(p, args, tasks):
    """--loss against the run's tasks: each task gets its kind's base loss where none is given; a
    metric loss needs tasks of its kind with one vector per example, and a memory loss (or
    --decoupled) one task."""
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
    if args.decoupled and args.loss not in BASE_LOSSES:
        p.error(f"--decoupled trains its own triplet loss on the retrieval head; use it with "
                f"--loss ce, not {args.loss}")
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


WHOLE_NUMBERS = ("epochs", "batch_size", "max_len", "max_train", "per_class", "max_eval",
                 "steps", "steps_per_epoch", "queue_size")  # each at least 1
BOUNDED = (("lr", 0, None), ("proxy_lr", 0, None), ("weight_decay", 0, None), ("warmup", 0, 1),
           ("lam", 0, 1))


def bad_values(args):
    """Each value out of its bounds, as (flag, what it must be); a flag left unset (None) passes.
    check_args words them for the command line, check_saved for a run.json."""
    for name in WHOLE_NUMBERS:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            yield name, "at least 1"
    for name, spec in LOSS_FLAGS.items():  # a loss's own, at least its "min"
        low = spec.get("min")
        if low is not None and getattr(args, name, None) is not None and getattr(args, name) < low:
            yield name, "at least 1" if low == 1 else f">= {low}"
    for name, low, high in BOUNDED:
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and low <= value
                                      and (high is None or value <= high)):
            yield name, f"a finite number {f'in [{low}, {high}]' if high else f'>= {low}'}"
    if args.lr == 0:
        yield "lr", "positive (0 would train nothing)"
    # AdamW's decoupled decay: each step multiplies the weights by 1 - lr x weight_decay (then
    # the Adam step); below 1 that factor stays positive for any lr up to 1, from 1 up it can zero
    # or flip every weight, and the loss climbs into the thousands
    if args.weight_decay is not None and args.weight_decay >= 1:
        yield "weight_decay", ("in [0, 1) (each step AdamW multiplies the weights by "
                               "1 - lr x weight_decay; BERT's recipe is 0.01)")
    if args.steps and args.epochs and args.epochs >= 1 and args.steps % args.epochs:
        yield "steps", f"a multiple of --epochs {args.epochs} (each epoch is N / --epochs steps)"
    if args.max_len is not None and args.max_len < 8:
        yield "max_len", "at least 8 ([CLS] a [SEP] b [SEP] and a few words)"
    if not 0 <= args.seed < 2 ** 32:  # numpy's seeds are 32-bit
        yield "seed", "in [0, 2**32)"
    if args.momentum is not None and not 0 <= args.momentum <= 1:
        yield "momentum", "in [0, 1]"


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


def check_rules(p, path, saved):
    """--resume: the rules check_args holds a command line to, held to run.json's flags too (a
    hand-edited file may break one: --loss supcon with --lam 0). Checked on a copy, as the command
    line of those flags (--tasks as given; --proxy_lr, filled for every loss, and a memory bank's
    --queue_size, filled with its size, as left unset); one line naming the file."""
    def refuse(message):
        raise MinknnError(f"{path}: as a command line its flags would be refused: {message} (was "
                          f"the file edited?)")
    rules = copy.copy(p)
    rules.error = refuse
    line = argparse.Namespace(**saved)
    line.tasks = ",".join(saved["tasks"]) if saved["task"] == "multitask" else None
    if saved["loss"] not in PROXY_LOSSES:
        line.proxy_lr = None
    if saved.get("memory") == "bank":  # a bank's size, filled in when it was made (trainer.py)
        line.queue_size = None
    check_args(rules, line)


def check_tasks(p, args):
    """args.tasks: the run's task names, from --task T or --task multitask --tasks a,b,c; with
    --train_file, one of them is your files' task (its name: the one the registry does not hold,
    else the file's own: minknn/tasks/own_task.py task_name). Returns the Tasks, your files read and
    checked (a bad row is one line, before any model is read)."""
    if args.task == "multitask":
        args.tasks = (DEFAULT_TASKS if args.tasks is None else args.tasks).split(",")
        if "" in args.tasks:
            p.error(f"--tasks '{','.join(args.tasks)}' has an empty name; list tasks as a,b,c")
        if "multitask" in args.tasks:
            p.error("--tasks lists registered tasks; 'multitask' is not one")
        if len(set(args.tasks)) != len(args.tasks):
            p.error(f"--tasks {','.join(args.tasks)} names a task twice")
        if given(args) and all(name in TASKS for name in args.tasks):
            p.error(f"--train_file: --tasks {','.join(args.tasks)} names registered tasks only; "
                    f"add a name for your files' task (e.g. --tasks {','.join(args.tasks)},mine)")
        if given(args):
            task_name(args, args.tasks)
    elif args.tasks is not None:
        p.error("--tasks is for --task multitask")
    elif given(args):
        if args.task in TASKS:
            p.error(f"--task {args.task} is a registered task; with --train_file, --task names "
                    f"your files' task: give it a name of its own (or leave --task out)")
        args.task = task_name(args, [args.task] if args.task else [])
        args.tasks = [args.task]
    else:
        args.task = args.task or "sst"
        args.tasks = [args.task]
    return tasks_of(args)


def check_siamese_scores(p, args, tasks):
    """--pair_mode siamese scores a similarity pair 2.5 (cos(u, v) + 1), in [0, 5]
    (minknn/model.py): your files' scores must lie there too."""
    for t in tasks:
        if t.own and t.kind == "similarity" and t.pair and args.pair_mode == "siamese":
            low, high = t.own["score_range"]
            if low < 0 or high > 5:
                p.error(f"--pair_mode siamese scores a pair 2.5 (cos + 1), from 0 to 5, and "
                        f"{t.files['train']}'s scores run from {low:g} to {high:g}; use "
                        f"--pair_mode cross (or scale the scores to [0, 5])")


def check_loss_flags(p, args):
    """A loss's own flags (its class's `flags`) and the memory's: refused with a loss that does not
    take them, else filled in with their defaults."""
    memory_flags = ("memory", "queue_size", "momentum")
    for name in (*LOSS_FLAGS, *memory_flags):
        owners = MEMORY_LOSSES if name in memory_flags else \
            [loss for loss in LOSSES if name in need(loss, "flags")]
        if getattr(args, name) is not None and args.loss not in owners:
            p.error(f"--{name} is a flag of --loss {' and '.join(owners)}, "
                    f"not of --loss {args.loss or args.sts_loss}")
    flags = need(args.loss, "flags")
    for name, spec in flags.items():
        if getattr(args, name) is None:
            setattr(args, name, spec["default"])
    refuse = getattr(LOSSES.get(args.loss), "refuse", None)
    why = refuse(**{name: getattr(args, name) for name in flags}) if refuse else None
    if why:
        p.error(why)
    if need(args.loss, "uses_memory"):
        args.memory = args.memory or "queue"
        if args.memory == "bank" and (args.queue_size is not None or args.momentum is not None):
            p.error("--memory bank keeps one entry per training example and no key encoder: "
                    "--queue_size and --momentum are for --memory queue")
        if args.memory == "queue" and args.momentum is None:
            args.momentum = MOMENTUM


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


def check_proxy_init(p, args, tasks):
    """--proxy_init names: for a loss with one proxy a class (proxyanchor, proxynca), whose every
    task it trains is a classification task of one text (a class name is one text) with names."""
    if args.proxy_init != "names":
        return
    if args.loss not in NAMED_PROXY_LOSSES:
        what = "has none" if args.loss not in PROXY_LOSSES else \
            "has K centres a class, which would start as one point and never part"
        p.error(f"--proxy_init names starts one proxy a class at its name "
                f"({', '.join(NAMED_PROXY_LOSSES)}); --loss {args.loss or args.sts_loss} {what}")
    for t in tasks:
        if t.kind != loss_kind(args.loss):  # trained by its kind's base loss: no proxies
            continue
        if t.pair:
            p.error(f"--proxy_init names encodes each class's name as one text, and {t.name}'s "
                    f"examples are pairs of texts; use --proxy_init random")
        if not t.names:  # its labels are codes (minknn/tasks/registry.py: Task.names)
            p.error(f"--proxy_init names: {t.name} has no readable class names (its labels "
                    f"{', '.join(map(str, t.labels or []))} are codes, not words; "
                    f"{names_remedy(t)}); use --proxy_init random")


def names_remedy(task):
    """Where a task's readable class names come from: your files' --label_names, or the
    registry."""
    return ("give them with --label_names" if task.own
            else "minknn/tasks/registry.py gives a task its names")


def metric_terms(args):
    """The terms the run adds to its base loss, as (how the command line names it, the loss's
    class): the named metric loss's, --decoupled's triplet loss's, --pair_loss's."""
    terms = [(f"--loss {args.loss}", LOSSES[args.loss])] if args.loss in METRIC_LOSSES else []
    if args.decoupled:
        terms.append(("--decoupled", DecoupledTripletLoss))
    if args.pair_loss:
        terms.append((f"--pair_loss {args.pair_loss}", PAIR_LOSSES[args.pair_loss]))
    return terms


def check_terms(p, args, tasks):
    """The rule every loss is held to, read from what it declares (minknn/losses/__init__.py
    NEEDS), never from its name: each term the run adds to the base loss (metric_terms) must have
    something to do.
    - Its weight, --lam or the loss's own `lam`, is above 0. At 0 its gradient is 0 and the run
      trains the base loss alone under the loss's name (summary.json would say setfit).
    - What its gradient reaches (its `trains`) is not all frozen. --option pretrain freezes the
      encoder: a term that reaches only the encoder, through z (the in-batch, memory and pair
      losses, SetFit's, AncSetFit's), would train nothing, the memory's keys included (the key
      encoder is a momentum copy of the frozen one). A proxy loss still trains its proxies on the
      frozen z, a classifier in its own right (proxy inference, evaluate.py --proxy; the DML
      paper's eq. 10), and --decoupled its retrieval head: those are taken.
    --lam with no such term weighs nothing. The base loss is held to the second need only where
    no task has a head (a siamese similarity task scores the cosine): there a frozen encoder
    leaves the run nothing to train. At --lam 1 its weight is 0 and the head keeps its start,
    which is the metric loss alone, as the DML paper ablates it (a proxy loss's epochs are then
    scored by its proxies): that is taken."""
    terms = metric_terms(args)
    if args.lam is not None and not terms:
        p.error(f"--lam weighs a metric-learning loss against the base loss; --loss "
                f"{args.loss or args.sts_loss} is the base loss alone")
    siamese = args.pair_mode == "siamese"
    headless = [t for t in tasks if t.kind == "similarity" and t.pair and siamese]
    if args.option == "pretrain" and len(headless) == len(tasks):  # and so no metric term
        p.error("nothing to train: --option pretrain freezes BERT, and a siamese similarity task "
                "has no head")
    base, alone = (("bce", "BCE") if loss_kind(args.loss) == "multilabel" else
                   ("ce", "cross-entropy"))
    frozen = {"encoder"} if args.option == "pretrain" else set()
    for named, term in terms:
        lam = term.lam if args.lam is None else args.lam
        fix = f"use --loss {base}" if named.startswith("--loss") else f"leave out {named}"
        if lam == 0:
            p.error(f"--lam 0 gives {named}'s term no weight: the run would train plain {alone} "
                    f"under its name; {fix} or give a --lam above 0")
        if not set(need(term, "trains")) - frozen:
            instead = (f"train plain {alone} on the frozen encoder"
                       if need(term, "trains_head") or lam < 1 else
                       "only fit a logistic regression on the frozen encoder after each epoch")
            p.error(f"--option pretrain freezes the encoder, all that {named}'s term trains: the "
                    f"run would {instead}; use --option finetune")


def check_whole_objective(p, args, tasks):
    """A loss trained on pairs it draws (setfit) trains one task; a loss that is the whole
    objective (trains_head False: the head is fit by logistic regression after each epoch, in one
    process) needs no head start; with --lam below 1 a cross-entropy term trains the head beside
    it, and it is a loss like the others."""
    if args.loss is None:
        return
    if need(args.loss, "pairs") and len(tasks) > 1:
        p.error(f"--loss {args.loss} trains one classification task on pairs of its own examples, "
                f"not a multi-task run")
    if need(args.loss, "anchored"):  # its anchors are statements of the classes' names
        t = tasks[0]
        if t.kind != "classify" or t.pair or not t.names:
            what = (f"a {t.kind} task" if t.kind != "classify" else "a task of pairs of texts"
                    if t.pair else f"a task without readable class names (its labels "
                    f"{', '.join(map(str, t.labels))} are codes; {names_remedy(t)})")
            p.error(f"--loss {args.loss} anchors each class of a single-text classification "
                    f"task at a sentence stating its name; {t.name} is {what}")
    if need(args.loss, "trains_head") or args.lam is not None and args.lam < 1:
        return
    if args.head_init == "probe":  # fit_head's regression, on the untrained encoder, then refit
        p.error(f"--head_init probe starts a head that trains; --loss {args.loss} at --lam 1 "
                f"fits its head by logistic regression after each epoch, which replaces that "
                f"start; leave out --head_init or give a --lam below 1")
    if distributed.launched():
        p.error(f"--loss {args.loss} fits its head in one process, after each epoch; run it "
                f"without torchrun")


def resumed_args(p, args):
    """--resume RUN: the run's own arguments, checked as the command line's (a hand-edited
    run.json gets one line naming the key); any other flag but --device is refused."""
    given = [a.option_strings[0] for a in p._actions if a.dest not in ("help", "resume", "device")
             and getattr(args, a.dest) != a.default]
    if given:
        p.error(f"--resume continues a run with the flags it started with; leave out "
                f"{', '.join(given)} (or start a new run with another --out)")
    # runs from before --save kept the best; runs from before --per_class, --steps, --head_init,
    # --proxy_init, --mlcon_reduction, --setfit_iterations, AncSetFit's flags and --tensorboard
    # had none (a random head and random proxies; mlcon's sum, which a None builds; no curves)
    # (a run of registered tasks keeps none of the file flags: its run.json is as it was)
    saved = {"save": "best", "per_class": None, "steps": None, "head_init": "random",
             "proxy_init": "random", "mlcon_reduction": None, "setfit_iterations": None,
             "anc_iterations": None, "anc_margin": None, "tensorboard": False,
             **dict.fromkeys(FILE_FLAGS), **saved_args(args.resume)}
    missing = [a.dest for a in p._actions
               if a.dest not in saved and a.dest not in ("help", "resume")]
    if missing:
        p.error(f"--resume {args.resume}: run.json has no {', '.join(missing)}; it was not written "
                f"by this version of train.py")
    path = os.path.join(args.resume, "run.json")
    check_saved(p, path, saved)
    check_rules(p, path, saved)
    if saved.get("train_file") is not None:  # your files: each as the run recorded it
        check_unchanged(read_json(path)["data"].get("files", {}), f"--resume {args.resume}")
    return argparse.Namespace(**{**saved, "out": args.resume, "resume": args.resume,
                                 "device": args.device})
