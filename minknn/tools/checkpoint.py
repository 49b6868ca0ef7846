"""Checkpoints that rebuild a run on another machine, written so a crash never corrupts one;
last.pt, the state a stopped run resumes from (what --resume checks of both: minknn/tools/resume.py).

A checkpoint is one torch.save'd dict:
    format       "minknn-checkpoint-2"
    args         the exact train.py arguments (a dict)
    tasks        task name -> {"kind", "labels", "pair"}, checked against the registry on loading;
                 for your own files' task also "own": their paths, sha256s, columns and how
                 their labels read (minknn/tasks/own_task.py), the task rebuilt from it alone
    bert_config  the encoder's config (a dict), so no model folder is needed to rebuild; its
                 model_type is the architecture (bert, roberta, distilbert or mpnet:
                 minknn/backbones.py)
    vocab, lowercase, max_len, tokenizer   the tokenizer and its options (tokenizer_config.json)
    merges       RoBERTa's only: its BPE rules, in order (the vocabulary alone cannot tokenise)
    model, loss  the state dicts of the model (encoder and heads) and of the tasks' losses
                 (proxies, when a loss has some)
    base_model   only when the encoder was frozen (--option pretrain): {"folder", "sha256"}, the
                 base model's folder (absolute) and its weights file's sha256. `model` then holds
                 only what trained (the heads, the --decoupled retrieval head), kilobytes instead
                 of the encoder's 91 MB: rebuild loads the encoder from that folder and refuses
                 it if its weights changed since the run.
    memory       the MoCo queue (keys, labels, the rows of the keys' examples, pointer) or memory
                 bank, for the memory losses only
    epoch, dev   the epoch it was saved after and its dev scores
    run          the id of the run that saved it (its run.json's "id"), which --resume holds it
                 to; none in a checkpoint from before the id
    data         {"root", "train_fingerprint": {task: sha256}}: the data root the run read and its
                 training examples' fingerprints (data.run_data), for evaluate.py
    contents_sha256   the checksum of every entry above (content_sha256), checked on loading
It is written whole, with a checksum of its contents, and refused in one line when damaged
(minknn/tools/files.py: atomic_save, sealed, check_contents).
"""
import dataclasses
import os

import torch

from minknn import MinknnError
from minknn.bert import BertConfig
from minknn.losses import build_losses
from minknn.model import Model
from minknn.tasks.data import data_root
from minknn.tasks.own_task import from_record
from minknn.tasks.registry import TASKS, get_task
from minknn.tokenizer import MPNetTokenizer, RobertaTokenizer, Tokenizer
from minknn.tools.files import (atomic_save, check_contents, file_sha256, load_tagged,
                                sealed)
from minknn.tools.weights import check_finite, check_fits, read_weights, weights_file

FORMAT = "minknn-checkpoint-2"


def save_checkpoint(path, model, losses, tokenizer, args, epoch, dev, memory=None, data=None,
                    base=None, run=None):
    """base: for a frozen encoder, base_model() of the folder it was loaded from; the encoder's
    weights are then left out, as that folder holds them. run: the run's id (run.json)."""
    if base is not None and any(p.requires_grad for p in model.bert.parameters()):
        raise ValueError("save_checkpoint: `base` leaves out the encoder, but this one trains")
    state = model.state_dict() if base is None else without_encoder(model.state_dict())
    atomic_save(sealed({
        "format": FORMAT, "args": dict(args),
        "tasks": {name: {"kind": t.kind, "labels": list(t.labels), "pair": t.pair,
                         **({"own": t.own} if t.own else {})}  # your files (own_task.py)
                  for name, t in model.tasks.items()},
        "bert_config": dataclasses.asdict(model.bert.config),
        "vocab": tokenizer.vocab, "lowercase": tokenizer.lowercase, "max_len": tokenizer.max_len,
        "tokenizer": tokenizer.options,
        **({"merges": tokenizer.merges} if isinstance(tokenizer, RobertaTokenizer) else {}),
        "model": state, "loss": losses.state_dict(), "epoch": epoch, "dev": dev,
        **({"memory": memory.state_dict()} if memory is not None else {}),
        **({"data": data} if data is not None else {}),
        **({"base_model": base} if base is not None else {}),
        **({"run": run} if run is not None else {}),
    }), path)


def without_encoder(state):
    """A model's state dict less the encoder's tensors (bert.*)."""
    return {k: v for k, v in state.items() if not k.startswith("bert.")}


def base_model(folder):
    """What a checkpoint without its frozen encoder records to load it again: the model folder,
    absolute, and its weights file's sha256."""
    return {"folder": os.path.abspath(folder), "sha256": file_sha256(weights_file(folder))}


