"""Files written whole and read back checked: what a kill, a full disk or bit rot cannot corrupt.

atomic_save writes to a temporary file in the same folder, flushed to disk, then renamed over the
old one: os.replace is atomic, so a kill mid-save leaves the previous file as it was, and its
temporary file, which the next command to open the run removes (remove_leftovers: only files no
writer holds, as each is locked while written). Ctrl-C and SIGTERM wait while a file is written
(minknn.signals_held): they arrive once it is whole, or the old one is still in place. Every
file minknn writes goes through it: checkpoints, last.pt, datastores, JSON and JSON Lines
(write_json, write_jsonl), predictions and tables.

The checksum (sealed, check_contents; checkpoint.pt, last.pt and the kNN datastores carry one):
torch.load does not notice changed bytes in a tensor's data, so flipped bits in the weights load
as a different model. The checksum is a sha256 over the saved dict's contents, taken before
torch.save and kept in the dict itself: every tensor's dtype, shape and raw bytes, and every other
value's repr, in the dict's own order. A hash of the file's bytes would need a second file (or
the hash after the zip) to travel with it through every rename; this one is inside the file, and
damage to the zip's own structure makes torch.load fail instead, also one line. Its cost is one
more pass over the bytes at each save and load: 0.07 s for the default model's 91 MB of weights
on this project's 2-core CPU (measured: content_sha256 of a 22.7M-float tensor), three times that
for last.pt (the weights and AdamW's two moments) once an epoch. A file from before checksums
loads with a warning.

The lock (lock_folder; the runner's grid.lock too): one process writes in a folder at a time,
held by flock, which the OS lets go of when the process ends, even by kill -9 (minknn/tools/run.py
holds a run's folder with it, and under torchrun a rank that outlives rank 0 takes it over:
rank_0_gone).
"""
import csv
import fcntl
import glob
import hashlib
import io
import json
import os
import tempfile

import torch

from minknn import MinknnError, signals_held, warn


def atomic_save(obj, path, writer=torch.save):
    """writer(obj, file) writes to a temporary file that is renamed to `path` once complete, with
    Ctrl-C and SIGTERM held until then (signals_held). A failed write (a full disk) is one line
    naming its cause: torch.save wraps the OSError in a RuntimeError of its own, so the cause is
    looked for in the exception's context."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    with signals_held():
        fd, tmp = temporary_file(path)
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


def temporary_file(path):
    """(fd, name) of a new temporary file beside path, <name of path>.<random>.tmp, locked (flock)
    while this process holds it open: remove_leftovers takes only the files no writer holds. A
    file removed by one before this locked it is no file to write to: another is made."""
    folder = os.path.dirname(path) or "."
    while True:
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".",
                                       suffix=".tmp")
        except OSError as e:
            raise MinknnError(f"{path}: cannot be written ({e.strerror})") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        if is_there(fd, tmp):
            return fd, tmp
        os.close(fd)


def is_there(fd, path):
    """Whether the open file fd is the file at path now (not removed, nor replaced)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def remove_leftovers(folder):
    """Removes the temporary files (*.tmp) that a killed save left in folder (a kill -9, a power
    cut mid-write): those no process is writing, as atomic_save locks its own while it writes.
    Every command that opens a run folder calls it: train.py --resume (run.open_run_folder),
    evaluate.py, the attack and the export (run.run_checkpoint), the runner's scoring of a cell
    (lab/cells.py). Only in a run's folder (it has run.json): a checkpoint.pt copied elsewhere (a
    downloads folder) may lie beside other programs' temporary files, which nothing here locks."""
    if not os.path.exists(os.path.join(folder, "run.json")):
        return
    for path in glob.glob(os.path.join(folder, "*.tmp")):
        try:
            with open(path, "rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a live writer's
                if is_there(f.fileno(), path):
                    os.remove(path)
        except OSError:  # a writer holds it (BlockingIOError), it went meanwhile, a folder
            continue


def hash_file(h, path):
    """h (a hashlib object) updated with the file's bytes, read a megabyte at a time."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h


def file_sha256(path):
    """The sha256 of a file's bytes (a model's weights, a cached file, a checkpoint)."""
    return hash_file(hashlib.sha256(), path).hexdigest()


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


def write_json(path, obj, indent=1):
    atomic_save(obj, path, lambda o, f: f.write(json.dumps(o, indent=indent).encode()))


def read_json(path, missing=None):
    """A JSON file's contents. A missing, unreadable or damaged file is one line naming it;
    missing: what that line adds when the file is not there (a model folder's needs)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise MinknnError(f"{path}: not found{f' ({missing})' if missing else ''}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MinknnError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise MinknnError(f"{path}: cannot be read ({e.strerror})") from None


def read_jsonl(path, fix=None):
    """The records of a JSON Lines file (metrics.jsonl, results.jsonl), each a JSON object. A
    line that is not one, like a last line cut short (a kill, a full disk, a copy), is named in
    one line, with `fix`: what would mend it."""
    records, then = [], f"; {fix}" if fix else ""
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None  # cut short, or never JSON
                if not isinstance(record, dict):
                    raise MinknnError(f"{path}:{n}: a truncated or damaged line (not a JSON "
                                      f"object){then}")
                records.append(record)
    except UnicodeDecodeError:
        raise MinknnError(f"{path}: not UTF-8, a damaged file{then}") from None
    except OSError as e:
        raise MinknnError(f"{path}: cannot be read ({e.strerror})") from None
    return records


def write_jsonl(path, records):
    atomic_save(records, path,
                lambda rs, f: f.write("".join(json.dumps(r) + "\n" for r in rs).encode()))


def write_csv(path, header, rows):
    """A CSV file of a header and rows, written whole (atomic_save)."""
    def writer(rows, f):
        text = io.StringIO()
        w = csv.writer(text)
        w.writerow(header)
        w.writerows(rows)
        f.write(text.getvalue().encode())
    atomic_save(rows, path, writer)

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
