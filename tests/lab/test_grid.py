"""The grid's grammar (minknn/lab/grid.py): methods with their grids, sizes, seeds, and the cells."""
import pytest

from minknn import MinknnError
from minknn.lab import grid


def test_method_grammar():
    m = grid.parse_method("proxyanchor[lam=0.1,0.5]+proxy[alpha=0.25]")
    assert (m.loss, m.train_grid, m.rule, m.rule_grid) == \
        ("proxyanchor", {"lam": [0.1, 0.5]}, "proxy", {"alpha": [0.25]})
    assert m.label == "proxyanchor+proxy"
    assert grid.split_top("ce,knnbert+knn[k=4,16;phi=0.5],supcon", ",") == \
        ["ce", "knnbert+knn[k=4,16;phi=0.5]", "supcon"], "commas inside [...] belong to a grid"
    assert grid.parse_seeds("0-2,7") == [0, 1, 2, 7]
    assert grid.parse_sizes("full,20,8pc") == ["full", "20", "8pc"]
    for bad, where in (("ce+knnn", "unknown inference rule 'knnn'"), ("ce+knn[alpha=1]", "alpha"),
                       ("ce[lam]", "not name=value"), ("ce+knn[k=0]", "k must be a whole number"),
                       ("ce+knn[k=2.5]", "k must be"), ("ce+knn[phi=2]", r"phi must be a number in \[0, 1\]"),
                       ("proxyanchor+proxy[alpha=abc]", "alpha must be")):
        with pytest.raises(MinknnError, match=where):
            grid.parse_method(bad)


def test_cells_are_shared_by_the_methods_of_one_training():
    methods = [grid.parse_method(m) for m in ("ce", "ce+knn", "proxyanchor[lam=0.1,0.5]+proxy")]
    cells = grid.cells_of(["mr"], methods, ["20"], [0, 1])
    assert len(cells) == 2 * (1 + 2), "one ce cell per seed (read by ce and ce+knn), and one " \
                                      "proxyanchor cell per lam and seed"
    ce = grid.Cell("mr", "20", 0, "ce", ())
    assert [m.name for m in cells[ce]] == ["ce", "ce+knn"]
    assert list(cells)[0].seed == 0 and list(cells)[-1].seed == 1, "whole seeds first"


def test_search_adds_the_values_that_apply_and_a_methods_own_win():
    search = grid.parse_grid("lr=1e-5,3e-5;lam=0.1,0.5", "lr=1e-5,3e-5;lam=0.1,0.5", flag="--search")
    assert search == {"lr": [1e-5, 3e-5], "lam": [0.1, 0.5]}
    takes_lam = {"supcon", "proxyanchor"}  # train.py's answer, as flags.search_applies asks it

    def expanded(text):
        m = grid.parse_method(text)
        return grid.with_search(m, search, lambda flag: flag != "lam" or m.loss in takes_lam)
    assert expanded("ce").train_grid == {"lr": [1e-5, 3e-5]}, "grid.with_search: lam does not apply to ce"
    assert expanded("supcon").train_grid == {"lr": [1e-5, 3e-5], "lam": [0.1, 0.5]}
    assert expanded("proxyanchor[lam=0.9]+proxy").train_grid == {"lr": [1e-5, 3e-5], "lam": [0.9]}, \
        "grid.with_search: the method's own lam must win over --search's"
    cells = grid.cells_of(["mr"], [expanded(t) for t in ("ce", "ce+knn", "supcon")], ["20"], [0])
    per_loss = {loss: sum(c.loss == loss for c in cells) for loss in ("ce", "supcon")}
    assert per_loss == {"ce": 2, "supcon": 4}, f"grid.cells_of: ce and ce+knn share 2 trainings, supcon 4: {per_loss}"
    assert grid.search_text(search) == "lr=1e-05,3e-05;lam=0.1,0.5"
    with pytest.raises(MinknnError, match="--search lr: 'lr' is not name=value"):
        grid.parse_grid("lr", "lr", flag="--search")