def base_weights(base, name):
    """The frozen encoder's weights from the base model's folder (read_weights), refused in one
    line when the folder is gone or its weights are not the ones the run trained on."""
    folder = base["folder"]
    if not os.path.isdir(folder):
        raise MinknnError(f"{name}: its base model {folder} is not a folder here; the run froze "
                          f"BERT (--option pretrain), so the checkpoint holds only its heads and "
                          f"loads the encoder from there (put the model back)")
    now = file_sha256(weights_file(folder))
    if now != base["sha256"]:
        raise MinknnError(f"{name}: the base model {folder} changed since the run: its weights' "
                          f"sha256 is {now}, not {base['sha256']}")
    return read_weights(folder)


def load_checkpoint(path):
    """path: a run folder (holding checkpoint.pt) or the checkpoint file itself."""
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint.pt")
    if not os.path.exists(path):  # a run folder's reasons for having none: run.no_checkpoint
        raise MinknnError(f"--checkpoint {path}: not found")
    ckpt = load_tagged(path, FORMAT, (f"--checkpoint {path}", "checkpoint"),
                       "evaluate a copy kept elsewhere, or train the run again")
    ckpt["file"] = path
    return ckpt


def data_dir_of(ckpt, data_dir):
    """The data root to score a checkpoint's run on (evaluate.py, the attack): data_dir (the
    --data_dir flag), else the root the run trained on (recorded in its checkpoint) when it is a
    folder here, else $MINKNN_DATA, else ./data. A root other than the run's is said in one line;
    a recorded root that is gone, with no flag and no $MINKNN_DATA, is refused in one line."""
    recorded = ckpt["data"]["root"] if "data" in ckpt else None
    env = os.environ.get("MINKNN_DATA")
    if data_dir or recorded is None:  # the flag, or a checkpoint from before the record
        data_root(data_dir)  # a root that is not a folder stops here, before the model
        if recorded is not None:
            say_elsewhere(data_dir, "--data_dir", recorded)
        return data_dir
    if os.path.isdir(recorded):
        aside = f", not $MINKNN_DATA's {env}" if env and not same_folder(env, recorded) else ""
        print(f"data: {recorded}, the run's{aside} (--data_dir for another)")
        return recorded
    if not env:
        raise MinknnError(f"--checkpoint {ckpt['file']}: the run read its data from {recorded}, "
                          f"which is not a folder here; give --data_dir (or MINKNN_DATA)")
    data_root()  # $MINKNN_DATA must be a folder too
    say_elsewhere(env, "MINKNN_DATA", recorded, " (not a folder here)")
    return env


def same_folder(a, b):
    return os.path.abspath(a) == os.path.abspath(b)


def say_elsewhere(root, source, recorded, why=""):
    """The one line of a run scored on a data root other than the one it trained on."""
    if not same_folder(root, recorded):
        print(f"data: scoring on data root {root} (from {source}), not the root the run "
              f"trained on, {recorded}{why}")


REQUIRED = ("args", "tasks", "bert_config", "vocab", "lowercase", "max_len", "model", "loss")


def rebuild(ckpt):
    """Returns (model, losses, tokenizer) from a loaded checkpoint alone (one without its frozen
    encoder: and its base model's folder). A checkpoint missing an entry, or whose weights do not
    fit the model its config builds, is refused in one line."""
    name = f"--checkpoint {ckpt.get('file', '')}".rstrip()
    args = ckpt.get("args", {})
    missing = [k for k in REQUIRED if k not in ckpt] + \
              [f"args['{k}']" for k in ("pooling", "pair_mode", "decoupled") if k not in args]
    missing += [k for k in ("args", "tasks", "bert_config", "model", "loss", "base_model")
                if k in ckpt and not isinstance(ckpt[k], dict)]  # present, but not a dict
    base = ckpt.get("base_model")
    if isinstance(base, dict):
        missing += [f"base_model['{k}']" for k in ("folder", "sha256") if k not in base]
    if missing:
        raise MinknnError(f"{name}: has no {', '.join(missing)}; it is not a whole minknn "
                          f"checkpoint (train the run again)")
    # the tokenizer's options; a checkpoint that stored only `lowercase` used the defaults
    options = ckpt.get("tokenizer", {"lowercase": ckpt["lowercase"]})
    config = BertConfig.from_dict(ckpt["bert_config"], f"{name}: bert_config")
    if config.model_type == "roberta":  # byte-level BPE: its merges were saved with the vocabulary
        if not isinstance(ckpt.get("merges"), list):
            raise MinknnError(f"{name}: has no merges (RoBERTa's BPE rules); it is not a whole "
                              f"minknn checkpoint (train the run again)")
        tokenizer = RobertaTokenizer(ckpt["vocab"], ckpt["merges"], ckpt["max_len"], **options)
    else:  # WordPiece: BERT's and DistilBERT's, or MPNet's with its special tokens
        kind = MPNetTokenizer if config.model_type == "mpnet" else Tokenizer
        tokenizer = kind(ckpt["vocab"], max_len=ckpt["max_len"], **options)
    model = Model.from_config(config, checkpoint_tasks(ckpt), args["pooling"], args["pair_mode"],
                              args["decoupled"])
    if base is not None:  # the frozen encoder: the run's config, the base model's weights
        model.bert.load_weights(*base_weights(base, name))
    losses = build_losses(model, args)
    for part, module in (("model", model), ("loss", losses)):
        for k, v in ckpt[part].items():
            check_finite(k, v, f"{name}: {part}")
        partial = part == "model" and base is not None  # all but the encoder, loaded above
        own = without_encoder(module.state_dict()) if partial else module.state_dict()
        check_fits(own, ckpt[part], f"{name}: {part}", "its bert_config, tasks and args")
        module.load_state_dict(ckpt[part], strict=not partial)
    return model, losses, tokenizer


