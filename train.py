"""Fine-tune BERT on one task, or on several at once.

    python train.py --task sst                       # cross-entropy, the default model, 3 epochs
    python train.py --task cfimdb --option pretrain  # frozen BERT, train the head only
    python train.py --task sst --max_train 500 --seed 1
    python train.py --task sst --loss proxyanchor    # 0.5 CE + 0.5 Proxy Anchor (minknn/losses/)
    python train.py --task rte --loss knnbert        # 0.9 CE + 0.1 KNN-BERT's loss, a MoCo queue
    python train.py --task sst --decoupled           # 0.5 CE + 0.5 triplet on a retrieval head
    python train.py --task reuters --loss mlcon      # multi-label: BCE + 0.1 Su et al.'s loss
    python train.py --task cr --per_class 8 --loss setfit --epochs 1 --batch_size 16 --lr 2e-5 \
        --warmup 0.1                                 # SetFit: cosine pairs, then a logistic head
    python train.py --task multitask --tasks sst,mrpc,sts --pcgrad   # one BERT, three heads
    python train.py --task sst --save none           # the dev scores only: no checkpoint (grids)
    torchrun --nproc_per_node 4 train.py --task sst  # one run on 4 GPUs (or CPU processes)

A run is a list of tasks (--task T, or --task multitask --tasks a,b,c) sharing one encoder,
each with its own head and loss as its kind says (minknn/kinds.py: classify, similarity,
multilabel). Each step takes one batch of every task; their losses are summed, or with --pcgrad
their gradients combined by gradient surgery (minknn/pcgrad.py). An epoch is one pass over the
largest task; a smaller task starts a new shuffled pass when it runs out. --steps N trains N
steps in all instead, whatever the data's size (Zhang et al. 2021, "Revisiting Few-sample BERT
Fine-tuning"), the dev set scored every N / --epochs of them. AdamW, linear warm-up over the
first 6% of the run's steps then linear decay to 0, gradients clipped to norm 1; a loss's own
parameters (proxies) get --proxy_lr. --head_init probe (the default with --option pretrain)
starts each classification and multi-label head as a logistic regression fit on the encoder as
loaded (LP-FT, Kumar et al. 2022; minknn/probe.py). A memory loss (knnbert, moco) keeps a
MoCo queue or memory bank (minknn/memory.py), filled before the first step and written after each.
--loss setfit steps over batches of SetFit's pairs, and its head is fit by logistic regression
(minknn/probe.py) at the end of each epoch, before the dev set is scored
(minknn/losses/setfit.py). This file holds the flags, the optimiser and the training step, and
the loop; the parts a run is made of (data, model, losses, memory, optimiser, batch streams) are
built, restored from last.pt and saved by minknn/trainer.py, which bench.py builds its runs with
too.

Under torchrun (minknn/distributed.py: gloo on the CPU, NCCL on CUDA, one GPU per process) a run
is the same run: --batch_size stays the global batch, each process encodes its slice of every
step's batch, and the losses see the outputs of the whole batch, gathered; the steps, schedule
and examples do not change with the number of processes, and --resume continues a run under any
number of them. Rank 0 alone holds the folder, scores the dev set, prints and writes the files.

Each run writes to its own folder (--out, a folder holding no run; default
runs/<task>-<loss>-seed<S>-<time>), which no other run may use (minknn/runs.py):
    checkpoint.pt   the best epoch by the dev score (rebuilds model and tokenizer alone): 91 MB
                    with the default model. With --option pretrain BERT stays the base model's,
                    so it holds only what trained (heads, proxies) and names the base model's
                    folder and weights' sha256, which must be there unchanged to evaluate it:
                    0.5 MB, nearly all of it the vocabulary. --save none writes no checkpoint:
                    the scores below are all the run keeps (a grid of runs); --save last
                    keeps the last epoch's instead, written every epoch (a fixed recipe that no
                    dev labels choose: the runner's --select none)
    metrics.jsonl   one line per epoch: training losses and dev scores
    summary.json    the final summary, also printed as one line ("stopped" if it did not finish)
    run.json, last.pt, run.lock   the arguments, the state after the last completed epoch, and
                    the lock held while training (removed when the run ends); a run stopped by
                    Ctrl-C, SIGTERM, kill -9 or a crash goes on from its last completed epoch
                    with `python train.py --resume RUN`
Ctrl-C and SIGTERM (a cluster stopping or preempting the job) stop a run the same way: the files
of an epoch already being saved are finished first, summary.json says "stopped": "interrupted"
(or "terminated"), one line says how to go on, and the exit status is 130 (or 143, 128 + 15,
as a shell reports a process that SIGTERM ended). checkpoint.pt and last.pt carry a checksum of
their contents: a file damaged on disk is refused in one line, not evaluated or resumed from.
A task's dev score is its first metric (accuracy; CoLA's MCC; Pearson; multi-label micro-F1);
a run's, the mean over its tasks, each put in [0, 1] (minBERT's overall score). A loss, gradient
norm, dev score or weight that is not finite stops the run before anything of it is saved.
"""
import contextlib
import os
import random
import sys
import time

