"""train.py and evaluate.py end to end, on the tiny fixture datasets and the tiny random BERT."""
import csv
import json
import os
import subprocess
import sys

import torch

import evaluate
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_train(tiny_bert_dir, data_dir, out, *extra):
    return train.main(["--task", "sst", "--model", tiny_bert_dir, "--data_dir", data_dir, "--out", str(out),
                       "--batch_size", "8", "--max_len", "32", "--device", "cpu", *extra])


def test_train_then_evaluate(tiny_bert_dir, data_dir, tmp_path):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "8", "--lr", "3e-3")
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["epoch"] for r in records] == list(range(1, 9))
    assert records[-1]["train_loss"] < 0.75 * records[0]["train_loss"]  # it learns (chance is ln 5 = 1.61)
    assert summary["dev_acc"] == max(r["acc"] for r in records) > 0.5
    assert json.load(open(tmp_path / "run" / "summary.json")) == summary

    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--device", "cpu"])
    assert result["acc"] == summary["dev_acc"] and result["macro_f1"] == summary["dev_macro_f1"]
    rows = list(csv.reader(open(result["predictions"])))
    assert rows[0] == ["id", "prediction", "label"] and len(rows) == 16

    test = evaluate.main(["--checkpoint", str(tmp_path / "run" / "checkpoint.pt"), "--split", "test", "--data_dir", data_dir])
    assert "acc" not in test and len(list(csv.reader(open(test["predictions"])))) == 8


def test_few_shot_pretrain_run_leaves_bert_untouched(tiny_bert_dir, data_dir, tmp_path):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--option", "pretrain",
                        "--max_train", "10", "--pooling", "cls", "--seed", "3")
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    from minknn.bert import BertModel
    original = BertModel.from_pretrained(tiny_bert_dir).state_dict()
    for k, v in original.items():
        assert torch.equal(ckpt["model"]["bert." + k], v), k
    assert ckpt["args"]["max_train"] == 10 and ckpt["args"]["lr"] == 1e-3 and summary["seed"] == 3


def test_bad_flags_give_one_line_errors(tiny_bert_dir, data_dir, tmp_path):
    def run(script, *args):
        p = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stderr.strip()

    code, err = run("train.py", "--loss", "proxyanchr", "--model", tiny_bert_dir, "--data_dir", data_dir)
    assert code == 2 and err == "error: unknown --loss 'proxyanchr'; choose one of: ce"
    code, err = run("train.py", "--task", "sst", "--model", str(tmp_path / "no-model"), "--data_dir", data_dir)
    assert code == 2 and err.startswith("error: --model") and "\n" not in err
    code, err = run("evaluate.py", "--checkpoint", str(tmp_path))
    assert code == 2 and err.startswith("error: --checkpoint") and "not found" in err