def checkpoint_tasks(ckpt):
    """The run's Tasks, from the registry (for their files and readers), checked against what
    the checkpoint was trained on."""
    tasks = []
    for name, saved in ckpt["tasks"].items():
        if isinstance(saved, dict) and isinstance(saved.get("own"), dict):  # your files' task
            tasks.append(from_record(name, saved))
            continue
        task = TASKS[name] if name in TASKS else get_task(name)  # an unknown name: get_task's error
        if task.labels is None:  # AAPD: its labels came from its data
            task = dataclasses.replace(task, labels=saved["labels"])
        if task.kind != saved["kind"] or list(task.labels) != saved["labels"] \
                or task.pair != saved["pair"]:
            raise MinknnError(f"--checkpoint was trained on {name} as a {saved['kind']} task with "
                              f"labels {saved['labels']}, but {name} is now a {task.kind} task "
                              f"with labels {task.labels}")
        tasks.append(task)
    return tasks


# ---------------------------------------------------------------------------------------------
# last.pt: the state a stopped run resumes from (minknn/tools/run.py says when it is written)

LAST_FORMAT = "minknn-last-1"


def save_last(folder, **state):
    """last.pt: the state, its format tag and its checksum (files.sealed)."""
    atomic_save(sealed({"format": LAST_FORMAT, **state}), os.path.join(folder, "last.pt"))


# what train.py reads from last.pt to resume (a memory loss: "memory", and "key_encoder" too)
LAST_ENTRIES = ("epoch", "best", "records", "model", "loss", "optimizer", "scheduler", "streams",
                "rng", "random", "memory_fill_seconds")
LAST_SUB_ENTRIES = {"random": ("python", "torch", "numpy"), "memory": ("keys",)}


def load_last(folder, needs=()):
    """The state last.pt holds, or None when no epoch completed (the run starts again). A file
    that cannot be read, is damaged (its checksum), or lacks an entry LAST_ENTRIES or `needs`
    names, is refused in one line."""
    path = os.path.join(folder, "last.pt")
    if not os.path.exists(path):
        return None
    best = os.path.join(folder, "checkpoint.pt")
    kept = f"; the best checkpoint is still in {best}" if os.path.exists(best) else ""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise MinknnError(f"{path}: cannot be read ({type(e).__name__}){kept}") from None
    if not isinstance(state, dict) or state.get("format") != LAST_FORMAT:
        raise MinknnError(f"{path}: not a minknn run state (no '{LAST_FORMAT}' format tag)")
    again = f"delete it, and --resume starts the run over from its first epoch{kept}"
    state = check_contents(state, path, again)
    missing = [k for k in (*LAST_ENTRIES, *needs) if k not in state]
    missing += [k for k in ("model", "loss", "optimizer", "scheduler", "streams", "random",
                            "memory", "key_encoder")
                if k in state and not isinstance(state[k], dict)]  # present, but not a dict
    missing += [f"{k}['{sub}']" for k, subs in LAST_SUB_ENTRIES.items() for sub in subs
                if isinstance(state.get(k), dict) and sub not in state[k]]
    if missing:
        raise MinknnError(f"{path}: has no {', '.join(missing)}; it is not a whole run state "
                          f"({again})")
    return state


def check_last_fits(state, folder, modules, streams):
    """last.pt's weights must fit the run's modules (modules: its entry -> the module it loads
    into: the model, the losses, a memory loss's memory and key encoder) and hold every task's
    batch stream, before any of them is loaded: one line naming the part, not load_state_dict's
    traceback."""
    path = os.path.join(folder, "last.pt")
    for entry, module in modules.items():
        check_fits(module.state_dict(), state[entry], f"{path}: {entry}", "the run's arguments")
    missing = [name for name in streams if name not in state["streams"]]
    if missing:
        raise MinknnError(f"{path}: has no batch stream of {', '.join(missing)}; it is not the "
                          f"state of this run's tasks")
