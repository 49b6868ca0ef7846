"""A run folder read from outside its run: how the run ended, whether a process trains in it now,
and, in one line, what can be done with it. minknn/runs.py holds a run's folder while it trains
and writes what is read here (its files: runs.py's docstring); this file only reads a folder
(run_checkpoint also removes a killed save's temporary files: files.remove_leftovers), for the
commands that meet one a run wrote: train.py's --out and --resume, evaluate.py, the
attack and the export (run_checkpoint), the runner's cells (run_status, missing_checkpoint).

    run_status(folder)          "finished", "diverged" or "stopped", from its summary.json
    held_run, finished_hint     why --out cannot take a new run there, and what to do instead
    missing_checkpoint(folder)  why a stopped run cannot be resumed: its checkpoint.pt is gone
    run_checkpoint(path)        the checkpoint evaluate.py reads; a folder without one refused
                                saying why (no_checkpoint), a run still training noted
    training(folder)            whether a process holds its run.lock now
"""
import fcntl
import os

from minknn import MinknnError
from minknn.checkpoint import load_checkpoint
from minknn.files import read_json, remove_leftovers


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
    """Whether a process is training in `folder` now: its run.lock is held (runs.lock_folder; the
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
