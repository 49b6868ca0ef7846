"""Checkpoints that rebuild a run on another machine, written so a crash never corrupts one;
last.pt, the state a stopped run resumes from; and what --resume checks of both (at the end).

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
    data         {"root", "train_fingerprint": {task: sha256}}: the data root the run read and its
                 training examples' fingerprints (data.run_data), for evaluate.py
    contents_sha256   the checksum of every entry above (content_sha256), checked on loading
It is written whole, with a checksum of its contents, and refused in one line when damaged
(minknn/tools/files.py: atomic_save, sealed, check_contents).
"""
import dataclasses
import glob
import os

import torch

from minknn import MinknnError
from minknn.bert import BertConfig
from minknn.datastore import AGAIN, read_file as read_datastore
from minknn.losses import build_losses
from minknn.model import Model
from minknn.tasks.data import data_root
from minknn.tasks.own_task import from_record
from minknn.tasks.registry import TASKS, get_task
from minknn.tokenizer import MPNetTokenizer, RobertaTokenizer, Tokenizer
from minknn.tools.distributed import is_main
from minknn.tools.files import (CHECKSUM, atomic_save, check_contents, content_sha256, file_sha256,
                                load_tagged, sealed)
from minknn.tools.weights import check_finite, check_fits, read_weights, weights_file

FORMAT = "minknn-checkpoint-2"


def save_checkpoint(path, model, losses, tokenizer, args, epoch, dev, memory=None, data=None,
                    base=None):
    """base: for a frozen encoder, base_model() of the folder it was loaded from; the encoder's
    weights are then left out, as that folder holds them."""
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


# ---------------------------------------------------------------------------------------------
# What --resume checks before it trains: every file of the stopped run that it goes on from or
# keeps, before the model and the data are read (minknn/tools/trainer.py calls read_last first).
#     last.pt         whole (load_last), and planned for run.json's epochs: it records
#                     the epochs it was saved under (a last.pt from before that record: its
#                     learning rate, 0 only after the schedule's last step, tells instead)
#     checkpoint.pt   whole (readable, its format tag, its checksum) and this run's: the epoch
#                     --save kept so far (last.pt's records say which, with its dev scores)
#     datastore-*.pt  whole: the kNN datastores evaluate.py --knn saved beside it
# A finishing run deletes last.pt, so a damaged checkpoint.pt would be its best model, and the last
# good copy of that epoch's weights gone. When last.pt holds the very epoch checkpoint.pt held
# (--save best: last.pt's epoch is the best so far; --save last: always), the checkpoint is written
# again from it once the run is restored (trainer.restore: the rebuilt run's parts and last.pt's
# weights), with a note; else --resume stops in one line, both files left as they are. A whole
# checkpoint that is not this run's (another run's file in its place) is never overwritten: one
# line too.

REWRITE = "rewrite_checkpoint"  # in last.pt's state as read_last returns it: checkpoint.pt's damage


def read_last(args):
    """--resume: last.pt's state (None if no epoch finished), checked against run.json, and the
    run's checkpoint.pt and datastores checked; then the run's first line, where it goes on (rank
    0), before the model's and the data's lines. A checkpoint.pt to write again from last.pt is
    noted in the state (REWRITE) and said after that line."""
    # a memory loss's last.pt also holds its memory, and a queue's its key encoder
    needs = {"queue": ("memory", "key_encoder"), "bank": ("memory",)}.get(args.memory, ())
    last = load_last(args.out, needs)
    if last:
        check_planned(args, last)
    damage = check_checkpoint(args, last)
    check_datastores(args.out)
    done = last["epoch"] if last else 0
    if is_main():
        where = (f"from epoch {done + 1} of {args.epochs}" if done < args.epochs
                 else f"after its last epoch ({done}): the run only finishes")
        print(f"resuming {args.out} {where}")
    if damage:
        last[REWRITE] = damage
        if is_main():
            print(f"note: {os.path.join(args.out, 'checkpoint.pt')} was damaged ({damage}); "
                  f"written again from last.pt, which holds its epoch ({last['epoch']})")
    return last


def check_planned(args, last):
    """run.json's epochs must be those last.pt was saved under: fewer would stop a run that had
    further to go (or has done more), more would stretch a schedule half done. A last.pt of the
    last epoch is a run stopped after its last save (Ctrl-C, SIGTERM, kill -9) but before it
    finished, which --resume finishes without training."""
    planned, done = last.get("epochs"), last["epoch"]
    if planned is None:  # a last.pt from before the record: its schedule tells
        edited = done > args.epochs or done == args.epochs and not schedule_ended(last)
    else:
        edited = planned != args.epochs
    if edited:
        said = f"has done {done}" if done >= args.epochs else f"planned {planned}"
        raise MinknnError(f"--resume {args.out}: run.json's epochs is {args.epochs}, and the run "
                          f"{said} (last.pt); was the file edited?")


