"""bench.py's scaffolding: the alternating best-of-rounds timer and the synthetic keys (the block
it writes into RESULTS.md is report.write_block, tests/test_report.py). The timings themselves are
commands to run, not tests."""
import torch

import bench


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
