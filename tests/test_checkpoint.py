import os

import pytest
import torch

from minknn import MinknnError
from minknn.checkpoint import atomic_save, load_checkpoint, rebuild, save_checkpoint
from minknn.data import TASKS
from minknn.losses import Objective
from minknn.model import Classifier
from minknn.tokenizer import Tokenizer

ARGS = {"pooling": "max", "loss": "ce", "task": "sst"}


def make_checkpoint(tiny_bert_dir, path, seed):
    from minknn.bert import BertModel
    torch.manual_seed(seed)
    model = Classifier(BertModel.from_pretrained(tiny_bert_dir), 5, "max")
    torch.nn.init.normal_(model.head.weight)
    tok = Tokenizer.from_folder(tiny_bert_dir, max_len=16)
    save_checkpoint(path, model, Objective("ce", 5, 32), tok, TASKS["sst"], ARGS, epoch=1, dev={"acc": 0.5})
    return model.eval(), tok


def test_rebuild_from_checkpoint_alone(tiny_bert_dir, tmp_path):
    model, tok = make_checkpoint(tiny_bert_dir, tmp_path / "checkpoint.pt", seed=0)
    ckpt = load_checkpoint(str(tmp_path))  # a run folder works as well as the file
    again, _, tok2 = rebuild(ckpt)
    batch = tok(["the film is great", "dull"])
    assert tok2.vocab == tok.vocab and tok2.max_len == 16
    assert torch.equal(again.eval()(**batch).logits, model(**batch).logits)
    assert ckpt["labels"] == TASKS["sst"].labels and ckpt["args"] == ARGS


def test_interrupted_write_keeps_the_previous_checkpoint(tiny_bert_dir, tmp_path):
    path = tmp_path / "checkpoint.pt"
    make_checkpoint(tiny_bert_dir, path, seed=0)
    before = load_checkpoint(str(path))["model"]["head.weight"].clone()

    def dies_halfway(obj, f):
        f.write(b"PK\x03\x04 half a zip file")
        raise KeyboardInterrupt  # as if killed mid-save

    with pytest.raises(KeyboardInterrupt):
        atomic_save({"format": "x"}, str(path), writer=dies_halfway)
    assert torch.equal(load_checkpoint(str(path))["model"]["head.weight"], before)
    assert os.listdir(tmp_path) == ["checkpoint.pt"]  # and no temporary file left


def test_missing_or_foreign_checkpoint(tmp_path):
    with pytest.raises(MinknnError, match="not found"):
        load_checkpoint(str(tmp_path / "nope.pt"))
    (tmp_path / "junk.pt").write_text("hello")
    with pytest.raises(MinknnError, match="not a minknn checkpoint"):
        load_checkpoint(str(tmp_path / "junk.pt"))
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(MinknnError, match="no 'minknn-checkpoint-1' format tag"):
        load_checkpoint(str(tmp_path / "other.pt"))
