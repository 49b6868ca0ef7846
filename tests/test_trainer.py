"""minknn/tools/trainer.py: the parts of a run are built in one place. train.py trains them, and bench.py
times them: a run that bench.py builds from already loaded examples and steps with train.py's
train_step must take train.py's first step exactly, or bench.py times another run than the one
that trains. (That a run restored from last.pt goes on exactly is tests/test_runs.py.)"""
import argparse

import pytest
import torch

from minknn.lab import bench
import train
from minknn.tasks.data import load_split
from minknn.tasks.registry import get_task
from minknn.tools.step import batch

CASES = {"ce": ["--task", "sst"],
         "knnbert": ["--task", "sst", "--loss", "knnbert"],  # the memory fill, the key encoder
         "multitask pcgrad": ["--task", "multitask", "--tasks", "sst,mrpc,sts", "--pcgrad"],
         "multi-label mlcon": ["--task", "goemotions", "--loss", "mlcon"]}  # heads at the priors


@pytest.mark.parametrize("case", list(CASES))
def test_bench_builds_and_steps_train_py_first_step(case, tiny_bert_dir, data_dir, tmp_path,
                                                    monkeypatch):
    """The first step of `python train.py` and of bench.py's path (built() on examples it read
    itself, minknn/tools/step.py's batch() of bench.fixed_batches' first rows, bench.step()): the same
    losses and the same weights after it, to the bit (the same random draws in the same order:
    the init, the heads, the memory fill, dropout, the batches; the same optimiser and schedule)."""
    flags = CASES[case] + ["--batch_size", "8", "--max_len", "32", "--lr", "3e-3", "--epochs", "1"]
    first, real_step = [], train.train_step

    def recorded(trainer, batches):
        out = real_step(trainer, batches)
        if not first:  # the losses, then every weight after the step
            first.append(({n: loss.detach().clone() for n, loss in out[0].items()},
                          {n: p.detach().clone() for n, p in [*trainer.model.named_parameters(),
                                                              *trainer.losses.named_parameters()]}))
        return out
    monkeypatch.setattr(train, "train_step", recorded)
    train.main(flags + ["--model", tiny_bert_dir, "--data_dir", data_dir, "--device", "cpu",
                        "--out", str(tmp_path / "run")])
    monkeypatch.undo()
    (train_losses, train_weights), = first

    args = argparse.Namespace(model=tiny_bert_dir, data_dir=data_dir)
    names = flags[flags.index("--tasks" if "--tasks" in flags else "--task") + 1].split(",")
    examples = {n: load_split(get_task(n, data_dir), "train", data_dir) for n in names}
    trainer = bench.built(args, flags, examples, torch.device("cpu"))
    rows = bench.fixed_batches(examples, trainer.tasks, 8, 1)[0]
    bench_losses = bench.step(trainer, batch(trainer, rows))[0]
    for name, loss in train_losses.items():
        torch.testing.assert_close(bench_losses[name], loss, rtol=0, atol=0, msg=lambda m: (
            f"{case}: the {name} loss of bench.py's first step is not train.py's: {m}"))
    weights = dict([*trainer.model.named_parameters(), *trainer.losses.named_parameters()])
    assert weights.keys() == train_weights.keys(), f"{case}: bench.py's run has other parameters"
    for name, p in train_weights.items():
        torch.testing.assert_close(weights[name], p, rtol=0, atol=0, msg=lambda m: (
            f"{case}: the weight {name} after bench.py's first step is not train.py's (the "
            f"optimiser, schedule or gradients differ): {m}"))
