"""Bad input stops with one line, before any slow work: the README's promise, walked as a table.

Each case builds its bad input in a temporary folder and runs train.py or evaluate.py in-process
through minknn.run, as the scripts' __main__ does. It must exit with status 2 and print exactly
one line on stderr, `error: ...`, containing the case's `says` text (the flag, file or value at
fault). Any other exception is a traceback a user would have seen, and fails the case. "Before
any slow work": the first training step and the first prediction pass are replaced by a function
that fails the test, so an error found only after an epoch (or after encoding a split) fails too.

A case: (id, script, setup, says). setup(tmp, model, data) returns the argv; tmp is a fresh
folder, model the tiny BERT's folder (copy it before breaking it), data the fixture datasets.
"""
import json
import os
import shutil

import pytest

import evaluate
import minknn.moco
import train
from minknn import run


def trainer(*extra, model=None, data=None):
    """argv of a short tiny-model run; model/data: overrides of the fixture folders."""
    def argv(tmp, tiny, fixtures):
        return ["--task", "sst", "--model", model(tmp, tiny) if model else tiny,
                "--data_dir", data(tmp, fixtures) if data else fixtures, "--out", str(tmp / "run"),
                "--batch_size", "8", "--max_len", "32", "--epochs", "1", "--device", "cpu", *extra]
    return argv


def broken_model(edit):
    """A copy of the tiny BERT folder, changed by edit(folder)."""
    def make(tmp, tiny):
        folder = tmp / "model"
        shutil.copytree(tiny, folder)
        edit(folder)
        return str(folder)
    return make


def edit_config(**changes):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
    return edit


# --- flags, run folders and saving (train.py, evaluate.py) ---
FLAG_CASES = [
]

# --- data files and folders (minknn/readers.py, minknn/data.py) ---
DATA_CASES = [
    # a setup that writes files first is a lambda returning a tuple of steps: its last item is the argv
    ("data file not UTF-8", "train", trainer(data=lambda tmp, fixtures: (
        shutil.copytree(fixtures, tmp / "data"),
        (tmp / "data/minbert/ids-sst-train.csv").write_bytes(   # line 2: "The cast is terr\xefble"
            (tmp / "data/minbert/ids-sst-train.csv").read_bytes().replace(b"terrible", b"terr\xefble")),
        str(tmp / "data"))[-1]),
     "ids-sst-train.csv:2: not UTF-8"),
    ("data file is a folder", "train", trainer(data=lambda tmp, fixtures: (
        shutil.copytree(fixtures, tmp / "data"),
        (tmp / "data/minbert/ids-sst-train.csv").unlink(),
        (tmp / "data/minbert/ids-sst-train.csv").mkdir(),
        str(tmp / "data"))[-1]),
     "ids-sst-train.csv: a folder, where sst's train file belongs"),
    ("data_dir is a file", "train", trainer(data=lambda tmp, fixtures: (
        (tmp / "file").write_text(""), str(tmp / "file"))[-1]),
     "file: is a file, not a folder"),
    ("data_dir not found", "train", trainer(data=lambda tmp, fixtures: str(tmp / "no-data")),
     "no-data: not found"),
]

# --- model folders, tokenizers and checkpoints (minknn/bert.py, tokenizer.py, checkpoint.py) ---
MODEL_CASES = [
]

# --- evaluate.py against its run (data root, fingerprints) ---
EVALUATE_CASES = [
    ("evaluate batch_size 0", "evaluate", lambda tmp, tiny, fixtures: [
        "--checkpoint", str(tmp / "run"), "--batch_size", "0"],
     "--batch_size must be at least 1, got 0"),
    ("evaluate max_eval 0", "evaluate", lambda tmp, tiny, fixtures: [
        "--checkpoint", str(tmp / "run"), "--max_eval", "0"],
     "--max_eval must be at least 1, got 0"),
    ("evaluate a folder without a checkpoint", "evaluate", lambda tmp, tiny, fixtures: (
        (tmp / "run").mkdir(), ["--checkpoint", str(tmp / "run")])[-1],
     "run/checkpoint.pt: not found"),
    # a tiny run trained on the fixtures, then --knn on a copy whose training texts all differ
    ("evaluate knn on other training examples", "evaluate", lambda tmp, tiny, fixtures: (
        train.main(trainer("--max_train", "16")(tmp, tiny, fixtures)),
        shutil.copytree(fixtures, tmp / "other"),
        (tmp / "other/minbert/ids-sst-train.csv").write_text(
            (tmp / "other/minbert/ids-sst-train.csv").read_text().replace(" .", " !")),
        ["--checkpoint", str(tmp / "run"), "--knn", "--k", "4", "--data_dir", str(tmp / "other")])[-1],
     "other/minbert/ids-sst-train.csv: not the sst training examples the run trained on"),
    # a run of two tasks: the second task's training set is checked before the first task is encoded
    ("evaluate knn on other training examples of a second task", "evaluate", lambda tmp, tiny, fixtures: (
        train.main(trainer("--task", "multitask", "--tasks", "sst,rte", "--max_train", "16")(tmp, tiny, fixtures)),
        shutil.copytree(fixtures, tmp / "other"),
        (tmp / "other/glue/RTE/train.tsv").write_text((tmp / "other/glue/RTE/train.tsv").read_text().replace(".", "!")),
        ["--checkpoint", str(tmp / "run"), "--knn", "--k", "4", "--data_dir", str(tmp / "other")])[-1],
     "other/glue/RTE/train.tsv: not the rte training examples the run trained on"),
    ("evaluate data_dir not found", "evaluate", lambda tmp, tiny, fixtures: (
        train.main(trainer("--max_train", "16")(tmp, tiny, fixtures)),
        ["--checkpoint", str(tmp / "run"), "--data_dir", str(tmp / "no-data")])[-1],
     "no-data: not found"),
]

CASES = FLAG_CASES + DATA_CASES + MODEL_CASES + EVALUATE_CASES


def no_slow_work(*args, **kwargs):
    pytest.fail("the error came after slow work started (a training step or a prediction pass)")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_slow_work(case, tiny_bert_dir, data_dir, tmp_path, capsys,
                                                 monkeypatch):
    name, script, setup, says = case
    argv = setup(tmp_path, tiny_bert_dir, data_dir)
    for module, function in ((train, "train_step"), (evaluate, "predict"), (minknn.moco, "predict")):
        monkeypatch.setattr(module, function, no_slow_work)
    main = {"train": train.main, "evaluate": evaluate.main}[script]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run(lambda: main(argv))
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: ")]
    assert exit_.value.code == 2, f"{name}: exit status {exit_.value.code}, expected 2"
    assert len(err) == 1 and err[0].startswith("error: "), f"{name}: stderr is not one line: {err}"
    assert says in err[0], f"{name}: the error does not name {says!r}: {err[0]}"


def test_every_section_has_cases():
    assert all([FLAG_CASES, DATA_CASES, MODEL_CASES, EVALUATE_CASES]), "a section of the table is empty"
