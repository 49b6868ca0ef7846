"""The experiment runner (minknn/lab/runner.py) and its table (minknn/lab/report.py) on the tiny fixtures:
a grid completes, its table holds the runs' own figures, a killed grid finishes without
retraining, the choices never look at the test split."""
import importlib.util
import json
import multiprocessing
import os
import re
import shutil
import signal

import pytest
import torch

import evaluate
import minknn.tools.trainer
import train
from minknn import MinknnError, Terminated
from minknn.lab import cells, grid, report, runner
from minknn.lab import flags as runner_flags
from minknn.tools.run import Diverged

from helpers import DATA, METHODS, dev_falling, lines_of, run_grid

@pytest.fixture(scope="module")
def finished(tiny_bert_dir, tmp_path_factory):
    """One 2-task x 2-training x 2-seed grid, checkpoints kept."""
    out = tmp_path_factory.mktemp("grid") / "g"
    run_grid(tiny_bert_dir, out, "--keep")
    return out


def test_grid_completes_and_the_table_holds_the_runs_figures(finished, tiny_bert_dir):
    lines = lines_of(finished)
    assert {(ln["task"], ln["seed"], ln["method"]) for ln in lines} == \
        {(t, s, m) for t in ("mr", "sst2") for s in (0, 1) for m in grid.split_top(METHODS, ",")}
    for ln in lines:  # the linear head's test figure is evaluate.py's on the kept checkpoint
        if ln["rule"] != "linear":
            continue
        ckpt = finished / "runs" / ln["cell"] / "checkpoint.pt"
        scored = evaluate.main(["--checkpoint", str(ckpt), "--split", "test", "--device", "cpu",
                                "--out", str(finished / f"check-{ln['cell']}.csv")])
        assert scored[ln["task"]]["acc"] == pytest.approx(ln["grid"][0]["test"]["acc"]), \
            f"runner: {ln['cell']}'s test accuracy differs from evaluate.py's on its checkpoint"
    for ln in lines:  # proxy inference and the kNN mix: evaluate.py's figures at each value
        ckpt = str(finished / "runs" / ln["cell"] / "checkpoint.pt")
        csv = str(finished / f"check-{ln['cell']}-{ln['rule']}.csv")
        for entry in ln["grid"] if ln["rule"] in ("proxy", "knn") else []:
            if ln["rule"] == "proxy":
                flags, key = ["--proxy", "--proxy_alpha", str(entry["params"]["alpha"])], "proxy_acc"
            elif entry["params"]["k"] == 2:
                flags, key = ["--knn", "--k", "2", "--phi", str(entry["params"]["phi"])], "mix_acc"
            else:
                continue
            scored = evaluate.main(["--checkpoint", ckpt, "--split", "test", "--device", "cpu",
                                    "--out", csv, *flags])
            assert scored[ln["task"]][key] == pytest.approx(entry["test"]["acc"]), \
                f"rules: {ln['cell']}'s {ln['rule']} at {entry['params']} differs from evaluate.py"
        if ln["rule"] == "knn":  # the sweep's deepest K (the whole datastore) too
            top = next(e for e in ln["sweep"] if e["k"] == ln["n_train"] and e["phi"] == 0.5)
            scored = evaluate.main(["--checkpoint", ckpt, "--split", "test", "--device", "cpu",
                                    "--out", csv, "--knn", "--k", str(ln["n_train"]), "--phi", "0.5"])
            assert scored[ln["task"]]["mix_acc"] == pytest.approx(top["test"]["acc"]), \
                f"rules: {ln['cell']}'s sweep at K {ln['n_train']} differs from evaluate.py"
    text = (finished / "table.md").read_text()
    for task in ("mr", "sst2"):  # ce's row: the mean and std of its runs' test figures
        values = [100 * ln["grid"][0]["test"]["acc"] for ln in lines
                  if ln["task"] == task and ln["method"] == "ce"]
        mean = sum(values) / 2
        std = abs(values[0] - values[1]) / 2 ** 0.5
        assert f"{mean:.2f} ± {std:.2f}" in text.split("| ce |")[1].split("\n")[0], \
            f"report: the ce row's {task} cell is not the mean ± std of the runs' figures"


def test_the_grid_draws_its_plots(finished):
    pytest.importorskip("matplotlib")
    drawn = sorted(os.listdir(finished / "plots"))
    for kind in ("sweep-mr-6", "map-mr-6-ce", "curves-mr-6", "bars-6"):
        assert f"{kind}.png" in drawn, f"runner: no {kind}.png among the grid's plots {drawn}"