import torch
from tqdm import tqdm

from minknn import MinknnError, Terminated, distributed, sigterm_raises
from minknn.cli import run
from minknn.parts import BY_NAME, require_written
from minknn.bert import ATTENTION, ATTENTIONS
from minknn.engine import PRECISIONS, autocast, default_precision, pick_device
from minknn.kinds import describe_run
from minknn.losses import LOSSES, MEMORY_LOSSES, PAIR_LOSSES, STS_LOSSES
from minknn.losses.mlcon import REDUCTIONS as MLCON_REDUCTIONS
from minknn.model import POOLINGS
from minknn.memory import QUEUE_SIZE
from minknn.cli import Parser
from minknn.options import DEFAULT_TASKS, check_args, resumed_args
from minknn.probe import fit_head
from minknn.proxy import PROXY_LOSSES
from minknn.runs import (best_so_far, check_same_data, close_run_folder, load_last, open_folder,
                         summarise, write_json)
from minknn.tasks import TASKS
from minknn.trainer import (Diverged, batch, build, check_epoch_finite, evaluate, forward,
                            restore, save)


def get_args(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    if args.resume is not None:
        return resumed_args(p, args)
    check_args(p, args)
    # resolved here, so that the run's args (saved in the checkpoint) say which ones it used
    args.precision = args.precision or default_precision(pick_device(args.device))
    return args


def make_parser():
    p = Parser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("data")
    g.add_argument("--task", default="sst", help=f"one of: {', '.join(TASKS)}; or multitask")
    g.add_argument("--data_dir", help="dataset root (default: $MINKNN_DATA, else ./data)")
    g.add_argument("--max_train", type=int, help="train on N examples per task (classes kept) "
                   "(default: all)")
    g.add_argument("--per_class", type=int, help="train on N examples of each class (default: all)")
    g.add_argument("--max_eval", type=int, help="score a fixed subset of N dev examples per "
                   "task (default: all)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default="minilm", help="minilm (the default weights), or a Hugging "
                   "Face BERT, RoBERTa or DistilBERT folder")
    g.add_argument("--option", default="finetune", choices=["finetune", "pretrain"],
                   help="finetune trains everything; pretrain freezes BERT, trains the heads")
    g.add_argument("--pooling", default="mean", choices=POOLINGS, help="z from the hidden states")
    g.add_argument("--max_len", type=int, default=128, help="longer texts are truncated")
    g.add_argument("--attention", default=ATTENTION, choices=ATTENTIONS,
                   help="attention() as written in minknn/bert.py, or PyTorch's fused kernel")
    g.add_argument("--pair_mode", default="cross", choices=["cross", "siamese"],
                   help="pair tasks: [CLS] a [SEP] b [SEP] as one sequence, or each text alone")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=3, help="passes over the (largest) training set; "
                   "with --steps, how many times the dev set is scored")
    g.add_argument("--steps", type=int, help="train N optimiser steps in all, whatever the "
                   "training set's size (Zhang et al. 2021), a multiple of --epochs: each epoch is "
                   "N / --epochs steps (default: --epochs passes over the largest task)")
    g.add_argument("--batch_size", type=int, default=32, help="examples per batch, per task; "
                   "under torchrun the global batch, split between the processes")
    g.add_argument("--lr", type=float, help="learning rate (default: 5e-5, pretrain 1e-3)")
    g.add_argument("--proxy_lr", type=float, help="the proxies' (default: 100 x --lr)")
    g.add_argument("--weight_decay", type=float, default=0.01, help="not on biases and LayerNorm")
    g.add_argument("--warmup", type=float, default=0.06, help="share of the steps warming up")
    g.add_argument("--head_init", choices=["random", "probe"], help="the classification and "
                   "multi-label heads' start: random, or probe: a logistic regression fit on the "
                   "encoder as loaded, before the first step (LP-FT, minknn/probe.py) (default: "
                   "random; probe with --option pretrain, whose head starts as that regression)")
    g.add_argument("--seed", type=int, default=0, help="the init, batches, dropout, the draw")
    g.add_argument("--device", default="auto", help="auto (CUDA if available), cpu or cuda")
    g.add_argument("--precision", choices=PRECISIONS, help="bf16 autocast or plain fp32 "
                   "(default: bf16 on CUDA, fp32 on the CPU)")
    g = p.add_argument_group("losses")
    g.add_argument("--loss", help=f"one of: {', '.join(LOSSES)} (default: ce; multi-label: bce)")
    g.add_argument("--lam", type=float, help="the metric loss's weight (default: the loss's own)")
    g.add_argument("--decoupled", action="store_true", help="add Liang et al.'s retrieval head")
    g.add_argument("--sts_loss", default="mse", choices=list(STS_LOSSES), help="similarity tasks")
    g.add_argument("--pair_loss", choices=list(PAIR_LOSSES), help="siamese paraphrase tasks: "
                   "this metric loss on the two texts' vectors (default: none)")
    g.add_argument("--m_most", type=int, help="knnbert: most similar positives (default: 50)")
    g.add_argument("--m_least", type=int, help="knnbert: least similar positives (default: 100)")
    g.add_argument("--mlcon_reduction", choices=MLCON_REDUCTIONS, help="mlcon: L_con summed over "
                   "the batch as Su et al. write it, or its mean over the examples that share a "
                   "label with another, on BCE's scale (minknn/losses/mlcon.py) (default: sum)")
    g.add_argument("--setfit_iterations", type=int, help="setfit: R, rounds of one positive and "
                   "one negative pair per example (default: 20); an epoch is a pass over the pairs")
    g = p.add_argument_group("memory (knnbert, moco)")
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
    p.add_argument("--resume", metavar="RUN", help="continue a stopped run from its last "
                   "completed epoch, with its own flags (only --device may change) (default: start "
                   "a new run)")
    return p


