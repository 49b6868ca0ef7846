import os
import re

import pytest
import torch

from minknn import MinknnError
from minknn.bert import BertModel
from minknn.checkpoint import atomic_save, load_checkpoint, rebuild, save_checkpoint
from minknn.losses import build_losses
from minknn.model import Model
from minknn.tasks import TASKS
from minknn.tokenizer import Tokenizer

ARGS = {"pooling": "max", "loss": "proxyanchor", "task": "multitask", "pair_mode": "siamese", "decoupled": False,
        "sts_loss": "l1"}


def make_checkpoint(tiny_bert_dir, path, seed):
    """A two-task model (sst, and sts as siamese pairs) whose head, proxies and weights are not
    the ones a fresh build starts from, so a rebuild that ignored any state would differ."""
    torch.manual_seed(seed)
    model = Model(BertModel.from_pretrained(tiny_bert_dir), [TASKS["sst"], TASKS["sts"]], "max", "siamese")
    torch.nn.init.normal_(model.heads["sst"].weight)
    losses = build_losses(model, ARGS)
    tok = Tokenizer.from_folder(tiny_bert_dir, max_len=16)
    save_checkpoint(path, model, losses, tok, ARGS, epoch=1, dev={"sst": {"acc": 0.5}})
    return model.eval(), losses, tok


def test_rebuild_from_checkpoint_alone(tiny_bert_dir, tmp_path):
    model, losses, tok = make_checkpoint(tiny_bert_dir, tmp_path / "checkpoint.pt", seed=0)
    ckpt = load_checkpoint(str(tmp_path))  # a run folder works as well as the file
    again, losses_again, tok2 = rebuild(ckpt)
    batch = tok(["the film is great", "dull"])
    assert tok2.vocab == tok.vocab and tok2.max_len == 16
    torch.testing.assert_close(again.eval()("sst", **batch).logits, model("sst", **batch).logits, rtol=0, atol=0,
                               msg="rebuilt sst head: logits differ from the saved model's")
    torch.testing.assert_close(again("sts", **batch).logits, model("sts", **batch).logits, rtol=0, atol=0,
                               msg="rebuilt siamese sts score differs")
    torch.testing.assert_close(losses_again["sst"].metric.proxies, losses["sst"].metric.proxies, rtol=0, atol=0,
                               msg="rebuilt proxies differ from the saved ones")
    assert losses_again["sts"].loss == "l1" and list(again.heads) == ["sst"]  # a siamese sts score has no head
    assert ckpt["tasks"]["sst"] == {"kind": "classify", "labels": TASKS["sst"].labels, "pair": False}
    assert ckpt["args"] == ARGS


def test_interrupted_write_keeps_the_previous_checkpoint(tiny_bert_dir, tmp_path):
    path = tmp_path / "checkpoint.pt"
    make_checkpoint(tiny_bert_dir, path, seed=0)
    before = load_checkpoint(str(path))["model"]["heads.sst.weight"].clone()

    def dies_halfway(obj, f):
        f.write(b"PK\x03\x04 half a zip file")
        raise KeyboardInterrupt  # as if killed mid-save

    with pytest.raises(KeyboardInterrupt):
        atomic_save({"format": "x"}, str(path), writer=dies_halfway)
    assert torch.equal(load_checkpoint(str(path))["model"]["heads.sst.weight"], before)
    assert os.listdir(tmp_path) == ["checkpoint.pt"]  # and no temporary file left


def test_missing_or_foreign_checkpoint(tmp_path):
    with pytest.raises(MinknnError, match="not found"):
        load_checkpoint(str(tmp_path / "nope.pt"))
    (tmp_path / "junk.pt").write_text("hello")
    with pytest.raises(MinknnError, match="not a minknn checkpoint"):
        load_checkpoint(str(tmp_path / "junk.pt"))
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(MinknnError, match="no 'minknn-checkpoint-2' format tag"):
        load_checkpoint(str(tmp_path / "other.pt"))
    torch.save({"format": "minknn-checkpoint-1"}, tmp_path / "old.pt")
    with pytest.raises(MinknnError, match="written by an earlier minknn .* train it again"):
        load_checkpoint(str(tmp_path / "old.pt"))


def test_a_checkpoint_of_a_task_that_changed_is_refused(tiny_bert_dir, tmp_path):
    make_checkpoint(tiny_bert_dir, tmp_path / "checkpoint.pt", seed=0)
    ckpt = load_checkpoint(str(tmp_path))
    ckpt["tasks"]["sst"]["labels"] = ["bad", "good"]
    with pytest.raises(MinknnError, match="trained on sst as a classify task with labels \\['bad', 'good'\\]"):
        rebuild(ckpt)


def test_rebuild_keeps_the_tokenizer_options(tiny_bert_dir, tmp_path):
    model, losses, _ = make_checkpoint(tiny_bert_dir, tmp_path / "checkpoint.pt", seed=0)
    options = {"lowercase": False, "strip_accents": True, "chinese_chars": False}
    save_checkpoint(tmp_path / "other.pt", model, losses, Tokenizer(Tokenizer.from_folder(tiny_bert_dir, 16).vocab,
                    max_len=16, **options), ARGS, epoch=1, dev={})
    assert rebuild(load_checkpoint(str(tmp_path / "other.pt")))[2].options == options, \
        "save_checkpoint did not store the tokenizer's options, or rebuild did not use them"
    ckpt = load_checkpoint(str(tmp_path))
    ckpt.pop("tokenizer", None)  # a checkpoint that stored only `lowercase`: the other options' defaults
    assert rebuild(ckpt)[2].options == {"lowercase": True, "strip_accents": None, "chinese_chars": True}
    ckpt["lowercase"] = False
    assert rebuild(ckpt)[2].options == {"lowercase": False, "strip_accents": None, "chinese_chars": True}
    ckpt["tokenizer"] = {"lowercase": True, "strip_accents": False, "chinese_chars": False}
    assert rebuild(ckpt)[2].options == ckpt["tokenizer"]


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.pop("vocab"), r"checkpoint.pt: has no vocab; it is not a whole minknn checkpoint"),
    (lambda c: c["args"].pop("pooling"), r"checkpoint.pt: has no args\['pooling'\]"),
    (lambda c: c["model"].pop("heads.sst.weight"),
     r"checkpoint.pt: model: does not fit the model built from its bert_config, tasks and args: "
     r"missing \['heads.sst.weight'\]$"),
    (lambda c: c["loss"].update(extra=torch.zeros(1)), r"checkpoint.pt: loss: does not fit .*: unexpected \['extra'\]$"),
    (lambda c: c["model"].update({"bert.pooler.dense.bias": torch.zeros(3)}),
     r"checkpoint.pt: model: 'bert.pooler.dense.bias' has shape \(3,\), but the model built from its "
     r"bert_config, tasks and args has \(32,\)"),
    (lambda c: c["model"]["heads.sst.bias"].fill_(float("inf")), "checkpoint.pt: model: heads.sst.bias holds 5 non-finite"),
    (lambda c: c["bert_config"].update(is_decoder=True), "checkpoint.pt: bert_config: is_decoder true is not implemented"),
], ids=["entry", "args", "missing", "unexpected", "shape", "inf", "config"])
def test_a_broken_checkpoint_is_one_line(tiny_bert_dir, tmp_path, edit, says):
    make_checkpoint(tiny_bert_dir, tmp_path / "checkpoint.pt", seed=0)
    ckpt = load_checkpoint(str(tmp_path))
    edit(ckpt)
    with pytest.raises(MinknnError, match=f"^--checkpoint {re.escape(str(tmp_path))}/{says}"):
        rebuild(ckpt)
