"""`multitask`: a PCGrad step against a summed-loss step (train.py's own train_step on runs built
as train.py builds them, from the same weights on the same batches), and where PCGrad's time
goes: the forward passes, one backward per task against one of the summed loss, the surgery on
the Gram matrix against Algorithm 1 on the gradients themselves.
"""
import random

import torch

from minknn.lab.bench.shared import Table, built, device_name, fixed_batches, precision_of, step
from minknn.tasks.data import load_split
from minknn.tasks.registry import get_task
from minknn.tools.engine import autocast
from minknn.tools.step import batch


def bench_multitask(args, device, timer, out):
    from minknn.pcgrad import pcgrad_coefficients
    tasks = [get_task(name, args.data_dir) for name in args.tasks.split(",")]
    train = {t.name: load_split(t, "train", args.data_dir) for t in tasks}
    rows = fixed_batches(train, tasks, 32, args.steps)
    argv = ["--task", "multitask", "--tasks", args.tasks, "--pair_mode", args.pair_mode,
            "--max_len", "64"]
    trainers = {pcgrad: built(args, argv + (["--pcgrad"] if pcgrad else []), train, device)
                for pcgrad in (False, True)}
    steps = [batch(trainers[False], r) for r in rows]
    seconds = timer.best_of_rounds({pcgrad: (lambda t=t: [step(t, b) for b in steps])
                                    for pcgrad, t in trainers.items()})
    summed, pcgrad = seconds[False] / len(steps), seconds[True] / len(steps)
    out.append(f"`python -m minknn.lab.bench multitask`: {device_name(device)}, "
               f"{precision_of(device)}; train.py's train_step on the same {args.steps} steps of "
               f"one real batch of 32 from each of {args.tasks} ({args.pair_mode} pairs, "
               f"--max_len 64), from the same weights, best of {args.rounds} alternating rounds\n")
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

    def gradient(loss):  # one task's, on the shared weights, flat; zeros for the pooler's
        grads = torch.autograd.grad(loss, shared, allow_unused=True)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                          for g, p in zip(grads, shared)])
    grads = torch.stack([gradient(loss) for loss in losses()])
    forward = timer.seconds(losses, args.steps)
    pieces = {"the forward passes and losses": forward,
              "backward of the summed loss":
                  timer.seconds(lambda: sum(losses()).backward(), args.steps) - forward,
              "one backward per task": timer.seconds(per_task_backward, args.steps) - forward,
              "the surgery: Gram matrix, Algorithm 1 on it, the weighted sum": timer.seconds(
                  lambda: pcgrad_coefficients(grads @ grads.T,
                                              random.Random(0)).sum(0).float() @ grads,
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
