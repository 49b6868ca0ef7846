"""File readers, one per official format. Each is reader(paths, task, source) -> list[Example]:
paths are the source's files (Task.files), source the official split they hold ("train",
"dev", "test", "all"); most readers need only the paths. A row that cannot be read stops the
run with one line naming the file and line (DataError), before any training. Files are read as
UTF-8 line by line (minknn/tasks/lines.py read_lines: a byte-order mark dropped, \r\n line ends as
\n), where a byte that is not UTF-8 is such a line; in SentEval's and Reuters' files (latin-1, as
SentEval reads them) a line that is not UTF-8 is read as latin-1, that line alone, with a note.

Labels are parsed against the task: a class given by its index ("0", "1") or by its name
("entailment"); a similarity score in [0, 5]; a multi-label example's classes as a sorted tuple
of indices.
"""
import csv
import html
import os
import re
import tarfile

from minknn.tasks.data import DataError, Example
from minknn.tasks.lines import read_lines


def parse_class(value, task, where):
    """A class index ("3") or a class name ("entailment") -> the index."""
    value = value.strip()
    if value in task.labels:
        return task.labels.index(value)
    try:
        label = int(value)
    except ValueError:
        label = -1
    if not 0 <= label < len(task.labels):
        raise DataError(f"{where}: unknown label '{value}'; {task.name} labels are "
                        f"0..{len(task.labels) - 1}"
                        + (f" ({', '.join(task.labels)})" if len(task.labels) <= 6 else ""))
    return label


def parse_label(value, task, where):
    """A similarity score (a number in [0, 5]) or a class; Quora writes its classes as 0.0 and
    1.0."""
    if task.kind == "similarity":
        try:
            score = float(value)
        except ValueError:
            score = -1.0
        if not 0 <= score <= 5:
            raise DataError(f"{where}: similarity '{value}' is not a number in [0, 5]")
        return score
    if value.strip() in ("0.0", "1.0"):
        value = value.strip()[0]
    return parse_class(value, task, where)


def parse_classes(names, task, where):
    """Multi-label: class names or indices -> their sorted, distinct indices."""
    return tuple(sorted({parse_class(name, task, where) for name in names}))


def header_columns(header, path, required):
    for column in required:
        if column not in header:
            raise DataError(f"{path}:1: header {header} has no '{column}' column")
    return [header.index(column) for column in required]


def csv_rows(path, hint="", **fmt):
    """The rows of a CSV (or tab-separated, CSV-quoted) file whose fields hold no line breaks
    (every such file minknn reads): one row per line, each line parsed alone. A field wrapped in
    quotes ("..", with "" for a quote mark inside) must close on its own line: read as one
    stream, a stray quote mark opening a field would swallow the lines up to the next quote mark
    into one text and drop their rows without a word. Such a line is one line naming it (hint:
    what that line adds)."""
    rows = []
    for lineno, line in enumerate(read_lines(path), start=1):
        try:
            rows.append(next(csv.reader([line], strict=True, **fmt)))
        except csv.Error as e:
            why = ("a field opens with a quote mark (\") that does not close on this line"
                   if "end of data" in str(e) else f"the CSV quoting is broken ({e})")
            raise DataError(f"{path}:{lineno}: {why}; a quoted field is \"..\", with \"\" for a "
                            f"quote mark inside{hint}") from None
    return rows


# ------------------------------------------------------------------------ CS224N minBERT

def read_minbert_sentiment(paths, task, source):
    """ids-sst-*.csv, ids-cfimdb-*.csv: tab-separated, a header row, columns found by name: id,
    sentence and (not in test-student files) sentiment. Fields are split on tabs only: the
    CFIMDB texts hold quote marks that a CSV reader would eat."""
    path = paths[0]
    lines = read_lines(path)
    if not lines:
        raise DataError(f"{path}: the file is empty")
    header = lines[0].split("\t")
    i_id, i_text = header_columns(header, path, ("id", "sentence"))
    i_label = label_column(header, "sentiment", path, source)
    examples = []
    for lineno, line in enumerate(lines[1:], start=2):
        row = line.split("\t")
        if len(row) != len(header):
            raise DataError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, "
                            f"got {len(row)}")
        label = None if i_label is None else parse_class(row[i_label], task, f"{path}:{lineno}")
        examples.append(Example(text=row[i_text].strip(), label=label, id=row[i_id]))
    return examples


def label_column(header, name, path, source):
    """The index of the label column; None in a test file (minBERT's test-student files and
    GLUE's test files have no labels), an error in a train or dev file."""
    if name in header:
        return header.index(name)
    if source in ("train", "dev"):
        raise DataError(f"{path}:1: the header has no '{name}' column; a {source} file needs its "
                        f"labels")
    return None


