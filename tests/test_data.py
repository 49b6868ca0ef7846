import dataclasses
import http.server
import os
import random
import re
import shutil
import threading
from collections import Counter

import pytest

from minknn import MinknnError
from minknn.kinds import kind_of
from minknn.tasks.data import (DataError, Example, Task, check_every_class_present, download,
                               eval_subset, examples_fingerprint, git_blob_id, load_split,
                               per_class_sample, run_data, stratified_sample, training_examples)
from minknn.tasks.lines import read_lines
from minknn.tasks.registry import TASKS, get_task


def test_sst_reader(data_dir):
    train = load_split(TASKS["sst"], "train", data_dir)
    assert len(train) == 40 and Counter(e.label for e in train) == {c: 8 for c in range(5)}
    assert train[0].text == "The cast is terrible , really awful ." and train[0].label == 0 and len(train[0].id) == 25
    test = load_split(TASKS["sst"], "test", data_dir)  # the odd test-student header, no labels
    assert len(test) == 7 and all(e.label is None for e in test) and test[0].text.startswith("The ")


def test_cfimdb_reader_keeps_quote_marks(data_dir):
    dev = load_split(TASKS["cfimdb"], "dev", data_dir)
    assert len(dev) == 8 and dev[0].text.startswith('"Awful" , said') and {e.label for e in dev} == {0, 1}


def copy_task_files(data_dir, tmp_path):
    shutil.copytree(os.path.join(data_dir, "minbert"), tmp_path / "minbert")
    return tmp_path / "minbert" / "ids-sst-train.csv"


def test_malformed_row_names_file_and_line(data_dir, tmp_path):
    path = copy_task_files(data_dir, tmp_path)
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace("\t", " ", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"ids-sst-train.csv:4: expected 4 tab-separated fields, got 3"):
        load_split(TASKS["sst"], "train", str(tmp_path))


def test_unknown_label_is_named(data_dir, tmp_path):
    path = copy_task_files(data_dir, tmp_path)
    lines = path.read_text().splitlines()
    lines[5] = lines[5].rsplit("\t", 1)[0] + "\t7"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"ids-sst-train.csv:6: unknown label '7'; sst labels are 0..4"):
        load_split(TASKS["sst"], "train", str(tmp_path))


def test_empty_split_and_missing_class(data_dir, tmp_path):
    path = copy_task_files(data_dir, tmp_path)
    header = path.read_text().splitlines()[0]
    path.write_text(header + "\n")
    with pytest.raises(DataError, match="the train split has no examples"):
        load_split(TASKS["sst"], "train", str(tmp_path))
    examples = [Example("a", label=0), Example("b", label=2)]
    with pytest.raises(DataError, match="no examples of class 'negative', 'positive', 'very positive'"):
        check_every_class_present(examples, TASKS["sst"], "train")
    with pytest.raises(DataError, match="train: has examples without labels"):
        check_every_class_present(examples + [Example("c")], TASKS["sst"], "train")


def test_a_byte_that_is_not_utf8_names_file_and_line(data_dir, tmp_path):
    path = copy_task_files(data_dir, tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"e", b"\xe9", 1)  # a latin-1 byte, as a wrongly converted copy has
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(DataError, match=r"ids-sst-train.csv:3: not UTF-8 \(invalid continuation byte\)$"):
        load_split(TASKS["sst"], "train", str(tmp_path))


def test_a_folder_where_a_data_file_belongs_is_named(data_dir, tmp_path):
    path = copy_task_files(data_dir, tmp_path)
    path.unlink()
    path.mkdir()
    with pytest.raises(DataError, match=r"minbert/ids-sst-train.csv: a folder, where sst's train file belongs$"):
        load_split(TASKS["sst"], "train", str(tmp_path))


def test_a_data_root_must_be_a_folder_that_exists(data_dir, tmp_path, monkeypatch):
    """Named by the flag or by MINKNN_DATA; never created by a download (a mistyped path would be)."""
    (tmp_path / "file").write_text("")
    with pytest.raises(DataError, match=rf"^--data_dir {tmp_path / 'file'}: is a file, not a folder; "):
        load_split(TASKS["sst"], "train", str(tmp_path / "file"))
    with pytest.raises(DataError, match=rf"^--data_dir {tmp_path / 'none'}: not found; "):
        load_split(TASKS["sst"], "train", str(tmp_path / "none"))
    monkeypatch.setenv("MINKNN_DATA", str(tmp_path / "none"))
    with pytest.raises(DataError, match=rf"^MINKNN_DATA={tmp_path / 'none'}: not found; "):
        load_split(TASKS["sst"], "train")
    assert sorted(os.listdir(tmp_path)) == ["file"]
    assert len(load_split(TASKS["sst"], "train", data_dir)) == 40  # --data_dir comes before MINKNN_DATA


