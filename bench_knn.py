"""What the kNN classifier and KNN-BERT's MoCo training cost, measured beside plain cross-entropy.

    MINKNN_DATA=../shared/data python bench_knn.py          # SST, the default model, CPU or CUDA
    python bench_knn.py --steps 10 --rounds 3 --k 64

1. Training. train.py's own train_step, on the same real SST batches (padded to their longest),
   for --loss ce and --loss knnbert (a queue of the whole training set, 8544 keys), alternating
   over a few rounds; each keeps its best round (on a shared 2-core machine one round moves by
   10-20%). It prints the seconds per step, their ratio (KNN-BERT reports 2.0x, 80 -> 162 s per
   epoch on RTE), the one-off queue fill, and where knnbert's extra time goes: the key encoder's
   forward pass, the momentum update, its loss over the queue (forward and backward), the enqueue.
2. Evaluation. Building the datastore of the training set (one forward pass), encoding the dev
   set (ms per query), and the kNN search and vote at K (ms per query), for both votes; the share
   kNN adds to an evaluation is (search + vote) / encoding.
The model is the pretrained default (--model), not a fine-tuned one: none of these costs depends
on the weights' values.
"""
import argparse
import random
import time

import torch

from minknn import run
from minknn.bert import BertModel, resolve_model_path
from minknn.data import load_split
from minknn.engine import autocast, encode_batch, pick_device, predict, to_device, TrainBatches
from minknn.kinds import kind_of
from minknn.knn import Datastore
from minknn.losses import build_losses
from minknn.model import Model
from minknn.moco import filled_memory
from minknn.tasks import get_task
from minknn.tokenizer import Tokenizer

import train as train_script
from bench import timed


class Trainer:
    """A model, its objective, optimiser and (for knnbert) filled MoCo queue, stepping train.py's train_step."""

    def __init__(self, loss, path, task, train, tokenizer, device, batches):
        self.args = train_script.get_args(["--loss", loss, "--task", task.name])
        torch.manual_seed(0)
        self.model = Model(BertModel.from_pretrained(path), [task], "mean").to(device)
        self.losses = build_losses(self.model, vars(self.args)).to(device)
        self.objective, self.task = self.losses[task.name], task
        self.params = list(self.model.parameters())
        self.optimizer, self.scheduler = train_script.make_optimizer(self.params, [], self.args, 10_000)
        self.moco, self.fill_seconds = None, None
        if loss == "knnbert":
            self.moco, self.fill_seconds = filled_memory(self.model, tokenizer, task, train, "queue", None,
                                                         self.args.momentum, 64, device)
        self.model.train()
        self.batches, self.train, self.tokenizer, self.device = batches, train, tokenizer, device

    def inputs(self, rows):
        batch = [self.train[i] for i in rows]
        return (to_device(encode_batch(self.tokenizer, batch), self.device),
                kind_of(self.task).targets(self.task, batch, self.device))

    def step(self, rows):
        inputs, labels = self.inputs(rows)
        batches = {self.task.name: (inputs, labels, torch.tensor(rows, device=self.device))}
        train_script.train_step(self.model, self.losses, self.optimizer, self.scheduler, self.params, batches, self.moco)

    def seconds_per_step(self):
        return timed(lambda: [self.step(rows) for rows in self.batches], self.device) / len(self.batches)


def knnbert_breakdown(trainer, device, repeats):
    """Seconds per step of each piece knnbert adds to a ce step."""
    moco, model = trainer.moco, trainer.model
    inputs, labels = trainer.inputs(trainer.batches[0])
    rows = torch.tensor(trainer.batches[0], device=device)
    with autocast(device):
        keys = moco.key_encoder(trainer.task.name, inputs)
    h = torch.randn(len(labels), keys.shape[1], device=device, requires_grad=True)

    def loss_over_queue():
        trainer.objective.metric(h, labels, keys, moco.memory.keys, moco.memory.labels, rows,
                                 moco.memory.ids).backward()

    def key_forward():
        with autocast(device):
            moco.key_encoder(trainer.task.name, inputs)

    return {"key encoder forward": timed(key_forward, device, repeats),
            "momentum update": timed(lambda: moco.key_encoder.update(model), device, repeats),
            "loss over the queue (fwd + bwd)": timed(loss_over_queue, device, repeats),
            "enqueue": timed(lambda: moco.memory.enqueue(keys, labels, rows), device, repeats)}


