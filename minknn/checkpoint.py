"""Checkpoints that rebuild a run on another machine, written so a crash never corrupts one.

A checkpoint is one torch.save'd dict:
    format       "minknn-checkpoint-1"
    args         the exact train.py arguments (a dict)
    task, labels the task name and its class names
    tasks        multi-task runs only (train.py --task multitask, or one pair task): task name ->
                 {"kind", "labels"}, and "labels" is None
    bert_config  the BERT config (a dict), so no model folder is needed to rebuild
    vocab, lowercase, max_len   the tokenizer
    model, loss  the state dicts of the classifier and of the loss (proxies, when it has some)
    memory       the MoCo queue (keys, labels, pointer) or memory bank, for the memory losses only
    epoch, dev   the epoch it was saved after and its dev metrics
It is written to a temporary file in the same folder, flushed to disk, then renamed over the old
one: os.replace is atomic, so a kill mid-save leaves the previous checkpoint as it was.
"""
import dataclasses
import os
import tempfile

import torch

from minknn import MinknnError
from minknn.bert import BertConfig
from minknn.data import get_task
from minknn.losses import Objective, loss_flags
from minknn.model import Classifier
from minknn.multitask import MultiTaskLoss, MultiTaskModel
from minknn.tokenizer import Tokenizer

FORMAT = "minknn-checkpoint-1"


def atomic_save(obj, path, writer=torch.save):
    """writer(obj, file) writes to a temporary file that is renamed to `path` once complete."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            writer(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_checkpoint(path, model, loss, tokenizer, task, args, epoch, dev, memory=None):
    """task: the run's Task, or a list of Tasks for a multi-task model (MultiTaskModel)."""
    tasks = {"tasks": {t.name: {"kind": t.kind, "labels": list(t.labels)} for t in task}} if isinstance(task, list) else {}
    atomic_save({
        "format": FORMAT, "args": dict(args), "task": args["task"] if tasks else task.name,
        "labels": None if tasks else list(task.labels), **tasks,
        "bert_config": dataclasses.asdict(model.bert.config),
        "vocab": tokenizer.vocab, "lowercase": tokenizer.lowercase, "max_len": tokenizer.max_len,
        "model": model.state_dict(), "loss": loss.state_dict(), "epoch": epoch, "dev": dev,
        **({"memory": memory.state_dict()} if memory is not None else {}),
    }, path)


def load_tagged(path, format_tag, what):
    """The dict torch.save'd at path, refused with one line unless it carries `format_tag`.
    what: how the error names the file and its kind, e.g. ("--checkpoint x.pt", "checkpoint")."""
    name, kind = what
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise MinknnError(f"{name}: not a minknn {kind} ({type(e).__name__})") from None
    if not isinstance(obj, dict) or obj.get("format") != format_tag:
        raise MinknnError(f"{name}: not a minknn {kind} (no '{format_tag}' format tag)")
    return obj


def load_checkpoint(path):
    """path: a run folder (holding checkpoint.pt) or the checkpoint file itself."""
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint.pt")
    if not os.path.exists(path):
        raise MinknnError(f"--checkpoint {path}: not found")
    return load_tagged(path, FORMAT, (f"--checkpoint {path}", "checkpoint"))


def rebuild(ckpt):
    """Returns (model, loss, tokenizer) from a loaded checkpoint alone."""
    args = ckpt["args"]
    tokenizer = Tokenizer(ckpt["vocab"], ckpt["lowercase"], ckpt["max_len"])
    config = BertConfig(**ckpt["bert_config"])
    if "tasks" in ckpt:
        tasks = checkpoint_tasks(ckpt)
        model = MultiTaskModel.from_config(config, tasks, args["pooling"], args["pair_mode"])
        loss = MultiTaskLoss(tasks, config.hidden_size, args["loss"], args.get("lam"), args["sts_loss"], args["pair_loss"])
    else:
        decoupled = args.get("decoupled", False)
        model = Classifier.from_config(config, len(ckpt["labels"]), args["pooling"], decoupled=decoupled)
        loss = Objective(args["loss"], len(ckpt["labels"]), config.hidden_size, args.get("lam"), decoupled,
                         **loss_flags(args["loss"], args))
    model.load_state_dict(ckpt["model"])
    loss.load_state_dict(ckpt["loss"])
    return model, loss, tokenizer


def checkpoint_tasks(ckpt):
    """The Tasks of a multi-task checkpoint, checked against the registry they were trained from."""
    tasks = []
    for name, saved in ckpt["tasks"].items():
        task = get_task(name)
        if task.kind != saved["kind"] or list(task.labels) != saved["labels"]:
            raise MinknnError(f"--checkpoint was trained on {name} as a {saved['kind']} task with labels "
                              f"{saved['labels']}, but {name} is now a {task.kind} task with labels {task.labels}")
        tasks.append(task)
    return tasks
