"""What a training run is made of, built once from train.py's arguments, restored from last.pt,
and saved after each epoch. train.py's loop steps them; the lab's bench times the same ones.

    trainer, last = build(args, make_optimizer)   # last: last.pt's state, or None
    best, records = restore(trainer, last) if last else (None, [])  # (and a damaged checkpoint.pt
                                                   # written again: minknn/tools/resume.py)
    begin(trainer, last, records)                  # run.json, each rank's dropout, its lines
    save(trainer, epoch, best, records)            # checkpoint.pt, last.pt, metrics.jsonl
    finish(trainer, best, records)                 # metrics.jsonl, summary.json, the last line;
                                                   # last.pt goes, once checkpoint.pt is whole
check_epoch_finite() stops a run (Diverged) whose scores or weights are not finite, before the
epoch is saved.

A Trainer is no framework, only what a run holds (the loop is train.py's):
    device, tokenizer     --device; the model folder's vocabulary, cut at --max_len
    tasks, train, dev     each task (minknn/tasks/registry.py), its training examples (all, or a
                          --max_train or --per_class draw) and its dev examples (a --max_eval
                          subset); data: the data root and the training sets' fingerprints
    model                 BERT and a head per task (minknn/model.py); a multi-label head starts
                          at its classes' priors, and with --head_init probe each classification
                          or multi-label head as the logistic regression on the loaded encoder
    losses                each task's loss (minknn/losses/), with a loss's parameters (proxies:
                          random, or with --proxy_init names at the encoded class names)
    moco, fill_seconds    a memory loss's queue or bank and key encoder (minknn/memory.py), filled
                          from the training examples before the first step (fill_memory)
    params, optimizer, scheduler   what trains (the model's and the losses' parameters), and
                          train.py's make_optimizer for them: AdamW, warm-up then linear decay
    steps, rng, streams   steps per epoch (a pass over the largest task, --steps_per_epoch, or
                          --steps / --epochs);
                          each task's batch stream, all drawn from one random.Random(--seed)
                          (a loss trained on pairs, setfit: over the pairs it draws first)
    pcgrad                --pcgrad: gradient surgery on the shared encoder (minknn/pcgrad.py)
    base                  --option pretrain: the base model's folder, which checkpoints name
                          instead of holding a copy of the frozen BERT
    args                  the run's arguments (build fills in --queue_size)
    ddp                   under torchrun: DistributedDataParallel of step.Forward(model), which
                          averages the gradients over the ranks (None in one process)
    curves                --tensorboard: the run's TensorBoard events (minknn/tools/curves.py),
                          made by begin() on rank 0 and written by save() (None without)
    run                   run.json's id and arguments (resume.run_identity; a new run's on rank
                          0, once begin() wrote it), which last.pt and checkpoint.pt record

build() makes them in the order of their random draws: seed_everything(--seed), BERT, the heads
(a probe fit draws nothing), the losses' parameters (drawn even where --proxy_init names then
sets them: the names draw nothing), the memory (its key encoder a copy; the
fill, in begin(), draws nothing), then the streams (their own random.Random). Another order
trains another run from the same seed, and a resumed run would not be the run it continues.

Each step's batch and forward, in between: minknn/tools/step.py. Under torchrun
(minknn/tools/distributed.py) every rank builds the same Trainer from the same seed; rank 0 alone
saves.
"""
import dataclasses
import math
import os
import random
import secrets
import time

import torch
from torch.nn.parallel import DistributedDataParallel

from minknn import MinknnError, backbones, run_begun, signals_held
from minknn.kinds import describe_run
from minknn.losses import build_losses, loss_kind
from minknn.memory import MoCo, new_memory
from minknn.model import Model
from minknn.pcgrad import PCGrad
from minknn.probe import fit_head
from minknn.proxy import has_proxies, start_at_names
from minknn.tasks.data import read_examples, run_data
from minknn.tasks.own_task import FLAGS as FILE_FLAGS, describe, files_record, tasks_of
from minknn.tokenizer import Tokenizer
from minknn.tools.checkpoint import base_model, check_last_fits, save_checkpoint, save_last
from minknn.tools.curves import Curves
from minknn.tools.distributed import all_reduce_mean, broadcast, is_main, rank, world
from minknn.tools.engine import (PairBatches, TrainBatches, pick_device, random_states,
                                 seed_everything, set_random_states)
from minknn.tools.files import write_json, write_jsonl
from minknn.tools.resume import REWRITE, check_kept, read_last, run_identity
from minknn.tools.run import Diverged, check_same_data, summarise
from minknn.tools.step import Forward
from minknn.tools.weights import resolve_model_path


