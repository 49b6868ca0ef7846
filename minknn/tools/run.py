"""A run's life in one place: its folder opened (new or resumed) and locked, held while it trains,
stopped or finished, and read from outside. One run per folder, one writer per run, and a killed
run resumed exactly where its last completed epoch left it.

train.py, top to bottom:
    saved_args(folder)          --resume: the arguments the run started with (its run.json)
    run_folder(args)            the block that trains: the folder opened and locked (open_folder),
                                how a run that does not finish ends (Ctrl-C, SIGTERM, Diverged, a
                                lost torchrun process: summary.json and one line), the lock let go
    resume.read_last(args)      --resume: last.pt and every file the run keeps, checked before the
                                model is built (minknn/tools/resume.py; their formats:
                                minknn/tools/checkpoint.py)
    check_same_data             a resumed run reads the training examples it started with
    summarise(args, state)      summary.json, when the run finishes (trainer.finish) or stops
Read from outside (evaluate.py, the export, predict, the runner's cells):
    run_status(folder)          "finished", "diverged" or "stopped", from its summary.json
    run_checkpoint(path)        the checkpoint a reader loads; a folder without one refused saying
                                why (no_checkpoint), a run still training noted
    training(folder)            whether a process holds its run.lock now
    held_run, finished_hint     why --out cannot take a new run there, and what to do instead
    missing_checkpoint(folder)  why a stopped run cannot be resumed: its checkpoint.pt is gone

A run folder (train.py --out) holds:
    run.lock        held (flock) by the process training in it; the OS releases it when the
                    process ends, even by kill -9, so a lock is never stale. Removed when the
                    run ends (finished, stopped or diverged); a kill -9 leaves it, unheld
    run.json        the run's id (random), arguments and data (root, fingerprints), written just
                    before the first step, once every input has been checked (--resume reads
                    them, and holds last.pt and checkpoint.pt to the id)
    last.pt         the state after the last completed epoch: model, losses (proxies), optimiser
                    and schedule, every random generator, the batch streams' places in their
                    passes, the memory and key encoder of a memory loss, the epochs' records
                    and the epochs planned (minknn/tools/checkpoint.py). Deleted when the run
                    finishes: only a run that can still go on needs it.
    checkpoint.pt   the best epoch (minknn/tools/checkpoint.py); the last with train.py --save last,
                    none with --save none
    metrics.jsonl, summary.json   every epoch's scores, and the run's best
Every file is written to a temporary name and renamed (files.atomic_save), so a kill leaves
each file either old or new; the temporary files a kill leaves behind are removed when the run
is resumed or evaluated (files.remove_leftovers). last.pt and checkpoint.pt carry a checksum of
their contents, checked on loading. The lock (files.lock_folder) needs fcntl (Linux, macOS).

On the CPU a resumed run is exact: it draws the same batches and the same dropout masks, so it
ends with the same weights as the run left alone (tests/test_runs.py). On a GPU some kernels are
not deterministic, so it is only as close as two runs of the same seed are.
"""
import contextlib
import fcntl
import os
import sys
import time

from minknn import (MinknnError, Terminated, exit_as_rank_0_says, restore_signals, sigterm_raises,
                    signals_ignored)
from minknn.tools import distributed
from minknn.tools.checkpoint import load_checkpoint, load_last
from minknn.tools.curves import check_folder
from minknn.tools.files import (is_there, lock_folder, make_folder, rank_0_gone, read_json,
                                remove_leftovers, write_json)


class Diverged(MinknnError):
    """A loss, gradient norm, weight or dev score that is not finite: the run stops, and nothing
    of the epoch in progress is saved."""
RUN_FILES = ("run.json", "last.pt", "checkpoint.pt", "metrics.jsonl", "summary.json")


