"""Fine-tune BERT on one task, or on several at once.

    python train.py --task sst                       # cross-entropy, the default model, 3 epochs
    python train.py --task sst --loss proxyanchor    # 0.5 CE + 0.5 Proxy Anchor (minknn/losses/)
    python train.py --task rte --loss knnbert        # 0.9 CE + 0.1 KNN-BERT's loss, a MoCo queue
    python train.py --task multitask --tasks sst,mrpc,sts --pcgrad   # one BERT, three heads
    python train.py --resume runs/RUN                # a stopped run goes on from its last epoch
    torchrun --nproc_per_node 4 train.py --task sst  # one run on 4 GPUs (or CPU processes)

Each step takes one batch of every task of the run; their losses are summed (with --pcgrad their
gradients are combined by gradient surgery) and AdamW takes one step. After each epoch the dev set
is scored and the run folder (--out) gets the epoch's files: checkpoint.pt holds the best epoch.
Every flag: python train.py --help (minknn/tools/options.py). What a run is made of, built once from
the flags: minknn/tools/trainer.py. The loop's defaults, the run folder, resuming and torchrun:
docs/runs.md.
"""
import time

import torch

from minknn import progress_bar
from minknn.assignment.parts import require_written
from minknn.kinds import describe_run
from minknn.probe import fit_head
from minknn.tools import distributed
from minknn.tools.cli import run
from minknn.tools.engine import autocast, pick_device
from minknn.tools.inference import dev_scores
from minknn.tools.options import get_args, parts_run
from minknn.tools.run import Diverged, run_folder
from minknn.tools.step import batch, forward
from minknn.tools.trainer import begin, build, check_epoch_finite, finish, restore, save


def make_optimizer(model_params, loss_params, args, total_steps):
    """AdamW; no weight decay on biases and LayerNorm weights (the usual BERT recipe); the loss's
    parameters (proxies) get their own learning rate and no weight decay. fused=True: one kernel
    updates every tensor, where the default loops over them in Python; on this project's CPU it
    made the step of 22.7M parameters several times faster (python -m minknn.lab.bench epoch)."""
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


def train_step(trainer, batches):
    """One optimiser step on one batch of each task (batches: task -> (inputs, targets, rows);
    trainer: the run's model, losses, optimiser and the rest, minknn/tools/trainer.py's Trainer).
    Returns each task's loss and its terms (CE and the metric term), and with --pcgrad how many
    task pairs' gradients conflicted. The forward and the losses run under --precision
    (engine.autocast); the weights and gradients stay fp32."""
    outputs, keys = forward(trainer, batches)  # minknn/tools/step.py: under torchrun, gathered
    task_losses, terms = {}, {}
    for name, (_, targets, rows) in batches.items():
        # a memory loss also sees the batch's keys, the memory, and the rows that name each
        # query's own keys in it
        memory = (keys, trainer.moco.memory, rows) if trainer.moco else ()
        with autocast(targets.device, trainer.args.precision):
            task_losses[name], terms[name] = trainer.losses[name](outputs[name], targets, *memory)
        if not torch.isfinite(task_losses[name]):
            raise Diverged(f"the {name} loss became {task_losses[name].item()}")
    optimizer, scheduler, params = trainer.optimizer, trainer.scheduler, trainer.params
    pcgrad, rng = trainer.pcgrad, trainer.rng  # --pcgrad's (None without), the run's rng
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
    if trainer.moco:  # after the step, the batch's keys join the memory (minknn/memory.py)
        (name, (_, targets, rows)), = batches.items()  # a memory loss's run has one task
        trainer.moco.after_step(keys, targets, rows, outputs[name].z)
    return task_losses, terms, conflicts