def test_the_fingerprint_of_training_examples(data_dir):
    train = load_split(TASKS["sst"], "train", data_dir)
    fp = examples_fingerprint(train)
    assert fp == examples_fingerprint(load_split(TASKS["sst"], "train", data_dir)) and len(fp) == 64
    changed = [dataclasses.replace(train[0], text=train[0].text + " ")] + train[1:]
    relabelled = [dataclasses.replace(train[0], label=1)] + train[1:]
    pair = [dataclasses.replace(train[0], text_b="b")] + train[1:]
    others = [changed, relabelled, pair, train[1:], train[::-1]]
    assert len({fp} | {examples_fingerprint(e) for e in others}) == 6, "a change that keeps the fingerprint"
    recorded = run_data(os.path.relpath(data_dir), {"sst": train})
    assert recorded == {"root": os.path.abspath(data_dir), "train_fingerprint": {"sst": fp}}


def test_unknown_task_and_split():
    with pytest.raises(MinknnError, match="unknown --task 'sts3'; choose one of: sst, cfimdb"):
        get_task("sts3")
    with pytest.raises(MinknnError, match="no 'val' split"):
        load_split(TASKS["sst"], "val")


def test_stratified_sample_keeps_class_shares_and_is_reproducible():
    examples = [Example(str(i), label=0 if i < 60 else 1 if i < 90 else 2) for i in range(100)]  # 60/30/10
    a = stratified_sample(examples, 20, seed=1)
    assert Counter(e.label for e in a) == {0: 12, 1: 6, 2: 2}
    assert [e.text for e in a] == [e.text for e in stratified_sample(examples, 20, seed=1)]
    assert [e.text for e in a] != [e.text for e in stratified_sample(examples, 20, seed=2)]
    small = stratified_sample(examples, 3, seed=0)  # rounding down would drop class 2
    assert Counter(e.label for e in small) == {0: 1, 1: 1, 2: 1}
    assert Counter(e.label for e in stratified_sample(examples, 7, seed=0)) == {0: 4, 1: 2, 2: 1}
    assert len({e.text for e in stratified_sample(examples, 99, seed=0)}) == 99
    with pytest.raises(MinknnError, match="--max_train 2 is smaller than the 3 classes"):
        stratified_sample(examples, 2, seed=0)



def test_per_class_sample_draws_n_of_each_class_reproducibly():
    task = Task("t", "t", None, {}, ["a", "b", "c"])
    examples = [Example(str(i), label=0 if i < 60 else 1 if i < 90 else 2) for i in range(100)]  # 60/30/10
    a = per_class_sample(examples, task, 8, seed=1)
    assert Counter(e.label for e in a) == {0: 8, 1: 8, 2: 8}, "data.per_class_sample: 8 of each class"
    assert [e.text for e in a] == [e.text for e in per_class_sample(examples, task, 8, seed=1)], \
        "data.per_class_sample: the same seed must draw the same examples (paired comparisons)"
    assert [e.text for e in a] != [e.text for e in per_class_sample(examples, task, 8, seed=2)], \
        "data.per_class_sample: another seed must draw other examples (it seeds the draw)"
    assert sorted(e.label for e in a[:6]) != [0] * 6, "the draw is shuffled, not sorted by class"
    with pytest.raises(MinknnError, match="--per_class 11: .*'c' has 10"):
        per_class_sample(examples, task, 11, seed=0)
    with pytest.raises(MinknnError, match="multilabel task"):
        per_class_sample(examples, dataclasses.replace(task, kind="multilabel"), 2, seed=0)


# ------------------------------------------------------------------ download, against a loopback server

@pytest.fixture
def server(data_dir):
    """Serves the fixture folder on 127.0.0.1; /cut/<file> sends half the body of a file whose
    Content-Length promises all of it, as a dropped connection would."""
    folder = os.path.join(data_dir, "minbert")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=folder, **kwargs)

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.startswith("/cut/"):
                body = open(os.path.join(folder, self.path[5:]), "rb").read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
                return
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_download_writes_the_whole_file(server, data_dir, tmp_path):
    original = os.path.join(data_dir, "minbert", "ids-sst-dev.csv")
    dest = tmp_path / "sub" / "ids-sst-dev.csv"
    download(server + "ids-sst-dev.csv", str(dest), blob=git_blob_id(original))
    assert dest.read_bytes() == open(original, "rb").read()
    assert os.listdir(dest.parent) == ["ids-sst-dev.csv"]  # no temporary file left behind


