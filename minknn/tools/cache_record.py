"""A cache folder's record of its files (minknn/tools/packaged.py): each file's sha256, checked when
the folder was made, with the stamps the file had then: its size, modification time (mtime) and
status-change time (ctime).

A later load checks each file by its stamps, one stat per file and no read: a file whose stamps
are the record's is taken as it was. Only a file whose stamps differ is hashed: the same sha256
(a copy of the cache, a touch, a chmod) and the record takes its new stamps, so the next load is
cheap again; another sha256 (a flipped bit, a truncation, a replacement) and the folder is
damaged. ctime is what sees a change whose writer put the old mtime back (touch -d, os.utime,
cp -p over it): setting a file's mtime sets its ctime to now, and no call sets ctime back.
What the stamps cannot see: a change beneath the file system (bit rot on the disk, a write to
the raw device) or one made with the clock set back. Deleting the record (RECORD, in the folder)
makes the next load hash every file, as it does for a folder made before records were kept:
that folder is checked once in full, and its record written.
"""
import os

from minknn import MinknnError, first_process
from minknn.tools.files import file_sha256, read_json, write_json

RECORD = "minknn-record.json"  # in the folder it describes: it is renamed into place with them


def stamps(path):
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def write_record(folder, files):
    """Records the files of `files` ({path in folder: sha256}, each checked already) with their
    stamps now, into folder/RECORD (a temporary file renamed into place)."""
    write_json(os.path.join(folder, RECORD), {"files": {
        file: {"sha256": sha256, **stamps(os.path.join(folder, file))}
        for file, sha256 in files.items()}})


def read_record(folder):
    """{path: its entry} of folder/RECORD; {} where there is none or it cannot be read (then
    every file is hashed, and the record written again)."""
    try:
        record = read_json(os.path.join(folder, RECORD))
    except MinknnError:
        return {}
    files = record.get("files") if isinstance(record, dict) else None
    return files if isinstance(files, dict) else {}


def damage(folder, files):
    """None where every file of `files` ({path in folder: sha256}) is as it was made; else (the
    first file that is not, why). Hashes only the files whose stamps differ from the record's
    (every file where there is no record), and records the new stamps of those whose sha256 is
    still the right one (where the folder cannot be written, they are hashed again next time)."""
    record, changed = read_record(folder), False
    if not record and first_process():
        print(f"checking the {len(files)} files of {folder} against their sha256 once (made "
              f"before minknn kept a record of them)", flush=True)
    for file, sha256 in files.items():
        path = os.path.join(folder, file)
        try:
            now = stamps(path)
        except FileNotFoundError:
            return path, "missing"
        was = record.get(file)
        if was == {"sha256": sha256, **now}:
            continue  # the cheap check: as it was when it was hashed
        if isinstance(was, dict) and was.get("sha256") == sha256 and was.get("size") != now["size"]:
            return path, f"{now['size']:,} bytes, where it was made with {was['size']:,}"
        got = file_sha256(path)
        if got != sha256:
            return path, f"sha256 {got}, not {sha256}"
        record[file], changed = {"sha256": sha256, **now}, True
    if changed:
        try:
            write_json(os.path.join(folder, RECORD), {"files": record})
        except MinknnError:  # a read-only cache: still checked, by the hash, at each load
            pass
    return None
