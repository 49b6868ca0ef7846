"""Tests of minknn/tasks/readers.py: every reader in the task registry (minknn/tasks/registry.py), each on a tiny
fixture written in its dataset's official format (tests/fixtures/data, laid out like the real data
root), read through data.load_split.

For each task: its example counts, a first example (text, text_b, label, id), its labels parsed as
the task's classes, its carved splits (train and dev disjoint and together the whole source, test
apart from both, the same dev every run), and one malformed input (a one-line DataError naming
file:line). The fixtures carry the quirks that ../shared/data/SOURCES.md lists for the real files (blank
lines, a latin-1 byte, a headerless file, bare and CSV-doubled quote marks, SGML entities), and the
tests add a byte-order mark where a real file could have one. Every reader is then tried on a BOM, on \r\n line ends
and on one line that is not UTF-8 (read alone as latin-1 with a note, or named). Then the official-count warning.
sst, cfimdb, quora, sts and mrpc are tested in tests/test_data.py. IMDB's fixture is no committed
binary: the tests build a tiny aclImdb_v1.tar.gz in tmp_path.
"""
import dataclasses
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from minknn.tasks.data import DataError, Example, load_split, read_source, source_paths
from minknn.tasks.registry import TASKS, get_task

TESTED_IN_TEST_DATA = {"sst", "cfimdb", "quora", "sts", "mrpc"}
REUTERS_FIXTURES = ("reut2-000.sgm", "reut2-001.sgm")


def fixture_task(name, data_dir):
    """The registry's entry, except that Reuters reads only the two fixture files (the entry lists all
    22) and AAPD's labels come from the fixture's label_train (tasks.get_task)."""
    if name == "reuters":
        return dataclasses.replace(TASKS["reuters"], files={"train": REUTERS_FIXTURES, "test": REUTERS_FIXTURES})
    return get_task(name, data_dir)


def ids(examples):
    return [e.id for e in examples]


def texts(examples):
    return {(e.text, e.text_b) for e in examples}


def names(task, example):
    """A multi-label example's class names, in its (sorted) index order."""
    return tuple(task.labels[c] for c in example.label)


def copy_and_edit(data_dir, tmp_path, task, name, lineno, old, new):
    """Copies the task's folder to tmp_path, replaces the first `old` by `new` in line `lineno`
    (1-based) of its file `name`, byte for byte (the TREC file is latin-1), and returns the new root."""
    shutil.copytree(os.path.join(data_dir, task.dataset), tmp_path / task.dataset)
    path = tmp_path / task.dataset / name
    lines = path.read_bytes().split(b"\n")
    assert old in lines[lineno - 1], f"fixture changed: {name}:{lineno} has no {old!r}"
    lines[lineno - 1] = lines[lineno - 1].replace(old, new, 1)
    path.write_bytes(b"\n".join(lines))
    return str(tmp_path)


def check_carved(task, data_dir, sizes):
    """The splits of a task whose dev (and, for SentEval, test) is cut from an official source:
    the sizes, train and dev disjoint and together the whole source, test apart from both, and the
    same dev ids again whatever the global random state (the cut uses its own Random(0))."""
    source = task.splits["dev"][0]
    test_is_carved = not isinstance(task.splits["test"], str)  # SentEval: test is cut from the same source
    whole = read_source(task, source, data_dir)
    random.seed(1)
    train = load_split(task, "train", data_dir)
    random.seed(2)
    dev = load_split(task, "dev", data_dir)
    test = load_split(task, "test", data_dir)
    name = task.name
    assert (len(train), len(dev), len(test)) == sizes, f"{name}: (train, dev, test) sizes"
    assert len(set(ids(whole))) == len(whole), f"{name}: ids of the {source} source are not unique"
    assert not set(ids(train)) & set(ids(dev)), f"{name}: train and dev share {set(ids(train)) & set(ids(dev))}"
    carved = train + dev + (test if test_is_carved else [])
    assert sorted(ids(carved)) == sorted(ids(whole)), f"{name}: the carved splits are not the whole {source} source"
    assert not texts(test) & texts(train + dev), f"{name}: the test split shares examples with train/dev"
    if test_is_carved:
        assert not set(ids(test)) & set(ids(train + dev)), f"{name}: test shares ids with train/dev"
    random.seed(3)
    assert ids(load_split(task, "dev", data_dir)) == ids(dev), f"{name}: a second load gives another dev split"
    return train, dev, test


def test_every_task_has_a_reader_test_here_or_in_test_data():
    covered = {"mr", "cr", "subj", "mpqa", "trec", "sst2", "sst5", "rte", "cola", "glue-sst2", "qnli", "stsb",
               "imdb", "agnews", "reuters", "goemotions", "aapd"}
    untested, stale = set(TASKS) - TESTED_IN_TEST_DATA - covered, covered - set(TASKS)
    assert not untested, \
        f"registry tasks without a reader test: {sorted(untested)} (add one, and the name above)"
    assert not stale, f"reader tests of tasks no longer in the registry: {sorted(stale)}"


# task -> the fixture that writes its files in tmp_path (a binary archive is not committed)
BUILT_FIXTURES = {"imdb": "imdb_root"}


