"""The grid's table (minknn/lab/report.py): the choice of hyper-parameters and the results-file
blocks."""
import json

import pytest

from minknn import MinknnError
from minknn.lab import report
from minknn.lab.stats import paired_t


def test_choose_follows_the_selection_split_not_the_test_split():
    def line(seed, scores):  # scores: alpha -> (select, test)
        return {"task": "mr", "size": "20", "seed": seed, "method": "pa+proxy", "label": "pa+proxy",
                "cell": f"c{seed}", "train_params": {},
                "grid": [{"params": {"alpha": a}, "select": {"acc": s}, "test": {"acc": t}}
                         for a, (s, t) in scores.items()]}
    cases = [  # (per-seed alpha -> (select, test), the alpha to choose, why)
        # 0.25: selection 0.9 and 0.4 (mean 0.65, best seed 0.9); 0.5: 0.7 and 0.7 (mean 0.7)
        ([{0.25: (0.9, 0.1), 0.5: (0.7, 0.9)}, {0.25: (0.4, 0.2), 0.5: (0.7, 0.8)}], 0.5,
         "the better mean selection score (0.7 against 0.65), not the best single seed"),
        ([{0.25: (0.9, 0.1), 0.5: (0.5, 0.9)}, {0.25: (0.7, 0.2), 0.5: (0.6, 0.8)}], 0.25,
         "the better mean selection score (0.8 against 0.55), whatever the test scores")]
    for seeds, alpha, why in cases:
        lines = [line(seed, scores) for seed, scores in enumerate(seeds)]
        c = report.choose(lines, "acc")["mr", "20", "pa+proxy"]
        assert c["params"] == ((), (("alpha", alpha),)), f"report.choose: alpha {alpha} has {why}"
        assert c["test"] == {s: {"acc": scores[alpha][1]} for s, scores in enumerate(seeds)}, \
            "report.choose: the chosen value's test scores are the ones reported"
    for ln in lines:  # a loss-like metric: the lowest selection score wins
        for e in ln["grid"]:
            e["select"]["hamming"] = e["select"]["acc"]
    assert report.choose(lines, "hamming")["mr", "20", "pa+proxy"]["params"] == \
        ((), (("alpha", 0.5),)), "report.choose: a lower Hamming loss is better"


def test_write_block_replaces_its_own_block_only(tmp_path):
    path = tmp_path / "R.md"
    path.write_text("intro\n<!-- bench.py epoch -->\nold epoch\n<!-- /bench.py epoch -->\nmiddle\n"
                    "<!-- bench.py knn -->\nold knn\n<!-- /bench.py knn -->\nend\n")
    report.write_block(str(path), "bench.py epoch", ["new line 1", "", "| a |"])
    assert path.read_text() == ("intro\n<!-- bench.py epoch -->\nnew line 1\n\n| a |\n<!-- /bench.py epoch -->\n"
                                "middle\n<!-- bench.py knn -->\nold knn\n<!-- /bench.py knn -->\nend\n"), \
        "write_block must replace the text between its own markers and leave every other line as it was"
    with pytest.raises(MinknnError, match="no block '<!-- bench.py index -->'"):
        report.write_block(str(path), "bench.py index", ["x"])


def result(task, method, seed, acc, size="20", metric="acc"):
    return {"task": task, "size": size, "seed": seed, "method": method, "label": method,
            "rule": "linear", "cell": f"{task}-{size}-{method}-{seed}", "train_params": {},
            "select": "sample", "test_split": "test", "n_test": 100, "n_select": 20,
            "grid": [{"params": {}, "select": {metric: acc}, "test": {metric: acc}}],
            "seconds": {"train": 1.0, "evaluate": 1.0}}


def row(text, method, size="20 examples"):
    block = text.split(f"| {size},")[1]
    return next(r for r in block.splitlines() if r.startswith(f"| {method} |"))


def test_the_table_pairs_seeds_and_marks_significance():
    base = [0.60, 0.62, 0.58, 0.61, 0.59]
    better = [0.66, 0.67, 0.63, 0.66, 0.65]  # d = 6, 5, 5, 5, 6 points: p = 1.2e-5
    lines = [result("mr", "ce", s, a) for s, a in enumerate(base)]
    lines += [result("mr", "supcon", s, a) for s, a in enumerate(better)]
    lines += [result("mr", "noisy", s, a) for s, a in enumerate([0.65, 0.61, 0.62, 0.63, 0.57])]
    text = report.table(lines)
    p = paired_t(better, base)
    assert f"(p {p:.3f}*)" in row(text, "supcon"), \
        f"report: supcon's p ({p:.4f} < 0.05) must be shown and starred: {row(text, 'supcon')}"
    assert "**65.40 ± 1.52**" in row(text, "supcon"), "the best mean of the column in bold"
    p = paired_t([0.65, 0.61, 0.62, 0.63, 0.57], base)
    assert f"(p {p:.3f})" in row(text, "noisy") and "*" not in row(text, "noisy"), \
        f"report: p = {p:.3f} is not < 0.05: no star"
    # seed 2 missing for supcon: pairs by seed (0, 1, 3, 4), not by position
    lines = [ln for ln in lines if not (ln["method"] == "supcon" and ln["seed"] == 2)]
    p = paired_t([0.66, 0.67, 0.66, 0.65], [0.60, 0.62, 0.61, 0.59])
    assert f"(p {p:.3f}*)" in row(report.table(lines), "supcon"), \
        "report: the p-value must pair the seeds both methods have, by seed"


