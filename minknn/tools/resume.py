"""What --resume checks before it trains: every file of the stopped run that it goes on from or
keeps, before the model and the data are read (minknn/tools/trainer.py calls read_last first).

    last.pt         whole (checkpoint.load_last); this run's: the id run.json gives the run (a
                    random one, written when the run began) and run.json's arguments, as last.pt
                    recorded both (a hand-edited run.json, or another run's last.pt, is one line);
                    planned for run.json's epochs, and holding no epoch past them (a last.pt from
                    before that record: its learning rate, 0 only after the schedule's last step,
                    tells instead)
    checkpoint.pt   whole (readable, its format tag, its checksum) and this run's: saved under its
                    id, whatever the epoch it holds, and the epoch --save kept so far (last.pt's
                    records say which, with its dev scores)
    datastore-*.pt  whole: the kNN datastores evaluate.py --knn saved beside it

A finishing run deletes last.pt, so a damaged checkpoint.pt would be its best model, and the last
good copy of that epoch's weights gone. When last.pt holds the very epoch checkpoint.pt held
(--save best: last.pt's epoch is the best so far; --save last: always), the checkpoint is written
again from it once the run is restored (trainer.restore: the rebuilt run's parts and last.pt's
weights), with a note; else --resume stops in one line, both files left as they are. A whole
checkpoint that is not this run's (another run's file in its place) is never overwritten: one
line too. Runs from before the id (their run.json has none) are held to the epochs alone.
"""
import glob
import json
import os

import torch

from minknn import MinknnError
from minknn.datastore import AGAIN, read_file as read_datastore
from minknn.tools.checkpoint import FORMAT, load_last
from minknn.tools.distributed import is_main
from minknn.tools.files import CHECKSUM, content_sha256, read_json


def run_identity(folder):
    """What last.pt records of the run it belongs to (its "run" entry): run.json's id (None in a
    run from before the id) and its arguments, as the file holds them."""
    saved = read_json(os.path.join(folder, "run.json"))
    return {"id": saved.get("id"), "args": saved["args"]}


REWRITE = "rewrite_checkpoint"  # in last.pt's state as read_last returns it: checkpoint.pt's damage


def read_last(args):
    """--resume: last.pt's state (None if no epoch finished), checked against run.json, and the
    run's checkpoint.pt and datastores checked; then the run's first line, where it goes on (rank
    0), before the model's and the data's lines. A checkpoint.pt to write again from last.pt is
    noted in the state (REWRITE) and said after that line."""
    # a memory loss's last.pt also holds its memory, and a queue's its key encoder
    needs = {"queue": ("memory", "key_encoder"), "bank": ("memory",)}.get(args.memory, ())
    last = load_last(args.out, needs)
    run = run_identity(args.out)
    if last:
        check_same_run(args, last, run)
        check_planned(args, last)
    damage = check_checkpoint(args, last, run["id"])
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


def check_same_run(args, last, run):
    """last.pt must be this run's (saved under run.json's id) and run.json must hold the arguments
    last.pt trained with: resumed with others, the next epoch would train another run than the one
    run.json names (another loss over this one's weights, a learning rate the optimiser in last.pt
    ignores). A last.pt from before the record ("run") is not held to it."""
    path, held = os.path.join(args.out, "last.pt"), last.get("run")
    if held is None:
        return
    if held.get("id") != run["id"]:
        raise MinknnError(f"--resume {args.out}: {path} is not this run's: it was saved by the run "
                          f"{held.get('id')}, and run.json names the run {run['id']}; put the run's "
                          f"own last.pt back (every file is left as it is)")
    edited = [k for k in sorted({*held["args"], *run["args"]})
              if held["args"].get(k, "absent") != run["args"].get(k, "absent")]
    if edited:
        said = "; ".join(f"{k} is {json.dumps(run['args'].get(k))}, and the run trained with "
                         f"{json.dumps(held['args'].get(k))}" for k in edited)
        raise MinknnError(f"--resume {args.out}: run.json's {said} (last.pt); was the file edited? "
                          f"Put it back as it was, or start a new run with another --out")


def check_planned(args, last):
    """run.json's epochs must be those last.pt was saved under: fewer would stop a run that had
    further to go (or has done more), more would stretch a schedule half done. A last.pt of the
    last epoch is a run stopped after its last save (Ctrl-C, SIGTERM, kill -9) but before it
    finished, which --resume finishes without training."""
    planned, done = last.get("epochs"), last["epoch"]
    if planned is not None and done > planned or len(last["records"]) != done:
        raise MinknnError(f"--resume {args.out}: {os.path.join(args.out, 'last.pt')} says it holds "
                          f"epoch {done}, with {len(last['records'])} epochs' records, of the "
                          f"{planned} it planned; it was edited (resealed), or not saved by "
                          f"train.py: delete it, and --resume starts the run over")
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


def check_checkpoint(args, last, run_id=None):
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
        other = not_this_runs(ckpt, last, kept, run_id)
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


def not_this_runs(ckpt, last, kept, run_id=None):
    """Why a whole checkpoint is not the run's kept epoch, in words, or None. It must be saved
    under the run's id (run_id: run.json's; None in a run from before the id), whatever epoch it
    holds; and hold kept: the epoch last.pt says it holds, with the dev scores last.pt's records
    give that epoch, or the epoch after last.pt's (a kill between that epoch's checkpoint.pt and
    its last.pt)."""
    epoch = ckpt.get("epoch")
    if ckpt["format"] != FORMAT:
        return f"its format is {ckpt['format']!r}, not {FORMAT!r}"
    if run_id is not None and ckpt.get("run") != run_id:
        saved = f"the run {ckpt['run']}" if ckpt.get("run") else "a run without an id"
        return f"it was saved by {saved} (epoch {epoch}), and run.json names the run {run_id}"
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
