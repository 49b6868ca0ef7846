"""Your files' rows (minknn/tasks/own_task.py makes a task of them; predict --file reads their
texts): CSV, TSV and JSON Lines, by the name's extension, each read a line at a time
(lines.read_lines: UTF-8, a byte-order mark and \r\n taken; readers.csv_rows: CSV quoting, a quoted
field closed on its own line), blank lines left out. CSV and TSV need a header row naming the
columns; JSON Lines hold an object a line, the columns its keys. Each row's texts and label are
checked against the kind (a class: a name or an integer; a score: a number; several classes: a list,
or a string cut at --label_sep), each fault one line naming the file, the line and the column. Which
classes there are, and each row's class index, is own_task.py's.
"""
import json
import math
import os
import re

from minknn.tasks.data import DataError
from minknn.tasks.lines import read_lines
from minknn.tasks.readers import csv_rows

FORMATS = {".csv": ",", ".tsv": "\t", ".jsonl": None}  # extension -> CSV delimiter (None: JSON)
SEPARATORS = {",": "comma", "\t": "tab", ";": "semicolon"}
OTHER = {",": "\t", "\t": ","}
EXTENSION = {",": ".csv", "\t": ".tsv"}
ONE_LINE = ("; and a text may not hold a line break: minknn reads one row a line (your file's "
            "texts with their line breaks replaced by spaces will do)")
INTEGER = re.compile(r"[+-]?\d+")


def table(path):
    """([(line number, {column: value})], the header's columns (None for JSON Lines), the header's
    line) of a CSV, TSV or JSON Lines file, each row whole (every field of the header), blank
    lines left out."""
    sep = FORMATS[os.path.splitext(path)[1].lower()]
    rows = []
    if sep is None:
        for lineno, line in enumerate(read_lines(path), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as e:
                why = getattr(e, "msg", "nested too deep")
                raise DataError(f"{path}:{lineno}: not a JSON object ({why}); a JSON Lines file "
                                f"holds one object a line") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: a JSON {type(row).__name__}, not an object "
                                f"({{\"text\": ..., \"label\": ...}})")
            rows.append((lineno, row))
        if not rows:
            raise DataError(f"{path}: no rows (the file is empty)")
        return rows, None, None
    lines = [(n, row) for n, row in enumerate(csv_rows(path, ONE_LINE, delimiter=sep), start=1)
             if row and (len(row) > 1 or row[0].strip())]  # not a blank line
    if not lines:
        raise DataError(f"{path}: the file is empty; it needs a header row, then one row a line")
    (first, header), body = lines[0], lines[1:]
    header = [h.strip() for h in header]
    for other in (OTHER[sep], ";"):  # a file of another separator: one field holding it
        if len(header) == 1 and other in header[0]:
            fix = (f"a {SEPARATORS[other]}-separated file is read as {EXTENSION[other]} (rename "
                   f"it)" if other in EXTENSION else "minknn reads comma-separated .csv and "
                   "tab-separated .tsv (save it as one)")
            raise DataError(f"{path}:{first}: the header is one {SEPARATORS[sep]}-separated "
                            f"field holding {SEPARATORS[other]}s: {fix}")
    twice = next((h for i, h in enumerate(header) if h and h in header[:i]), None)
    if twice:
        where = ", ".join(str(i + 1) for i, h in enumerate(header) if h == twice)
        raise DataError(f"{path}:{first}: the header names column '{twice}' twice (fields "
                        f"{where}); each column needs a name of its own")
    if not body:
        raise DataError(f"{path}: no rows below the header")
    for lineno, row in body:
        if len(row) != len(header):
            few = "too few" if len(row) < len(header) else "too many"
            raise DataError(f"{path}:{lineno}: {few} fields: {len(row)} {SEPARATORS[sep]}-"
                            f"separated fields, where the header has {len(header)} "
                            f"({', '.join(header)})" + ("; a text with a comma must be quoted "
                                                        "(\"..\")" if few == "too many" and
                                                        sep == "," else ""))
        rows.append((lineno, dict(zip(header, row))))
    return rows, header, first


def missing(path, line, column, header, what):
    """The line of a column the header lacks; one of another case is named."""
    near = next((h for h in header if h.lower() == column.lower()), None)
    seen = f"; the header has '{near}' (names are matched exactly)" if near else \
        f"; the header has: {', '.join(header)}"
    return DataError(f"{path}:{line}: no column '{column}' ({what}){seen}")


