"""Run folders that never lose work: one run per folder, one writer per run, and a killed run
resumed exactly where its last completed epoch left it.

A run folder (train.py --out) holds:
    run.lock        held (flock) by the process training in it; the OS releases it when the
                    process ends, even by kill -9, so a lock is never stale. Removed when the
                    run ends (finished, stopped or diverged); a kill -9 leaves it, unheld
    run.json        the run's arguments and data (root, fingerprints), written just before the
                    first step, once every input has been checked (--resume reads them)
    last.pt         the state after the last completed epoch: model, losses (proxies), optimiser
                    and schedule, every random generator, the batch streams' places in their
                    passes, the memory and key encoder of a memory loss, the epochs' records
                    and the epochs planned (minknn/checkpoint.py). Deleted when the run
                    finishes: only a run that can still go on needs it.
    checkpoint.pt   the best epoch (minknn/checkpoint.py); the last with train.py --save last,
                    none with --save none
    metrics.jsonl, summary.json   every epoch's scores, and the run's best
Every file is written to a temporary name and renamed (files.atomic_save), so a kill leaves
each file either old or new; the temporary files a kill leaves behind are removed when the run
is resumed or evaluated (files.remove_leftovers). last.pt and checkpoint.pt carry a checksum of
their contents, checked on loading; --resume checks every file it keeps (minknn/resume.py).
The lock needs fcntl (Linux, macOS). run_folder() holds a run's folder while it trains and says
how a run that did not finish ended (Ctrl-C, SIGTERM, divergence, a lost process). A folder read
from outside its run (how the run ended, whether it trains now, its checkpoint.pt for evaluate.py
or why it has none yet) is minknn/status.py's.

On the CPU a resumed run is exact: it draws the same batches and the same dropout masks, so it
ends with the same weights as the run left alone (tests/test_runs.py). On a GPU some kernels are
not deterministic, so it is only as close as two runs of the same seed are.
"""
import contextlib
import fcntl
import os
import signal
import sys
import tempfile
import threading
import time

from minknn import MinknnError, Terminated, distributed, exit_as_rank_0_says, sigterm_raises
from minknn.checkpoint import load_last
from minknn.files import is_there, read_json, remove_leftovers, write_json
from minknn.status import finished_hint, held_run, missing_checkpoint, run_status

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


def signals_ignored():
    """Ctrl-C and SIGTERM ignored from here on; returns the handlers they had (restore_signals).
    A run that is stopping says how (summary.json, one line) to the end: a second Ctrl-C, or
    the SIGTERM torchrun sends every rank left as soon as one fails, would cut that short (it
    came while rank 0 read last.pt, which left no summary.json and a bare `terminated`). Only the
    main thread can set handlers: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(handlers):
    for s, handler in handlers.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)


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


def make_folder(folder, what="--out"):
    """Creates `folder` if needed and checks that files can be written there (one line if not);
    what: how the error names it."""
    if not folder or (os.path.exists(folder) and not os.path.isdir(folder)):
        raise MinknnError(f"{what} '{folder}': not a folder; give a folder path for the run")
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, suffix=".tmp")  # a name no other run shares
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise MinknnError(f"{what} {folder}: cannot write there ({e.strerror})") from None


def lock_folder(folder, name="run.lock", holder="training process", what=None):
    """An exclusive lock on folder/name, held while the returned file stays open (the runner
    locks its grid's folder with it too: name grid.lock, holder "runner"). A run that ends
    removes its run.lock before it lets go (close_run_folder): a process that opened that file
    just before then locks a file no longer in the folder, while a third may create and lock a
    new one. So the lock counts only if the file locked is still the one at the path; if not,
    try again. what: how the error names the folder (default: its path)."""
    path = os.path.join(folder, name)
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip() or "?"
            f.close()
            raise MinknnError(f"{what or folder} is in use by another {holder} (pid {pid}); "
                              f"wait for it to finish, or choose another --out") from None
        if is_there(f.fileno(), path):
            break
        f.close()  # a lock on a removed run.lock: it guards nothing
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def rank_0_gone(folder):
    """Whether rank 0 of the run in `folder` ended without saying how (killed), asked under
    torchrun by a rank that stops: if so, returns run.lock, locked now by this rank, which says it
    in rank 0's place (another_rank_stops); else None: rank 0 holds the lock (it is alive, and
    says it), or removed it (it has said it), or another rank took it over (that one says it).
    Rank 0 holds run.lock from before the other ranks learn the folder until it has said how the
    run ended, and removes it before it lets go (close_run_folder); the OS lets go of it when its
    holder dies. So a run.lock still at its path that this rank can lock was left by a rank 0 that
    died without a word. One rank gets it; the others find it held, or gone once that one has
    spoken. Nothing here waits or times."""
    path = os.path.join(folder, "run.lock")
    try:
        lock = open(path, "r+")  # not created here: a lock rank 0 removed stays removed
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if is_there(lock.fileno(), path):
            lock.seek(0)
            lock.truncate()
            lock.write(str(os.getpid()))  # whose it is now, for lock_folder's message
            lock.flush()
            return lock
    except BlockingIOError:
        pass
    lock.close()
    return None


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
        return open_run_folder(args.out, args.save), []
    default = os.path.join("runs", f"{args.task}-{args.loss or args.sts_loss}-seed{args.seed}-"
                                   f"{time.strftime('%Y%m%d-%H%M%S')}")
    args.out, lock, created = new_run_folder(args.out, default)
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