def test_each_task_in_its_own_first_score_unless_told():
    lines = [result("mr", m, s, 0.6 + 0.01 * s) for m in ("ce", "supcon") for s in range(2)]
    lines += [result("cola", m, s, 0.3 + 0.01 * s, metric="mcc") for m in ("ce", "supcon")
              for s in range(2)]
    lines += [result("mr", "ce", s, 0.7, size="100") for s in range(2)]
    text = report.table(lines)
    assert "| 20 examples, each task's first score | mr (accuracy) | cola (MCC) |" in text, \
        "report: tasks with different first scores get one column each, named, and no mean"
    assert "| 100 examples, accuracy | mr |" in text
    assert "mr 20: 20 dev examples" in text and "mr 100: 20 dev examples" in text, \
        "report: the selection note names each task and size"
    with pytest.raises(MinknnError, match="--test signflip enumerates"):
        many = [result("mr", "ce", s, 0.5) for s in range(21)]
        report.check_test("signflip", many)


def test_no_p_and_no_star_where_the_t_test_is_undefined():
    two = [result("mr", "ce", s, a) for s, a in enumerate([0.60, 0.62])]
    two += [result("mr", "supcon", s, a) for s, a in enumerate([0.61, 0.63])]  # +1 point each
    text = report.table(two)
    assert row(text, "supcon").endswith("** (no p) |"), \
        f"report: 2 seeds give no t-test p and no star: {row(text, 'supcon')}"
    assert "No p for supcon (mr): fewer than 3 paired seeds." in text, \
        "report: the note under the table must say why supcon has no p"
    base, noisy = [0.60, 0.62, 0.55], [0.65, 0.61, 0.62]
    three = [result("mr", "ce", s, a) for s, a in enumerate(base)]
    three += [result("mr", "supcon", s, a + 0.01) for s, a in enumerate(base)]  # +1 point each
    three += [result("mr", "noisy", s, a) for s, a in enumerate(noisy)]
    text = report.table(three)
    assert row(text, "supcon").endswith("(no p) |"), \
        f"report: 3 equal differences (std 0) give no p: {row(text, 'supcon')}"
    assert "No p for supcon (mr): the differences are all equal" in text
    assert f"(p {paired_t(noisy, base):.3f})" in row(text, "noisy"), \
        "report: unequal differences on 3 seeds keep their p"
    assert "No p for noisy" not in text
    text = report.table(two, test="signflip")  # valid with 2 seeds, but never below 0.5
    assert row(text, "supcon").endswith("(p 0.500) |"), row(text, "supcon")
    assert "smallest p with 2 paired seeds is 0.5: no star is possible below 6 seeds" in text, \
        "report: a sign-flip table with too few seeds to reach 0.05 must say so"


def test_a_bad_write_file_stops_before_the_table_is_written(tmp_path):
    folder = tmp_path / "g"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(
        json.dumps(result("mr", m, s, 0.6)) + "\n" for m in ("ce", "supcon") for s in range(3)))
    for write, says in ((tmp_path / "missing.md", "missing.md: not found"),
                        (tmp_path, "cannot be read"),  # a folder
                        (tmp_path / "R.md", "no block '<!-- runner g -->'")):
        if write.name == "R.md":
            write.write_text("no markers here\n")
        with pytest.raises(MinknnError, match=says):
            report.write_report(str(folder), write=str(write))
        assert not (folder / "table.md").exists(), \
            f"report.write_report: --write {write.name} is refused before table.md is written"
    (tmp_path / "R.md").write_text("a\n<!-- runner g -->\nold\n<!-- /runner g -->\nb\n")
    report.write_report(str(folder), write=str(tmp_path / "R.md"))
    assert "| supcon |" in (tmp_path / "R.md").read_text() and (folder / "table.md").exists()


def searched(task, method, seed, params, select, test, search=None):
    """A result line of a --search grid: the training parameters of its cell, one entry."""
    line = result(task, method, seed, test)
    line["train_params"], line["cell"] = params, f"{task}-{method}-{params}-{seed}"
    line["grid"][0]["select"] = {"acc": select}
    if search:
        line["search"] = search
    return line