def check_columns(path, rows, header, line, spec, source):
    """The text columns and, but in a test file, the label column must be the file's; returns
    whether its rows have labels. A CSV whose first row names none of them has no header."""
    texts, label = spec["text_columns"], spec["label_column"]  # label None: texts only
    named = texts + ([label] if label else [])
    if header is not None:
        if label and not {n.lower() for n in named} & {h.lower() for h in header}:
            raise DataError(f"{path}:{line}: the first line ({', '.join(header)[:80]}) names none "
                            f"of the columns {', '.join(named)}: the file needs a header row "
                            f"naming its columns (or give --text_column and --label_column)")
        for column in texts:
            if column not in header:
                raise missing(path, line, column, header, "--text_column")
        if label and label not in header and source != "test":
            raise missing(path, line, label, header, "the labels, --label_column")
        return bool(label) and label in header
    labelled = bool(label) and any(label in row for _, row in rows)
    for lineno, row in rows:
        for column in texts + ([label] if source != "test" or labelled else []):
            if column not in row:
                raise DataError(f"{path}:{lineno}: no '{column}' in this row (its keys: "
                                f"{', '.join(row)[:80]})" + (" (give --text_column)" if
                                                            column in texts else ""))
    return labelled


def class_value(raw, where, column):
    """A class as a file writes it: an integer (3, '3', 3.0) or a name ('positive'); a number with
    a fraction, or true/false, is refused."""
    if isinstance(raw, bool) or raw is None or isinstance(raw, (list, dict)):
        what = {bool: "true/false", type(None): "null", list: "a list",
                dict: "an object"}[type(raw)]
        hint = ("; a row of several classes is --task_kind multilabel" if isinstance(raw, list)
                else "")
        raise DataError(f"{where}: column '{column}' holds {what}, not a class{hint}")
    if isinstance(raw, str):
        raw = raw.strip()
        if INTEGER.fullmatch(raw):
            return int(raw)
        try:
            number = float(raw)
        except ValueError:
            return raw
        if not math.isfinite(number):
            return raw
        raw = number
    if isinstance(raw, float) and not math.isfinite(raw):
        raise DataError(f"{where}: column '{column}' holds {raw}, not a class")
    if isinstance(raw, float) and not raw.is_integer():
        raise DataError(f"{where}: column '{column}' holds {raw}, a number with a fraction, "
                        f"where a classification task wants a class (a name or an integer); "
                        f"scores are --task_kind similarity")
    return int(raw)


def row_classes(raw, spec, where, column):
    """A row's classes as written: one (classify) or a list (multilabel)."""
    if spec["kind"] == "classify":
        return [class_value(raw, where, column)]
    if isinstance(raw, str):
        raw = [part for part in raw.split(spec["label_sep"]) if part.strip()]
    elif not isinstance(raw, list):
        raise DataError(f"{where}: column '{column}' holds {json.dumps(raw)}, not a list of "
                        f"classes (or a string of them cut by --label_sep "
                        f"'{spec['label_sep']}')")
    return [class_value(value, where, column) for value in raw]


def similarity(raw, where, column):
    """A similarity score: a finite number, or a text that reads as one."""
    try:
        score = float(raw) if not isinstance(raw, bool) and raw is not None else None
    except (TypeError, ValueError):
        score = None
    if score is None or not math.isfinite(score):
        shown = raw if isinstance(raw, str) else json.dumps(raw)
        raise DataError(f"{where}: column '{column}' holds '{shown}', not a number: --task_kind "
                        f"similarity wants a score a row")
    return score


def parsed(path, spec, source):
    """[(line, texts, classes or a score or None)] of a file, every text and label checked
    against the kind (not yet against the classes)."""
    rows, header, line = table(path)
    labelled = check_columns(path, rows, header, line, spec, source)
    label = spec["label_column"]
    if labelled and source == "test" and all(empty(row[label]) for _, row in rows):
        labelled = False  # a test file's label column left empty (pandas' NaN): unlabelled
    out = []
    for lineno, row in rows:
        where = f"{path}:{lineno}"
        texts = []
        for column in spec["text_columns"]:
            text = row[column]
            if not isinstance(text, str):
                raise DataError(f"{where}: column '{column}' holds {json.dumps(text)}, not a "
                                f"text")
            if not text.strip():
                raise DataError(f"{where}: column '{column}' is empty; every row needs its text")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, which JSON's "\\ud83d" can write
                raise DataError(f"{where}: column '{column}' holds a lone surrogate (a half of a "
                                f"character, JSON's \\ud83d alone), which no text can hold"
                                ) from None
            texts.append(text.strip())
        value = None
        if labelled:
            raw = row[label]
            if raw is None or (spec["kind"] != "multilabel" and empty(raw)):
                raise DataError(f"{where}: column '{label}' is empty (no label)")
            value = (similarity(raw, where, label) if spec["kind"] == "similarity"
                     else row_classes(raw, spec, where, label))
        out.append((lineno, texts, value))
    return out


def empty(value):
    """A label left empty: null, or a blank string."""
    return value is None or isinstance(value, str) and not value.strip()


def file_texts(path, columns):
    """[(line, texts)] of a CSV, TSV or JSON Lines file's text columns (predict --file), each row
    checked as a training file's are."""
    spec = {"kind": "classify", "text_columns": columns, "label_column": None}
    return [(lineno, texts) for lineno, texts, _ in parsed(path, spec, "test")]


def label_type(value):
    return "an integer" if isinstance(value, int) else "a name"
