"""The loss registry's promise: a new loss is one file in minknn/losses/ and its registry entry,
and nothing else is edited. A copy of the repository gets a toy loss with needs of its own (a
MoCo memory, proxies that proxy inference reads, a flag of its own), and train.py then
evaluate.py run it end to end from the command line, in the copy. A loss that still had to be
named in train.py, options.py, checks.py, trainer.py or evaluate.py would fail here."""
import json
import os
import shutil
import subprocess
import sys

from helpers import DATA
from minknn.assignment.edition import repository_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOY = '''"""A toy loss for tests/test_new_loss.py: each query's cross-entropy against the class proxies,
plus a hinge pushing it away from the memory's keys of other classes.

    L = CE(10 cos(z, P), y) + mean over keys k of another class of max(0, q.k - margin)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ToyLoss(nn.Module):
    lam = 0.3
    uses_memory = True
    flags = {"toy_margin": {"type": float, "default": 0.5, "help": "the hinge's margin"}}

    def __init__(self, num_classes, dim, toy_margin=0.5):
        super().__init__()
        self.margin = toy_margin
        self.proxies = nn.Parameter(torch.randn(num_classes, dim))

    def class_logits(self, z):
        return 10 * F.normalize(z, dim=-1) @ F.normalize(self.proxies, dim=-1).T

    def forward(self, z, labels, batch_keys, memory_keys, memory_labels, rows, memory_rows):
        q = F.normalize(z, dim=-1)
        other = (memory_labels[None, :] != labels[:, None]).float()
        push = (q @ memory_keys.T - self.margin).clamp(min=0) * other
        return F.cross_entropy(self.class_logits(z), labels) + push.sum() / other.sum().clamp(min=1)
'''


def copy_with_toy_loss(dest):
    """The repository's own files copied to dest, plus losses/toy.py and its registry entry."""
    for f in repository_files(ROOT):
        os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))
    with open(os.path.join(dest, "minknn", "losses", "toy.py"), "w") as f:
        f.write(TOY)
    registry = os.path.join(dest, "minknn", "losses", "__init__.py")
    text = open(registry).read()
    entry = '    "setfit": SetFitLoss,\n'
    assert text.count(entry) == 1 and "from minknn.losses.triplet import TripletLoss\n" in text, \
        "the registry's METRIC_LOSSES no longer ends with setfit: update this test's entry"
    text = text.replace(entry, entry + '    "toy": ToyLoss,\n')
    text = text.replace("from minknn.losses.triplet import TripletLoss\n",
                        "from minknn.losses.toy import ToyLoss\n"
                        "from minknn.losses.triplet import TripletLoss\n")
    with open(registry, "w") as f:
        f.write(text)


def edited(copy):
    """The files of the copy that differ from this repository's, or are new."""
    changed = []
    for folder, _, names in os.walk(copy):
        for name in names:
            path = os.path.relpath(os.path.join(folder, name), copy)
            if "__pycache__" in path:
                continue
            mine = os.path.join(ROOT, path)
            if not os.path.exists(mine) or open(mine, "rb").read() != \
                    open(os.path.join(copy, path), "rb").read():
                changed.append(path)
    return sorted(changed)


def script(copy, *argv):
    p = subprocess.run([sys.executable, *argv], cwd=copy, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": copy, "OMP_NUM_THREADS": "1"})
    return p.returncode, p.stdout, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""


def test_a_new_loss_with_needs_trains_and_evaluates_with_no_other_file_edited(tiny_bert_dir,
                                                                              tmp_path):
    copy = str(tmp_path / "repo")
    copy_with_toy_loss(copy)
    assert edited(copy) == ["minknn/losses/__init__.py", "minknn/losses/toy.py"]
    run = str(tmp_path / "run")
    small = ["--model", tiny_bert_dir, "--data_dir", DATA, "--device", "cpu"]
    code, _, err = script(copy, "train.py", "--task", "sst", "--loss", "ce", "--toy_margin", "0.2",
                          *small)
    assert (code, err) == (2, "error: --toy_margin is a flag of --loss toy, not of --loss ce"), \
        "the toy loss's own flag must be refused with another loss, as knnbert's --m_most is"
    code, out, err = script(copy, "train.py", "--task", "sst", "--loss", "toy", "--toy_margin",
                            "0.2", "--epochs", "2", "--batch_size", "8", "--max_len", "32",
                            "--out", run, *small)
    assert code == 0, f"train.py --loss toy: exit {code}: {err}"
    assert "memory: a queue of 40 keys" in out, f"a loss that uses a memory gets one:\n{out}"
    args = json.load(open(os.path.join(run, "run.json")))["args"]
    assert (args["toy_margin"], args["memory"], args["lam"]) == (0.2, "queue", None), args
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["loss"] == "toy" and summary["lam"] == {"sst": 0.3}, summary
    code, out, err = script(copy, "evaluate.py", "--checkpoint", run, "--proxy", "--knn", "--k",
                            "4", "--data_dir", DATA, "--device", "cpu")
    assert code == 0, f"evaluate.py --proxy --knn on the toy loss's run: exit {code}: {err}"
    metrics = json.load(open(os.path.join(run, "predictions-dev-proxy-knn-k4-metrics.json")))["sst"]
    assert {"acc", "proxy_acc", "knn_acc", "mix_acc"} <= set(metrics), sorted(metrics)
    code, out, _ = script(copy, "train.py", "--help")
    assert "--toy_margin" in out and "toy: the hinge's margin (default: 0.5)" in " ".join(
        out.split()), "train.py --help lists the new loss's flag, with its default"
    assert "memory (knnbert, moco, toy)" in out, "the memory's flags name the new loss too"