@contextlib.contextmanager
def run_folder(args):
    """The run in its folder (a new one, or --resume's, set in args.out), held while the block
    trains; under torchrun rank 0 alone holds and writes it. How a run that does not finish ends:
    Ctrl-C and SIGTERM (a cluster stopping or preempting the job) stop it the same way, the files
    of an epoch being saved finished first, summary.json saying "stopped": "interrupted" (or
    "terminated"), one line saying how to go on, exit status 130 (or 143, 128 + 15); a Diverged
    run stops before anything of the epoch is saved, summary.json saying why, with one line; under
    torchrun a process that failed stops the others, rank 0 says how (or, if it is the one lost,
    a rank left: another_rank_stops), and the run can be resumed."""
    lock, created = None, []
    try:
        if distributed.is_main():  # the folder first: a run training in it stops this one
            lock, created = open_folder(args)
    finally:  # the other ranks learn the folder rank 0 opened, or that it could not
        args.out = distributed.broadcast_object(args.out if lock else None)
    if args.out is None:  # not rank 0: it says why
        exit_as_rank_0_says()
    set_aside = {}  # the signal handlers of a run that is stopping (signals_ignored)
    try:
        with sigterm_raises():  # a cluster's SIGTERM stops the run as Ctrl-C does
            yield
    except KeyboardInterrupt as e:
        set_aside = signals_ignored()
        how, status = ("terminated", 143) if isinstance(e, Terminated) else ("interrupted", 130)
        if not distributed.is_main():
            another_rank_stops(args, status)
        if run_status(args.out) == "finished":
            # it came after finish() wrote summary.json: the run is whole, and its last.pt may be
            # gone already; summary.json rewritten as stopped would say no epoch had finished
            print(f"\n{how} after the run finished; {finished_hint(args.out)}", file=sys.stderr)
        else:
            last = load_last(args.out)
            where = best_so_far(args, last) if last else "no epoch had finished"
            if summarise(args, last, stopped=how) is None:  # before the first step
                print(f"\n{how} before the first step; nothing was saved", file=sys.stderr)
            else:
                print(f"\n{how}: {where}; continue with: python train.py --resume {args.out}",
                      file=sys.stderr)
        sys.exit(status)
    except Diverged as e:
        set_aside = signals_ignored()
        if not distributed.is_main():  # every rank stops at the same step; rank 0 says why
            exit_as_rank_0_says()
        last = load_last(args.out)
        kept = best_so_far(args, last) if last else "nothing was saved"
        summarise(args, last, stopped=f"diverged: {e}")
        raise MinknnError(f"{e}; the run stopped and {kept}; try a lower --lr") from None
    except RuntimeError as e:
        if not distributed.lost_peer(e):
            raise
        # under torchrun: a collective lost a rank that failed (its own error comes first) or was
        # killed (torchrun reports it), and torchrun SIGTERMs the others: rank 0 says it here, in
        # the line that comes back after the signals below, and ends with status 2; another rank
        # waits for that SIGTERM, then says it only if rank 0 is the one lost
        if not distributed.is_main():
            distributed.stop_awaited()
        set_aside = signals_ignored()
        if not distributed.is_main():
            another_rank_stops(args, 2)
        summarise(args, load_last(args.out), stopped=LOST)
        say_lost(args)
        sys.exit(2)
    finally:
        if lock:
            close_run_folder(args.out, lock, created)
        # in one process the handlers come back (train.main runs in-process in the runner and
        # the tests); a rank that stopped under torchrun ends ignoring them
        if not distributed.launched():
            restore_signals(set_aside)


LOST = "failed: another rank failed or was killed"  # summary.json's "stopped" when a rank is lost


def say_lost(args):
    print(f"error: rank {distributed.rank()} stopped: another rank failed or was killed (its "
          f"error, or torchrun's report of it, says which); continue with: python train.py "
          f"--resume {args.out}", file=sys.stderr)


def another_rank_stops(args, status):
    """How a rank other than 0 ends a run that stops under torchrun (Ctrl-C, SIGTERM, a lost
    peer): exit `status`, saying nothing, as rank 0 says how the run stopped; but if rank 0 is
    gone without a word (killed: rank_0_gone), this rank says it in rank 0's place, as rank 0
    says a lost peer: summary.json, the line with the resume command, exit status 2."""
    lock = rank_0_gone(args.out)
    if lock is None:
        sys.exit(status)
    try:
        summarise(args, load_last(args.out), stopped=LOST)
    finally:
        close_run_folder(args.out, lock, [])
    say_lost(args)
    sys.exit(2)