def test_interrupted_or_wrong_download_leaves_no_file(server, tmp_path):
    dest = tmp_path / "ids-sst-dev.csv"
    with pytest.raises(DataError, match="ids-sst-dev.csv"):
        download(server + "cut/ids-sst-dev.csv", str(dest))
    assert os.listdir(tmp_path) == []
    with pytest.raises(DataError, match="does not match its known content"):
        download(server + "ids-sst-dev.csv", str(dest), blob="0" * 40)
    assert os.listdir(tmp_path) == []
    with pytest.raises(DataError, match="cannot download"):
        download(server + "no-such-file.csv", str(dest))
    assert os.listdir(tmp_path) == []


def test_a_failed_download_leaves_no_folder_it_made(server, tmp_path):
    """evaluate.py without a data root once left an empty data/minbert/ behind."""
    (tmp_path / "kept").mkdir()
    with pytest.raises(DataError, match="cannot download"):
        download(server + "no-such-file.csv", str(tmp_path / "kept" / "new" / "deeper" / "ids-sst-dev.csv"))
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []  # an existing folder stays


def test_load_split_downloads_a_missing_file(server, tmp_path, monkeypatch):
    task = TASKS["cfimdb"]
    monkeypatch.setattr(task, "url", server)
    monkeypatch.setattr(task, "blobs", {})  # the fixture is not the official file
    dev = load_split(task, "dev", str(tmp_path))
    assert len(dev) == 8 and (tmp_path / "minbert" / "ids-cfimdb-dev.csv").exists()


def test_quora_reader_unquotes_and_drops_empty_labels(data_dir, capsys):
    train = load_split(TASKS["quora"], "train", data_dir)
    assert len(train) == 24 and Counter(e.label for e in train) == {1: 8, 0: 16}
    assert train[0] == Example("the cat eats an apple.", "the cat consumes an apple.", 1, "q0000")
    assert train[1].text == 'the teacher says "hello" to the cat.'  # "" inside a quoted field is one quote mark
    dev = load_split(TASKS["quora"], "dev", data_dir)  # its 13th row has an empty label, like quora-dev.csv's two
    assert len(dev) == 12 and "q0999" not in {e.id for e in dev}
    assert "quora-dev.csv: dropped 1 rows with an empty is_duplicate label (lines 14)" in capsys.readouterr().out
    test = load_split(TASKS["quora"], "test", data_dir)
    assert len(test) == 6 and all(e.label is None and e.text_b for e in test)


def test_sts_reader_reads_real_valued_labels(data_dir):
    train = load_split(TASKS["sts"], "train", data_dir)
    assert len(train) == 24 and train[0].label == 4.0 and train[1].label == 1.7 and isinstance(train[1].label, float)
    assert train[2].text_b == '"the pilot" finds a new book.'
    assert all(e.label is None for e in load_split(TASKS["sts"], "test", data_dir))


def test_mrpc_reader_drops_the_bom_and_keeps_bare_quotes(data_dir):
    train = load_split(TASKS["mrpc"], "train", data_dir)
    assert len(train) == 24 and Counter(e.label for e in train) == {1: 8, 0: 16}
    assert train[0] == Example("a child eats an apple.", "a child consumes an apple.", 1, "300-1300")
    assert train[1].text_b == '"the farmer builds a small boat.'  # QUOTE_NONE: the lone quote stays
    test = load_split(TASKS["mrpc"], "test", data_dir)
    assert len(test) == 6 and all(e.label is None for e in test)


@pytest.mark.parametrize("task, last_field, message", [
    ("sts", "\t6.5", r"sts-train.csv:3: similarity '6.5' is not a number in \[0, 5\]"),
    ("quora", "\t2.0", r"quora-train.csv:3: unknown label '2.0'; quora labels are 0..1"),
    ("quora", "", r"quora-train.csv:3: expected 5 tab-separated fields, got 4"),
])
def test_bad_pair_rows_name_file_and_line(data_dir, tmp_path, task, last_field, message):
    copy_task_files(data_dir, tmp_path)
    path = tmp_path / "minbert" / f"{task}-train.csv"
    lines = path.read_text().splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + last_field  # the label of line 3
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        load_split(TASKS[task], "train", str(tmp_path))


def test_similarity_draw_is_uniform_and_seeded(data_dir):
    a = training_examples(TASKS["sts"], data_dir, max_train=10, seed=1)
    assert len(a) == 10 and len({e.id for e in a}) == 10
    assert [e.id for e in a] == [e.id for e in training_examples(TASKS["sts"], data_dir, max_train=10, seed=1)]
    assert [e.id for e in a] != [e.id for e in training_examples(TASKS["sts"], data_dir, max_train=10, seed=2)]


# ------------------------------------------------------------------ splits carved from a source

def numbered(paths, task, source):
    """A reader of a file of one number per line: example i has id "i" and label i % 2."""
    return [Example(line, label=int(line) % 2, id=line) for line in open(paths[0]).read().split()]