def train_epoch(trainer, epoch):
    """One epoch of steps, one batch of every task per step. Returns each task's mean training
    loss, and with --pcgrad the count of task pairs whose gradients conflicted. With
    --tensorboard each step's losses, lr and conflicts also go to the run's curves."""
    trainer.model.train()
    totals, terms_sum, conflicts = dict.fromkeys(trainer.train, 0.0), {}, 0
    first = trainer.tasks[0].name
    bar = progress_bar(range(trainer.steps), desc=f"epoch {epoch}/{trainer.args.epochs}",
                       disable=not distributed.is_main())
    for step in bar:
        rows = {name: next(stream) for name, stream in trainer.streams.items()}
        lr = trainer.optimizer.param_groups[0]["lr"]  # the lr this step takes
        try:
            task_losses, terms, found = train_step(trainer, batch(trainer, rows))
        except Diverged as e:
            raise Diverged(f"epoch {epoch}, step {step + 1}: {e}") from None
        conflicts += found or 0
        losses = {name: loss.item() for name, loss in task_losses.items()}  # one .item() each
        values = {name: {term: v.item() for term, v in terms[name].items()} for name in terms}
        for name, loss in losses.items():
            totals[name] += loss
            for term, value in values[name].items():  # CE (or BCE) and the metric term
                terms_sum[term] = terms_sum.get(term, 0.0) + value
        if trainer.curves:  # --tensorboard: kept, written with the epoch's files (curves.py)
            trainer.curves.step((epoch - 1) * trainer.steps + step + 1, lr, losses, values, found)
        shown = {"loss": totals[first], **terms_sum} if len(totals) == 1 else totals
        bar.set_postfix({k: f"{v / (step + 1):.4f}" for k, v in shown.items()})  # means so far
    return {name: total / trainer.steps for name, total in totals.items()}, conflicts


def end_epoch(trainer, epoch, train_loss, conflicts, seconds, best, records):
    """An epoch's dev scores, its record (appended to records), its files (checkpoint.pt if it is
    the best) and its line. Returns the best epoch so far."""
    args, tasks = trainer.args, trainer.tasks
    for t in tasks:  # a loss that trains no head (SetFit's): the head is a logistic regression
        if not trainer.losses[t.name].trains_head:  # on the trained encoder's z (probe.py)
            fit_head(trainer.model, trainer.tokenizer, t, trainer.train[t.name],
                     2 * args.batch_size, trainer.device, args.precision)
    dev = dev_scores(trainer.model, trainer.losses, trainer.tokenizer, tasks, trainer.dev, args,
                     trainer.device)  # minknn/tools/inference.py
    check_epoch_finite(epoch, trainer.model, trainer.losses, dev)
    record = {"epoch": epoch, "train_loss": train_loss, "epoch_seconds": round(seconds, 1),
              "dev": dev}
    if args.pcgrad:  # how often surgery had something to do: the share of pairs in conflict
        pairs = trainer.steps * len(tasks) * (len(tasks) - 1) // 2
        record["conflicting_pairs"] = round(conflicts / pairs, 4)
    records.append(record)
    is_best = best is None or dev["overall"] > best["dev"]["overall"]
    if is_best:
        best = {"epoch": epoch, "dev": dev}
    save(trainer, epoch, best, records)
    mark = f" (best{', saved' if args.save == 'best' else ''})" if is_best else ""
    mark += " (saved: --save last)" if args.save == "last" else ""
    print(f"epoch {epoch}: train loss {', '.join(f'{v:.4f}' for v in train_loss.values())}; "
          f"dev {describe_run(tasks, dev)}{mark}; {seconds:.0f} s")
    return best


def run_training(args, device=None):
    """The run: its parts built (or restored from last.pt), then one epoch after another; rank 0
    alone scores and saves each. Returns the run's summary (None on the other ranks)."""
    trainer, last = build(args, make_optimizer, device=device)  # minknn/tools/trainer.py
    best, records = restore(trainer, last) if last else (None, [])
    begin(trainer, last, records)  # run.json, each rank's dropout, what the run is (printed)
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
    return finish(trainer, best, records)  # summary.json, the last line


def main(argv=None):
    args = get_args(argv)  # minknn/tools/options.py, checked by checks.py before anything is read
    require_written(parts_run(args))  # a student edition: the parts this run calls are written
    # torchrun: this process is a rank; the run folder held, Ctrl-C and SIGTERM, divergence
    with distributed.processes(pick_device(args.device)) as device, run_folder(args):
        return run_training(args, device)


if __name__ == "__main__":
    run(main)