@dataclasses.dataclass
class Trainer:  # the fields the module docstring describes; None where a run has no such part
    args: object
    device: torch.device
    tokenizer: Tokenizer
    base: dict
    tasks: list
    train: dict
    dev: dict
    data: dict
    model: Model
    losses: torch.nn.ModuleDict
    moco: MoCo
    fill_seconds: float
    params: list
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    steps: int
    rng: random.Random
    streams: dict
    pcgrad: PCGrad
    ddp: DistributedDataParallel = None
    curves: Curves = None
    run: dict = None


def build(args, make_optimizer, examples=None, device=None):
    """(the run's Trainer, last.pt's state with --resume, else None). make_optimizer: train.py's
    (model_params, loss_params, args, total_steps) -> (optimizer, scheduler). examples: (train,
    dev), each task name -> its examples, already read (the lab's bench); by default they are read
    as the arguments say, and their fingerprints kept for the run folder. device: under torchrun,
    this rank's (distributed.setup); by default --device's."""
    seed_everything(args.seed)
    device = device or pick_device(args.device)
    last = read_last(args) if args.resume else None  # first: its line says where the run goes on
    model_path = resolve_model_path(args.model)  # a wrong --model fails before the data is read
    tokenizer = Tokenizer.from_folder(model_path, args.max_len)  # so do its config and vocabulary
    bert = backbones.from_pretrained(model_path).set_attention(args.attention)  # and its weights
    # a frozen BERT is the base model's: the checkpoint names that instead of holding a copy
    base = base_model(model_path) if args.option == "pretrain" and args.save == "best" else None
    if base and last:
        check_same_base(args, bert, last, model_path)
    tasks = tasks_of(args)  # the registry's, and your own files' (minknn/tasks/own_task.py)
    for t in tasks:
        if t.own and is_main():  # where your files' task comes from, and that it has no test
            print(describe(t))
    train, dev = examples or read_examples(args, tasks)  # minknn/tasks/data.py
    data = None
    if examples is None:  # saved for evaluate.py; a run of your files alone needs no data root
        data = run_data(None if all(t.own for t in tasks) else args.data_dir, train)
        if files_record(tasks):  # your files' paths and sha256s (--resume)
            data["files"] = files_record(tasks)

    model = Model(bert, tasks, args.pooling, args.pair_mode, args.option, args.decoupled)
    model.start_heads(train)
    model.to(device)
    if args.head_init == "probe" and not last:  # resumed: last.pt holds the heads
        fit_probes(args, model, tokenizer, tasks, train, device)
    losses = build_losses(model, vars(args)).to(device)
    if args.proxy_init == "names" and not last:  # resumed: last.pt holds the proxies as trained
        name_proxies(args, model, tokenizer, tasks, losses, device)
    moco, fill_seconds = make_memory(args, model, tasks[0], train[tasks[0].name],
                                     losses[tasks[0].name], last)
    rng = random.Random(args.seed)
    streams = {t.name: batch_stream(args, train[t.name], losses[t.name], rng) for t in tasks}
    model_params = [p for p in model.parameters() if p.requires_grad]
    loss_params = list(losses.parameters())
    if not model_params + loss_params:
        raise MinknnError("nothing to train: --option pretrain freezes BERT, and a siamese "
                          "similarity task has no head")
    # --steps N: N / --epochs steps an epoch, whatever the data's size (checks.py: a multiple);
    # else a pass over the largest task (stream.n: its examples, or a pair loss's pairs)
    steps = (args.steps // args.epochs if args.steps else args.steps_per_epoch
             or max(-(-stream.n // args.batch_size) for stream in streams.values()))
    optimizer, scheduler = make_optimizer(model_params, loss_params, args, args.epochs * steps)
    pcgrad = make_pcgrad(model) if args.pcgrad else None
    ddp = None
    if world() > 1:  # DDP copies rank 0's model to every rank; the proxies are not in it
        broadcast(losses)
        # find_unused_parameters: some parameters take no part in a step (BERT's pooler, which
        # no --pooling reads); without it DDP stops at the second step, still waiting for theirs
        ddp = DistributedDataParallel(Forward(model), find_unused_parameters=True,
                                      device_ids=[device] if device.type == "cuda" else None)
    return Trainer(args=args, device=device, tokenizer=tokenizer, base=base, tasks=tasks,
                   train=train, dev=dev, data=data, model=model, losses=losses, moco=moco,
                   fill_seconds=fill_seconds, params=model_params + loss_params,
                   optimizer=optimizer, scheduler=scheduler, steps=steps, rng=rng,
                   streams=streams, pcgrad=pcgrad, ddp=ddp,
                   run=run_identity(args.out) if args.resume else None), last


def fit_probes(args, model, tokenizer, tasks, train, device):
    """--head_init probe: each classification and multi-label head (one vector per example) set
    to the logistic regression on the encoder's z of the training examples, as loaded (LP-FT;
    minknn/probe.py). It draws no random numbers, so the run's draws stay in build()'s order.
    Under torchrun every rank fits it from the same examples and weights, and
    DistributedDataParallel then copies rank 0's parameters to every rank (build()), so every
    rank starts from rank 0's fit, bit for bit."""
    for t in tasks:
        if t.kind in ("classify", "multilabel") and not model.siamese(t):
            fit_head(model, tokenizer, t, train[t.name], 2 * args.batch_size, device,
                     args.precision)


def name_proxies(args, model, tokenizer, tasks, losses, device):
    """--proxy_init names: each proxy of each task trained by a proxy loss set to the loaded
    encoder's z of its class's name (AncSetFit; minknn/proxy.py start_at_names), after the loss
    drew its random proxies (so the run's later draws are a random run's). It draws nothing, and
    every rank computes the same; build() then broadcasts rank 0's proxies to every rank."""
    for t in tasks:
        if has_proxies(losses[t.name]):
            start_at_names(model, tokenizer, t, losses[t.name].metric, device, args.precision)


def batch_stream(args, examples, loss, rng):
    """A task's batches of training-set rows: shuffled passes over its examples, or, for a loss
    trained on pairs (setfit), over the pairs it draws, once, here, from the run's rng."""
    metric = getattr(loss, "metric", None)  # a similarity task's loss has none
    if getattr(metric, "pairs", False):
        return PairBatches(metric.draw_pairs([e.label for e in examples], rng), args.batch_size,
                           rng)
    return TrainBatches(len(examples), args.batch_size, rng)


def check_same_base(args, bert, last, model_path):
    """A resumed run that froze BERT loads it from the base model's folder: it must not have
    changed since the run started."""
    if any(not torch.equal(v, last["model"]["bert." + k]) for k, v in bert.state_dict().items()):
        raise MinknnError(f"--resume {args.out}: the base model {model_path} changed since the run "
                          f"started; the run froze BERT, and its checkpoints name that folder for "
                          f"it (put the model back, or start a new run)")


def make_memory(args, model, task, train, loss, last):
    """(MoCo, the seconds its fill took) of a loss that uses a memory (a run of one task,
    minknn/tools/checks.py): with last.pt its memory comes from there (restore()); a new run's is
    empty until fill_memory(), and its seconds None. (None, None) for the other losses."""
    if not getattr(loss, "uses_memory", False):
        return None, None
    if last:
        return (MoCo(model, task, args.memory, len(last["memory"]["keys"]), args.momentum),
                last["memory_fill_seconds"])
    moco = new_memory(model, task, train, args.memory, args.queue_size, args.momentum)
    args.queue_size = len(moco.memory.keys)
    return moco, None


def fill_memory(trainer):
    """A new run's memory filled from its training examples, once, before the first step
    (MoCo.fill: the key encoder's keys, in batches of twice --batch_size), and
    trainer.fill_seconds the time it took. begin() calls it after the lines that say what the run
    is, so that the fill's progress bar comes after them."""
    args, task = trainer.args, trainer.tasks[0]
    train, start = trainer.train[task.name], time.time()
    labels = torch.tensor([e.label for e in train], device=trainer.device)
    trainer.moco.fill(trainer.model, trainer.tokenizer, train, labels, 2 * args.batch_size,
                      trainer.device, args.precision)
    trainer.fill_seconds = time.time() - start


def make_pcgrad(model):
    """PCGrad of the encoder's trainable parameters; under torchrun it averages each task's
    gradient over the ranks before the surgery, and the heads' after (minknn/pcgrad.py)."""
    shared = [p for p in model.bert.parameters() if p.requires_grad]
    if world() == 1:
        return PCGrad(shared)
    heads = [p for n, p in model.named_parameters()
             if p.requires_grad and not n.startswith("bert.")]
    return PCGrad(shared, all_reduce_mean, heads)


def modules(trainer):
    """The run's modules by their entry in last.pt: the model, the losses (proxies), and a memory
    loss's memory and a queue's key encoder."""
    found = {"model": trainer.model, "loss": trainer.losses}
    if trainer.moco:
        found["memory"] = trainer.moco.memory
        if trainer.moco.key_encoder:
            found["key_encoder"] = trainer.moco.key_encoder.encoder
    return found


def restore(trainer, last):
    """Everything a step reads, as it was after the last completed epoch (last: last.pt's
    state). Returns (the best epoch so far, the records of the epochs done)."""
    check_last_fits(last, trainer.args.out, modules(trainer), trainer.streams)
    for entry, module in modules(trainer).items():
        module.load_state_dict(last[entry])
    trainer.optimizer.load_state_dict(last["optimizer"])
    trainer.scheduler.load_state_dict(last["scheduler"])
    for name, stream in trainer.streams.items():
        stream.load_state_dict(last["streams"][name])
    trainer.rng.setstate(last["rng"])
    set_random_states(last["random"])
    if last.get(REWRITE) and is_main():  # a damaged checkpoint.pt of last.pt's epoch (read_last)
        write_checkpoint(trainer, last["epoch"], last["records"][-1]["dev"])
    return last["best"], last["records"]


def state(trainer):
    """What last.pt keeps of the trainer (with the epoch, best and records: save_last); epochs
    and run (its id and arguments): what --resume holds run.json to (resume.py)."""
    held = modules(trainer)  # in last.pt's order: model, loss, ..., then memory, key_encoder
    return {"epochs": trainer.args.epochs, "run": trainer.run,
            "model": held.pop("model").state_dict(),
            "loss": held.pop("loss").state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
            "streams": {n: s.state_dict() for n, s in trainer.streams.items()},
            "rng": trainer.rng.getstate(), "random": random_states(),
            "memory_fill_seconds": trainer.fill_seconds,
            **{entry: module.state_dict() for entry, module in held.items()}}


def save(trainer, epoch, best, records):
    """An epoch's files in the run folder: checkpoint.pt if the epoch is the best (--save best)
    or every epoch (--save last), then with --tensorboard the epoch's events, then last.pt, then
    metrics.jsonl. Ctrl-C and SIGTERM wait until all are written. Curves that cannot be written
    stop the run in one line once the rest is saved: it resumes, this epoch's curves lost."""
    args, failed = trainer.args, None
    with signals_held():
        if best["epoch"] == epoch and args.save == "best" or args.save == "last":
            write_checkpoint(trainer, epoch, records[-1]["dev"])
        if trainer.curves:  # before last.pt: a kill -9 between them loses no event, and the
            # resumed run's START tells TensorBoard to drop the epoch it trains again (curves.py)
            trainer.curves.epoch(epoch * trainer.steps, records[-1])
            try:
                trainer.curves.write()
            except MinknnError as e:  # said below, once last.pt agrees with checkpoint.pt
                failed = e
        # then the state to resume from, then the records: a kill -9 between two of these
        # saves leaves last.pt one epoch behind, and the resumed run redoes that epoch
        save_last(args.out, epoch=epoch, best=best, records=records, **state(trainer))
        write_jsonl(os.path.join(args.out, "metrics.jsonl"), records)
    if failed:
        raise MinknnError(f"{failed}; the run stopped after epoch {epoch}, saved but for its "
                          f"curves: continue with python train.py --resume {args.out}")


def recorded_args(args):
    """The arguments checkpoint.pt keeps (run.json: all but --resume): the file flags only where
    they were given (a run of registered tasks keeps what it kept before them)."""
    return {k: v for k, v in vars(args).items() if not (k in FILE_FLAGS and v is None)}


def write_checkpoint(trainer, epoch, dev):
    """checkpoint.pt of the trainer's weights now, those of `epoch` with its dev scores."""
    save_checkpoint(os.path.join(trainer.args.out, "checkpoint.pt"), trainer.model, trainer.losses,
                    trainer.tokenizer, recorded_args(trainer.args), epoch, dev,
                    trainer.moco.memory if trainer.moco else None, data=trainer.data,
                    base=trainer.base, run=trainer.run["id"])


def begin(trainer, last, records):
    """A run's start, once all that can fail before its first step has passed: a new run's
    run.json (rank 0), a resumed run's data checked against it, each rank's dropout masks, the
    lines that say what the run is, then a new run's memory filled (its progress bar after
    them); with --tensorboard rank 0's curves (a resumed run's from the step after its last
    epoch). records: the epochs done (last.pt's)."""
    args, tasks, train, dev = trainer.args, trainer.tasks, trainer.train, trainer.dev
    if args.resume:
        check_same_data(args.out, trainer.data)
    else:  # from here on, a run to resume
        args.data_dir = trainer.data["root"]  # absolute: a resumed run reads the same files
        if is_main():
            saved = {k: v for k, v in recorded_args(args).items() if k != "resume"}
            write_json(os.path.join(args.out, "run.json"), {"id": secrets.token_hex(8),
                                                            "args": saved, "data": trainer.data})
            trainer.run = run_identity(args.out)  # what identifies it (minknn/tools/resume.py)
    if world() > 1:  # from here an error of this rank's is its own, which it says (says_errors)
        run_begun()
    if rank() > 0:  # its own dropout masks; rank 0 draws what one process would
        torch.manual_seed(random.Random(f"{args.seed} {rank()} {len(records)}").getrandbits(62))
    counts = ", ".join(f"{t.name} {len(train[t.name])}/{len(dev[t.name])}" for t in tasks)
    print(f"train/dev examples: {counts}{' (dev: a --max_eval subset)' if args.max_eval else ''}; "
          f"{sum(p.numel() for p in trainer.params):,} trainable parameters; "
          f"loss {args.loss or args.sts_loss}"
          f"{' + decoupled' if args.decoupled else ''}{'; PCGrad' if args.pcgrad else ''}"
          f"{'; heads fit as the probe' if args.head_init == 'probe' and not last else ''}"
          f"{named(args, tasks) if not last else ''}; "
          f"{trainer.steps} steps/epoch; {where(trainer)}; run folder {args.out}")
    if args.tensorboard and is_main():
        folder = os.path.join(args.out, "tensorboard")
        trainer.curves = Curves(folder, len(records) * trainer.steps + 1 if last else None)
        print(f"curves: TensorBoard's event files in {folder}, written each epoch "
              f"(tensorboard --logdir {args.out})")
    if trainer.moco and not last:  # the fill's progress bar after the line above
        fill_memory(trainer)
        print(f"memory: a {args.memory} of {args.queue_size} keys, filled in "
              f"{trainer.fill_seconds:.0f} s")


def named(args, tasks):
    """--proxy_init names: the names each task's proxies start from, as begin() prints them."""
    if args.proxy_init != "names":
        return ""
    return "; proxies at the class names " + "; ".join(
        f"{t.name}: " + ", ".join(repr(n) for n in t.names) for t in tasks
        if t.kind == loss_kind(args.loss))


def where(trainer):
    """The run's device, and under torchrun its processes."""
    return f"{trainer.device}{f' x {world()} processes' if trainer.ddp else ''}"


SAVED_NOTE = {"best": "", "none": ", not saved: --save none",
              "last": "; checkpoint.pt holds the last epoch: --save last"}


def finish(trainer, best, records):
    """A finished run's metrics.jsonl (whole), summary.json and last line (rank 0); last.pt goes,
    as nothing is left to resume. Returns the summary (None on the other ranks)."""
    if not is_main():
        return None
    args = trainer.args
    check_kept(args)  # last.pt goes below: never while checkpoint.pt is damaged
    # the records again: a kill -9 after the last epoch's last.pt left its metrics.jsonl behind
    write_jsonl(os.path.join(args.out, "metrics.jsonl"), records)
    summary = summarise(args, {"best": best, "records": records, "train": trainer.train,
                               "dev": trainer.dev, "steps": trainer.steps,
                               "losses": trainer.losses, "device": trainer.device,
                               "memory_fill_seconds": trainer.fill_seconds})
    os.remove(os.path.join(args.out, "last.pt"))
    decoupled = " + decoupled" if args.decoupled else ""
    print(f"done: {','.join(args.tasks)} {summary['loss']}{decoupled}"
          f"{' pcgrad' if args.pcgrad else ''} seed {args.seed}: best dev "
          f"{describe_run(trainer.tasks, best['dev'])} (epoch {best['epoch']}"
          f"{SAVED_NOTE[args.save]}); {summary['seconds_per_epoch']:.0f} s/epoch on "
          f"{where(trainer)}; {args.out}")
    return summary


def check_epoch_finite(epoch, model, losses, dev_scores):
    """Refuses to save an epoch whose dev scores or weights are not finite."""
    bad = [f"{task} {metric}" for task, scores in dev_scores.items() if isinstance(scores, dict)
           for metric, value in scores.items() if not math.isfinite(value)]
    if bad:
        raise Diverged(f"epoch {epoch}: the dev score{'s' * (len(bad) > 1)} {', '.join(bad)} "
                       f"{'are' if len(bad) > 1 else 'is'} not finite")
    for name, p in [*model.named_parameters(), *losses.named_parameters()]:
        if not torch.isfinite(p).all():
            raise Diverged(f"epoch {epoch}: the weight {name} is not finite")