def read_minbert_pairs(paths, task, source):
    """quora-*.csv, sts-*.csv: tab-separated with CSV quoting (a field may be wrapped in double
    quotes, with "" for a quote mark inside), a header row, columns found by name: id,
    sentence1, sentence2 and (not in test-student files) is_duplicate (0.0 or 1.0) or
    similarity (a number in [0, 5]).
    One exception to "a bad row stops the run": quora-dev.csv has two rows whose second sentence
    swallowed the rest of the line, leaving the label empty. The starter code drops them silently;
    we drop rows with an empty label and say which lines."""
    path = paths[0]
    rows = csv_rows(path, delimiter="\t")
    if not rows:
        raise DataError(f"{path}: the file is empty")
    header = rows[0]
    i_id, i_a, i_b = header_columns(header, path, ("id", "sentence1", "sentence2"))
    column = "similarity" if task.kind == "similarity" else "is_duplicate"
    i_label = label_column(header, column, path, source)
    examples, dropped = [], []
    for row_number, row in enumerate(rows[1:], start=2):
        where = f"{path}:{row_number}"
        if len(row) != len(header):
            raise DataError(f"{where}: expected {len(header)} tab-separated fields, got {len(row)}")
        label = None
        if i_label is not None:
            if not row[i_label].strip():
                dropped.append(str(row_number))
                continue
            label = parse_label(row[i_label], task, where)
        examples.append(Example(text=row[i_a].strip(), text_b=row[i_b].strip(), label=label,
                                id=row[i_id]))
    if dropped:
        print(f"{path}: dropped {len(dropped)} rows with an empty {column} label "
              f"(lines {', '.join(dropped)})")
    return examples


# ------------------------------------------------------------------------ GLUE

def glue_tsv(text, text_b=None, label="label", id="index", columns=None):
    """A reader of GLUE's tsv files (download_glue_data.py's layout): tab-separated with no
    quoting (texts hold bare quote marks, so GLUE's loaders read them with QUOTE_NONE; we split
    on tabs), a header row naming the columns (that may start with a byte-order mark), or, for
    CoLA's headerless train and dev files, the names in `columns`. text, text_b, label: the
    columns read; id: a column, or a tuple of columns joined by "-" (MRPC's "#1 ID", "#2 ID");
    a test file without the label column (GLUE's test files) gives unlabelled examples."""
    def read(paths, task, source):
        path = paths[0]
        lines = read_lines(path)
        if not lines:
            raise DataError(f"{path}: the file is empty")
        header, first = (list(columns), 1) if columns else (lines[0].split("\t"), 2)
        wanted = (text,) + ((text_b,) if text_b else ())
        i_texts = header_columns(header, path, wanted)
        ids = (id,) if isinstance(id, str) else id
        i_ids = [header.index(c) for c in ids if c in header]
        i_label = label_column(header, label, path, source)
        examples = []
        for lineno, line in enumerate(lines[first - 1:], start=first):
            row = line.split("\t")
            if len(row) != len(header):
                raise DataError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, "
                                f"got {len(row)}")
            where = f"{path}:{lineno}"
            examples.append(Example(
                text=row[i_texts[0]].strip(), text_b=row[i_texts[1]].strip() if text_b else None,
                label=None if i_label is None else parse_label(row[i_label], task, where),
                id="-".join(row[i] for i in i_ids) if i_ids else str(lineno)))
        return examples
    return read


# ------------------------------------------------------------------------ SentEval

def read_senteval_classes(paths, task, source):
    """MR, CR, SUBJ, MPQA (SentEval's processed files): one sentence per line, one file per
    class, the files given in class order (rt-polarity.neg is class 0, .pos class 1). SentEval
    keeps blank lines as samples (CR has 4, MPQA 3); we drop them: an empty text is no example."""
    examples = []
    for label, path in enumerate(paths):
        for lineno, line in enumerate(read_lines(path, latin1=True), start=1):
            if line.strip():
                examples.append(Example(text=line.strip(), label=label,
                                        id=f"{os.path.basename(path)}:{lineno}"))
    return examples


def read_labelled_lines(paths, task, source, split, expected, trec=False):
    """One example per line of paths[0] (a line that is not UTF-8 read as latin-1, as SentEval
    reads them): split(line) -> (label, text), or None for a line that is not `expected`. trec:
    blank lines are skipped, and the error shows the line's start."""
    path, examples = paths[0], []
    for lineno, line in enumerate(read_lines(path, latin1=True), start=1):
        if trec and not line.strip():
            continue
        found = split(line)
        if found is None:
            got = f", got '{line[:40]}'" if trec else ""
            raise DataError(f"{path}:{lineno}: expected {expected}{got}")
        label, text = found
        examples.append(Example(text=text.strip(), label=parse_class(label, task,
                                                                     f"{path}:{lineno}"),
                                id=f"{source}:{lineno}"))
    return examples