def test_every_registered_task_reads_its_fixture(request, data_dir):
    """Every task of the registry (minknn/tasks/registry.py), whatever its reader: each of its splits loads
    from the task's fixture, as examples whose texts and labels fit the task. The list is the
    registry itself, so a task added without a fixture fails here, named."""
    for name, registered in TASKS.items():
        built = BUILT_FIXTURES.get(name)
        root = request.getfixturevalue(built) if built else data_dir
        files = registered.files
        if name == "reuters":  # the registry lists 22 files; the fixture has two
            files = {"train": REUTERS_FIXTURES, "test": REUTERS_FIXTURES}
        where = dataclasses.replace(registered, files=files)
        missing = [os.path.join("tests", "fixtures", "data", os.path.relpath(path, root))
                   for source in files for path in source_paths(where, source, root)
                   if not os.path.isfile(path)]
        assert not missing, (f"task '{name}' (minknn/tasks/registry.py) has no test fixture: "
                             f"{', '.join(missing)}; write a few lines of each official file "
                             f"there, in its format (or, for a binary, a fixture that writes it "
                             f"in tmp_path: BUILT_FIXTURES in tests/test_readers.py)")
        task = dataclasses.replace(fixture_task(name, root), url="")  # never a download here
        for split in task.splits or task.files:
            examples = load_split(task, split, root)
            for e in examples:
                what = f"{name} {split} {e.id}"
                assert isinstance(e.text, str) and e.text.strip(), f"{what}: an empty text"
                assert (e.text_b is not None) == task.pair, \
                    f"{what}: text_b {e.text_b!r} in a task with pair={task.pair}"
                assert e.label is None or label_fits(task, e.label), f"{what}: label {e.label!r}"
            assert split != "train" or all(e.label is not None for e in examples), \
                f"{name}: unlabelled training examples"


def label_fits(task, label):
    """A class index, a similarity score in [0, 5], or a multi-label example's sorted class
    indices."""
    if task.kind == "similarity":
        return isinstance(label, float) and 0 <= label <= 5
    if task.kind == "multilabel":
        return isinstance(label, tuple) and list(label) == sorted(set(label)) and all(
            isinstance(c, int) and 0 <= c < len(task.labels) for c in label)
    return isinstance(label, int) and 0 <= label < len(task.labels)


# ------------------------------------------------------------------ SentEval MR, CR, SUBJ, MPQA

def test_mr_reads_a_file_per_class_and_cuts_80_10_10(data_dir):
    task = TASKS["mr"]
    whole = read_source(task, "all", data_dir)
    assert len(whole) == 40, "mr: 20 lines in each of rt-polarity.neg and .pos"
    assert whole[0] == Example("the film is bad and boring .", None, 0, "rt-polarity.neg:1"), "mr: first example"
    assert whole[20] == Example("the film is great and wonderful .", None, 1, "rt-polarity.pos:1"), "mr: first .pos"
    assert [task.labels[e.label] for e in (whole[0], whole[20])] == ["negative", "positive"], "mr: class order"
    train, dev, test = check_carved(task, data_dir, (32, 4, 4))
    # a cut of the pooled files without the shuffle would give a test split of .pos lines only
    assert {e.label for e in test} == {0, 1}, "mr: the test split holds one class only"


def test_cr_drops_blank_lines_but_keeps_line_numbers(data_dir):
    task = TASKS["cr"]
    whole = read_source(task, "all", data_dir)
    assert len(whole) == 20, "cr: 10 non-blank lines per file (custrev.* hold blank lines, as SentEval's)"
    assert all(e.text for e in whole), "cr: a blank line was kept as an example"
    neg = [e.id for e in whole if e.label == 0]
    assert neg[3:5] == ["custrev.neg:4", "custrev.neg:6"], "cr: the id after the blank line 5 names the wrong line"
    pos = [e for e in whole if e.label == 1]
    assert pos[2] == Example("the screen is bright and lovely .", None, 1, "custrev.pos:4"), "cr: line after a blank"
    check_carved(task, data_dir, (16, 2, 2))


def test_subj_objective_is_class_0(data_dir):
    task = TASKS["subj"]
    whole = read_source(task, "all", data_dir)
    assert len(whole) == 20, "subj: 10 lines per file"
    assert whole[0].id == "subj.objective:1" and task.labels[whole[0].label] == "objective", "subj: class order"
    assert whole[10] == Example("the film is a warm and clever delight .", None, 1, "subj.subjective:1"), \
        "subj: first subjective line"
    check_carved(task, data_dir, (16, 2, 2))


def test_mpqa_reads_short_phrases_and_drops_blank_lines(data_dir):
    task = TASKS["mpqa"]
    whole = read_source(task, "all", data_dir)
    assert len(whole) == 20 and all(e.text for e in whole), "mpqa: 20 non-blank phrases (3 blank lines dropped)"
    assert whole[0] == Example("badly let down", None, 0, "mpqa.neg:1"), "mpqa: first example"
    assert whole[4].id == "mpqa.neg:6", "mpqa: the id after the blank line 5 names the wrong line"
    check_carved(task, data_dir, (16, 2, 2))


def test_senteval_missing_class_file_is_named(data_dir, tmp_path):
    # read_senteval_classes takes any line as a sentence: its malformed input is a missing class file
    task = TASKS["cr"]
    shutil.copytree(os.path.join(data_dir, task.dataset), tmp_path / task.dataset)
    os.remove(tmp_path / task.dataset / "custrev.pos")
    with pytest.raises(DataError, match=r"custrev\.pos: not found, and cr has no download address"):
        load_split(task, "train", str(tmp_path))


# ------------------------------------------------------------------ SentEval TREC, SST

def test_trec_reads_coarse_classes_and_the_latin1_byte(data_dir):
    task = TASKS["trec"]
    whole = read_source(task, "train", data_dir)
    assert len(whole) == 20, "trec: train_5500.label lines"
    assert whole[0] == Example("What is a red giant star ?", None, task.labels.index("DESC"), "train:1"), "trec: first"
    # train_5500.label is not UTF-8 (one latin-1 byte, 0xE9): read as latin-1, not dropped or replaced
    assert whole[7].text == "Where is the oldest caf\u00e9 in the old harbour ?", "trec: latin-1 line 8"
    assert task.labels[whole[7].label] == "LOC", "trec: 'LOC:other' is coarse class LOC"
    test = load_split(task, "test", data_dir)
    assert [task.labels[e.label] for e in test] == ["NUM", "LOC", "HUM", "DESC", "ENTY", "ABBR"], "trec: test labels"
    assert test[0].id == "test:1" and test[0].text == "How far is the mill from the old stone bridge ?", "trec: test[0]"
    check_carved(task, data_dir, (18, 2, 6))