def make_optimizer(model_params, loss_params, args, total_steps):
    """AdamW; no weight decay on biases and LayerNorm weights (the usual BERT recipe); the loss's
    parameters (proxies) get their own learning rate and no weight decay. fused=True: one kernel
    updates every tensor, where the default loops over them in Python; on this project's CPU it
    made the step of 22.7M parameters several times faster (bench.py epoch)."""
    # Three parameter groups, as BERT's released fine-tuning code makes them:
    #   the weight matrices (p.ndim >= 2)     weight_decay args.weight_decay
    #   biases and LayerNorm weights          weight_decay 0.0; the parameters come without their
    #                                         names: these are the ones with p.ndim < 2
    #   loss_params (the proxies)             weight_decay 0.0, and their own "lr": args.proxy_lr
    # in torch.optim.AdamW(groups, lr=args.lr, fused=True), the decay apart from the adaptive step.
    # The schedule multiplies every group's lr at step s (0 for the first optimizer.step()) by
    #     min((s + 1) / warmup, max(0, (total_steps - s) / max(1, total_steps - warmup)))
    # with warmup = max(1, int(args.warmup * total_steps)) steps (a share of the steps, not of the
    # epochs): from lr / warmup up to lr, then linearly down to 0 at total_steps. LambdaLR(opt, f)
    # calls f(s). Return (the optimiser, the scheduler).
    # BEGIN part training
    decay = [p for p in model_params if p.ndim >= 2]
    no_decay = [p for p in model_params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0},
                             {"params": loss_params, "weight_decay": 0.0, "lr": args.proxy_lr}],
                            lr=args.lr, fused=True)
    warmup = max(1, int(args.warmup * total_steps))

    def schedule(step):  # the factor on every group's lr: up over `warmup` steps, down to 0
        up, down = (step + 1) / warmup, (total_steps - step) / max(1, total_steps - warmup)
        return min(up, max(0.0, down))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    # END part training