def new_run_folder(out, default):
    """Creates and locks the folder of a new run: `out`, which must not hold a run already, or
    with out None a fresh folder named `default` (plus -2, -3, .. if taken, created exclusively,
    so runs started in the same second never share one). Returns (folder, lock, the folders this
    process created)."""
    if out is None:
        parent = os.path.dirname(default) or "."
        created = [] if os.path.exists(parent) else [parent]
        folder, n = default, 1
        os.makedirs(parent, exist_ok=True)
        while True:
            try:
                os.mkdir(folder)
                break
            except FileExistsError:
                n += 1
                folder = f"{default}-{n}"
        created.append(folder)
    else:
        folder, created = out, [] if os.path.exists(out) else [out]
        make_folder(folder)
    lock = lock_folder(folder)  # before looking: a run still starting has its lock already
    held = [name for name in RUN_FILES if os.path.exists(os.path.join(folder, name))]
    if held:
        try:
            why = held_run(folder, held)
        finally:
            close_run_folder(folder, lock, [])
        raise MinknnError(why)
    return folder, lock, created


def close_run_folder(folder, lock, created):
    """Removes run.lock while still holding it, then releases it (lock_folder: a process that
    opened the old file meanwhile tries again). A run that stopped before it wrote run.json (a
    bad input found while loading, Ctrl-C) leaves nothing behind: the folders it made go too
    (the run's, and runs/ when it made that too) if they are empty."""
    path = os.path.join(folder, "run.lock")
    if is_there(lock.fileno(), path):  # unlink, then close: never a moment unlocked
        os.remove(path)
    if not os.path.exists(os.path.join(folder, "run.json")):
        for made in reversed(created or []):  # the run's folder first, then its parent
            try:
                os.rmdir(made)  # only when empty: another run may have started in runs/
            except OSError:
                pass
    lock.close()


def saved_args(folder):
    """The arguments a run started with (its run.json), for --resume."""
    path = os.path.join(folder, "run.json")
    if not folder or not os.path.isfile(path):
        raise MinknnError(f"--resume {folder}: no run to resume there (no run.json: not a run "
                          f"folder, or a run stopped before its first step; start that again)")
    saved = read_json(path)
    if not isinstance(saved, dict) or not isinstance(saved.get("args"), dict):
        raise MinknnError(f"{path}: not a minknn run's arguments (no \"args\" object)")
    data = saved.get("data")
    if not (isinstance(data, dict) and isinstance(data.get("root"), str)
            and isinstance(data.get("train_fingerprint"), dict)):
        raise MinknnError(f"{path}: no \"data\" object with the data root and training "
                          f"fingerprints the run started with (was the file edited?)")
    return saved["args"]


def open_run_folder(folder, save="best"):
    """Locks the folder of a run to resume and removes the temporary files a kill left. save: the
    run's --save (a run with --save none has no checkpoint.pt to need)."""
    lock = lock_folder(folder)
    if run_status(folder) == "finished":
        close_run_folder(folder, lock, [])
        raise MinknnError(f"--resume {folder}: this run finished (summary.json); nothing to "
                          f"resume ({finished_hint(folder)}; a new run needs another --out)")
    missing = missing_checkpoint(folder, save)
    if missing:
        close_run_folder(folder, lock, [])
        raise MinknnError(f"--resume {folder}: {missing}; the run cannot go on without it (start "
                          f"it again)")
    remove_leftovers(folder)
    return lock


def check_same_data(folder, data):
    """A resumed run must read the training examples it started with (data: train.py's
    run_data, the root and the fingerprints)."""
    started = read_json(os.path.join(folder, "run.json"))["data"]
    if data["train_fingerprint"] != started["train_fingerprint"]:
        raise MinknnError(f"--resume {folder}: the training examples under {data['root']} are "
                          f"not the ones the run started with (from {started['root']}); put those "
                          f"back, or start a new run")