def test_sst2_reads_sentence_tab_label(data_dir):
    task = TASKS["sst2"]
    train, dev, test = (load_split(task, s, data_dir) for s in ("train", "dev", "test"))
    assert (len(train), len(dev), len(test)) == (12, 4, 4), "sst2: official splits as they are"
    assert train[0] == Example("a warm and funny film", None, 1, "train:1"), "sst2: first example (text stripped)"
    assert [e.label for e in test] == [1, 0, 1, 0], "sst2: test labels"
    # a UTF-8 file must be read as UTF-8 first (latin-1 first would give 'cafÃ©')
    assert dev[0] == Example("the caf\u00e9 scene is lovely .", None, 1, "dev:1"), "sst2: UTF-8 text in sentiment-dev"


def test_sst5_reads_label_space_sentence(data_dir):
    task = TASKS["sst5"]
    train, dev, test = (load_split(task, s, data_dir) for s in ("train", "dev", "test"))
    assert (len(train), len(dev), len(test)) == (10, 5, 5), "sst5: official splits as they are"
    assert train[0] == Example("a wonderful , warm and clever film .", None, 4, "train:1"), "sst5: first example"
    assert [task.labels[e.label] for e in train[:3]] == ["very positive", "very negative", "neutral"], "sst5: labels"
    assert sorted(e.label for e in test) == [0, 1, 2, 3, 4], "sst5: test labels"


# ------------------------------------------------------------------ GLUE (dev: 10 % of train.tsv; test: dev.tsv)

def test_rte_reads_pairs_and_keeps_bare_quotes(data_dir):
    task = TASKS["rte"]
    whole = read_source(task, "train", data_dir)
    assert len(whole) == 40, "rte: 40 pairs in train.tsv (its header row is no example)"
    assert [e.label for e in whole].count(0) == 20, "rte: 20 entailment, 20 not_entailment"
    assert whole[0] == Example("The pilot flew the small plane across the lake before the storm arrived.",
                               "The pilot drove a bus across the lake.", 1, "0"), "rte: first example"
    # GLUE's tsv files are not CSV-quoted: a text that starts with a quote mark keeps it
    assert whole[5].text == '"We will open the new bridge before the end of the year," the mayor said.', "rte: quotes"
    assert whole[16].text.startswith('The gardener, known as "the rose man", grew'), "rte: inner quotes"
    train, dev, test = check_carved(task, data_dir, (36, 4, 8))
    assert test == read_source(task, "dev", data_dir), "rte: the test split is GLUE's dev.tsv"
    assert test[0] == Example("The sailor repaired the torn sail before the race began.", "The sailor repaired a sail.",
                              0, "0"), "rte: first test example"


def test_cola_reads_headerless_files(data_dir):
    task = TASKS["cola"]
    whole = read_source(task, "train", data_dir)
    assert len(whole) == 20, "cola: train.tsv has no header: its first line is an example"
    assert whole[0] == Example("The cat sat on the warm mat.", None, 1, "1"), "cola: first example (id = line)"
    assert whole[1].label == 0 and task.labels[0] == "unacceptable", "cola: label 0 with '*' in column 3"
    train, dev, test = check_carved(task, data_dir, (18, 2, 6))
    assert test[-1] == Example("The boat sank the.", None, 0, "6"), "cola: dev.tsv's last line has no newline"


def test_glue_sst2_ids_are_line_numbers(data_dir):
    task = TASKS["glue-sst2"]
    whole = read_source(task, "train", data_dir)
    assert len(whole) == 20, "glue-sst2: 20 rows after the header"
    assert whole[0] == Example("the film is great and warm", None, 1, "2"), "glue-sst2: first row is on line 2"
    train, dev, test = check_carved(task, data_dir, (18, 2, 6))
    assert test[0] == Example("it 's a warm and lovely film .", None, 1, "2"), "glue-sst2: first test example"


def test_qnli_reads_question_and_sentence(data_dir):
    task = TASKS["qnli"]
    whole = read_source(task, "train", data_dir)
    assert len(whole) == 20, "qnli: train.tsv rows"
    assert whole[0] == Example("What did the farmer do?",
                               "The farmer sold his old red truck to a neighbour last spring.", 0, "0"), \
        "qnli: first example (question, sentence)"
    assert [task.labels[e.label] for e in whole[:2]] == ["entailment", "not_entailment"], "qnli: labels by name"
    check_carved(task, data_dir, (18, 2, 6))


def test_stsb_reads_scores_from_the_last_of_ten_columns(data_dir):
    task = TASKS["stsb"]
    whole = read_source(task, "train", data_dir)
    assert len(whole) == 20, "stsb: train.tsv rows"
    assert whole[0] == Example("A man is riding a horse.", "A man rides a horse.", 5.0, "0"), "stsb: first example"
    assert [e.label for e in whole[1:3]] == [4.75, 3.8], "stsb: scores"
    assert whole[-1].label == 0.0 and isinstance(whole[-1].label, float), "stsb: the score '0' is the float 0.0"
    check_carved(task, data_dir, (18, 2, 6))


def test_glue_header_with_a_byte_order_mark(data_dir, tmp_path):
    # MRPC's train.tsv starts with a BOM; a BOM kept in 'index' would silently turn ids into line numbers
    task = TASKS["rte"]
    shutil.copytree(os.path.join(data_dir, task.dataset), tmp_path / task.dataset)
    path = tmp_path / task.dataset / "train.tsv"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert read_source(task, "train", str(tmp_path))[0].id == "0", "rte: a BOM before the header hid the 'index' column"