def test_the_table_is_redrawn_from_results_alone(finished, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(finished / "results.jsonl", copy)  # no runs/, no checkpoints
    runner.main(["--table", str(copy)])
    assert (copy / "table.md").read_text() == (finished / "table.md").read_text()
    with pytest.raises(MinknnError, match="--metric hamming: not a score of mr"):
        runner.main(["--table", str(copy), "--metric", "hamming"])


def test_setfit_and_its_knn_rule_share_one_training(tiny_bert_dir, tmp_path):
    """--methods setfit,setfit+knn-only: one cell trained by SetFit's pairs, its logistic head scored by the linear
    rule (evaluate.py's figure on the kept checkpoint) and its z by kNN alone, both in the table."""
    out = tmp_path / "g"
    text = run_grid(tiny_bert_dir, out, "--keep", "--seeds", "0", tasks="mr",
                    methods="setfit[setfit_iterations=2],setfit[setfit_iterations=2]+knn-only[k=1,3]")
    lines = lines_of(out)
    assert [ln["label"] for ln in lines] == ["setfit", "setfit+knn-only"]
    assert len({ln["cell"] for ln in lines}) == 1, "the two rules must read one training"
    linear, knn = lines
    ckpt = out / "runs" / linear["cell"] / "checkpoint.pt"
    assert torch.load(ckpt, weights_only=True)["args"]["setfit_iterations"] == 2
    scored = evaluate.main(["--checkpoint", str(ckpt), "--split", "test", "--device", "cpu",
                            "--out", str(tmp_path / "check.csv")])
    assert scored["mr"]["acc"] == pytest.approx(linear["grid"][0]["test"]["acc"])
    assert [e["params"] for e in knn["grid"]] == [{"k": 1, "phi": 1.0}, {"k": 3, "phi": 1.0}]
    assert "setfit+knn-only" in text


def test_checkpoints_go_unless_kept(tiny_bert_dir, tmp_path):
    run_grid(tiny_bert_dir, tmp_path / "g", tasks="mr", methods="ce")
    runs = sorted(os.listdir(tmp_path / "g" / "runs"))
    assert len(runs) == 2
    for name in runs:
        files = os.listdir(tmp_path / "g" / "runs" / name)
        assert "cell.json" in files and "checkpoint.pt" not in files and "last.pt" not in files, \
            f"runner: {name} should keep its scores (cell.json) and drop its checkpoint: {files}"


def test_a_cells_progress_line_names_the_split_its_scores_are_on():
    """The runner's line after each cell gives each method's first score: it must say on which split (test, or
    the dev examples left after the selection sample), as the table does, not a bare `acc`."""
    line = {"method": "ce", "label": "ce", "test_split": "dev less the selection sample",
            "grid": [{"params": {}, "select": {"acc": 0.5}, "test": {"acc": 0.625}}]}
    knn = dict(line, method="ce+knn", label="ce+knn",
               grid=[{"params": {"k": 1}, "select": {"acc": 0.5}, "test": {"acc": 0.75}}])
    said = runner.describe_cell([line, knn])
    assert said == "on dev less the selection sample: ce acc 0.6250; ce+knn acc 0.7500 (k 1)", \
        f"a cell's scores should name their split once, first: {said!r}"
    assert runner.describe_cell([dict(line, test_split="test")]).startswith("on test: ce acc"), \
        runner.describe_cell([dict(line, test_split="test")])
    diverged = {"method": "ce", "label": "ce", "diverged": "diverged: epoch 1: the mr loss became nan"}
    assert runner.describe_cell([diverged]) == "ce diverged", runner.describe_cell([diverged])


def test_a_killed_grid_finishes_without_retraining(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    reference = tmp_path / "reference"
    run_grid(tiny_bert_dir, reference, tasks="mr")
    calls, real_main, real_step = [], train.main, train.train_step
    steps = {"n": 0}

    def counting_main(argv):
        calls.append(argv)
        steps["n"] = 0
        return real_main(argv)

    def step_then_kill(*a, **k):  # the third cell is killed in its second epoch
        steps["n"] += 1
        if len(calls) == 3 and steps["n"] > 2:
            raise KeyboardInterrupt
        return real_step(*a, **k)
    monkeypatch.setattr(train, "main", counting_main)
    monkeypatch.setattr(train, "train_step", step_then_kill)
    out = tmp_path / "g"
    with pytest.raises(SystemExit) as stop:
        run_grid(tiny_bert_dir, out, tasks="mr")
    assert stop.value.code == 130
    killed = sorted(os.listdir(out / "runs"))
    done_before = {n: (out / "runs" / n / "cell.json").read_text() for n in killed
                   if (out / "runs" / n / "cell.json").exists()}
    assert len(done_before) == 2, "the two cells before the kill are finished"

    monkeypatch.setattr(train, "train_step", real_step)
    calls.clear()
    capsys.readouterr()
    run_grid(tiny_bert_dir, out, tasks="mr")
    progress = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]
    assert len(progress) == 4, f"runner: one progress line a cell, not {progress}"
    assert all(re.search(r"seed\d: on (test|dev less the selection sample): ", ln) for ln in progress), \
        f"runner: each cell's line names the split of its scores: {progress}"
    assert not any("left" in ln for ln in progress[:2]), \
        f"runner: a cell read back from before has no time to go by: {progress[:2]}"
    for ln in progress[2:3]:  # the resumed cell: the one after it is left
        assert re.search(r"about \d+ min left", ln), f"runner: no (or a negative) estimate: {ln}"
    resumed = [argv for argv in calls if argv[0] == "--resume"]
    assert len(resumed) == 1 and len(calls) == 2, \
        f"runner: the rerun should resume the killed cell and train the one left, not {calls}"
    for name, text in done_before.items():
        assert (out / "runs" / name / "cell.json").read_text() == text, f"{name} was redone"
    strip = [{k: v for k, v in ln.items() if k != "seconds"} for ln in lines_of(out)]
    assert strip == [{k: v for k, v in ln.items() if k != "seconds"} for ln in lines_of(reference)], \
        "runner: a killed and resumed grid must give the uninterrupted grid's figures"


def test_a_cell_stopped_while_its_last_epoch_saves_is_finished_by_the_rerun(tiny_bert_dir, tmp_path, monkeypatch):
    """Ctrl-C while the first cell's last epoch (its second) saves last.pt: train.py finishes the save, then stops
    the grid (exit 130). The rerun goes on from that cell: it finishes it without training a step, scores it, and
    trains the other cell, as the grid left alone does."""
    reference = tmp_path / "reference"
    run_grid(tiny_bert_dir, reference, tasks="mr", methods="ce")
    real_save, saves = minknn.tools.trainer.save_last, []

    def save_then_ctrl_c(folder, **state):  # save() holds the signal until the epoch's files are written
        real_save(folder, **state)
        saves.append(state["epoch"])
        if len(saves) == 2:
            os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(minknn.tools.trainer, "save_last", save_then_ctrl_c)
    out = tmp_path / "g"
    with pytest.raises(SystemExit) as stop:
        run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    assert stop.value.code == 130 and saves == [1, 2], f"exit {stop.value.code} after saving epochs {saves}"
    monkeypatch.setattr(minknn.tools.trainer, "save_last", real_save)
    calls, real_main, real_step = [], train.main, train.train_step
    monkeypatch.setattr(train, "main", lambda argv: calls.append(argv) or real_main(argv))
    monkeypatch.setattr(train, "train_step", lambda *a, **k: calls.append("step") or real_step(*a, **k))
    try:
        run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    except (MinknnError, SystemExit) as e:
        pytest.fail(f"the rerun stopped on the cell stopped while its last epoch saved: {e!r}")
    assert calls[0] == ["--resume", calls[0][1]] and calls[1] != "step", \
        f"the stopped cell should be resumed and finished without a step: {calls[:3]}"
    strip = [{k: v for k, v in ln.items() if k != "seconds"} for ln in lines_of(out)]
    assert strip == [{k: v for k, v in ln.items() if k != "seconds"} for ln in lines_of(reference)], \
        "runner: a grid stopped while a cell's last epoch saved must give the grid left alone's figures"


def poisoned_copy(tmp_path):
    """The fixtures with every sst2 test label flipped."""
    data = tmp_path / "data"
    shutil.copytree(DATA, data)
    path = data / "senteval" / "SST" / "binary" / "sentiment-test"
    rows = [line.rsplit("\t", 1) for line in path.read_text().splitlines()]
    path.write_text("".join(f"{text}\t{1 - int(label)}\n" for text, label in rows))
    return str(data)


def test_choices_never_look_at_the_test_labels(tiny_bert_dir, tmp_path):
    run_grid(tiny_bert_dir, tmp_path / "clean", tasks="sst2")
    run_grid(tiny_bert_dir, tmp_path / "poisoned", tasks="sst2", data_dir=poisoned_copy(tmp_path))
    clean, poisoned = lines_of(tmp_path / "clean"), lines_of(tmp_path / "poisoned")
    assert [ln["grid"][0]["test"] for ln in clean] != [ln["grid"][0]["test"] for ln in poisoned], \
        "the poisoning must change the test scores, or this test checks nothing"
    for a, b in zip(clean, poisoned):
        assert a["best_epoch"] == b["best_epoch"], f"{a['cell']}: the epoch was chosen on test"
        assert [e["select"] for e in a["grid"]] == [e["select"] for e in b["grid"]]
    chosen = {k: v["params"] for k, v in report.choose(clean, "acc").items()}
    assert chosen == {k: v["params"] for k, v in report.choose(poisoned, "acc").items()}, \
        "report.choose: the hyper-parameters chosen changed with the test labels"


def test_bad_grids_stop_in_one_line_before_training(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "g"
    with pytest.raises(SystemExit):
        run_grid(tiny_bert_dir, out, "--seed", "3")
    assert "the runner sets it for each cell" in capsys.readouterr().err
    with pytest.raises(MinknnError, match="proxy inference needs a proxy loss"):
        run_grid(tiny_bert_dir, out, methods="ce+proxy")
    with pytest.raises(SystemExit):
        run_grid(tiny_bert_dir, out, "--slurm_partition", "gpu")
    assert "--slurm_partition is for --launcher slurm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_grid(tiny_bert_dir, out, "--launcher", "slurm", "--jobs", "2")
    assert "--jobs is --launcher local's" in capsys.readouterr().err
    with pytest.raises(MinknnError, match="--per_class 50"):
        runner.main(["--tasks", "mr", "--sizes", "50pc", "--out", str(out), "--model",
                     tiny_bert_dir, "--data_dir", DATA])
    with pytest.raises(MinknnError, match="--select dev: sst has no labelled test split"):
        run_grid(tiny_bert_dir, out, "--select", "dev", tasks="sst")
    assert not out.exists(), "nothing is written before the grid is checked"
    with pytest.raises(MinknnError, match=r"--methods ce\[seed=7\]: seed is the runner's"):
        run_grid(tiny_bert_dir, out, methods="ce[seed=7]")
    with pytest.raises(MinknnError, match=r"--methods ce\[lr=abc\]: argument --lr: invalid float"):
        run_grid(tiny_bert_dir, out, methods="ce[lr=abc]")
    with pytest.raises(MinknnError, match="knn needs one vector per example .* siamese pair"):
        runner.main(["--tasks", "mrpc", "--methods", "ce+knn", "--sizes", "4", "--out", str(out),
                     "--model", tiny_bert_dir, "--data_dir", DATA, "--pair_mode", "siamese"])
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    with pytest.raises(MinknnError, match=r"holds a grid run with --warmup \(not given\)"):
        run_grid(tiny_bert_dir, out, "--warmup", "0.1", tasks="mr", methods="ce")
    runner.main(["--tasks", "mr", "--methods", "ce", "--sizes", "6", "--seeds", "0-1", "--out",
                 str(out), "--device=cpu", "--max_len", "32", "--batch_size", "4", "--lr", "3e-3",
                 "--epochs", "2", "--data_dir", DATA, "--model", tiny_bert_dir])  # reordered


SEARCH = "lr=1e-3,3e-3;lam=0.1,0.5"


def run_small(tiny_bert_dir, out, *extra, methods, data_dir=DATA, epochs="2"):
    """One task (sst2, labelled test), one seed: the --search and --select none grids."""
    return runner.main(["--tasks", "sst2", "--methods", methods, "--sizes", "6", "--seeds", "0",
                        "--out", str(out), "--model", tiny_bert_dir, "--data_dir", data_dir,
                        "--epochs", epochs, "--batch_size", "4", "--max_len", "32",
                        "--device", "cpu", *extra])


def trained_with(monkeypatch):
    """Records each cell's train.py flags as (loss, lr, lam, save), None where not given."""
    seen, real = [], train.main

    def main(argv):
        last = {flag: value for flag, value in zip(argv, argv[1:]) if flag.startswith("--")}
        number = {f: last.get(f"--{f}") and float(last[f"--{f}"]) for f in ("lr", "lam")}
        seen.append((last["--loss"], number["lr"], number["lam"], last["--save"]))
        return real(argv)
    monkeypatch.setattr(train, "main", main)
    return seen


def test_search_trains_each_method_at_the_values_that_apply(tiny_bert_dir, tmp_path, monkeypatch):
    """--search lr x lam: ce without lam (train.py refuses --lam for the base loss alone), supcon
    at every pair, proxyanchor at its own lam 0.9; the choice on the selection split (a poisoned
    test split changes nothing chosen); the budget and the chosen values under the table; a rerun
    with another --search refused in one line."""
    methods = "ce,ce+knn,supcon,proxyanchor[lam=0.9]+proxy"
    seen = trained_with(monkeypatch)
    run_small(tiny_bert_dir, tmp_path / "clean", "--search", SEARCH, methods=methods)
    lrs = (1e-3, 3e-3)
    want = {("ce", lr, None) for lr in lrs} | {("supcon", lr, lam) for lr in lrs for lam in (0.1, 0.5)} | \
        {("proxyanchor", lr, 0.9) for lr in lrs}
    assert {s[:3] for s in seen} == want and len(seen) == len(want), \
        f"runner_flags.search_methods: the cells trained {sorted(seen, key=str)}, not {sorted(want, key=str)}"
    lines = lines_of(tmp_path / "clean")
    assert sorted(len([ln for ln in lines if ln["method"] == m]) for m in grid.split_top(methods, ",")) == \
        [2, 2, 2, 4], "one result line per method and training"
    text = (tmp_path / "clean" / "table.md").read_text()
    assert "Budget, trainings per task, size and seed (--search lr=0.001,0.003;lam=0.1,0.5): ce: 2 trainings " \
           "(lam does not apply), ce+knn: 2 trainings (lam does not apply), proxyanchor+proxy: 2 trainings " \
           "(its own lam=0.9), supcon: 4 trainings." in text, text
    chosen = text.split("Chosen (6): ")[1].split("\n")[0]
    for method, values in (("ce", "lr="), ("supcon", "lam=0."), ("supcon", "lr="), ("proxyanchor+proxy", "lam=0.9")):
        assert values in chosen.split(f"{method} on sst2: ")[1].split(";")[0], \
            f"report: the chosen {values} of {method} must be listed: {chosen}"

    run_small(tiny_bert_dir, tmp_path / "poisoned", "--search", SEARCH, methods=methods,
              data_dir=poisoned_copy(tmp_path))
    poisoned = lines_of(tmp_path / "poisoned")
    assert [ln["grid"][0]["test"] for ln in lines] != [ln["grid"][0]["test"] for ln in poisoned], \
        "the poisoning must change the test scores, or this test checks nothing"
    assert {k: v["params"] for k, v in report.choose(lines, "acc").items()} == \
        {k: v["params"] for k, v in report.choose(poisoned, "acc").items()}, \
        "report.choose: the searched values chosen changed with the test labels"
    with pytest.raises(MinknnError, match=r"holds a grid run with --search lr=0.001,0.003;lam=0.1,0.5; use "):
        run_small(tiny_bert_dir, tmp_path / "clean", "--search", "lr=1e-3", methods=methods)
    with pytest.raises(MinknnError, match=r"holds a grid run with --search lr=0.001,0.003;lam=0.1,0.5; use "):
        run_small(tiny_bert_dir, tmp_path / "clean", methods=methods)


def test_bad_searches_and_choices_under_select_none_stop_in_one_line(tiny_bert_dir, tmp_path):
    out = tmp_path / "g"
    for extra, methods, says in (
            (["--search", "lam=2"], "ce,supcon", r"--search lam: no method of --methods takes it \(--lam must be "
             r"a finite number in \[0, 1\], got 2.0\)$"),  # each refusal once
            (["--search", "m_most=5"], "ce,supcon", r"--search m_most: no method of --methods takes it \(--m_most "
             r"is a flag of --loss knnbert, not of --loss ce \| --m_most .* not of --loss supcon\)"),
            (["--search", "lr=1e-3,-1"], "ce", r"--search lr=-1: --lr must be a finite number >= 0, got -1.0 "
             r"\(with --methods ce\)"),
            (["--search", "k=4,16"], "ce+knn", "unrecognized arguments: --k 4.*are inference values"),
            (["--search", "seed=1"], "ce", "seed is the runner's to set"),
            (["--search", "lr"], "ce", "--search lr: 'lr' is not name=value"),
            (["--select", "none"], "ce,proxyanchor[lam=0.1,0.5]", r"--methods proxyanchor\[lam=0.1,0.5\]: 2 "
             r"values of lam, and --select none has no dev labels to choose one"),
            (["--select", "none"], "ce+knn[k=1,2]", r"--methods ce\+knn\[k=1,2\]: 2 values of k, and --select"),
            (["--select", "none", "--search", "lr=1e-3,3e-3"], "ce", "--search lr=1e-3,3e-3: 2 values of lr")):
        with pytest.raises(MinknnError, match=says):
            run_small(tiny_bert_dir, out, *extra, methods=methods)
    assert not out.exists(), "nothing is written before the grid is checked"


def test_select_none_scores_the_last_epoch_and_chooses_nothing(tiny_bert_dir, tmp_path, monkeypatch):
    """--select none: each cell trains with --save last and is scored at its last epoch, though the
    first was the best on dev; the lines carry no selection scores, the table says nothing was
    chosen, the plots are drawn; a rerun with another --select is refused in one line."""
    out = tmp_path / "g"
    seen = trained_with(monkeypatch)
    dev_falling(monkeypatch)
    run_small(tiny_bert_dir, out, "--select", "none", "--keep", methods="ce,ce+knn[k=2]", epochs="3")
    assert [s[3] for s in seen] == ["last"], f"cells.train_argv: --select none must train with --save last: {seen}"
    lines = lines_of(out)
    cell = out / "runs" / lines[0]["cell"]
    assert json.load(open(cell / "summary.json"))["best_epoch"] == 1, \
        "the falling dev scores must make epoch 1 the best, or this test checks nothing"
    for ln in lines:
        assert ln["best_epoch"] == 3, f"{ln['method']}: scored at epoch {ln['best_epoch']}, not the last (3)"
        assert all("select" not in e for e in ln["grid"]), f"{ln['method']}: --select none keeps no selection scores"
    scored = evaluate.main(["--checkpoint", str(cell), "--split", "test", "--device", "cpu",
                            "--out", str(tmp_path / "check.csv")])
    ce = next(ln for ln in lines if ln["method"] == "ce")
    assert scored["sst2"]["acc"] == pytest.approx(ce["grid"][0]["test"]["acc"]), \
        "runner: ce's test figure is not the last epoch's checkpoint's"
    text = (out / "table.md").read_text()
    assert "Selection (none): the last epoch and the given values; no dev labels choose anything" in text, text
    assert "Given, chosen by nothing (6): ce+knn on sst2: k=2, phi=0.25." in text, text
    if importlib.util.find_spec("matplotlib"):  # an optional extra
        assert {"curves-sst2-6.png", "bars-6.png", "sweep-sst2-6.png"} <= set(os.listdir(out / "plots"))
    with pytest.raises(MinknnError, match=r"holds a grid run with --select none; use the same flags"):
        run_small(tiny_bert_dir, out, "--keep", methods="ce,ce+knn[k=2]", epochs="3")
    grid_json = json.load(open(out / "grid.json"))  # a grid.json from before --search: as none given
    del grid_json["search"]
    (out / "grid.json").write_text(json.dumps(grid_json))
    run_small(tiny_bert_dir, out, "--select", "none", "--keep", methods="ce,ce+knn[k=2]", epochs="3")


def test_the_grid_records_the_tasks_it_was_chosen_on_and_shows_the_others_apart(tiny_bert_dir, tmp_path):
    """--chosen_on sst5,cr on a grid of sst2: grid.json records the development tasks, the table shows sst2 as
    held out, and the grid cannot go on with other development tasks, or none (a claim made after the fact)."""
    out = tmp_path / "g"
    with pytest.raises(MinknnError, match=r"--chosen_on 'sst5,nope': no task 'nope'"):
        run_small(tiny_bert_dir, out, "--chosen_on", "sst5,nope", methods="ce", epochs="1")
    run_small(tiny_bert_dir, out, "--chosen_on", "sst5,cr", methods="ce", epochs="1")
    assert json.load(open(out / "grid.json"))["chosen_on"] == ["cr", "sst5"]
    text = (out / "table.md").read_text()
    assert "Held out (nothing was chosen on them" in text and "| 6 examples, accuracy | sst2 |" in text, text
    assert "Development tasks" not in text, "no development task ran in this grid: no table of them"
    for again in (["--chosen_on", "sst2"], []):
        with pytest.raises(MinknnError, match=r"holds a grid run with --chosen_on cr,sst5"):
            run_small(tiny_bert_dir, out, *again, methods="ce", epochs="1")


def test_jobs_run_cells_side_by_side_on_the_cpu(tiny_bert_dir, tmp_path):
    """--jobs 2 on the CPU: two processes, each with half of the cores' torch threads; the cells
    give the figures of a one-at-a-time grid run with that many threads (the number of threads
    changes a float sum's last bits, so the reference runs with as many)."""
    threads = max(1, torch.get_num_threads() // 2)
    with runner.cell_pool(2, torch.device("cpu")) as pool:
        seen = {pool.submit(torch.get_num_threads).result() for _ in range(4)}
    assert seen == {threads}, f"runner.start_worker: a --jobs 2 process runs {seen} threads, " \
                              f"not half of this machine's {torch.get_num_threads()}"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run_grid(tiny_bert_dir, tmp_path / "one", tasks="mr", methods="ce")
    finally:
        torch.set_num_threads(before)
    run_grid(tiny_bert_dir, tmp_path / "two", "--jobs", "2", tasks="mr", methods="ce")
    strip = [[{k: v for k, v in ln.items() if k != "seconds"} for ln in lines_of(tmp_path / name)]
             for name in ("one", "two")]
    assert strip[0] == strip[1], "runner --jobs 2: the cells' figures differ from --jobs 1's"


def test_each_pool_process_takes_its_own_gpu(monkeypatch):
    """On a machine with several GPUs, --jobs gives the processes the visible GPUs in turn (its
    CUDA_VISIBLE_DEVICES), for `--device cuda` or auto; a device with an index is every cell's."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7")
    assert runner.gpus_to_share(torch.device("cuda")) == ["4", "7"]
    assert runner.gpus_to_share(torch.device("cuda:1")) == [] == runner.gpus_to_share(torch.device("cpu"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # not this process's
    started, took = multiprocessing.get_context("spawn").Value("i", 0), []
    for _ in range(3):
        runner.start_worker(1, ["4", "7"], started)
        took.append(os.environ["CUDA_VISIBLE_DEVICES"])
    assert took == ["4", "7", "4"], f"runner.start_worker: the processes took GPUs {took}"


def test_a_task_without_test_labels_is_scored_on_the_rest_of_dev(tiny_bert_dir, tmp_path):
    """sst's test split has no labels: the selection sample (as large as the training set) and
    the examples scored are disjoint parts of dev."""
    args, flags = runner.get_args(["--tasks", "sst", "--sizes", "6", "--out", str(tmp_path / "g"),
                                   "--data_dir", DATA])
    ctx = cells.Context(args, flags)
    dev = runner_flags.load_split(ctx.task("sst"), "dev", DATA)
    selection, test, name = ctx.splits("sst", 6)
    assert len(selection) == 6, "--select sample: a dev sample as large as the training set"
    assert not {e.id for e in selection} & {e.id for e in test}, \
        "runner: the examples scored must not include the ones that chose"
    assert len(test) == len(dev) - 6 and name == "dev less the selection sample"
    with pytest.raises(MinknnError, match="sst has no labelled test split: .* leave too few"):
        runner_flags.check_splits(ctx, ctx.task("sst"), 10)


def test_a_diverged_cell_is_recorded_and_left_out(tiny_bert_dir, tmp_path, monkeypatch):
    real = train.check_epoch_finite

    def diverge_proxyanchor(epoch, model, losses, dev_scores):
        if getattr(losses["mr"], "metric", None) is not None:  # the proxyanchor cells
            raise Diverged(f"epoch {epoch}: the dev score mr acc is not finite")
        return real(epoch, model, losses, dev_scores)
    monkeypatch.setattr(train, "check_epoch_finite", diverge_proxyanchor)
    out = tmp_path / "g"
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce,proxyanchor+proxy")
    lines = lines_of(out)
    assert [ln["method"] for ln in lines if "diverged" in ln] == ["proxyanchor+proxy"] * 2
    text = (out / "table.md").read_text()
    assert "diverged with seed(s) 0, 1" in text and "| proxyanchor+proxy | – |" in text
    monkeypatch.setattr(train, "check_epoch_finite", real)
    monkeypatch.setattr(train, "main", lambda argv: pytest.fail(f"retrained: {argv}"))
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce,proxyanchor+proxy")  # nothing to redo


def killed_while_scoring(tiny_bert_dir, out, monkeypatch):
    """A one-task grid stopped by Ctrl-C in its first cell's scoring: that cell trained, none
    scored. Returns the list of train.py argvs the next run_grid calls will record."""
    real = cells.score_cell
    monkeypatch.setattr(cells, "score_cell", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(SystemExit):
        run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    monkeypatch.setattr(cells, "score_cell", real)
    calls, real_main = [], train.main
    monkeypatch.setattr(train, "main", lambda argv: calls.append(argv) or real_main(argv))
    return calls


def test_a_kill_while_scoring_resumes_without_retraining(tiny_bert_dir, tmp_path, monkeypatch):
    out = tmp_path / "g"
    calls = killed_while_scoring(tiny_bert_dir, out, monkeypatch)
    trained = [p.parent for p in out.rglob("checkpoint.pt")]
    assert len(trained) == 1, f"the premise: one cell trained, {trained}"
    leftover = trained[0] / "datastore-mean.pt.k1ll3d.tmp"  # a save killed mid-write, as files.atomic_save names it
    leftover.write_bytes(b"half a file")
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    assert len(calls) == 1, "the cell killed while scoring is scored, not retrained; the other " \
                            f"one trains: {calls}"
    assert len(lines_of(out)) == 2
    assert not leftover.exists(), "scoring a cell left a killed save's temporary file in its folder"


def test_a_damaged_metrics_file_of_an_unscored_cell_trains_it_again(tiny_bert_dir, tmp_path,
                                                                    monkeypatch, capsys):
    """A cell trained but not yet scored whose metrics.jsonl is cut short (its epochs' records,
    kept nowhere else once the run finished): the rerun trains that cell again, with a warning,
    and finishes the grid; its figures are the ones the first training gave."""
    out = tmp_path / "g"
    calls = killed_while_scoring(tiny_bert_dir, out, monkeypatch)
    cell = sorted((out / "runs").iterdir())[0]
    metrics = cell / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole[:-20])
    capsys.readouterr()
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    assert [a for a in calls if str(cell) in a], \
        f"runner: {cell.name}'s damaged metrics.jsonl must make the rerun train it again: {calls}"
    assert f"warning: {cell.name}: its metrics.jsonl is damaged" in capsys.readouterr().err

    def records(text):
        return [{k: v for k, v in json.loads(line).items() if k != "epoch_seconds"}
                for line in text.splitlines()]
    assert records(metrics.read_text()) == records(whole), \
        "runner: the cell trained again must give the records it gave before (the same seed)"
    assert len(lines_of(out)) == 2


def test_a_method_added_later_is_scored_from_kept_checkpoints(tiny_bert_dir, tmp_path,
                                                              monkeypatch):
    kept, dropped = tmp_path / "kept", tmp_path / "dropped"
    run_grid(tiny_bert_dir, kept, "--keep", tasks="mr", methods="ce")
    run_grid(tiny_bert_dir, dropped, tasks="mr", methods="ce")
    monkeypatch.setattr(train, "main", lambda argv: pytest.fail(f"retrained: {argv}"))
    run_grid(tiny_bert_dir, kept, "--keep", tasks="mr", methods="ce,ce+knn[k=2]")
    assert [ln["method"] for ln in lines_of(kept)] == ["ce", "ce+knn[k=2]"] * 2
    with pytest.raises(MinknnError, match="scored before some of these methods were added"):
        run_grid(tiny_bert_dir, dropped, tasks="mr", methods="ce,ce+knn[k=2]")


def test_a_multilabel_grid_votes_and_scores_its_own_way(tiny_bert_dir, tmp_path):
    out = tmp_path / "g"
    runner.main(["--tasks", "goemotions", "--methods", "bce,bce+knn[k=2;phi=0.5]", "--sizes", "20",
                 "--seeds", "0", "--out", str(out), "--model", tiny_bert_dir, "--data_dir", DATA,
                 "--epochs", "2", "--lr", "3e-3", "--batch_size", "8", "--max_len", "32",
                 "--device", "cpu", "--keep", "--metric", "micro_f1,hamming"])
    knn = next(ln for ln in lines_of(out) if ln["rule"] == "knn")
    scored = evaluate.main(["--checkpoint", str(out / "runs" / knn["cell"]), "--split", "test",
                            "--device", "cpu", "--knn", "--k", "2", "--phi", "0.5",
                            "--out", str(tmp_path / "p.csv")])
    for metric in ("micro_f1", "hamming"):
        assert scored["goemotions"][f"mix_{metric}"] == pytest.approx(knn["grid"][0]["test"][metric]), \
            f"rules: the multi-label kNN mix's {metric} differs from evaluate.py's"
    assert "Hamming loss" in (out / "table.md").read_text()


def test_damaged_results_and_cell_files_are_mended_by_a_rerun(tiny_bert_dir, tmp_path,
                                                              monkeypatch, capsys):
    """A results.jsonl cut short (a kill in an older writer, a copy, a full disk): --table names
    its line; the rerun rewrites it from the cells' cell.json, training nothing. A damaged
    cell.json (cut short, or emptied of its lines): that cell is scored again from its kept
    checkpoint, or trained again without one; the other cell is left alone."""
    out = tmp_path / "g"
    run_grid(tiny_bert_dir, out, "--keep", tasks="mr", methods="ce")
    results, table = (out / "results.jsonl").read_text(), (out / "table.md").read_text()
    (out / "results.jsonl").write_text(results[:-25])  # the last line loses its end
    with pytest.raises(MinknnError, match=r"results.jsonl:2: a truncated or damaged line"):
        runner.main(["--table", str(out)])
    cells = sorted((out / "runs").glob("*/cell.json"))
    written = [path.stat().st_mtime_ns for path in cells]
    monkeypatch.setattr(train, "main", lambda argv: pytest.fail(f"retrained: {argv}"))
    run_grid(tiny_bert_dir, out, "--keep", tasks="mr", methods="ce")
    assert (out / "results.jsonl").read_text() == results, \
        "runner: the rerun must rewrite results.jsonl whole from the cells' cell.json"
    assert (out / "table.md").read_text() == table
    assert [path.stat().st_mtime_ns for path in cells] == written, \
        "runner: a damaged results.jsonl must leave the cells' own files alone"

    rescored, retrained = sorted(os.listdir(out / "runs"))  # seed 0's cell, seed 1's
    cut, emptied = (out / "runs" / name / "cell.json" for name in (rescored, retrained))
    emptied.write_text(json.dumps({"cell": rescored, "lines": []}))  # whole JSON, no scores
    cut.write_text(cut.read_text()[:40])
    (out / "runs" / retrained / "checkpoint.pt").unlink()
    capsys.readouterr()
    monkeypatch.undo()
    calls, real_main = [], train.main
    monkeypatch.setattr(train, "main", lambda argv: calls.append(argv) or real_main(argv))
    run_grid(tiny_bert_dir, out, "--keep", tasks="mr", methods="ce")
    assert [argv[argv.index("--out") + 1] for argv in calls] == [str(out / "runs" / retrained)], \
        f"runner: only the cell whose cell.json and checkpoint are both gone trains again: {calls}"
    err = capsys.readouterr().err
    assert f"warning: {cut}: damaged (cut short, emptied, or not a cell's result lines); scoring the " \
        f"cell again" in err and f"warning: {emptied}: damaged (cut short, emptied, or not a cell's result " \
        f"lines); training the cell again" in err, err
    strip = [{k: v for k, v in ln.items() if k != "seconds"} for ln in lines_of(out)]
    want = [{k: v for k, v in json.loads(ln).items() if k != "seconds"}
            for ln in results.splitlines()]
    assert strip == want, "runner: the cells done again must give the figures they gave before"


@pytest.mark.parametrize("stop, status, says", [
    (KeyboardInterrupt(), 130, "interrupted"), (SystemExit(130), 130, "interrupted"),
    (Terminated(), 143, "terminated"), (SystemExit(143), 143, "terminated"),
], ids=["ctrl-c-while-scoring", "ctrl-c-in-train.py", "sigterm-while-scoring", "sigterm-in-train.py"])
def test_ctrl_c_and_sigterm_stop_the_grid_with_their_own_status(stop, status, says, tiny_bert_dir, tmp_path,
                                                                 monkeypatch, capsys):
    """Ctrl-C and SIGTERM (minknn.Terminated) in the runner's own code, or train.py's exit for them (130, 143):
    the grid stops with that status and one line saying how to go on."""
    def stopped(*args):
        raise stop
    monkeypatch.setattr(runner, "run_cell", stopped)
    with pytest.raises(SystemExit) as exit_:
        try:
            run_grid(tiny_bert_dir, tmp_path / "g", tasks="mr", methods="ce")
        except KeyboardInterrupt as e:  # else pytest takes it for its own Ctrl-C and stops
            pytest.fail(f"{stop!r} came out of the runner as {e!r}, not as exit status {status}")
    assert exit_.value.code == status, f"{stop!r}: the grid exited with {exit_.value.code}, not {status}"
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning")]
    assert err == [f"{says}; run the same command again to go on (finished cells are kept in {tmp_path / 'g'}/runs)"], \
        err


def test_the_probe_rule_is_a_regression_on_the_trained_encoders_training_vectors(tiny_bert_dir,
                                                                                  tmp_path,
                                                                                  monkeypatch):
    """ce+probe: the cell's head replaced by fit_logistic on the trained encoder's z of the cell's
    own training draw (the vectors it is fit on are recorded); its test scores are that
    regression's predictions, recomputed here from the kept checkpoint."""
    from minknn.tools import inference
    from minknn.tools.checkpoint import load_checkpoint, rebuild
    from minknn.tasks.data import load_split
    from minknn.tools.engine import predict
    from minknn.metrics import accuracy
    from minknn.probe import fit_logistic
    fitted = []
    monkeypatch.setattr(inference, "fit_logistic", lambda z, *a, **k: fitted.append(z) or
                        fit_logistic(z, *a, **k))
    out = tmp_path / "g"
    run_small(tiny_bert_dir, out, "--keep", "--lr", "3e-3", methods="ce,ce+probe")
    lines = {ln["method"]: ln for ln in lines_of(out)}
    cell = out / "runs" / lines["ce"]["cell"]
    model, _, tokenizer = rebuild(load_checkpoint(str(cell / "checkpoint.pt")))
    task, cpu = model.tasks["sst2"], torch.device("cpu")
    ctx = cells.Context(runner.get_args(["--tasks", "sst2", "--out", str(out), "--data_dir", DATA,
                                          "--seeds", "0"])[0], [])
    train_set = ctx.train_examples(grid.Cell("sst2", "6", 0, "ce", ()))
    test = load_split(task, "test", DATA)
    _, z_train = predict(model, tokenizer, task, train_set, 8, cpu)
    _, z_test = predict(model, tokenizer, task, test, 8, cpu)
    assert len(fitted) == 1, f"inference.py probe: {len(fitted)} regressions fit for one cell"
    torch.testing.assert_close(fitted[0], z_train, msg="inference.py probe: the regression is not fit "
                               "on the trained encoder's z (its pooling) of the cell's training draw")
    W, b = fit_logistic(z_train, torch.tensor([e.label for e in train_set]), 2)
    expected = accuracy((z_test @ W.T + b).argmax(1).numpy(), [e.label for e in test])
    assert lines["ce+probe"]["grid"][0]["test"]["acc"] == pytest.approx(expected), (
        "inference.py probe: the test accuracy is not a logistic regression's on the trained encoder's "
        "training vectors")
    from minknn.tools.inference import probe_probabilities  # the probabilities themselves, not one score
    got = probe_probabilities(task, train_set, z_train, {"test": z_test})
    torch.testing.assert_close(got["test"], torch.softmax((z_test @ W.T + b).double(), -1),
                               atol=1e-4, rtol=1e-3, msg="inference.py probe_probabilities: not the "
                               "regression fit on the trained encoder's training vectors")