def train_step(model, losses, optimizer, scheduler, params, batches, moco=None, pcgrad=None,
               rng=random, precision=None, ddp=None):
    """One optimiser step on one batch of each task (batches: task -> (inputs, targets, rows)).
    Returns each task's loss and parts, and with --pcgrad (pcgrad: the run's PCGrad of the
    shared encoder) how many task pairs' gradients conflicted. A memory loss's key encoder makes
    the keys first; they join the memory after.
    The forward passes run under --precision (engine.autocast); the backward follows their
    dtypes, and the weights and their gradients stay fp32.
    Under torchrun (ddp: the run's DistributedDataParallel) each batch's inputs are this rank's
    slice, and the losses see the outputs of the whole batch, gathered (minknn/trainer.py
    forward()); the backward of their sum averages the gradients over the ranks."""
    task_losses, parts = {}, {}
    if ddp is not None:  # a PCGrad step averages its gradients itself (minknn/pcgrad.py)
        outputs = forward(model, batches, ddp.module if pcgrad else ddp, precision)
    for name, (inputs, targets, rows) in batches.items():
        with autocast(targets.device, precision):
            keys = moco.batch_keys(model, inputs, rows) if moco else None
            output = outputs[name] if ddp is not None else model(name, **inputs)
            # a memory loss also sees the memory, and the rows that name each query's own keys
            memory_args = (keys, moco.memory, rows) if moco else ()
            task_losses[name], parts[name] = losses[name](output, targets, *memory_args)
        if not torch.isfinite(task_losses[name]):
            raise Diverged(f"the {name} loss became {task_losses[name].item()}")
    # The step, in this order: (1) optimizer.zero_grad(set_to_none=True), so that the last step's
    # gradients go; (2) backpropagate the sum of the task losses, or with --pcgrad call
    # conflicts = pcgrad.backward(list(task_losses.values()), rng) instead (it fills .grad itself;
    # without --pcgrad conflicts is None); (3) clip the gradients of `params`, the proxies'
    # included, to a total norm of 1 (torch.nn.utils.clip_grad_norm_, which returns the norm
    # before clipping: one that is not finite raises Diverged here, before the step, so that the
    # weights stay finite); (4) optimizer.step(); (5) scheduler.step(): once per step, after it.
    # BEGIN part training
    optimizer.zero_grad(set_to_none=True)
    conflicts = None
    if pcgrad is not None:  # surgery on the shared encoder only: each head is its own task's
        conflicts = pcgrad.backward(list(task_losses.values()), rng)
    else:
        sum(task_losses.values()).backward()
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    if not torch.isfinite(norm):  # before the step: the weights stay finite
        raise Diverged(f"the gradient norm became {norm.item()}")
    optimizer.step()
    scheduler.step()
    # END part training
    if moco:
        moco.after_step(keys, targets, rows, output.embeddings)
    return task_losses, parts, conflicts


def parts_run(args):
    """The parts of the assignment (minknn/assignment.py) this run calls: BERT, pooling and the
    training step, and the run's metric loss, memory, PCGrad and proxy inference where it has
    them. In a student edition one not written yet stops the run before anything is read."""
    parts = ["embeddings", "layer", "pooling", "training"]
    parts += ["attention"] * (args.attention == "explicit")
    # a loss's part has its name (moco's is moco-loss); ce, bce, mse and --decoupled's have none
    parts += [p for p in ({"moco": "moco-loss"}.get(args.loss, args.loss), args.pair_loss)
              if p in BY_NAME]
    parts += ["memory"] * (args.loss in MEMORY_LOSSES) + ["pcgrad"] * args.pcgrad
    # a proxy loss at --lam 1 is scored by its proxies (minknn/trainer.py evaluate())
    parts += ["proxy-inference"] * (args.lam == 1 and args.loss in PROXY_LOSSES)
    return parts


def main(argv=None):
    args = get_args(argv)
    require_written(parts_run(args))
    if not distributed.launched():
        return train_in_folder(args)
    _, _, device = distributed.setup(pick_device(args.device))  # torchrun: this process is a rank
    try:  # rank 0 alone prints (the others' errors still reach stderr)
        with open(os.devnull, "w") as quiet, \
                contextlib.redirect_stdout(sys.stdout if distributed.is_main() else quiet):
            return train_in_folder(args, device)
    finally:
        distributed.teardown()


