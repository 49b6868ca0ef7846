"""The grid's table (minknn/report.py): the choice of hyper-parameters and the results-file
blocks."""
import pytest

from minknn import MinknnError, report


def test_choose_follows_the_selection_split_not_the_test_split():
    def line(seed, scores):  # scores: alpha -> (select, test)
        return {"task": "mr", "size": "20", "seed": seed, "method": "pa+proxy", "label": "pa+proxy",
                "cell": f"c{seed}", "train_params": {},
                "grid": [{"params": {"alpha": a}, "select": {"acc": s}, "test": {"acc": t}}
                         for a, (s, t) in scores.items()]}
    lines = [line(0, {0.25: (0.9, 0.1), 0.5: (0.5, 0.9)}),
             line(1, {0.25: (0.7, 0.2), 0.5: (0.6, 0.8)})]
    c = report.choose(lines, "acc")["mr", "20", "pa+proxy"]
    assert c["params"] == ((), (("alpha", 0.25),)), \
        "report.choose: alpha 0.25 has the better mean selection score (0.8 against 0.55)"
    assert c["test"] == {0: {"acc": 0.1}, 1: {"acc": 0.2}}, "and its test scores are reported"
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