def read_trec(paths, task, source):
    """TREC (train_5500.label, TREC_10.label): "COARSE:fine question", one per line; the label is
    the coarse class (ABBR, DESC, ENTY, HUM, LOC, NUM), as in SentEval."""
    def split(line):
        label, _, text = line.partition(" ")
        return (label.split(":")[0], text) if ":" in label and text.strip() else None
    return read_labelled_lines(paths, task, source, split, "'COARSE:fine question'", trec=True)


def read_sst_binary(paths, task, source):
    """SentEval's SST/binary/sentiment-{train,dev,test}: "sentence<TAB>label" per line."""
    def split(line):
        text, tab, label = line.rpartition("\t")
        return (label, text) if tab else None
    return read_labelled_lines(paths, task, source, split, "'sentence<TAB>label'")


def read_sst_fine(paths, task, source):
    """SentEval's SST/fine/sentiment-{train,dev,test}: "label sentence" per line, labels 0-4."""
    def split(line):
        label, _, text = line.partition(" ")
        return (label, text) if text.strip() else None
    return read_labelled_lines(paths, task, source, split, "'label sentence'")


# ------------------------------------------------------------------------ IMDB, AG News

def read_imdb(paths, task, source):
    """The Large Movie Review Dataset (Maas et al. 2011), read straight from the official archive
    aclImdb_v1.tar.gz: the reviews aclImdb/<source>/{neg,pos}/<id>_<rating>.txt, neg class 0 and
    pos class 1, in name order. Reading the archive takes about as long as reading the 50,000
    extracted files (2 s against 1 s on our machine), so nothing is extracted or written. The
    reviews' HTML line breaks (<br />) become spaces; a byte-order mark is dropped, \r\n read as
    \n."""
    path, examples = paths[0], []
    pattern = re.compile(rf"aclImdb/{source}/(neg|pos)/(\d+_\d+)\.txt")
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                match = pattern.fullmatch(member.name)
                if match and member.isfile():
                    try:
                        text = (archive.extractfile(member).read().decode("utf-8-sig")
                                .replace("<br />", " ").replace("\r\n", "\n"))
                    except UnicodeDecodeError as e:
                        raise DataError(f"{path}: {member.name} is not UTF-8 "
                                        f"({e.reason})") from None
                    examples.append((match.group(1), match.group(2), text))
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{path}: not a readable aclImdb archive "
                        f"({type(e).__name__}: {e})") from None
    examples.sort()
    return [Example(text=text.strip(), label=int(side == "pos"), id=f"{source}/{side}/{name}")
            for side, name, text in examples]


def read_agnews(paths, task, source):
    """AG's News (ag_news_csv/{train,test}.csv): CSV rows "class","title","description", classes
    1-4 (classes.txt: World, Sports, Business, Sci/Tech). The text is the title and the
    description, as in Zhang et al. 2015; the files write a line break inside a description as a
    backslash, which becomes a space."""
    path = paths[0]
    examples = []
    for lineno, row in enumerate(csv_rows(path), start=1):
        if len(row) != 3:
            raise DataError(f"{path}:{lineno}: expected 3 comma-separated fields, got {len(row)}")
        label = int(row[0]) - 1 if row[0].strip().isdigit() else -1  # classes 1..4 -> indices 0..3
        if not 0 <= label < len(task.labels):
            raise DataError(f"{path}:{lineno}: unknown class '{row[0]}'; {task.name} classes are "
                            f"1..{len(task.labels)}")
        text = f"{row[1].strip()} {row[2].strip()}".replace("\\", " ")
        examples.append(Example(text=text, label=label, id=f"{source}:{lineno}"))
    return examples


# ------------------------------------------------------------------------ multi-label

# one <REUTERS> element, not across a story
REUTERS_ELEMENT = re.compile(r"<REUTERS\b([^>]*)>((?:(?!<REUTERS\b).)*?)</REUTERS>", re.S)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def reuters_text(body):
    """A story's text: its TITLE and BODY, or the whole TEXT element when it has neither (TYPE
    "UNPROC"); SGML entities (&lt;, &#3;) decoded, control characters removed."""
    pieces = [m.group(1) for tag in ("TITLE", "BODY")
             for m in [re.search(rf"<{tag}>(.*?)</{tag}>", body, re.S)] if m]
    if not pieces:
        text = re.search(r"<TEXT[^>]*>(.*?)</TEXT>", body, re.S)
        pieces = [re.sub(r"<[^>]+>", " ", text.group(1))] if text else []
    return CONTROL.sub(" ", html.unescape("\n".join(pieces))).strip()