def summarise(args, state, stopped=None):
    """Writes and returns summary.json of train.py's run, from its state (the loop's, or
    last.pt's; None if no epoch ended); stopped: why it did not finish. None when the run never
    started (no run.json): the folder stays free for a new run."""
    if not os.path.exists(os.path.join(args.out, "run.json")):
        return None
    state = state or {"best": None, "records": []}
    best, records = state["best"], state["records"]
    summary = {"task": args.task, "tasks": args.tasks, "loss": args.loss or args.sts_loss,
               "decoupled": args.decoupled, "pair_mode": args.pair_mode, "pcgrad": args.pcgrad,
               "seed": args.seed, "epochs": len(records), "max_eval": args.max_eval,
               "save": args.save,
               "best_epoch": best and best["epoch"], "dev": best and best["dev"],
               "seconds_per_epoch": round(sum(r["epoch_seconds"] for r in records)
                                          / max(1, len(records)), 1), "run": args.out}
    if "losses" in state:
        summary.update({
            "lam": {n: loss.lam for n, loss in state["losses"].items() if hasattr(loss, "lam")},
            "device": str(state["device"]), "steps_per_epoch": state["steps"],
            "train_examples": {n: len(e) for n, e in state["train"].items()},
            "dev_examples": {n: len(e) for n, e in state["dev"].items()}})
    if state.get("memory_fill_seconds") is not None:
        summary["memory_fill_seconds"] = round(state["memory_fill_seconds"], 1)
    if stopped:
        summary["stopped"] = stopped
    write_json(os.path.join(args.out, "summary.json"), summary)
    return summary


