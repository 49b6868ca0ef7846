"""train.py and evaluate.py end to end, on the tiny fixture datasets and the tiny random BERT."""
import csv
import json
import os
import subprocess
import sys

import pytest
import torch

import evaluate
import train
from minknn.losses import LOSSES
from minknn.proxy import PROXY_LOSSES

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
    assert code == 2 and err == ("error: unknown --loss 'proxyanchr'; choose one of: ce, triplet, npairs, supcon, "
                                 "softtriple, proxynca, proxyanchor, contrastive, mnrl")
    code, err = run("train.py", "--task", "sst", "--model", str(tmp_path / "no-model"), "--data_dir", data_dir)
    assert code == 2 and err.startswith("error: --model") and "\n" not in err
    code, err = run("evaluate.py", "--checkpoint", str(tmp_path))
    assert code == 2 and err.startswith("error: --checkpoint") and "not found" in err


@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_trains_end_to_end(tiny_bert_dir, data_dir, tmp_path, loss):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "2", "--lr", "1e-3", "--loss", loss)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in records) and summary["loss"] == loss
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ckpt["args"]["loss"] == loss and ckpt["args"]["proxy_lr"] == 0.1
    if loss in PROXY_LOSSES:
        assert [k for k in ckpt["loss"]] == ["metric.centres" if loss == "softtriple" else "metric.proxies"]


def test_proxies_learn_at_their_own_rate(tiny_bert_dir, data_dir, tmp_path):
    def proxies(*flags):
        run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--loss", "proxyanchor", *flags)
        return torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["loss"]["metric.proxies"]
    frozen, trained = proxies("--proxy_lr", "0"), proxies()   # the same seed: the same random start
    assert not torch.equal(frozen, trained)
    assert torch.equal(frozen, proxies("--proxy_lr", "0", "--lr", "1e-3"))   # the encoder's lr does not move them


def test_proxy_inference_from_a_checkpoint(tiny_bert_dir, data_dir, tmp_path):
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "3", "--lr", "3e-3", "--loss", "proxyanchor")
    common = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--proxy"]
    plain = evaluate.main(common + ["--proxy_alpha", "0"])
    assert (plain["proxy_acc"], plain["proxy_macro_f1"]) == (plain["acc"], plain["macro_f1"])
    mixed = evaluate.main(common)
    assert mixed["acc"] == plain["acc"] and 0 <= mixed["proxy_acc"] <= 1
    rows = list(csv.reader(open(tmp_path / "run" / "predictions-dev-proxy.csv")))
    assert rows[0] == ["id", "prediction", "label"] and len(rows) == 16


def test_proxy_errors_are_one_line(tiny_bert_dir, data_dir, tmp_path):
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--max_train", "10")
    p = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--proxy"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip() == (
        "error: --proxy: this checkpoint was trained with --loss ce, which has no proxies; "
        "proxy inference needs one of: softtriple, proxynca, proxyanchor")
    for bad in (["--loss", "supcon", "--lam", "1.5"], ["--loss", "ce", "--lam", "0.5"]):
        with pytest.raises(SystemExit):
            train.get_args(bad)
    with pytest.raises(SystemExit):
        evaluate.get_args(["--checkpoint", "x", "--proxy_alpha", "-0.1"])


def test_lam_one_scores_epochs_by_the_nearest_proxy(tiny_bert_dir, data_dir, tmp_path):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "2", "--lr", "3e-3",
                        "--loss", "proxynca", "--lam", "1")
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--proxy", "--proxy_alpha", "1"])
    assert (summary["dev_acc"], summary["dev_macro_f1"]) == (result["proxy_acc"], result["proxy_macro_f1"])
    assert result["acc"] != result["proxy_acc"]  # the untrained head scores differently: the test can fail
