"""bench.py's scaffolding: the block it writes into RESULTS.md, and the alternating best-of-rounds timer.
(The timings themselves are commands to run, not tests.)"""
import pytest
import torch

import bench
from minknn import MinknnError


def test_write_block_replaces_its_own_block_only(tmp_path):
    path = tmp_path / "R.md"
    path.write_text("intro\n<!-- bench.py epoch -->\nold epoch\n<!-- /bench.py epoch -->\nmiddle\n"
                    "<!-- bench.py knn -->\nold knn\n<!-- /bench.py knn -->\nend\n")
    bench.write_block(str(path), "epoch", ["new line 1", "", "| a |"])
    assert path.read_text() == ("intro\n<!-- bench.py epoch -->\nnew line 1\n\n| a |\n<!-- /bench.py epoch -->\n"
                                "middle\n<!-- bench.py knn -->\nold knn\n<!-- /bench.py knn -->\nend\n"), \
        "write_block must replace the text between its own markers and leave every other line as it was"
    with pytest.raises(MinknnError, match="no block '<!-- bench.py index -->'"):
        bench.write_block(str(path), "index", ["x"])


def test_best_of_rounds_alternates_and_keeps_each_ones_best():
    """Contestants take turns, round after round (a slow moment hits a round, not a contestant), and each
    keeps its fastest round."""
    order, times = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}

    def contestant(name):
        return bench.times_itself(lambda: order.append(name) or next(times[name]))
    best = bench.Timer(torch.device("cpu"), 3).best_of_rounds({"a": contestant("a"), "b": contestant("b")})
    assert order == ["a", "b"] * 3, f"the rounds ran in the order {order}, not alternating"
    assert best == {"a": 1.0, "b": 4.0}, f"each contestant's best round is its minimum, got {best}"


def test_synthetic_keys_are_reproducible_clusters():
    keys, labels = bench.clustered_keys(400, 16, seed=1)
    again, _ = bench.clustered_keys(400, 16, seed=1)
    torch.testing.assert_close(keys, again, msg=lambda m: f"clustered_keys with the same seed differ: {m}")
    assert keys.shape == (400, 16) and set(labels.tolist()) <= set(range(5))