def open_folder(args):
    """Locks the run's folder: --resume's, or a new one (--out, or a fresh name in runs/, then
    set in args.out). Returns (the lock, the folders made for it)."""
    if args.resume:
        lock, created = open_run_folder(args.out, args.save), []
    else:
        default = os.path.join("runs", f"{args.task}-{args.loss or args.sts_loss}-"
                               f"seed{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        args.out, lock, created = new_run_folder(args.out, default)
    if args.tensorboard:  # its curves' folder, checked before anything is read (curves.py)
        try:
            created += check_folder(os.path.join(args.out, "tensorboard"))
        except MinknnError:
            close_run_folder(args.out, lock, created)
            raise
    return lock, created


def best_so_far(args, last):
    """Where a stopped run's best epoch so far is (last: the state in last.pt)."""
    if args.save == "best":
        return (f"the best checkpoint (epoch {last['best']['epoch']}) is "
                f"{os.path.join(args.out, 'checkpoint.pt')}")
    if args.save == "last":
        return (f"the last epoch's checkpoint (epoch {last['epoch']}) is "
                f"{os.path.join(args.out, 'checkpoint.pt')}")
    return (f"the best epoch so far ({last['best']['epoch']}) is in "
            f"{os.path.join(args.out, 'summary.json')} (--save none: no checkpoint)")


# A run folder read from outside its run: the commands that meet one a run wrote (train.py's
# --out and --resume, evaluate.py, the attack, the export, predict, the runner's cells)

def run_status(folder):
    """How the run in `folder` ended, from its summary.json: "finished"; "diverged" (resumed, it
    would diverge again); or "stopped", which --resume continues: Ctrl-C, SIGTERM, or no
    summary.json at all (a kill -9, a crash, a run still starting). The one reading of it: the
    runner's cells go by it too."""
    path = os.path.join(folder, "summary.json")
    stopped = read_json(path).get("stopped") if os.path.exists(path) else "killed"
    if not stopped:
        return "finished"
    return "diverged" if str(stopped).startswith("diverged") else "stopped"


def held_run(folder, held):
    """Why --out `folder`, which holds the files `held`, cannot take a new run, and what can be
    done instead: a stopped run goes on with --resume; a finished one is evaluated."""
    status = run_status(folder)
    if status == "stopped":
        return (f"--out {folder} already holds a run ({', '.join(held)}); continue it with "
                f"--resume {folder}, or choose another --out")
    if status == "diverged":
        return (f"--out {folder} holds a run that diverged (summary.json); start again with "
                f"another --out")
    return (f"--out {folder} holds a finished run (summary.json); choose another --out for a new "
            f"one ({finished_hint(folder)})")


def finished_hint(folder):
    """What can still be done with a finished run."""
    if os.path.exists(os.path.join(folder, "checkpoint.pt")):
        return f"evaluate it with: python evaluate.py --checkpoint {folder}"
    return f"its scores are in {os.path.join(folder, 'summary.json')}: --save none kept no model"


def missing_checkpoint(folder, save="best"):
    """Why a stopped run in `folder` cannot be resumed though it has last.pt: its checkpoint.pt,
    the epoch --save kept so far, is gone; None when it can. The runner asks this of every cell
    to resume before its grid trains."""
    if save != "none" and os.path.exists(os.path.join(folder, "last.pt")) and \
            not os.path.exists(os.path.join(folder, "checkpoint.pt")):
        return f"checkpoint.pt, the {save} epoch so far, is missing"
    return None


def run_checkpoint(path, name="--checkpoint", doing="scoring"):
    """The checkpoint evaluate.py, the attack and the export read: path, a run folder (its
    checkpoint.pt) or the file. A run folder that has none is refused in one line saying why and
    what to do (no_checkpoint); a run still training (its run.lock held) is said in a note, and its
    checkpoint.pt so far is read. name: the flag or argument path came from; doing: the reader's
    work, for the note."""
    file = os.path.join(path, "checkpoint.pt") if os.path.isdir(path) else path
    folder = os.path.dirname(file) or "."
    why = None if os.path.exists(file) else no_checkpoint(folder)
    if why:
        raise MinknnError(f"{name} {folder}: {why}")
    ckpt = load_checkpoint(file)  # a file not found, not a checkpoint, damaged: said there
    if os.path.basename(file) != "checkpoint.pt":
        return ckpt
    remove_leftovers(folder)  # a run's folder: a killed save's temporary files go
    if training(folder):
        last = ckpt.get("args", {}).get("save") == "last"
        print(f"note: {folder} is still training (run.lock held): {doing} its "
              f"{'last epoch (--save last)' if last else 'best epoch'} so far, {ckpt.get('epoch')}")
    return ckpt


def no_checkpoint(folder):
    """Why the run in `folder` has no checkpoint.pt, and what to do; None when it is not a run's
    folder, or one that had a checkpoint.pt (it is then not found)."""
    path = os.path.join(folder, "run.json")
    saved = read_json(path) if os.path.isfile(path) else {}
    if isinstance(saved, dict) and isinstance(saved.get("args"), dict) \
            and saved["args"].get("save") == "none":
        return (f"the run was trained with --save none and kept no checkpoint to evaluate; its dev "
                f"scores are in {os.path.join(folder, 'summary.json')}")
    if os.path.exists(os.path.join(folder, "last.pt")) or not (saved or training(folder)):
        return None  # an epoch ended (its checkpoint.pt is gone), or no run started here
    if training(folder):
        return ("no checkpoint.pt yet: the run is still in its first epoch (run.lock held); "
                "evaluate it once that has ended")
    return {"stopped": f"no checkpoint.pt yet: the run stopped before its first epoch ended; go on "
                       f"with python train.py --resume {folder}",
            "diverged": "no checkpoint.pt: the run diverged in its first epoch (summary.json says "
                        "where); train it again with a lower --lr"}.get(run_status(folder))


def training(folder):
    """Whether a process is training in `folder` now: its run.lock is held (files.lock_folder; the
    OS lets go of it when the process ends, so a run.lock left by a kill -9 is not). Asked by
    taking a shared lock and letting go at once: a run starting in that instant finds the folder
    in use."""
    try:
        with open(os.path.join(folder, "run.lock")) as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # had: nobody holds it
        return False
    except BlockingIOError:
        return True
    except OSError:  # no run.lock: no run started there, or it ended
        return False
