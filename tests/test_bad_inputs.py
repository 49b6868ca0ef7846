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
from minknn.runs import lock_folder


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


def run_folder(tmp, files=("run.json",)):
    """tmp/run, holding the given files as a run would (their contents do not matter here)."""
    folder = tmp / "run"
    folder.mkdir(exist_ok=True)
    for name in files:
        (folder / name).write_text(json.dumps({"args": {}}))
    return str(folder)


HELD = []  # locks held by the "in use" case while its run starts


def in_use(tmp, tiny, fixtures):
    HELD.append(lock_folder(run_folder(tmp, ())))
    return trainer()(tmp, tiny, fixtures)


def under_a_file(tmp, tiny, fixtures):
    (tmp / "file").write_text("")
    return [a if a != str(tmp / "run") else str(tmp / "file" / "run") for a in trainer()(tmp, tiny, fixtures)]


def finished_run(tmp, tiny, fixtures):
    train.main(trainer("--max_train", "10")(tmp, tiny, fixtures))
    return ["--resume", str(tmp / "run")]


# --- flags, run folders and saving (train.py, evaluate.py) ---
FLAG_CASES = [
    ("lr negative in e-notation", "train", trainer("--lr", "-1e-4"), "--lr must be a finite number >= 0, got -0.0001"),
    ("lr nan", "train", trainer("--lr", "nan"), "--lr must be a finite number >= 0, got nan"),
    ("lr inf", "train", trainer("--lr", "inf"), "--lr must be a finite number >= 0, got inf"),
    ("lr 0", "train", trainer("--lr", "0"), "--lr 0 would train nothing"),
    ("seed -1", "train", trainer("--seed", "-1"), "--seed must be in [0, 2**32), got -1"),
    ("weight_decay -1", "train", trainer("--weight_decay", "-1"), "--weight_decay must be a finite number >= 0"),
    ("warmup 5", "train", trainer("--warmup", "5"), "--warmup must be a finite number in [0, 1], got 5.0"),
    ("proxy_lr -1", "train", trainer("--loss", "proxyanchor", "--proxy_lr", "-1"), "--proxy_lr must be a finite"),
    ("max_len 1", "train", trainer("--max_len", "1"), "--max_len must be at least 8"),
    ("momentum nan", "train", trainer("--loss", "knnbert", "--momentum", "nan"), "--momentum must be in [0, 1]"),
    ("out holds a run", "train", lambda tmp, *a: run_folder(tmp) and trainer()(tmp, *a), "already holds a run"),
    ("out holds metrics only", "train", lambda tmp, *a: run_folder(tmp, ["metrics.jsonl"]) and trainer()(tmp, *a),
     "continue it with --resume"),
    ("out in use by another run", "train", in_use, "is in use by another training process"),
    ("out under a file", "train", under_a_file, "cannot write there"),
    ("resume a folder that is no run", "train", lambda tmp, *a: ["--resume", str(tmp)], "not a run folder"),
    ("resume with other flags", "train", lambda tmp, *a: ["--resume", str(tmp), "--lr", "1e-3"], "leave out --lr"),
    ("resume a finished run", "train", finished_run, "this run finished (summary.json); nothing to resume"),
]

# --- data files and folders (minknn/readers.py, minknn/data.py) ---
DATA_CASES = [
]

# --- model folders, tokenizers and checkpoints (minknn/bert.py, tokenizer.py, checkpoint.py) ---
MODEL_CASES = [
]

# --- evaluate.py against its run (data root, fingerprints) ---
EVALUATE_CASES = [
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
    try:
        with pytest.raises(SystemExit) as exit_:
            run(lambda: main(argv))
    finally:
        while HELD:
            HELD.pop().close()
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: ")]
    assert exit_.value.code == 2, f"{name}: exit status {exit_.value.code}, expected 2"
    assert len(err) == 1 and err[0].startswith("error: "), f"{name}: stderr is not one line: {err}"
    assert says in err[0], f"{name}: the error does not name {says!r}: {err[0]}"


def test_every_section_has_cases():
    assert all([FLAG_CASES, DATA_CASES, MODEL_CASES, EVALUATE_CASES]), "a section of the table is empty"
