"""Files written before minknn's files moved still load: a run folder stopped after its first
epoch (checkpoint.pt with a memory bank, last.pt, run.json) and a grid's results.jsonl, all
written by minknn at commit 8dc0bf9 (tests/fixtures/make_old_run.py says how). Today's
evaluate.py scores the old checkpoint as the old one did, today's train.py --resume ends the old
run as the old one did (its losses within LOSS_RTOL, the rest exactly), and today's runner draws
the old grid's table from its results.jsonl alone."""
import json
import math
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

# The stored losses were summed by one CPU's kernels; another CPU's (MKL's and oneDNN's code paths
# for it, the vector width) add the same float32 terms in another order. After the ten steps of
# the old run's two epochs, epoch 2's mean loss moved by 5e-8 of itself on a 2-core AMD EPYC
# (issue 51) and by 2.5e-8 under `pytest --kernels avx2` (tests/kernels.py): less than float32's
# spacing at 1.9. 1e-6 is twenty times that, and a four-hundredth of what a resume that fails to
# restore one thing moves it by (the RNG state, the optimiser's moments, the schedule's step:
# 4e-4 to 6e-3 of it). Everything else the records hold (epochs, dev scores: ratios of counts of
# predictions) is compared exactly.
LOSS_RTOL = 1e-6


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
    """The old files were made in one thread (make_old_run.py): on their CPU, the same sums in the
    same order, to the bit; on another, the nearest order (LOSS_RTOL covers the rest)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def differences(got, want, where="", loss=False):
    """Where the records `got` differ from `want`, one 'path: got X, want Y' each: numbers under
    a "train_loss" key within LOSS_RTOL of each other, everything else equal."""
    if isinstance(got, dict) and isinstance(want, dict) and got.keys() == want.keys():
        return [d for k in want for d in differences(got[k], want[k], f"{where}.{k}",
                                                     loss or k == "train_loss")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want))
                for d in differences(g, w, f"{where}[{i}]", loss)]
    if loss and isinstance(got, float) and isinstance(want, float):
        same = math.isclose(got, want, rel_tol=LOSS_RTOL, abs_tol=0)
    else:
        same = type(got) is type(want) and got == want
    return [] if same else [f"{where.lstrip('.')}: got {got!r}, want {want!r}"]


def scores(metrics):
    return {k: v for k, v in metrics.items() if k != "timing"}


def test_an_old_checkpoint_scores_as_it_did(tmp_path, tiny_bert_dir, one_thread):
    folder = old_run(tmp_path, tiny_bert_dir)
    old = json.load(open(os.path.join(OLD, "run", "predictions-dev-metrics.json")))["sst"]
    new = evaluate.main(["--checkpoint", folder, "--knn", "--k", "8", "--data_dir", DATA,
                         "--device", "cpu"])["sst"]
    # exactly: every score is a ratio of counts of predictions, the same on any CPU that predicts
    # the same labels
    assert scores(new) | {"predictions": None} == scores(old) | {"predictions": None}, \
        f"the old checkpoint's scores: {scores(old)}; today's evaluate.py: {scores(new)}"


def test_an_old_stopped_run_resumes_to_the_old_codes_end(tmp_path, tiny_bert_dir, one_thread):
    folder = old_run(tmp_path, tiny_bert_dir)
    train.main(["--resume", folder, "--device", "cpu"])
    want = [json.loads(line) for line in open(os.path.join(OLD, "resumed-metrics.jsonl"))]
    got = [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))]
    for record in want + got:
        record.pop("epoch_seconds")
    wrong = differences(got, want)
    assert not wrong, (f"the old run resumed by today's train.py differs from the old one's "
                       f"metrics.jsonl (losses within rel {LOSS_RTOL}): {'; '.join(wrong)}")
    assert not os.path.exists(os.path.join(folder, "last.pt")), "a finished run keeps no last.pt"


def test_an_old_grid_draws_its_table(tmp_path, monkeypatch):
    grid = str(tmp_path / "grid")
    shutil.copytree(os.path.join(OLD, "grid"), grid)
    os.remove(os.path.join(grid, "table.md"))
    monkeypatch.setitem(sys.modules, "minknn.lab.plots", None)  # the table only (no matplotlib)
    runner.main(["--table", grid])
    assert open(os.path.join(grid, "table.md")).read() == \
        open(os.path.join(OLD, "grid", "table.md")).read()
