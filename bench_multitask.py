"""What PCGrad costs: the time of one multi-task step with and without gradient surgery.

    MINKNN_DATA=../shared/data python bench_multitask.py                 # sst,mrpc,sts, cross pairs
    python bench_multitask.py --tasks sst,quora,sts --pair_mode siamese --steps 5 --rounds 3

Both runs step train.py's own train_step on the same real batches (one per task, batch 32,
padded to the longest, --max_len 64), from the same initial weights, alternating over a few rounds;
each keeps its best round (on a shared 2-core machine one round moves by 10-20%). Without PCGrad
the step sums the task losses and runs one backward; with it, each task's loss gets its own
backward, the K gradients of the shared encoder are copied out, projected (minknn/pcgrad.py) and
written back. The breakdown times each piece of a PCGrad step alone, and counts how many task
pairs had conflicting gradients (g_i . g_j < 0) on the timed batches.
The model is the pretrained default (--model), not a fine-tuned one: the costs do not depend on
the weights' values, but the conflict count does.
"""
import argparse
import random

import torch

import train as train_script
from bench import timed
from minknn import run
from minknn.bert import BertModel, resolve_model_path
from minknn.data import load_split
from minknn.engine import autocast, encode_batch, pick_device, to_device, TrainBatches
from minknn.kinds import kind_of
from minknn.losses import build_losses
from minknn.model import Model
from minknn.pcgrad import project_conflicting
from minknn.tasks import get_task
from minknn.tokenizer import Tokenizer


class Trainer:
    """A multi-task model, its losses and optimiser, stepping train.py's train_step."""

    def __init__(self, args, path, tasks, device):
        torch.manual_seed(0)
        self.model = Model(BertModel.from_pretrained(path), tasks, "mean", args.pair_mode).to(device).train()
        self.loss_fns = build_losses(self.model, vars(args)).to(device)
        self.params = list(self.model.parameters())
        self.shared = list(self.model.bert.parameters())
        self.optimizer, self.scheduler = train_script.make_optimizer(self.params, [], args, 10_000)

    def step(self, batches, pcgrad):
        train_script.train_step(self.model, self.loss_fns, self.optimizer, self.scheduler, self.params, batches,
                                pcgrad=pcgrad, rng=random.Random(0))

    def losses(self, batches):
        """Each task's loss on its batch, each from its own forward pass, as train_step computes them."""
        losses = []
        for name, (inputs, targets, _) in batches.items():
            with autocast(targets.device):
                losses.append(self.loss_fns[name](self.model(name, **inputs), targets)[0])
        return losses

    def task_gradients(self, batches):
        """(K, P): each task's gradient on the shared encoder, flattened."""
        grads = []
        for loss in self.losses(batches):
            found = torch.autograd.grad(loss, self.shared, allow_unused=True)  # the pooler is unused
            grads.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(found, self.shared)]))
        return torch.stack(grads)


def breakdown(trainer, batches, device, repeats):
    """Seconds of each piece of a PCGrad step, on one set of batches."""
    grads = trainer.task_gradients(batches)
    shared = trainer.shared

    def forward():
        trainer.losses(batches)

    def summed_backward():
        sum(trainer.losses(batches)).backward()

    def one_backward_per_task():
        for loss in trainer.losses(batches):
            loss.backward()

    rows = torch.zeros_like(grads)

    def gather_and_scatter():  # what pcgrad_backward copies: each task's .grad into its row, the sum back
        for p in shared:
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad
        for k in range(len(grads)):
            offset = 0
            for p in shared:
                rows[k, offset:offset + p.numel()] = p.grad.reshape(-1)
                p.grad.zero_()
                offset += p.numel()
        update, offset = grads.sum(0), 0
        for p in shared:
            p.grad.copy_(update[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def optimizer():
        torch.nn.utils.clip_grad_norm_(trainer.params, 1.0)
        trainer.optimizer.step()

    trainer.optimizer.zero_grad()
    fwd = timed(forward, device, repeats)
    pieces = {"forward passes and losses": fwd,
              "backward, summed loss": timed(summed_backward, device, repeats) - fwd,
              "backward, one per task": timed(one_backward_per_task, device, repeats) - fwd,
              "copy out / write back the gradients": timed(gather_and_scatter, device, repeats),
              "projection (project_conflicting)": timed(lambda: project_conflicting(grads, random.Random(0)), device, repeats),
              "clip + AdamW step": timed(optimizer, device, repeats)}
    trainer.optimizer.zero_grad()
    return pieces, grads


def main():
    p = argparse.ArgumentParser(description="the time of a multi-task step with and without PCGrad")
    p.add_argument("--model", default="minilm")
    p.add_argument("--tasks", default="sst,mrpc,sts")
    p.add_argument("--pair_mode", default="cross", choices=["cross", "siamese"])
    p.add_argument("--data_dir", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=5, help="steps per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds per setting, alternating; the best counts")
    args = p.parse_args()
    device = pick_device(args.device)
    tasks = [get_task(name) for name in args.tasks.split(",")]
    path = resolve_model_path(args.model)
    tokenizer = Tokenizer.from_folder(path, 64)
    train = {t.name: load_split(t, "train", args.data_dir) for t in tasks}
    streams = {t.name: TrainBatches(len(train[t.name]), 32, random.Random(0)) for t in tasks}
    steps = []
    for _ in range(args.steps):
        step = {}
        for t in tasks:
            rows = next(streams[t.name])
            examples = [train[t.name][i] for i in rows]
            step[t.name] = (to_device(encode_batch(tokenizer, examples, t.pair and args.pair_mode == "siamese"), device),
                            kind_of(t).targets(t, examples, device), torch.tensor(rows, device=device))
        steps.append(step)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    lengths = ", ".join(f"{t.name} {steps[0][t.name][0]['input_ids'].shape[1]}" for t in tasks)
    print(f"device: {name}; tasks {args.tasks}, {args.pair_mode} pairs, batch 32 per task (first step's lengths: {lengths})")

    train_args = train_script.get_args(["--task", "multitask", "--tasks", args.tasks, "--pair_mode", args.pair_mode])
    trainers = {pcgrad: Trainer(train_args, path, tasks, device) for pcgrad in (False, True)}
    seconds = {pcgrad: float("inf") for pcgrad in trainers}
    for _ in range(args.rounds):
        for pcgrad, trainer in trainers.items():
            per_step = timed(lambda: [trainer.step(batches, pcgrad) for batches in steps], device) / len(steps)
            seconds[pcgrad] = min(seconds[pcgrad], per_step)
    print(f"\nbest of {args.rounds} rounds of {args.steps} steps:")
    print(f"  summed losses: {seconds[False]:.3f} s/step")
    print(f"  PCGrad:        {seconds[True]:.3f} s/step")
    print(f"  ratio PCGrad / summed: {seconds[True] / seconds[False]:.2f}x")

    pieces, conflicts, pairs = None, 0, 0
    for batches in steps:
        found, grads = breakdown(trainers[False], batches, device, 1)
        pieces = found if pieces is None else {k: min(v, found[k]) for k, v in pieces.items()}
        conflicts += int(((grads @ grads.T).triu(1) < 0).sum())
        pairs += len(tasks) * (len(tasks) - 1) // 2
    print(f"\nwhere a step's time goes (best of {args.steps} batches, {sum(p.numel() for p in trainers[True].shared):,} shared parameters):")
    for piece, s in pieces.items():
        print(f"  {piece:<38} {1000 * s:8.1f} ms")
    print(f"\nconflicting task pairs (g_i . g_j < 0) on these batches: {conflicts} of {pairs}")


if __name__ == "__main__":
    run(main)