def main():
    p = argparse.ArgumentParser(description="cost of knnbert training and of kNN evaluation")
    p.add_argument("--model", default="minilm")
    p.add_argument("--task", default="sst")
    p.add_argument("--data_dir", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=10, help="training steps per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds per loss, alternating; the best counts")
    p.add_argument("--k", type=int, default=64)
    args = p.parse_args()
    device = pick_device(args.device)
    task = get_task(args.task)
    train, dev = load_split(task, "train", args.data_dir), load_split(task, "dev", args.data_dir)
    path = resolve_model_path(args.model)
    tokenizer = Tokenizer.from_folder(path, 128)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; {task.name}: {len(train)} train / {len(dev)} dev examples; batch 32")

    batches = [rows for rows, _ in zip(TrainBatches(len(train), 32, random.Random(0)), range(args.steps))]
    trainers = {loss: Trainer(loss, path, task, train, tokenizer, device, batches) for loss in ("ce", "knnbert")}
    seconds = {loss: float("inf") for loss in trainers}
    for _ in range(args.rounds):
        for loss, trainer in trainers.items():
            seconds[loss] = min(seconds[loss], trainer.seconds_per_step())
    steps_per_epoch = -(-len(train) // 32)
    print(f"\ntraining, best of {args.rounds} rounds of {args.steps} steps:")
    for loss in trainers:
        print(f"  {loss:>8}: {seconds[loss]:.3f} s/step, {seconds[loss] * steps_per_epoch:.0f} s per epoch of {steps_per_epoch} steps")
    print(f"  ratio knnbert / ce: {seconds['knnbert'] / seconds['ce']:.2f}x per step")
    fill = trainers["knnbert"].fill_seconds
    print(f"  queue fill, once per run: {fill:.1f} s ({100 * fill / (seconds['ce'] * steps_per_epoch):.0f}% of one ce epoch)")
    print("  where knnbert's extra time goes, per step:")
    for piece, s in knnbert_breakdown(trainers["knnbert"], device, args.steps).items():
        print(f"    {piece:<32} {1000 * s:8.2f} ms")
    del trainers

    print("\nevaluation:")
    torch.manual_seed(0)
    model = Model(BertModel.from_pretrained(path), [task], "mean").to(device)
    start = time.perf_counter()
    _, keys = predict(model, tokenizer, task, train, 64, device)
    datastore = Datastore(keys, [e.label for e in train], [e.id for e in train], len(task.labels))
    for vote in ("cosine", "distance"):
        datastore.index(vote)
    build = time.perf_counter() - start
    start = time.perf_counter()
    _, queries = predict(model, tokenizer, task, dev, 64, device)
    encode_ms = 1000 * (time.perf_counter() - start) / len(dev)
    print(f"  datastore build: {build:.1f} s for {len(datastore)} keys (one forward pass and both faiss indexes)")
    print(f"  encoder: {encode_ms:.2f} ms/query over the {len(dev)} dev examples")
    for vote in ("cosine", "distance"):
        def knn():
            scores, rows = datastore.search(queries, args.k, vote)
            datastore.vote(scores, rows, vote, 10.0)
        knn_ms = 1000 * timed(knn, device, 3) / len(dev)
        print(f"  kNN search and vote ({vote}, K {args.k}): {knn_ms:.3f} ms/query, +{100 * knn_ms / encode_ms:.1f}% on the encoder")


if __name__ == "__main__":
    run(main)