@pytest.mark.parametrize("name, source, file", [("mr", "all", "rt-polarity.neg"), ("sst5", "train", "sentiment-train"),
                                               ("sst2", "train", "sentiment-train")])
def test_a_byte_order_mark_is_not_text(data_dir, tmp_path, name, source, file):
    task = TASKS[name]
    first = read_source(task, source, data_dir)[0]
    shutil.copytree(os.path.join(data_dir, task.dataset), tmp_path / task.dataset)
    path = tmp_path / task.dataset / file
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert read_source(task, source, str(tmp_path))[0] == first, f"{name}: the BOM became part of line 1"


# str.splitlines() would also break a line at U+2028, U+2029, U+0085, \x0b, \x0c and \x1c-\x1e: a GLUE
# sentence holding one of them (a Wikipedia-derived text can) would be cut in two, and every later
# line number would be off.
def test_a_unicode_line_separator_inside_a_text_is_not_a_line_break(data_dir, tmp_path):
    task = TASKS["rte"]
    root = copy_and_edit(data_dir, tmp_path, task, "train.tsv", 4, b"the harvest", "the\u2028harvest".encode())
    whole = read_source(task, "train", root)
    assert len(whole) == 40 and whole[2].text_b == "The singer sang at a festival.", "rte: a U+2028 split line 4"


# ------------------------------------------------------------------ AG News

def test_agnews_reads_title_and_description(data_dir):
    task = TASKS["agnews"]
    whole = read_source(task, "train", data_dir)
    assert len(whole) == 20, "agnews: train.csv rows"
    assert whole[0] == Example("Shares Rise as Bank Profits Grow NEW YORK (Reuters) - Shares rose on Tuesday after "
                               "the bank said profits grew.", None, 2, "train:1"), "agnews: first example (class 3)"
    assert [task.labels[e.label] for e in whole[:4]] == ["Business", "World", "Sci/Tech", "Sports"], "agnews: 1..4"
    # the files write a line break inside a description as a backslash
    assert whole[2].text.endswith("the company said. The chip will ship next year."), "agnews: backslash line break"
    train, dev, test = check_carved(task, data_dir, (18, 2, 8))
    assert 'called its new screen "a big step" for mobile video.' in test[6].text, "agnews: doubled quote marks"
    assert test[6].text.startswith('Phone Maker Calls It "a Big Step" Reuters'), "agnews: quoted title"


# ------------------------------------------------------------------ IMDB (the archive is built here)

