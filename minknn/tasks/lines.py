"""A file's lines, decoded one at a time, as every reader of a data file reads them
(minknn/tasks/readers.py's official formats, minknn/tasks/own_files.py's CSV, TSV and JSON Lines,
predict's .txt): UTF-8 line by line, a byte-order mark and \\r\\n line ends taken, and, where a
format allows it (SentEval's, Reuters'), a line that is not UTF-8 read as latin-1, that line alone,
with a note. A file or a line that cannot be read is one line naming it (minknn/tasks/data.py
DataError).
"""
import os

from tqdm import tqdm

from minknn import first_process
from minknn.tasks.data import DataError


def read_bytes(path):
    """The file's bytes; a file that cannot be read (a folder, no permission) is one line naming
    it."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror})") from None


BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which some editors write at a file's start
_NOTED = set()  # (file, lines) whose latin-1 note this process has given


def read_lines(path, latin1=False):
    """The file's lines, a byte-order mark at its start dropped, each without its line end (\n or
    \r\n). Lines end at \n only: str.splitlines() would also break at characters such as U+2028
    inside a text. Each line is UTF-8; a line that is not is one line naming the file and line
    (the official files of every task but SentEval's and Reuters' are UTF-8: such a byte means a
    damaged copy), or, with latin1=True, that line alone is read as latin-1, and said in a note
    (SentEval reads its files as latin-1; TREC's training file has one byte that is not UTF-8).
    The whole file read as latin-1 would silently turn every correct accent of its other lines
    into two characters ('é' into 'Ã©')."""
    data = read_bytes(path).removeprefix(BOM)
    try:
        return split_lines(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        if not latin1:
            line = data.count(b"\n", 0, e.start) + 1
            raise DataError(f"{path}:{line}: not UTF-8 ({e.reason})") from None
    lines, latin = [], []
    for lineno, line in enumerate(split_lines(data), start=1):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(line.decode("latin-1"))
            latin.append(lineno)
    note_latin1(path, latin)
    return lines


def split_lines(text):
    """text (str or bytes) cut at each \n, a \r before it dropped; a final \n ends the last line."""
    lines = text.split("\n" if isinstance(text, str) else b"\n")
    lines = [line[:-1] if line[-1:] in ("\r", b"\r") else line for line in lines]
    return lines[:-1] if not lines[-1] else lines


def note_latin1(path, lines, shown=10):
    """`note: <path>: lines 17, 230 are not UTF-8; read as latin-1` on stdout (the first `shown`
    line numbers, then how many more), once a process for the same file and lines: TREC's train
    and dev splits are both read from train_5500.label. Under torchrun rank 0 alone says it."""
    if not lines or (os.path.abspath(path), tuple(lines)) in _NOTED:
        return
    _NOTED.add((os.path.abspath(path), tuple(lines)))
    numbers = ", ".join(map(str, lines[:shown])) + (
        f" and {len(lines) - shown} more" if len(lines) > shown else "")
    which = f"line {numbers} is" if len(lines) == 1 else f"lines {numbers} are"
    if first_process():
        tqdm.write(f"note: {path}: {which} not UTF-8; read as latin-1")