def train_in_folder(args, device=None):
    """The run in its folder (a new one, or --resume's), held while it trains; under torchrun
    rank 0 alone holds and writes it. Ctrl-C, SIGTERM and divergence end it as the module
    docstring says."""
    lock, created = None, []
    try:
        if distributed.is_main():  # the folder first: a run training in it stops this one
            lock, created = open_folder(args)
    finally:  # the other ranks learn the folder rank 0 opened, or that it could not
        args.out = distributed.broadcast_object(args.out if lock else None)
    if args.out is None:  # not rank 0: it says why
        sys.exit(2)
    try:
        with sigterm_raises():  # a cluster's SIGTERM stops the run as Ctrl-C does
            return run_training(args, device)
    except KeyboardInterrupt as e:
        how, status = ("terminated", 143) if isinstance(e, Terminated) else ("interrupted", 130)
        if distributed.is_main():
            last = load_last(args.out)
            where = best_so_far(args, last) if last else "no epoch had finished"
            if summarise(args, last, stopped=how) is None:  # before the first step
                print(f"\n{how} before the first step; nothing was saved", file=sys.stderr)
            else:
                print(f"\n{how}: {where}; continue with: python train.py --resume {args.out}",
                      file=sys.stderr)
        sys.exit(status)
    except Diverged as e:
        if not distributed.is_main():  # every rank stops at the same step; rank 0 says why
            sys.exit(2)
        last = load_last(args.out)
        kept = best_so_far(args, last) if last else "nothing was saved"
        summarise(args, last, stopped=f"diverged: {e}")
        raise MinknnError(f"{e}; the run stopped and {kept}; try a lower --lr") from None
    except RuntimeError as e:
        if not distributed.lost_peer(e):
            raise
        # under torchrun: a collective lost a rank that failed (its own error comes first), and
        # torchrun stops the others
        if distributed.is_main():
            summarise(args, load_last(args.out), stopped="failed: another rank failed")
        raise MinknnError(f"rank {distributed.rank()} stopped: another rank failed (see its "
                          f"error); continue with: python train.py --resume {args.out}") from None
    finally:
        if lock:
            close_run_folder(args.out, lock, created)


def run_training(args, device=None):
    trainer, last = build(args, make_optimizer, device=device)  # minknn/trainer.py
    best, records = restore(trainer, last) if last else (None, [])
    if args.resume:
        check_same_data(args.out, trainer.data)
    else:  # all that can fail before the first step has passed: from here on, a run to resume
        args.data_dir = trainer.data["root"]  # absolute: a resumed run reads the same files
        if distributed.is_main():
            write_json(os.path.join(args.out, "run.json"),
                       {"args": {k: v for k, v in vars(args).items() if k != "resume"},
                        "data": trainer.data})
    if distributed.rank() > 0:  # its own dropout masks; rank 0 draws what one process would
        torch.manual_seed(random.Random(f"{args.seed} {distributed.rank()} {len(records)}")
                          .getrandbits(62))
    tasks, train, dev, steps = trainer.tasks, trainer.train, trainer.dev, trainer.steps
    sizes = ", ".join(f"{t.name} {len(train[t.name])}/{len(dev[t.name])}" for t in tasks)
    ranks = f" x {distributed.world()} processes" if trainer.ddp else ""
    print(f"train/dev examples: {sizes}{' (dev: a --max_eval subset)' if args.max_eval else ''}; "
          f"{sum(p.numel() for p in trainer.params):,} trainable parameters; "
          f"loss {args.loss or args.sts_loss}"
          f"{' + decoupled' if args.decoupled else ''}{'; PCGrad' if args.pcgrad else ''}"
          f"{'; heads fit as the probe' if args.head_init == 'probe' and not last else ''}; "
          f"{steps} steps/epoch; {trainer.device}{ranks}; run folder {args.out}")
    if trainer.moco and not last:
        print(f"memory: a {args.memory} of {args.queue_size} keys, filled in "
              f"{trainer.fill_seconds:.0f} s")
    if last:
        print(f"resumed after epoch {last['epoch']} of {args.epochs}")

    for epoch in range(len(records) + 1, args.epochs + 1):
        start = time.time()
        train_loss, conflicts = train_epoch(trainer, epoch)
        seconds = time.time() - start
        stop = None
        if distributed.is_main():  # rank 0 alone scores and saves the epoch
            try:
                best = end_epoch(trainer, epoch, train_loss, conflicts, seconds, best, records)
            except Diverged as e:
                stop = e
        if distributed.broadcast_object(stop is not None):  # the other ranks wait for rank 0
            raise stop or Diverged(f"epoch {epoch}: rank 0 found it not finite")

    if not distributed.is_main():
        return None
    summary = summarise(args, {"best": best, "records": records, "train": train, "dev": dev,
                               "steps": steps, "losses": trainer.losses,
                               "device": trainer.device,
                               "memory_fill_seconds": trainer.fill_seconds})
    os.remove(os.path.join(args.out, "last.pt"))  # finished: nothing left to resume
    decoupled = " + decoupled" if args.decoupled else ""
    print(f"done: {','.join(args.tasks)} {summary['loss']}{decoupled}"
          f"{' pcgrad' if args.pcgrad else ''} seed {args.seed}: best dev "
          f"{describe_run(tasks, best['dev'])} (epoch {best['epoch']}{SAVED_NOTE[args.save]}); "
          f"{summary['seconds_per_epoch']:.0f} s/epoch on {trainer.device}{ranks}; {args.out}")
    return summary


