"""Files written before minknn's files moved still load: a run folder stopped after its first
epoch (checkpoint.pt with a memory bank, last.pt, run.json) and a grid's results.jsonl, all
written by minknn at commit 8dc0bf9 (tests/fixtures/make_old_run.py says how). Today's
evaluate.py scores the old checkpoint as the old one did, today's train.py --resume ends the old
run as the old one did, to the last bit of its losses, and today's runner draws the old grid's
table from its results.jsonl alone."""
import json
import os
import shutil
import sys

import pytest
import torch

import evaluate
import train
from helpers import DATA
from minknn.lab import runner

OLD = os.path.join(os.path.dirname(__file__), "fixtures", "old")


def old_run(tmp_path, tiny_bert_dir):
    """The old run folder, copied, its run.json pointing at this machine's tiny BERT and data (the
    same files, at other paths: the fingerprints of the training examples still hold)."""
    folder = str(tmp_path / "run")
    shutil.copytree(os.path.join(OLD, "run"), folder)
    path = os.path.join(folder, "run.json")
    saved = json.load(open(path))
    saved["args"].update(model=tiny_bert_dir, data_dir=os.path.abspath(DATA))
    saved["data"]["root"] = os.path.abspath(DATA)
    json.dump(saved, open(path, "w"))
    return folder


@pytest.fixture
def one_thread():
    """The old files were made in one thread (make_old_run.py): the same sums in the same order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def scores(metrics):
    return {k: v for k, v in metrics.items() if k != "timing"}


def test_an_old_checkpoint_scores_as_it_did(tmp_path, tiny_bert_dir, one_thread):
    folder = old_run(tmp_path, tiny_bert_dir)
    old = json.load(open(os.path.join(OLD, "run", "predictions-dev-metrics.json")))["sst"]
    new = evaluate.main(["--checkpoint", folder, "--knn", "--k", "8", "--data_dir", DATA,
                         "--device", "cpu"])["sst"]
    assert scores(new) | {"predictions": None} == scores(old) | {"predictions": None}, \
        f"the old checkpoint's scores: {scores(old)}; today's evaluate.py: {scores(new)}"


def test_an_old_stopped_run_resumes_to_the_old_codes_end(tmp_path, tiny_bert_dir, one_thread):
    folder = old_run(tmp_path, tiny_bert_dir)
    train.main(["--resume", folder, "--device", "cpu"])
    want = [json.loads(line) for line in open(os.path.join(OLD, "resumed-metrics.jsonl"))]
    got = [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))]
    for record in want + got:
        record.pop("epoch_seconds")
    assert got == want, f"the old run resumed by today's train.py: {got}; by the old one: {want}"
    assert not os.path.exists(os.path.join(folder, "last.pt")), "a finished run keeps no last.pt"


def test_an_old_grid_draws_its_table(tmp_path, monkeypatch):
    grid = str(tmp_path / "grid")
    shutil.copytree(os.path.join(OLD, "grid"), grid)
    os.remove(os.path.join(grid, "table.md"))
    monkeypatch.setitem(sys.modules, "minknn.lab.plots", None)  # the table only (no matplotlib)
    runner.main(["--table", grid])
    assert open(os.path.join(grid, "table.md")).read() == \
        open(os.path.join(OLD, "grid", "table.md")).read()