def read_reuters(paths, task, source):
    """Reuters-21578 (Distribution 1.0): the SGML files reut2-000.sgm .. reut2-021.sgm, a line
    that is not UTF-8 read as latin-1 (one byte of reut2-017.sgm). The ModApte split (the
    collection's README, section VIII.B): stories with TOPICS="YES" and LEWISSPLIT="TRAIN" (9,603)
    or "TEST" (3,299), of which we keep those with at least one of the task's 90 topic categories
    (those with a training and a test story): 7,770 and 3,019. Their other topics are dropped."""
    split, examples = source.upper(), []
    for path in paths:
        sgml = "\n".join(read_lines(path, latin1=True))
        found, line, seen = 0, 1, 0
        for match in REUTERS_ELEMENT.finditer(sgml):
            found += 1
            # the story's line number, counted as we go
            line, seen = line + sgml.count("\n", seen, match.start()), match.start()
            where = f"{path}:{line}"
            attrs = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            if "NEWID" not in attrs or "LEWISSPLIT" not in attrs or "TOPICS" not in attrs:
                raise DataError(f"{where}: a <REUTERS> element without its TOPICS, LEWISSPLIT and "
                                f"NEWID attributes")
            if attrs["TOPICS"] != "YES" or attrs["LEWISSPLIT"] != split:
                continue
            topics = re.search(r"<TOPICS>(.*?)</TOPICS>", match.group(2), re.S)
            names = re.findall(r"<D>(.*?)</D>", topics.group(1)) if topics else []
            classes = tuple(sorted(task.labels.index(n) for n in set(names) if n in task.labels))
            if classes:
                examples.append(Example(text=reuters_text(match.group(2)), label=classes,
                                        id=attrs["NEWID"]))
        if found != sgml.count("<REUTERS "):
            opened = [m.start() for m in re.finditer(r"<REUTERS ", sgml)]
            closed = {m.start() for m in REUTERS_ELEMENT.finditer(sgml)}
            bad = next(i for i in opened if i not in closed)
            raise DataError(f"{path}:{sgml.count(chr(10), 0, bad) + 1}: a <REUTERS> element that "
                            f"is never closed")
        if not found:  # every file of the collection holds 1,000 stories (the last, 578)
            raise DataError(f"{path}: no <REUTERS> story in it (an empty or truncated copy?)")
    return examples


def read_goemotions(paths, task, source):
    """GoEmotions (data/{train,dev,test}.tsv): tab-separated with CSV quoting (1,097 training
    texts are wrapped in quotes), no header; columns text, emotion ids (comma-separated indices
    into emotions.txt, 27 = neutral) and the Reddit comment id."""
    path = paths[0]
    examples = []
    for lineno, row in enumerate(csv_rows(path, delimiter="\t"), start=1):
        if len(row) != 3:
            raise DataError(f"{path}:{lineno}: expected 3 tab-separated fields, got {len(row)}")
        classes = parse_classes(row[1].split(","), task, f"{path}:{lineno}")
        examples.append(Example(text=row[0].strip(), label=classes, id=row[2]))
    return examples


def read_aapd(paths, task, source):
    """AAPD (Yang et al. 2018, the SGM paper's layout): text_<split> holds one abstract per line
    (tokens separated by spaces), label_<split> the same line's labels (arXiv subjects, separated
    by spaces); paths = (text file, label file)."""
    text_path, label_path = paths
    texts, labels = read_lines(text_path), read_lines(label_path)
    if len(texts) != len(labels):
        raise DataError(f"{label_path}: {len(labels)} lines of labels for the {len(texts)} texts "
                        f"of {text_path}")
    examples = []
    for lineno, (text, names) in enumerate(zip(texts, labels), start=1):
        if not names.split():
            raise DataError(f"{label_path}:{lineno}: no labels")
        examples.append(Example(text=text.strip(),
                                label=parse_classes(names.split(), task, f"{label_path}:{lineno}"),
                                id=f"{source}:{lineno}"))
    return examples


def aapd_label_names(label_path):
    """AAPD ships no list of its 54 labels: they are the names in its training label file,
    sorted."""
    if not os.path.exists(label_path):
        raise DataError(f"{label_path}: not found; AAPD's labels are read from it")
    return sorted({name for line in read_lines(label_path) for name in line.split()})