SAVED_NOTE = {"best": "", "none": ", not saved: --save none",
              "last": "; checkpoint.pt holds the last epoch: --save last"}


def end_epoch(trainer, epoch, train_loss, conflicts, seconds, best, records):
    """An epoch's dev scores, its record (appended to records), its files (checkpoint.pt if it is
    the best) and its line. Returns the best epoch so far."""
    args, tasks = trainer.args, trainer.tasks
    if args.loss == "setfit":  # SetFit's head: a logistic regression on the trained encoder's z
        fit_head(trainer.model, trainer.tokenizer, tasks[0], trainer.train[tasks[0].name],
                 2 * args.batch_size, trainer.device, args.precision)
    dev_scores = evaluate(trainer.model, trainer.losses, trainer.tokenizer, tasks, trainer.dev,
                          args, trainer.device)
    check_epoch_finite(epoch, trainer.model, trainer.losses, dev_scores)
    record = {"epoch": epoch, "train_loss": train_loss, "epoch_seconds": round(seconds, 1),
              "dev": dev_scores}
    if args.pcgrad:  # how often surgery had something to do: the share of pairs in conflict
        pairs = trainer.steps * len(tasks) * (len(tasks) - 1) // 2
        record["conflicting_pairs"] = round(conflicts / pairs, 4)
    records.append(record)
    is_best = best is None or dev_scores["overall"] > best["dev"]["overall"]
    if is_best:
        best = {"epoch": epoch, "dev": dev_scores}
    save(trainer, epoch, best, records)
    saved = ", saved" if args.save == "best" else ""
    mark = f" (best{saved})" if is_best else ""
    mark += " (saved: --save last)" if args.save == "last" else ""
    print(f"epoch {epoch}: train loss {', '.join(f'{v:.4f}' for v in train_loss.values())}; "
          f"dev {describe_run(tasks, dev_scores)}{mark}; {seconds:.0f} s")
    return best


def train_epoch(trainer, epoch):
    """One epoch of steps, one batch of every task per step. Returns each task's mean training
    loss, and with --pcgrad the count of task pairs whose gradients conflicted."""
    trainer.model.train()
    totals, terms_sum, conflicts = dict.fromkeys(trainer.train, 0.0), {}, 0
    first = trainer.tasks[0].name
    bar = tqdm(range(trainer.steps), desc=f"epoch {epoch}/{trainer.args.epochs}",
               disable=not distributed.is_main())
    for step in bar:
        rows = {name: next(stream) for name, stream in trainer.streams.items()}
        try:
            task_losses, terms, found = train_step(
                trainer.model, trainer.losses, trainer.optimizer, trainer.scheduler,
                trainer.params, batch(trainer, rows), trainer.moco, trainer.pcgrad, trainer.rng,
                trainer.args.precision, trainer.ddp)
        except Diverged as e:
            raise Diverged(f"epoch {epoch}, step {step + 1}: {e}") from None
        conflicts += found or 0
        for name, loss in task_losses.items():
            totals[name] += loss.item()
            for term, value in terms[name].items():  # CE (or BCE) and the metric term
                terms_sum[term] = terms_sum.get(term, 0.0) + value.item()
        shown = {"loss": totals[first], **terms_sum} if len(totals) == 1 else totals
        bar.set_postfix({k: f"{v / (step + 1):.4f}" for k, v in shown.items()})  # means so far
    return {name: total / trainer.steps for name, total in totals.items()}, conflicts


if __name__ == "__main__":
    run(main)