def numbers_task(tmp_path, n=50, **fields):
    (tmp_path / "numbers").mkdir(exist_ok=True)
    (tmp_path / "numbers" / "all.txt").write_text("\n".join(str(i) for i in range(n)) + "\n")
    return Task("numbers", "numbers", numbered, {"all": "all.txt"}, ["even", "odd"], **fields)


def test_carved_splits_are_disjoint_whole_and_stable(tmp_path):
    task = numbers_task(tmp_path, splits={"train": ("all", 0.0, 0.8), "dev": ("all", 0.8, 0.9),
                                          "test": ("all", 0.9, 1.0)})
    ids = {s: [e.id for e in load_split(task, s, str(tmp_path))] for s in ("train", "dev", "test")}
    assert [len(ids[s]) for s in ("train", "dev", "test")] == [40, 5, 5]
    assert sorted(sum(ids.values(), []), key=int) == [str(i) for i in range(50)]  # every row once: disjoint, whole
    assert ids["dev"] == sorted(ids["dev"], key=int)  # kept in file order
    assert ids["dev"] != [str(i) for i in range(40, 45)]  # a shuffle, not the file's tail
    again = {s: [e.id for e in load_split(task, s, str(tmp_path))] for s in ("train", "dev", "test")}
    assert again == ids  # the same rows every run: the shuffle is fixed, not --seed's
    random.seed(123)  # nor the global generator's
    assert [e.id for e in load_split(task, "dev", str(tmp_path))] == ids["dev"]


def test_a_count_that_differs_from_the_official_one_is_a_warning(tmp_path, capsys):
    task = numbers_task(tmp_path, n=7, counts={"all": 8})
    assert len(load_split(task, "all", str(tmp_path))) == 7
    err = capsys.readouterr().err.strip()
    assert err == (f"warning: {tmp_path / 'numbers' / 'all.txt'}: read 7 examples, but the official numbers "
                   f"all split has 8") and "\n" not in err
    numbers_task(tmp_path, n=8, counts={"all": 8})
    load_split(task, "all", str(tmp_path))
    assert capsys.readouterr().err == ""


def test_eval_subset_is_fixed_and_in_order():
    examples = [Example(str(i), id=str(i)) for i in range(100)]
    subset = eval_subset(examples, 10)
    assert len(subset) == 10 and [int(e.id) for e in subset] == sorted(int(e.id) for e in subset)
    random.seed(5)  # --seed does not move it
    assert eval_subset(examples, 10) == subset and subset != examples[:10]  # a draw, not the head of the file
    assert eval_subset(examples, None) == examples
    assert eval_subset(examples, 500) == examples


def test_every_registered_task_is_complete():
    """What train.py needs of each registry entry, so that adding a task cannot half-work."""
    for name, task in TASKS.items():
        splits = task.splits or {s: s for s in task.files}
        assert {"train", "dev"} <= set(splits), f"{name}: needs a train and a dev split"
        sources = {r if isinstance(r, str) else r[0] for r in splits.values()}
        assert sources <= set(task.files), f"{name}: a split reads a source its files do not name"
        assert set(task.counts) <= set(task.files), f"{name}: counts for a source it does not have"
        assert task.kind in ("classify", "similarity", "multilabel"), name
        assert (task.labels == []) == (task.kind == "similarity") or task.labels is None, name
        assert task.positive is None or task.pair, f"{name}: only a pair task has a matching class"
        first = (task.metrics or kind_of(task).metrics)[0]
        assert first != "hamming", f"{name}: the first score picks the best epoch; it must be higher-is-better"


def test_lines_read_as_latin1_are_one_note_with_their_numbers_capped(tmp_path, capsys, monkeypatch):
    """read_lines(latin1=True): each line that is not UTF-8 is read as latin-1, alone; one note on stdout names the
    file and the first ten such lines, then how many more; under torchrun only rank 0 gives it."""
    path = tmp_path / "sentiment-train"
    path.write_bytes(b"".join(b"caf\xe9 %d\r\n" % i if i % 2 else f"café {i}\r\n".encode() for i in range(1, 25)))
    assert read_lines(str(path), latin1=True) == [f"café {i}" for i in range(1, 25)], "a line's decoding changed another"
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"note: {path}: lines 1, 3, 5, 7, 9, 11, 13, 15, 17, 19 and 2 more are not UTF-8; "
                                f"read as latin-1"] and err == "", f"the note: {out!r} {err!r}"
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:1: not UTF-8 \(invalid continuation byte\)$"):
        read_lines(str(path))  # without latin1 (every file but SentEval's and Reuters'): one error
    monkeypatch.setenv("RANK", "1")
    other = tmp_path / "sentiment-dev"
    other.write_bytes(b"caf\xe9\n")
    assert read_lines(str(other), latin1=True) == ["café"] and capsys.readouterr().out == "", "rank 1 gave the note"
