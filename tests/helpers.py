"""The tests' shared helpers (tests/conftest.py holds the pytest fixtures, which use these): the
fixture datasets' folder, the tiny random BERT written in the Hugging Face layout, and a dev score
that falls each epoch. tests/hf_folders.py writes the tiny RoBERTa and DistilBERT folders.

The tiny BERT (2 layers, 32 wide) is written with the same file formats as a real one
(config.json, model.safetensors, vocab.txt), so the whole loading path is exercised in
milliseconds. Only the parity tests in test_bert.py and test_tokenizer.py load the real default model.

    from helpers import DATA, TINY, tiny_vocab, write_tiny_bert, dev_falling, run_grid, lines_of
    from helpers import required     # a package of the test extra, or one line saying to install it
"""
import importlib
import json
import os
import re

import torch

from minknn.bert import BertConfig, BertModel
from minknn.lab import report, runner
from minknn.tools.weights import save_safetensors

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
DATA = os.path.join(FIXTURES, "data")

TINY = dict(vocab_size=0, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", model_type="bert")


def required(name):
    """The module `name` of the test extra (transformers, sentence-transformers: libraries minknn's
    own code never imports, which its tests hold it against), imported; where it is missing, the
    test file fails to load with one line saying how to install it (not a skip: CI installs it)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(f"{name} is not installed; the tests need the test extra: "
                          f"pip install -e '.[test]'") from None


def tiny_vocab():
    """Special tokens, every word of the fixture datasets, and letters (so any word tokenises)."""
    words = set()
    for root, _, files in os.walk(DATA):
        if os.path.relpath(root, DATA) not in ("minbert", os.path.join("glue", "MRPC")):
            continue  # the other fixtures' words tokenise into the letters below
        for name in files:
            with open(os.path.join(root, name), encoding="utf-8-sig") as f:
                lines = f.read().splitlines()
            header = lines[0].split("\t")
            columns = [header.index(c) for c in ("sentence", "sentence1", "sentence2", "#1 String", "#2 String") if c in header]
            for line in lines[1:]:
                for column in columns:
                    words.update(re.findall(r"\w+", line.split("\t")[column].lower()))
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    return (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words - set(letters)) + list(letters)
            + ["##" + c for c in letters] + list(".,!?'\"-"))


def write_tiny_bert(folder, seed=0):
    os.makedirs(folder, exist_ok=True)
    vocab = tiny_vocab()
    config = dict(TINY, vocab_size=len(vocab))
    torch.manual_seed(seed)
    model = BertModel(BertConfig.from_dict(config))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    save_safetensors(model.state_dict(), os.path.join(folder, "model.safetensors"))
    return model


def dev_falling(monkeypatch):
    """Makes every epoch's overall dev score lower than the one before, so that epoch 1 is the best (the epoch
    scored: one more than the run's metrics.jsonl holds, so a resumed run scores as the run left alone)."""
    import train
    real = train.dev_scores

    def falling(*args, **kwargs):
        path = os.path.join(args[5].out, "metrics.jsonl")  # args[5]: the run's arguments
        epoch = 1 + (len(open(path).readlines()) if os.path.exists(path) else 0)
        return {**real(*args, **kwargs), "overall": 1.0 - 0.1 * epoch}
    monkeypatch.setattr(train, "dev_scores", falling)


# the runner's grids (tests/lab/test_runner.py; test_backbones.py runs one on RoBERTa)
METHODS = "ce,proxyanchor+proxy[alpha=0,0.5,1],ce+knn[k=1,2,4;phi=0,0.5,1]"


def run_grid(tiny_bert_dir, out, *extra, data_dir=DATA, tasks="mr,sst2", methods=METHODS):
    return runner.main(["--tasks", tasks, "--methods", methods, "--sizes", "6", "--seeds", "0-1",
                        "--out", str(out), "--model", tiny_bert_dir, "--data_dir", data_dir,
                        "--epochs", "2", "--lr", "3e-3", "--batch_size", "4", "--max_len", "32",
                        "--device", "cpu", *extra])


def lines_of(out):
    return report.read_results(str(out))
