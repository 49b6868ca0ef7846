"""bench.py's scaffolding: the alternating best-of-rounds timer and the synthetic keys (the block
it writes into RESULTS.md is report.write_block, tests/test_report.py). The timings themselves are
commands to run, not tests."""
import os
import re
import sys
import tomllib

import pytest
import torch

from minknn import MinknnError
from minknn.lab import bench
from minknn.tools.cli import run
from helpers import DATA


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


BAD_FLAGS = [  # argv, what the one line says
    (["model", "--lengths", "0"], "argument --lengths: '0': give whole numbers of at least 1"),
    (["model", "--lengths", "64,"], "argument --lengths: '64,': give whole numbers of at least 1"),
    (["model", "--batch_size", "0"], "--batch_size must be at least 1, got 0"),
    (["model", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["model", "--rounds", "-1"], "--rounds must be at least 1, got -1"),
    (["model", "--random", "12,100"], "argument --random: '12,100': give LAYERS,HIDDEN, HIDDEN a multiple of 64"),
    (["epoch", "--examples", "0"], "--examples must be at least 1, got 0"),
    (["epoch", "--max_len", "4"], "--max_len must be at least 8"),
    (["epoch", "--seed", "-1"], "--seed must be in [0, 2**32)"),
    (["knn", "--k", "0"], "--k must be at least 1, got 0"),
    (["index", "--queries", "0"], "--queries must be at least 1, got 0"),
    (["index", "--dim", "0"], "--dim must be at least 1, got 0"),
    (["index", "--sizes", "0"], "argument --sizes: '0'"),
    (["index", "--nprobe", "32,-1"], "argument --nprobe: '32,-1'"),
    (["index", "--ef_search", "many"], "argument --ef_search: 'many'"),
    (["index", "--sizes", "50"], "--sizes 50: a datastore of fewer keys than --k 64"),
    (["model", "--lengths", "64,100", "--model", None], "--lengths 100: longer than the model's 64 positions"),
    (["ddp", "--processes", "0"], "--processes must be at least 1, got 0"),
    (["ddp", "--examples", "0"], "--examples must be at least 1, got 0"),
    (["grid", "--jobs", "0"], "--jobs must be at least 1, got 0"),
    (["grid", "--seeds", "0-x"], "--seeds: '0-x' is not a seed or a range"),
    (["grid", "--sizes", "many"], "--sizes: 'many' is not full"),
]


@pytest.mark.parametrize("argv, says", BAD_FLAGS, ids=[" ".join(a[:3]) for a, _ in BAD_FLAGS])
def test_bad_flags_are_one_line_before_anything_runs(argv, says, tiny_bert_dir, monkeypatch, capsys):
    """Each subcommand's sizes and counts must be positive (--lengths 0 gave a traceback or an empty table): one
    line naming the flag, exit status 2, before a model is loaded or anything is timed."""
    def nothing_slow(*args, **kwargs):
        pytest.fail(f"bench.py {' '.join(argv)}: work started before the flags were checked")
    for name in ("bench_epoch", "bench_ddp", "bench_grid", "bench_knn", "bench_multitask", "bench_index"):
        monkeypatch.setattr(bench, name, nothing_slow)
    monkeypatch.setattr(bench.backbones, "from_pretrained", nothing_slow)
    argv = [tiny_bert_dir if a is None else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        run(lambda: bench.main(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), \
        f"bench.py {' '.join(argv)}: exit {exit_.value.code}, stderr {err} (one line, `error: ...`, was expected)"
    assert says in err[0], f"bench.py {' '.join(argv)}: the error does not name {says!r}: {err[0]}"


@pytest.mark.parametrize("kind", ["roberta", "distilbert", "mpnet"])
def test_model_runs_on_every_backbone(kind, request, monkeypatch, capsys):
    """`bench.py model --model FOLDER` on a RoBERTa, DistilBERT or MPNet folder: a row per length
    and step, each ratio a number (without transformers, as in CI: no reference column). RoBERTa's
    lengths stop at its 64 usable positions (66 rows, less padding_idx + 1), not at 66."""
    folder = request.getfixturevalue(f"tiny_{kind}_dir")
    monkeypatch.setattr(bench, "check_transformers", lambda: None)
    monkeypatch.setattr(bench, "peak_matmul_flops", lambda device: 1e11)
    run(lambda: bench.main(["model", "--model", folder, "--device", "cpu", "--lengths", "8,64",
                            "--batch_size", "2", "--steps", "1", "--rounds", "1"]))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| 8 |", "| 64 |"))]
    assert len(rows) == 4, f"bench.py model on {kind}: expected 4 rows (2 lengths x train, inference), got {rows}"
    if kind == "roberta":
        with pytest.raises(SystemExit) as e:
            run(lambda: bench.main(["model", "--model", folder, "--device", "cpu", "--lengths", "65"]))
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--lengths 65: longer than the model's 64 positions" in err, err


def test_model_on_ragged_batches_counts_the_real_tokens_only(tiny_bert_dir, monkeypatch, capsys):
    """`bench.py model --ragged`: lengths from T/4 to T, padded to T, as a batch of sentences is.
    MFU counts the real tokens' FLOPs only, so with the same clock a ragged batch's MFU is below
    the full batch's (about 5/8 of it: the mean length is 5T/8)."""
    monkeypatch.setattr(bench, "check_transformers", lambda: None)
    monkeypatch.setattr(bench, "peak_matmul_flops", lambda device: 1e11)
    monkeypatch.setattr(bench.Timer, "best_of_rounds", lambda self, steps, *a, **k: dict.fromkeys(steps, 0.01))
    mfu = {}
    for ragged in ([], ["--ragged"]):
        run(lambda: bench.main(["model", "--model", tiny_bert_dir, "--device", "cpu", "--lengths", "64",
                                "--batch_size", "8", "--steps", "1", "--rounds", "1", *ragged]))
        out = capsys.readouterr().out
        assert ("lengths from T/4 to T" in out) == bool(ragged), out
        row = next(line for line in out.splitlines() if line.startswith("| 64 | train |"))
        mfu[bool(ragged)] = float(row.split("|")[5])  # minknn MFU, after 2 examples/s columns
    ratio = mfu[True] / mfu[False]
    assert 0.4 < ratio < 0.9, f"ragged MFU / full MFU {ratio:.2f}: the FLOPs should count real tokens only"


def test_profile_times_train_pys_step_and_names_its_operators(tiny_bert_dir, capsys):
    """`bench.py profile` on the CPU: a row for shapes met first and for shapes seen, the operators'
    own CPU time, each a positive time, and the profiler's table of operators; the GPU's rows
    (kernels, launches, syncs) only on a GPU."""
    from helpers import DATA
    run(lambda: bench.main(["profile", "--model", tiny_bert_dir, "--device", "cpu", "--data_dir", DATA,
                            "--steps", "2", "--batch_size", "4", "--max_len", "16"]))
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines()
            if line.startswith("| ") and " ms |" in line}
    assert set(rows) == {"wall time, shapes met for the first time", "wall time, shapes seen before",
                         "PyTorch operators' own CPU time (profiled)"}, rows
    ms = {k: float(v.split()[0]) for k, v in rows.items()}
    assert all(v > 0 for v in ms.values()), ms
    assert "aten::" in out and "Self CPU" in out, "no table of operators printed"
    assert "kernel launches" not in out, "a GPU row on the CPU"


def test_model_of_random_weights_at_the_sizes_asked(tiny_bert_dir, monkeypatch, capsys):
    """`bench.py model --random 2,128`: a random BERT of 2 layers 128 wide (heads of 64) stands in
    for --model's weights, on both sides, and the line above the table says so."""
    monkeypatch.setattr(bench, "check_transformers", lambda: None)
    monkeypatch.setattr(bench, "peak_matmul_flops", lambda device: 1e11)
    run(lambda: bench.main(["model", "--model", tiny_bert_dir, "--random", "2,128", "--device", "cpu",
                            "--lengths", "8", "--batch_size", "2", "--steps", "1", "--rounds", "1"]))
    out = capsys.readouterr().out
    assert "bert, 2 layers 128 wide, random weights" in out, out
    assert len([line for line in out.splitlines() if line.startswith("| 8 |")]) == 2, out


def test_model_without_transformers_names_the_extra_that_installs_it(tiny_bert_dir, monkeypatch, capsys):
    """`bench.py model` where transformers cannot be imported (made so here: sys.modules' None entry fails the
    import) says, above its table, that there is no reference and the extra that installs one, as `epoch` does;
    the extra is pyproject.toml's, and holds transformers."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setattr(bench, "peak_matmul_flops", lambda device: 1e11)
    run(lambda: bench.main(["model", "--model", tiny_bert_dir, "--device", "cpu", "--lengths", "8",
                            "--batch_size", "2", "--steps", "1", "--rounds", "1"]))
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("`python -m"))
    extra = re.search(r"transformers not installed: no reference \(pip install -e '\.\[(\w+)\]'\)", line)
    assert extra, f"bench.py model without transformers does not say what to install: {line}"
    with open(os.path.join(os.path.dirname(bench.__file__), "..", "..", "..", "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert any(d.startswith("transformers") for d in extras.get(extra[1], [])), \
        f"bench.py model says pip install -e '.[{extra[1]}]'; pyproject.toml's extras are {extras}"

def test_predict_times_predict_against_evaluate_on_the_same_texts(tiny_bert_dir, capsys):
    """`bench.py predict`: both commands answer the same texts, the head alone and with kNN, each row a time,
    a throughput and their ratio (no time is asserted: the figures are measured, not tested)."""
    run(lambda: bench.main(["predict", "--model", tiny_bert_dir, "--device", "cpu", "--data_dir", DATA,
                            "--texts", "60", "--rounds", "1", "--max_len", "32", "--k", "4"]))
    out = capsys.readouterr().out
    assert "the same 60 sst sentences" in out, out
    rows = [line for line in out.splitlines() if line.startswith("| the head")]
    assert [r.split(" | ")[0] for r in rows] == ["| the head", "| the head and kNN (K 4)"], rows
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert cells[1].endswith("texts/s)") and cells[2].endswith("texts/s)") and \
            cells[3].endswith("x evaluate.py's throughput"), row
    with pytest.raises(MinknnError, match="--task sts: predict's texts here are a classification task's single"):
        bench.main(["predict", "--model", tiny_bert_dir, "--device", "cpu", "--data_dir", DATA, "--task", "sts"])


def test_onnx_times_onnxruntime_against_minknn_on_the_same_texts(tiny_bert_dir, capsys):
    """`bench.py onnx`: onnxruntime on the exported classifier.onnx and minknn's own prediction pass
    answer the same texts, and agree (the line says within what); one row, two throughputs and their
    ratio (no time is asserted)."""
    run(lambda: bench.main(["onnx", "--model", tiny_bert_dir, "--device", "cpu", "--data_dir", DATA,
                            "--texts", "40", "--rounds", "1", "--max_len", "32"]))
    out = capsys.readouterr().out
    said = next(line for line in out.splitlines() if line.startswith("`python -m minknn.lab.bench onnx`"))
    gap = float(said.rsplit("agree within ", 1)[1].split()[0])
    assert "the same 40 sst sentences" in said and gap < 1e-5, said
    row = next(line for line in out.splitlines() if line.startswith("| 40 texts"))
    cells = row.strip("| ").split(" | ")
    assert cells[1].endswith("texts/s)") and cells[2].endswith("texts/s)") and \
        cells[3].endswith("x minknn's throughput"), row