def schedule_ended(last):
    """Whether last.pt (its state) was saved after the run's last step: train.py's schedule
    (make_optimizer) brings every group's lr down to exactly 0 there, and nowhere before. Only
    for a last.pt without its epochs: a student's schedule may end elsewhere."""
    return all(group["lr"] == 0 for group in last["optimizer"]["param_groups"])


def check_checkpoint(args, last):
    """Why the run's checkpoint.pt is damaged, in words, when last.pt holds its epoch (the file
    can be written again from there); None when it is whole, or the run has none to keep. Refused
    in one line: a damaged one whose epoch last.pt no longer holds, and a whole one that is not
    this run's."""
    path = os.path.join(args.out, "checkpoint.pt")
    if last is None or args.save == "none" or not os.path.exists(path):
        return None  # no epoch done (the run starts over), or none kept (run.open_run_folder)
    kept = last["epoch"] if args.save == "last" else last["best"]["epoch"]
    ckpt, damage = read_whole(path)
    if damage is None:
        other = not_this_runs(ckpt, last, kept)
        if other:
            raise MinknnError(f"--resume {args.out}: {path} is a whole checkpoint, but not this "
                              f"run's: {other}; put the run's own back (this file and last.pt are "
                              f"left as they are)")
        return None
    if kept != last["epoch"]:
        raise MinknnError(f"--resume {args.out}: {path}, the {args.save} epoch so far ({kept}), is "
                          f"damaged ({damage}), and last.pt holds epoch {last['epoch']}, not that "
                          f"one: epoch {kept}'s weights are lost. Both files are left as they are; "
                          f"put back a good copy of checkpoint.pt, or train the run again")
    return damage


def check_kept(args):
    """Before a finishing run deletes last.pt: its checkpoint.pt must still be whole (damaged
    since --resume checked it, or while this run trained), else one line, last.pt left in place."""
    path = os.path.join(args.out, "checkpoint.pt")
    if args.save == "none" or not os.path.exists(path):
        return
    damage = read_whole(path)[1]
    if damage:
        raise MinknnError(f"{path} is damaged ({damage}); last.pt, the last epoch's state, is left "
                          f"in {args.out}: put back a good copy of checkpoint.pt, or train the run "
                          f"again")


def read_whole(path):
    """(the checkpoint at path, None), or (None, why it is damaged, in words): unreadable (cut
    short, not a zip), without a format tag, or its contents off their checksum. A checkpoint of
    another format is whole: (it, None), for not_this_runs to refuse."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        return None, f"it cannot be read: {type(e).__name__}"
    if not isinstance(ckpt, dict) or "format" not in ckpt:
        return None, "it is not a minknn checkpoint: no format tag"
    saved = ckpt.pop(CHECKSUM, None)
    if saved is not None and content_sha256(ckpt) != saved:
        return None, "its contents do not match the checksum saved with it"
    return ckpt, None


def not_this_runs(ckpt, last, kept):
    """Why a whole checkpoint is not the run's kept epoch, in words, or None. kept: the epoch
    last.pt says it holds, with the dev scores last.pt's records give that epoch; or the epoch
    after last.pt's (a kill between that epoch's checkpoint.pt and its last.pt)."""
    epoch = ckpt.get("epoch")
    if ckpt["format"] != FORMAT:
        return f"its format is {ckpt['format']!r}, not {FORMAT!r}"
    if epoch == last["epoch"] + 1:
        return None
    dev = {r["epoch"]: r["dev"] for r in last["records"]}.get(kept)
    if epoch != kept or ckpt.get("dev") != dev:
        return (f"it holds epoch {epoch}{' with other dev scores' if epoch == kept else ''}, "
                f"where last.pt says the epoch kept so far is {kept}")
    return None


def check_datastores(folder):
    """The kNN datastores evaluate.py --knn saved in the run folder must be whole (their format
    tag and checksum): one line naming a damaged one, with what to do."""
    for path in sorted(glob.glob(os.path.join(folder, "datastore-*.pt"))):
        try:
            read_datastore(path)
        except MinknnError as e:
            then = "" if AGAIN in str(e) else f"; {AGAIN}"
            raise MinknnError(f"--resume {folder}: {e}{then}") from None