def test_the_budget_line_says_each_methods_trainings_and_why_they_differ():
    search = {"lr": [1e-5, 3e-5], "lam": [0.1, 0.5]}
    lines = []
    for seed in range(3):
        lines += [searched("mr", "ce", seed, {"lr": lr}, 0.6, 0.6, search) for lr in search["lr"]]
        lines += [searched("mr", "supcon", seed, {"lr": lr, "lam": lam}, 0.7, 0.7, search)
                  for lr in search["lr"] for lam in search["lam"]]
        lines += [searched("mr", "pa", seed, {"lr": lr, "lam": 0.9}, 0.7, 0.7, search) for lr in search["lr"]]
    text = report.table(lines)
    assert "Budget, trainings per task, size and seed (--search lr=1e-05,3e-05;lam=0.1,0.5): ce: 2 trainings " \
           "(lam does not apply), pa: 2 trainings (its own lam=0.9), supcon: 4 trainings." in text, text
    same = [ln for ln in lines if ln["method"] == "supcon"]
    assert "Budget: 4 trainings per task, size and seed for every method (--search lr=1e-05,3e-05;lam=0.1,0.5)." \
        in report.table(same), "report: an equal budget is one plain sentence"
    assert "Budget" not in report.table([result("mr", "ce", s, 0.6) for s in range(3)]), \
        "report: a grid with one training per method and no --search has no budget to state"


def test_choose_searched_values_on_selection_and_without_selection_scores():
    lines = []
    for seed in range(2):  # lr 1e-5: better on selection, worse on test
        lines += [searched("mr", "ce", seed, {"lr": 1e-5}, 0.8, 0.5),
                  searched("mr", "ce", seed, {"lr": 3e-5}, 0.6, 0.9)]
    c = report.choose(lines, "acc")["mr", "20", "ce"]
    assert c["params"] == ((("lr", 1e-5),), ()) and c["test"] == {0: {"acc": 0.5}, 1: {"acc": 0.5}}, \
        f"report.choose: the searched lr must be chosen on selection scores, not test: {c['params']}"
    assert "Chosen (20): ce on mr: lr=1e-05." in report.table(lines), "the chosen searched value is listed"
    fixed = [searched("mr", "ce", seed, {}, 0.0, 0.7) for seed in range(2)]  # --select none: no scores
    for ln in fixed:
        ln["select"] = "none"
        del ln["grid"][0]["select"]
    c = report.choose(fixed, "acc")["mr", "20", "ce"]
    assert c["params"] == ((), ()) and c["test"] == {0: {"acc": 0.7}, 1: {"acc": 0.7}}, \
        "report.choose: without selection scores the only candidate wins"
    assert "Selection (none): the last epoch and the given values; no dev labels choose anything" in \
        report.table(fixed)
    two = fixed + [dict(ln, train_params={"lr": 1e-5}) for ln in fixed]
    with pytest.raises(MinknnError, match="mr 20 ce: 2 candidates and no selection scores to choose one"):
        report.choose(two, "acc")


def test_held_out_tasks_are_a_table_of_their_own_with_their_own_mean():
    """--chosen_on sst5,cr: the development tasks (sst5, cr) and the held-out ones (trec, subj) in two tables,
    each mean over its own tasks only; a held-out task where the baseline did not run has no p. Without it, one
    table over every task."""
    acc = {"sst5": 0.30, "cr": 0.70, "trec": 0.50, "subj": 0.80}
    lines = [result(t, m, s, a + (0.05 + 0.02 * s if m == "anc" else 0.01 * s))
             for t, a in acc.items() for m in ("setfit", "anc") for s in range(3) if (t, m) != ("subj", "setfit")]
    text = report.table(lines, chosen_on=["cr", "sst5"])
    dev, held = text.split("Held out")
    assert "Development tasks (the methods and settings were chosen on cr, sst5):" in dev and \
        "| 20 examples, accuracy | sst5 | cr | mean |" in dev and "trec" not in dev.split("|---")[0], dev
    assert "| 20 examples, accuracy | trec | subj | mean |" in held, \
        f"the held-out table must have the tasks not chosen on (trec, subj) as its columns, and no other: {held}"
    held_row = row(held, "anc")
    trec, subj, mean = held_row.split("|")[2:5]
    assert "57.00 ± 2.00" in trec and "(p " in trec and "(no p)" in subj, \
        f"trec: anc 57.00 with its p against setfit; subj: setfit never ran there, so no p: {held_row}"
    assert "72.00" in mean, f"the held-out mean is over trec and subj only ((57 + 87) / 2 = 72.00): {held_row}"
    assert "57.00" in row(dev, "anc").split("|")[4], \
        f"the development mean is over sst5 and cr only ((37 + 77) / 2 = 57.00): {row(dev, 'anc')}"
    whole = report.table(lines)
    assert "Held out" not in whole and "| 20 examples, accuracy | sst5 | cr | trec | subj | mean |" in whole
