"""Checkpoints that rebuild a run on another machine, written so a crash never corrupts one.

A checkpoint is one torch.save'd dict:
    format       "minknn-checkpoint-2"
    args         the exact train.py arguments (a dict)
    tasks        task name -> {"kind", "labels", "pair"}, checked against the registry on loading
    bert_config  the encoder's config (a dict), so no model folder is needed to rebuild; its
                 model_type is the architecture (bert, roberta or distilbert: minknn/backbones.py)
    vocab, lowercase, max_len, tokenizer   the tokenizer and its options (tokenizer_config.json)
    merges       RoBERTa's only: its BPE rules, in order (the vocabulary alone cannot tokenise)
    model, loss  the state dicts of the model (encoder and heads) and of the tasks' losses
                 (proxies, when a loss has some)
    base_model   only when the encoder was frozen (--option pretrain): {"folder", "sha256"}, the
                 base model's folder (absolute) and its weights file's sha256. `model` then holds
                 only what trained (the heads, the --decoupled retrieval head), kilobytes instead
                 of the encoder's 91 MB: rebuild loads the encoder from that folder and refuses
                 it if its weights changed since the run.
    memory       the MoCo queue (keys, labels, example ids, pointer) or memory bank, for the
                 memory losses only
    epoch, dev   the epoch it was saved after and its dev scores
    data         {"root", "train_fingerprint": {task: sha256}}: the data root the run read and its
                 training examples' fingerprints (data.run_data), for evaluate.py
    contents_sha256   the checksum of every entry above (content_sha256), checked on loading
It is written to a temporary file in the same folder, flushed to disk, then renamed over the old
one: os.replace is atomic, so a kill mid-save leaves the previous checkpoint as it was. Ctrl-C and
SIGTERM wait while a file is written (signals_held): they arrive once it is whole, or the old one
is still in place.

The checksum (sealed, check_contents; last.pt and the kNN datastores carry one too): torch.load
does not notice changed bytes in a tensor's data, so flipped bits in the weights load as a
different model. The checksum is a sha256 over the saved dict's contents, taken before
torch.save and kept in the dict itself: every tensor's dtype, shape and raw bytes, and every other
value's repr, in the dict's own order. A hash of the file's bytes would need a second file (or
the hash after the zip) to travel with it through every rename; this one is inside the file, and
damage to the zip's own structure makes torch.load fail instead, also one line. Its cost is one
more pass over the bytes at each save and load: 0.07 s for the default model's 91 MB of weights
on this project's 2-core CPU (measured: content_sha256 of a 22.7M-float tensor), three times that
for last.pt (the weights and AdamW's two moments) once an epoch. A file from before checksums loads with a warning.
"""
import contextlib
import dataclasses
import hashlib
import os
import signal
import tempfile
import threading

import torch

from minknn import MinknnError, warn
from minknn.bert import BertConfig
from minknn.weights import check_finite, check_fits, file_sha256, read_json, read_weights, weights_file
from minknn.losses import build_losses
from minknn.model import Model
from minknn.tasks import TASKS, get_task
from minknn.tokenizer import RobertaTokenizer, Tokenizer

FORMAT = "minknn-checkpoint-2"


@contextlib.contextmanager
def signals_held(signums=(signal.SIGINT, signal.SIGTERM)):
    """Ctrl-C (SIGINT) and SIGTERM that arrive inside the block wait until it ends, then go to the
    handlers that were there before (KeyboardInterrupt, minknn.Terminated, or the default that
    ends the process). Without this, the KeyboardInterrupt raised inside torch.save's writer
    comes out as its own RuntimeError, and the file is left half written. Only the main thread
    can set handlers (and only it runs them): elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    before = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in signums}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in dict.fromkeys(arrived):  # each signal once, in the order they came; its
            signal.raise_signal(s)          # KeyboardInterrupt wins over an error of the block


def atomic_save(obj, path, writer=torch.save):
    """writer(obj, file) writes to a temporary file that is renamed to `path` once complete, with
    Ctrl-C and SIGTERM held until then (signals_held). A failed write (a full disk) is one line
    naming its cause: torch.save wraps the OSError in a RuntimeError of its own, so the cause is
    looked for in the exception's context."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    with signals_held():
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".",
                                       suffix=".tmp")
        except OSError as e:
            raise MinknnError(f"{path}: cannot be written ({e.strerror})") from None
        try:
            with os.fdopen(fd, "wb") as f:
                writer(obj, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except (OSError, RuntimeError) as e:  # a full disk, a quota: the old file left as it was
            cause = e if isinstance(e, OSError) else e.__context__
            if isinstance(cause, KeyboardInterrupt):  # raised by the writer itself, not a signal
                raise cause from None
            if not isinstance(cause, OSError):
                raise  # not a failed write: a bug, shown whole
            raise MinknnError(f"{path}: cannot be written ({cause.strerror}); any earlier version "
                              f"of it is unchanged") from None
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


CHECKSUM = "contents_sha256"  # the entry that holds a saved dict's checksum


def content_sha256(obj):
    """The sha256 of a dict's contents as torch.save writes them and torch.load gives them back:
    each tensor's dtype, shape and raw bytes, each other value's repr, each container's kind and
    length, walked in order (a dict in its keys' order, which torch.load keeps)."""
    h = hashlib.sha256()

    def walk(x):
        if torch.is_tensor(x):
            t = x.detach().cpu().contiguous()
            h.update(f"tensor {t.dtype} {tuple(t.shape)}\n".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # its bytes, not copied
        elif isinstance(x, dict):
            h.update(f"dict {len(x)}\n".encode())
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple)):
            h.update(f"{'list' if isinstance(x, list) else 'tuple'} {len(x)}\n".encode())
            for v in x:
                walk(v)
        elif x is None or isinstance(x, (bool, int, float, str, bytes)):
            h.update(f"{x!r}\n".encode())  # 1, 1.0, '1', True: each its own repr
        else:  # a repr may hold a memory address: a new type needs a case above
            raise TypeError(f"content_sha256: cannot hash a {type(x).__name__}")
    walk(obj)
    return h.hexdigest()