def write_imdb(path, reviews):
    """An aclImdb_v1.tar.gz with the official member names: aclImdb/<split>/<pos|neg>/<id>_<rating>.txt,
    plus the README, vocabulary, url lists, bag-of-words and unsup files that the reader must skip."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        def add(name, data=None):
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        add("aclImdb")
        add("aclImdb/README", b"Large Movie Review Dataset v1.0\n\nOverview\n")
        add("aclImdb/imdb.vocab", b"the\nand\na\n")
        for split in ("test", "train"):
            add(f"aclImdb/{split}")
            add(f"aclImdb/{split}/labeledBow.feat", b"0:9 1:1\n")
            for side in ("neg", "pos"):
                add(f"aclImdb/{split}/{side}")
                for name, text in sorted(reviews[split][side].items(), reverse=True):  # the reader sorts
                    add(f"aclImdb/{split}/{side}/{name}.txt", text)
                add(f"aclImdb/{split}/urls_{side}.txt", b"http://www.imdb.com/title/tt0000001/usercomments\n")
        add("aclImdb/train/unsup")
        add("aclImdb/train/unsup/0_0.txt", b"An unlabelled review that no split holds.")


def imdb_reviews():
    good, bad = ["great", "lovely", "warm", "funny", "clever"], ["dull", "awful", "boring", "flat", "weak"]
    reviews = {split: {"neg": {}, "pos": {}} for split in ("train", "test")}
    for split, n in (("train", 10), ("test", 3)):
        for i in range(n):
            town = f"film about a {split} town, number {i}."
            reviews[split]["pos"][f"{i}_{7 + i % 4}"] = f"A {good[i % 5]} {town}".encode()  # ratings 7-10
            reviews[split]["neg"][f"{i}_{1 + i % 4}"] = f"A {bad[i % 5]} {town}".encode()   # ratings 1-4
    reviews["train"]["pos"]["3_10"] = b"A great film.<br /><br />The cast is warm and funny."
    return reviews


@pytest.fixture
def imdb_root(tmp_path):
    write_imdb(str(tmp_path / "imdb" / "aclImdb_v1.tar.gz"), imdb_reviews())
    return str(tmp_path)


@pytest.fixture
def imdb_task():
    return dataclasses.replace(TASKS["imdb"], url="")  # never download the real archive from a test


def test_imdb_reads_the_archive_in_name_order(imdb_root, imdb_task):
    whole = read_source(imdb_task, "train", imdb_root)
    assert len(whole) == 20, "imdb: 10 neg + 10 pos train reviews (README, urls, .feat and unsup skipped)"
    assert whole[0] == Example("A dull film about a train town, number 0.", None, 0, "train/neg/0_1"), "imdb: first"
    assert [e.label for e in whole] == [0] * 10 + [1] * 10, "imdb: neg is class 0, pos class 1"
    review = next(e for e in whole if e.id == "train/pos/3_10")
    assert "<br" not in review.text and review.text.split() == "A great film. The cast is warm and funny.".split(), \
        "imdb: <br /> must become a space"
    train, dev, test = check_carved(imdb_task, imdb_root, (18, 2, 6))
    assert test[0].id == "test/neg/0_1" and test[0].text.endswith("test town, number 0."), "imdb: first test review"


def test_imdb_truncated_archive_is_named(tmp_path, imdb_task):
    path = tmp_path / "imdb" / "aclImdb_v1.tar.gz"
    write_imdb(str(path), imdb_reviews())
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # an interrupted download
    with pytest.raises(DataError, match=r"aclImdb_v1\.tar\.gz: not a readable aclImdb archive"):
        load_split(imdb_task, "train", str(tmp_path))


# A review that is not UTF-8 is named, not just the archive of 50,000 members.
def test_imdb_bad_review_names_the_member(tmp_path, imdb_task):
    reviews = imdb_reviews()
    reviews["train"]["pos"]["2_9"] = b"A great film \xff with a bad byte."
    write_imdb(str(tmp_path / "imdb" / "aclImdb_v1.tar.gz"), reviews)
    with pytest.raises(DataError, match=r"aclImdb_v1\.tar\.gz.*aclImdb/train/pos/2_9\.txt"):
        load_split(imdb_task, "train", str(tmp_path))


# ------------------------------------------------------------------ Reuters-21578 (ModApte, 90 topics)

def test_reuters_modapte_split_and_topics(data_dir):
    task = fixture_task("reuters", data_dir)
    train = read_source(task, "train", data_dir)
    test = read_source(task, "test", data_dir)
    # kept: TOPICS="YES", LEWISSPLIT TRAIN or TEST, at least one of the 90 topics. Dropped: 2 and 10
    # (TOPICS="NO", 10 with a topic), 4 (YES but no topic), 6 (only pork-belly, not one of the 90), 9 (NOT-USED)
    assert ids(train) == ["1", "3", "5", "7", "12", "1001", "1002", "1004"], "reuters: ModApte train stories"
    assert ids(test) == ["8", "11", "1003"], "reuters: ModApte test stories"
    story = {e.id: e for e in train + test}
    assert story["1"].label == (task.labels.index("cocoa"),), "reuters: one topic"
    assert names(task, story["3"]) == ("corn", "grain", "wheat"), "reuters: several topics, as sorted indices"
    assert story["3"].label == tuple(sorted(story["3"].label)), "reuters: label indices not sorted"
    assert names(task, story["5"]) == ("earn",), "reuters: pork-belly (not one of the 90) is ignored"
    assert names(task, story["8"]) == ("crude", "nat-gas"), "reuters: test story topics"
    assert story["1"].text == ("GHANA COCOA CROP SEEN LARGER\nGood rains in the main growing\nareas will lift this "
                               "season's cocoa crop, the marketing board said.\n    Arrivals so far are ahead of last "
                               "year's pace.\n Reuter"), "reuters: TITLE and BODY, &#3; removed"
    assert story["3"].text.startswith("PRAIRIE GRAIN <PGC> SEES BIGGER WHEAT AND CORN SALES\n"
                                      "Prairie Grain Corp <PGC> said"), "reuters: &lt; is '<'"
    assert story["7"].text == "M-1 MONEY SUPPLY ROSE 1.2 BILLION DLRS IN WEEK", "reuters: a BRIEF story is its TITLE"
    assert story["11"].text.startswith("JAPAN U.S. TRADE FIGURES - FEB 26\n"), "reuters: an UNPROC story is its TEXT"
    for e in train + test:
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]|&#\d+;|&lt;|<TEXT|<BODY", e.text), f"reuters: story {e.id} text"


def test_reuters_carved_splits(data_dir):
    task = fixture_task("reuters", data_dir)
    train, dev, test = check_carved(task, data_dir, (7, 1, 3))
    assert all(e.label and all(0 <= c < 90 for c in e.label) for e in train + dev + test), "reuters: labels"


def test_reuters_element_without_newid_is_named(data_dir, tmp_path):
    task = fixture_task("reuters", data_dir)
    root = copy_and_edit(data_dir, tmp_path, task, "reut2-000.sgm", 41, b' NEWID="3"', b"")
    with pytest.raises(DataError, match=r"reut2-000\.sgm:41: a <REUTERS> element without its TOPICS, LEWISSPLIT"):
        load_split(task, "train", root)


def test_an_empty_reuters_file_is_named(data_dir, tmp_path):
    """A truncated download: one file of the 22 holding no story would only shift the counts."""
    task = fixture_task("reuters", data_dir)
    shutil.copytree(os.path.join(data_dir, task.dataset), tmp_path / task.dataset)
    (tmp_path / task.dataset / "reut2-000.sgm").write_bytes(b"")
    with pytest.raises(DataError, match=r"reut2-000\.sgm: no <REUTERS> story in it"):
        load_split(task, "train", str(tmp_path))


# An unclosed <REUTERS> element that is not the file's last: a non-greedy match would run on to the
# next </REUTERS>, and the element after it (line 22 here) would be blamed.
def test_reuters_unclosed_element_names_its_own_line(data_dir, tmp_path):
    task = fixture_task("reuters", data_dir)
    root = copy_and_edit(data_dir, tmp_path, task, "reut2-000.sgm", 21, b"</REUTERS>", b"")
    with pytest.raises(DataError, match=r"reut2-000\.sgm:2: a <REUTERS> element that is never closed"):
        load_split(task, "train", root)


# ------------------------------------------------------------------ GoEmotions

def test_goemotions_reads_sorted_multi_labels_and_csv_quoting(data_dir):
    task = TASKS["goemotions"]
    train, dev, test = (load_split(task, s, data_dir) for s in ("train", "dev", "test"))
    assert (len(train), len(dev), len(test)) == (40, 10, 10), "goemotions: official splits as they are"
    assert train[0] == Example("You are a great player, [NAME].", None, (0,), "eixgci5"), "goemotions: first example"
    assert names(task, train[0]) == ("admiration",), "goemotions: 0 is admiration"
    # line 6 is CSV-quoted: wrapped in quote marks, "" for a quote mark inside
    assert train[5] == Example('[NAME] said "thank you" and I smiled all day.', None, (15, 17), "e4fwe0j"), \
        "goemotions: CSV-quoted text"
    assert names(task, train[5]) == ("gratitude", "joy"), "goemotions: two labels"
    assert sum(len(e.label) == 2 for e in train) >= 5, "goemotions: rows with two labels"
    for e in train + dev + test:
        assert isinstance(e.label, tuple) and list(e.label) == sorted(set(e.label)), f"goemotions: {e.id} label"
        assert set(e.label) <= {0, 2, 15, 17, 27}, f"goemotions: {e.id} label {e.label}"
    assert len(set(ids(train + dev + test))) == 60, "goemotions: comment ids"


# ------------------------------------------------------------------ AAPD

AAPD_LABELS = ["cs.ai", "cs.cl", "cs.cv", "cs.it", "cs.lg", "math.it", "math.st", "stat.ml", "stat.th"]


def test_aapd_labels_are_the_sorted_names_of_label_train(data_dir):
    task = get_task("aapd", data_dir)
    assert task.labels == AAPD_LABELS, "aapd: labels = sorted names of label_train"
    assert TASKS["aapd"].labels is None, "aapd: get_task changed the registry's shared entry"
    train, dev, test = (load_split(task, s, data_dir) for s in ("train", "dev", "test"))
    assert (len(train), len(dev), len(test)) == (10, 3, 3), "aapd: text_* / label_* lines"
    assert train[0] == Example("we study the capacity of a noisy channel with feedback and show that a simple code "
                               "is optimal .", None, (3, 5), "train:1"), "aapd: first example"
    # label_train line 9 is "stat.ml math.st stat.th": the label is the sorted indices
    assert train[8].label == (6, 7, 8) and names(task, train[8]) == ("math.st", "stat.ml", "stat.th"), "aapd: 3 labels"
    assert names(task, dev[0]) == ("cs.it", "math.it") and dev[0].id == "dev:1", "aapd: first dev example"


def test_aapd_label_and_text_files_of_different_lengths(data_dir, tmp_path):
    task = TASKS["aapd"]
    shutil.copytree(os.path.join(data_dir, task.dataset), tmp_path / task.dataset)
    path = tmp_path / task.dataset / "label_test"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(DataError, match=r"label_test: 2 lines of labels for the 3 texts of .*text_test"):
        load_split(get_task("aapd", str(tmp_path)), "test", str(tmp_path))


def test_aapd_without_label_train_is_named(tmp_path):
    with pytest.raises(DataError, match=r"label_train: not found; AAPD's labels are read from it"):
        get_task("aapd", str(tmp_path))


# ------------------------------------------------------------------ one malformed line per reader

MALFORMED = [  # task, split to load, file, line, bytes replaced, by, the error expected
    ("trec", "train", "train_5500.label", 4, b"HUM:ind", b"XYZ:abc", r"unknown label 'XYZ'; trec labels are 0\.\.5"),
    ("trec", "train", "train_5500.label", 9, b"NUM:date", b"NUM-date", r"expected 'COARSE:fine question'"),
    ("sst2", "train", "sentiment-train", 3, b" \t1", b" 1", r"expected 'sentence<TAB>label'"),
    ("sst2", "dev", "sentiment-dev", 2, b"\t0", b"\t2", r"unknown label '2'; sst2 labels are 0\.\.1"),
    ("sst5", "train", "sentiment-train", 2, b"0 an", b"5 an", r"unknown label '5'; sst5 labels are 0\.\.4"),
    ("rte", "train", "train.tsv", 3, b"\tnot_entailment", b"\tentailed",
     r"unknown label 'entailed'; rte labels are 0\.\.1 \(entailment, not_entailment\)"),
    ("rte", "dev", "train.tsv", 6, b".\tThe painter sold", b". The painter sold",
     r"expected 4 tab-separated fields, got 3"),
    ("cola", "train", "train.tsv", 3, b"\t1\t", b"\t2\t", r"unknown label '2'; cola labels are 0\.\.1"),
    ("glue-sst2", "train", "train.tsv", 5, b" \t0", b" 0", r"expected 2 tab-separated fields, got 1"),
    ("qnli", "test", "dev.tsv", 2, b"\tentailment", b"\tentailed", r"unknown label 'entailed'; qnli labels are 0\.\.1"),
    ("stsb", "train", "train.tsv", 3, b"\t4.750", b"\t5.5", r"similarity '5\.5' is not a number in \[0, 5\]"),
    ("agnews", "train", "train.csv", 2, b'"1"', b'"5"', r"unknown class '5'; agnews classes are 1\.\.4"),
    ("agnews", "test", "test.csv", 4, b'","', b" ", r"expected 3 comma-separated fields, got 2"),
    ("goemotions", "train", "train.tsv", 3, b"\t27\t", b"\t28\t", r"unknown label '28'; goemotions labels are 0\.\.27"),
    ("goemotions", "dev", "dev.tsv", 5, b"\te", b" e", r"expected 3 tab-separated fields, got 2"),
    ("aapd", "dev", "label_val", 2, b"cs.cl", b"cs.xx", r"unknown label 'cs\.xx'; aapd labels are 0\.\.8"),
    ("aapd", "train", "label_train", 3, b"cs.cl", b"", r"no labels"),
]


@pytest.mark.parametrize("name, split, file, line, old, new, message", MALFORMED,
                         ids=[f"{m[0]}-{m[2]}:{m[3]}" for m in MALFORMED])
def test_malformed_line_names_file_and_line(data_dir, tmp_path, name, split, file, line, old, new, message):
    root = copy_and_edit(data_dir, tmp_path, fixture_task(name, data_dir), file, line, old, new)
    with pytest.raises(DataError, match=rf"{re.escape(file)}:{line}: {message}") as error:
        load_split(fixture_task(name, root), split, root)
    assert "\n" not in str(error.value), f"{name}: the error is not one line"


# A CSV-quoted file (minBERT's pair files, GoEmotions, AG News) with a stray quote mark opening a field: read as one
# stream, the quoted field would run on to the next quote mark, swallowing the lines between into one text and
# dropping their rows without a word; every field of these files fits on its line, so it is one line naming the line.
STRAY_QUOTES = [  # task, split, file, line, bytes replaced, by, the error expected
    # the old stream reader took line 3's sentence2 on to line 4's quoted one: 23 rows, no error
    ("sts", "train", "sts-train.csv", 3, b"\ta dog builds", b'\t"a dog builds', "a field opens with a quote mark"),
    ("quora", "train", "quora-train.csv", 4, b"\t", b'\t"', "a field opens with a quote mark"),
    ("goemotions", "train", "train.tsv", 2, b"This ref", b'"This ref', "a field opens with a quote mark"),
    ("agnews", "train", "train.csv", 3, b'"4"', b'"4', "the CSV quoting is broken"),
    ("sts", "dev", "sts-dev.csv", 2, b"\t", b'\t"quoted" then more ', "the CSV quoting is broken"),
]


@pytest.mark.parametrize("name, split, file, line, old, new, message", STRAY_QUOTES,
                         ids=[f"{q[0]}-{q[2]}:{q[3]}" for q in STRAY_QUOTES])
def test_a_stray_quote_mark_names_file_and_line(data_dir, tmp_path, name, split, file, line, old, new, message):
    task = fixture_task(name, data_dir)
    root = copy_and_edit(data_dir, tmp_path, task, file, line, old, new)
    try:
        examples = load_split(task, split, root)
    except DataError as e:
        assert f"{file}:{line}: {message}" in str(e) and "\n" not in str(e), f"{name}: the error: {e}"
        return
    pytest.fail(f"{name}: {file} with a stray quote mark on line {line} was read, as {len(examples)} {split} "
                f"examples (readers.csv_rows must refuse it, naming the line)")


# A byte that is not UTF-8 in a UTF-8 dataset (all but SentEval's and Reuters'): one DataError line
# naming file and line, neither a UnicodeDecodeError traceback nor a text silently read as latin-1.
@pytest.mark.parametrize("name, file", [("agnews", "train.csv"), ("goemotions", "train.tsv"), ("rte", "train.tsv"),
                                        ("cola", "train.tsv"), ("aapd", "text_train")])
def test_a_byte_that_is_not_utf8_names_file_and_line(data_dir, tmp_path, name, file):
    task = fixture_task(name, data_dir)
    root = copy_and_edit(data_dir, tmp_path, task, file, 3, b"a", b"\xe9")
    with pytest.raises(DataError, match=rf"{re.escape(file)}:3: not UTF-8") as error:
        load_split(task, "train", root)
    assert "\n" not in str(error.value)


# ------------------------------------------------------------------ encodings: a BOM, CRLF, a line that is not UTF-8

# Every reader, through its task: a byte-order mark at the start of each file, \r\n line ends, and, where a line that is
# not UTF-8 is read as latin-1 (SentEval's and Reuters' files), one such line among lines that hold correct UTF-8
# accents. The list is the registry: a task added with a new reader is tried here too.
LATIN1_TASKS = {"mr", "cr", "subj", "mpqa", "trec", "sst2", "sst5", "reuters"}
EDITED_LINES = {"reuters": (17, 56), "imdb": (1, 2)}  # two stories' bodies; a review's two lines; else lines 2, 3


def lf(data):
    return data.replace(b"\r\n", b"\n").removeprefix(b"\xef\xbb\xbf")


def written(name, folder, data_dir, edit, files=None):
    """(task, root): the task's fixture copied to folder, each file of its training source (all: SentEval's), or its
    `files` first, rewritten as edit(bytes); for IMDB each review of the archive, given a second line ("The end.")."""
    if name == "imdb":
        reviews = imdb_reviews()
        for side in (side for split in reviews.values() for side in split.values()):
            side.update({key: edit(review + b"\nThe end.") for key, review in side.items()})
        write_imdb(str(folder / "imdb" / "aclImdb_v1.tar.gz"), reviews)
        return dataclasses.replace(TASKS["imdb"], url=""), str(folder)
    task = fixture_task(name, data_dir)
    shutil.copytree(os.path.join(data_dir, task.dataset), folder / task.dataset)
    for path in source_paths(task, encoded_source(task), str(folder))[:files]:
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(edit(data))
    return dataclasses.replace(task, url=""), str(folder)


def encoded_source(task):
    return "all" if "all" in task.files else "train"


def fields(examples):
    return [(e.id, e.text, e.text_b, repr(e.label)) for e in examples]


@pytest.mark.parametrize("edit", ["bom", "crlf"])
@pytest.mark.parametrize("name", list(TASKS))
def test_a_byte_order_mark_and_crlf_line_ends_change_no_example(data_dir, tmp_path, name, edit):
    """A BOM dropped before anything else reads the file (TREC's first label was 'ï»¿DESC'), and no '\\r' left in a
    text, an id or a label: the examples are those of the same files without them."""
    changed = {"bom": lambda data: b"\xef\xbb\xbf" + lf(data), "crlf": lambda data: lf(data).replace(b"\n", b"\r\n")}
    task, plain = written(name, tmp_path / "plain", data_dir, lf)
    task, root = written(name, tmp_path / edit, data_dir, changed[edit])
    source = encoded_source(task)
    expected, got = read_source(task, source, plain), read_source(task, source, root)
    assert fields(got) == fields(expected), f"{name}: a {edit.upper()} changed the examples read"


def with_cafe(line, latin1=False):
    """The line with the word 'café' before its last space: in UTF-8, or with é as the latin-1 byte 0xE9."""
    head, space, tail = line.rpartition(b" ")
    assert space, f"fixture changed: no space in {line!r}"
    return head + (b" caf\xe9 " if latin1 else " café ".encode()) + tail


def cafe_in(lines, latin1_line=None):
    """An edit: 'café' in UTF-8 in `lines` (1-based) of a file, but latin-1 in latin1_line, the only line that is not
    UTF-8 (a latin-1 line of the fixture, as TREC's has, is written in UTF-8)."""
    def edit(data):
        rows = [row if is_utf8(row) else row.decode("latin-1").encode() for row in lf(data).split(b"\n")]
        for n in lines:
            rows[n - 1] = with_cafe(rows[n - 1], latin1=n == latin1_line)
        return b"\n".join(rows)
    return edit


@pytest.mark.parametrize("name", list(TASKS))
def test_a_line_that_is_not_utf8_is_read_alone_as_latin1_or_named(data_dir, tmp_path, capsys, name):
    """SentEval's and Reuters' files: the line alone is read as latin-1, the other lines' UTF-8 accents as they are
    (the whole file read as latin-1 turned them into 'cafÃ©'), and one note names the file and the line. The other
    readers' files are UTF-8: the line is one error naming file and line."""
    a, b = EDITED_LINES.get(name, (2, 3))
    task, utf8 = written(name, tmp_path / "utf8", data_dir, cafe_in((a, b)), files=1)
    task, mixed = written(name, tmp_path / "mixed", data_dir, cafe_in((a, b), latin1_line=b), files=1)
    source = encoded_source(task)
    first = source_paths(task, source, mixed)[0] if name != "imdb" else None
    if name not in LATIN1_TASKS:
        where = (re.escape(f"{os.path.basename(first)}:{b}: not UTF-8") if first
                 else r"aclImdb_v1\.tar\.gz: aclImdb/train/(neg|pos)/\d+_\d+\.txt is not UTF-8")
        with pytest.raises(DataError, match=where) as error:
            read_source(task, source, mixed)
        assert "\n" not in str(error.value)
        return
    task, plain = written(name, tmp_path / "plain", data_dir, cafe_in(()), files=1)
    expected, before = read_source(task, source, utf8), read_source(task, source, plain)
    cafes = [e.id for e in expected if "café" in e.text and e not in before]
    assert len(cafes) == 2, f"{name}: the 'café' of lines {a} and {b}, all UTF-8, is not read in two texts: {cafes}"
    capsys.readouterr()
    got = read_source(task, source, mixed)
    assert fields(got) == fields(expected), f"{name}: a line that is not UTF-8 changed the other lines' texts"
    note = f"note: {first}: line {b} is not UTF-8; read as latin-1"
    assert capsys.readouterr().out.splitlines() == [note], f"{name}: the note naming line {b}"
    read_source(task, source, mixed)
    assert "note:" not in capsys.readouterr().out, f"{name}: the note was given twice"


def is_utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ------------------------------------------------------------------ the official-count warning

SOURCES = [(name, source) for name in ["mr", "cr", "subj", "mpqa", "trec", "sst2", "sst5", "rte", "cola", "glue-sst2",
                                       "qnli", "stsb", "agnews", "reuters", "goemotions", "aapd"]
           for source in TASKS[name].files]


@pytest.mark.parametrize("name, source", SOURCES, ids=[f"{n}-{s}" for n, s in SOURCES])
def test_a_count_unlike_the_official_one_is_one_warning_naming_the_files(data_dir, capsys, name, source):
    task = fixture_task(name, data_dir)
    capsys.readouterr()
    n = len(read_source(task, source, data_dir))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: "), f"{name} {source}: expected one warning line, got {err}"
    files = task.files[source]
    for file in (files,) if isinstance(files, str) else files:
        assert os.path.join(task.dataset, file) in err[0], f"{name} {source}: the warning does not name {file}"
    assert f"read {n} examples" in err[0] and str(task.counts[source]) in err[0], f"{name} {source}: counts"


def test_official_counts_give_no_warning(data_dir, capsys, imdb_root, imdb_task):
    rte = dataclasses.replace(TASKS["rte"], counts={"train": 40, "dev": 8})
    imdb = dataclasses.replace(imdb_task, counts={"train": 20, "test": 6})
    capsys.readouterr()
    load_split(rte, "dev", data_dir)
    load_split(imdb, "test", imdb_root)
    assert capsys.readouterr().err == "", "a source with its official count printed a warning"
    load_split(imdb_task, "test", imdb_root)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "aclImdb_v1.tar.gz: read 6 examples" in err[0], f"imdb: count warning {err}"


# ------------------------------------------------------------------ the same dev split in every run

CARVED = ["mr", "cr", "subj", "mpqa", "trec", "rte", "cola", "glue-sst2", "qnli", "stsb", "agnews", "reuters"]


def test_carved_dev_splits_are_the_same_in_a_fresh_process(data_dir):
    """Another interpreter, with another hash seed (set order) and another global random state,
    cuts the same dev splits."""
    script = f"""
import dataclasses, json, random, sys
from minknn.tasks.data import load_split
from minknn.tasks.registry import TASKS
random.seed(99)
tasks = {{n: TASKS[n] for n in {CARVED!r}}}
files = {REUTERS_FIXTURES!r}
tasks["reuters"] = dataclasses.replace(TASKS["reuters"], files={{"train": files, "test": files}})
print(json.dumps({{n: [e.id for e in load_split(task, "dev", sys.argv[1])] for n, task in tasks.items()}}))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=root)
    result = subprocess.run([sys.executable, "-c", script, data_dir], cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    there = json.loads(result.stdout.splitlines()[-1])  # after TREC's latin-1 note
    for name in CARVED:
        here = ids(load_split(fixture_task(name, data_dir), "dev", data_dir))
        assert there[name] == here, f"{name}: the dev split differs between two runs"