def sealed(obj):
    """The dict with its checksum added, to be saved."""
    return {**obj, CHECKSUM: content_sha256(obj)}


def check_contents(obj, name, remedy):
    """A loaded dict less its checksum, refused in one line when its contents do not match it
    (remedy: what to do then). A dict saved before minknn wrote checksums loads with a warning."""
    saved = obj.pop(CHECKSUM, None)
    if saved is None:
        warn(f"{name}: saved without a checksum (by an earlier minknn), so damage to it would go "
             f"unnoticed")
    elif content_sha256(obj) != saved:
        raise MinknnError(f"{name}: its contents do not match the checksum saved with it (the file "
                          f"was damaged after it was written); {remedy}")
    return obj


def save_checkpoint(path, model, losses, tokenizer, args, epoch, dev, memory=None, data=None,
                    base=None):
    """base: for a frozen encoder, base_model() of the folder it was loaded from; the encoder's
    weights are then left out, as that folder holds them."""
    if base is not None and any(p.requires_grad for p in model.bert.parameters()):
        raise ValueError("save_checkpoint: `base` leaves out the encoder, but this one trains")
    state = model.state_dict() if base is None else without_encoder(model.state_dict())
    atomic_save(sealed({
        "format": FORMAT, "args": dict(args),
        "tasks": {name: {"kind": t.kind, "labels": list(t.labels), "pair": t.pair}
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


def load_tagged(path, format_tag, what, remedy):
    """The dict torch.save'd at path, refused with one line unless it carries `format_tag` (or one
    of a tuple of tags, the current one first) and its contents match their checksum. what: how
    the error names the file and its kind, e.g. ("--checkpoint x.pt", "checkpoint"); remedy:
    what the error advises when the contents do not match."""
    name, kind = what
    tags = (format_tag,) if isinstance(format_tag, str) else format_tag
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise MinknnError(f"{name}: not a minknn {kind}, or a damaged one ({type(e).__name__})") \
            from None
    if isinstance(obj, dict) and obj.get("format") == "minknn-checkpoint-1":
        raise MinknnError(f"{name}: written by an earlier minknn (format minknn-checkpoint-1, "
                          f"before every task shared one model); train it again with this version")
    if not isinstance(obj, dict) or obj.get("format") not in tags:
        raise MinknnError(f"{name}: not a minknn {kind} (no '{tags[0]}' format tag)")
    return check_contents(obj, name, remedy)


def load_checkpoint(path):
    """path: a run folder (holding checkpoint.pt) or the checkpoint file itself."""
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint.pt")
    folder = os.path.dirname(path) or "."
    if not os.path.exists(path) and saved_nothing(folder):
        raise MinknnError(f"--checkpoint {folder}: the run was trained with --save none and kept "
                          f"no checkpoint to evaluate; its dev scores are in "
                          f"{os.path.join(folder, 'summary.json')}")
    if not os.path.exists(path):
        raise MinknnError(f"--checkpoint {path}: not found")
    ckpt = load_tagged(path, FORMAT, (f"--checkpoint {path}", "checkpoint"),
                       "evaluate a copy kept elsewhere, or train the run again")
    ckpt["file"] = path
    return ckpt


def saved_nothing(folder):
    """Whether the run in `folder` was trained with train.py --save none (its run.json says so)."""
    path = os.path.join(folder, "run.json")
    saved = read_json(path) if os.path.isfile(path) else None
    return isinstance(saved, dict) and isinstance(saved.get("args"), dict) \
        and saved["args"].get("save") == "none"


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
    else:
        tokenizer = Tokenizer(ckpt["vocab"], max_len=ckpt["max_len"], **options)
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
