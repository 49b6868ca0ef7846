import hashlib
import io
import os
import random
import re
import shutil
import signal

import pytest
import torch

from minknn import MinknnError, Terminated, backbones, sigterm_raises
from minknn.bert import BertModel
from minknn.datastore import fingerprint
from minknn.losses import build_losses
from minknn.model import Model
from minknn.tasks.registry import TASKS
from minknn.tokenizer import Tokenizer
from minknn.tools.checkpoint import base_model, load_checkpoint, rebuild, save_checkpoint
from minknn.tools.files import CHECKSUM, atomic_save, content_sha256, read_json
from minknn.tools.weights import load_safetensors, save_safetensors

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


@pytest.mark.parametrize("kind", ["roberta", "distilbert"])
def test_a_checkpoint_rebuilds_its_architecture_and_tokenizer(kind, request, tmp_path):
    """bert_config's model_type rebuilds a RobertaModel or DistilBertModel (not a BERT with their
    weights' shapes), and a RoBERTa checkpoint its byte-level BPE from the merges saved beside the
    vocabulary; one saved without them is refused in one line."""
    folder = request.getfixturevalue(f"tiny_{kind}_dir")
    torch.manual_seed(0)
    model = Model(backbones.from_pretrained(folder), [TASKS["sst"]], ARGS["pooling"]).eval()
    tok = Tokenizer.from_folder(folder, max_len=16)
    save_checkpoint(tmp_path / "checkpoint.pt", model, build_losses(model, ARGS), tok, ARGS, epoch=1, dev={})
    again, _, tok2 = rebuild(load_checkpoint(str(tmp_path)))
    assert type(again.bert) is type(model.bert) and type(tok2) is type(tok), (
        f"{kind}: rebuilt a {type(again.bert).__name__} with a {type(tok2).__name__}, "
        f"saved a {type(model.bert).__name__} with a {type(tok).__name__}")
    texts = ["the film is great", "ça, c'est très bien 😀"]
    assert tok2(texts)["input_ids"].tolist() == tok(texts)["input_ids"].tolist(), \
        f"{kind}: the rebuilt tokenizer's ids differ from the saved one's"
    batch = tok(texts)
    torch.testing.assert_close(again.eval()("sst", **batch).logits, model("sst", **batch).logits, rtol=0, atol=0,
                               msg=f"{kind}: the rebuilt model's logits differ from the saved model's")
    if kind == "roberta":
        ckpt = load_checkpoint(str(tmp_path))
        del ckpt["merges"]
        with pytest.raises(MinknnError, match="has no merges"):
            rebuild(ckpt)


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


class SignalsAt:
    """A file that sends this process `signum` (Ctrl-C's SIGINT, a cluster's SIGTERM) as its byte `at` is written,
    or raises KeyboardInterrupt there itself with raises=True (a stop no handler can hold back)."""

    def __init__(self, f, at, signum, raises=False):
        self.f, self.at, self.signum, self.raises, self.written = f, at, signum, raises, 0

    def write(self, data):
        if self.written <= self.at < self.written + len(data):
            if self.raises:
                raise KeyboardInterrupt
            os.kill(os.getpid(), self.signum)
        self.written += len(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()


OLD, NEW = {"format": "old", "w": torch.zeros(3000)}, {"format": "new", "w": torch.arange(3000.0)}
NEW_SIZE = len((lambda b: torch.save(NEW, b) or b.getvalue())(io.BytesIO()))


@pytest.mark.parametrize("at", [0, 1, 100, NEW_SIZE // 2, NEW_SIZE - 1], ids=["byte-0", "byte-1", "byte-100",
                                                                             "middle", "last-byte"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_save_waits_until_the_file_is_whole(tmp_path, signum, at):
    """Ctrl-C or SIGTERM at any byte of a torch.save: the save finishes, then the signal arrives as its exception
    (KeyboardInterrupt, or Terminated where SIGTERM raises it), and the handlers are the ones there before. Were
    it raised inside torch.save, PyTorch would turn it into a RuntimeError ('unexpected pos') and leave the save
    half done."""
    path = str(tmp_path / "checkpoint.pt")
    torch.save(OLD, path)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with sigterm_raises(), pytest.raises(Terminated if signum == signal.SIGTERM else KeyboardInterrupt):
        atomic_save(NEW, path, lambda obj, f: torch.save(obj, SignalsAt(f, at, signum)))
        pytest.fail(f"a {signum.name} sent at byte {at} of the save never arrived (atomic_save's signals_held "
                    f"must deliver it once the file is whole)")
    saved = torch.load(path, weights_only=True)
    assert saved["format"] == "new", f"{signum.name} at byte {at}: the save was dropped, the old file is still " \
                                     f"there (atomic_save must hold the signal until the file is whole: signals_held)"
    torch.testing.assert_close(saved["w"], NEW["w"], rtol=0, atol=0,
                               msg=lambda m: f"{signum.name} at byte {at}: the saved tensor is not whole: {m}")
    assert os.listdir(tmp_path) == ["checkpoint.pt"], f"a temporary file was left: {os.listdir(tmp_path)}"
    after = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert after == before, f"the signal handlers were {before} before the save and are {after} after it"


@pytest.mark.parametrize("at", [0, 100, NEW_SIZE // 2, NEW_SIZE - 1], ids=["byte-0", "byte-100", "middle",
                                                                           "last-byte"])
def test_a_save_stopped_at_any_byte_keeps_the_old_file(tmp_path, at):
    """A KeyboardInterrupt raised inside torch.save's writer itself, at any byte: the old file as it was, no
    temporary file, and the KeyboardInterrupt itself (not PyTorch's RuntimeError wrapped around it)."""
    path = str(tmp_path / "checkpoint.pt")
    torch.save(OLD, path)
    with pytest.raises(KeyboardInterrupt):
        atomic_save(NEW, path, lambda obj, f: torch.save(obj, SignalsAt(f, at, None, raises=True)))
    saved = torch.load(path, weights_only=True)
    assert saved["format"] == "old", f"stopped at byte {at}: the old file was replaced"
    torch.testing.assert_close(saved["w"], OLD["w"], rtol=0, atol=0,
                               msg=lambda m: f"stopped at byte {at}: the old file changed: {m}")
    assert os.listdir(tmp_path) == ["checkpoint.pt"], f"a temporary file was left: {os.listdir(tmp_path)}"


def flip_exponents(t, n=256):
    """float32 t with the top exponent bit of its first n values flipped, as bit rot would: 0.02 becomes 7e36."""
    bits = t.detach().clone().contiguous().view(torch.int32)
    bits.view(-1)[:n] ^= 1 << 30
    return bits.view(torch.float32)


def test_the_checksum_survives_a_round_trip_and_sees_every_part():
    """content_sha256 of what torch.save writes equals that of what torch.load gives back (or every resume would be
    refused), and changes with any one value, dtype, shape, key, order or container the saved dict holds."""
    obj = {"format": "x", "model": {"w": torch.randn(40, 40), "b": torch.randn(3).bfloat16(), "n": torch.tensor(3),
                                    "mask": torch.tensor([True, False]), "none": torch.zeros(0)},
           "optimizer": {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
           "random": {"python": random.Random(0).getstate(), "numpy": ["MT19937", [1, 2], 3, 0, 0.0]},
           "best": None, "records": [{"epoch": 1, "dev": {"acc": 0.5}}], "nan": float("nan")}
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    again = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    assert content_sha256(again) == content_sha256(obj), "the checksum changed through torch.save and torch.load"

    def middle_value(o):
        o["model"]["w"][20, 20] += 1  # a change print() would elide ("...")
    changes = {
        "one weight in the middle": middle_value,
        "a bf16 value": lambda o: o["model"]["b"].__setitem__(1, 2.0),
        "a tensor's dtype, the same bytes": lambda o: o["model"].update(w=o["model"]["w"].view(torch.int32)),
        "a tensor's shape, the same bytes": lambda o: o["model"].update(w=o["model"]["w"].reshape(20, 80)),
        "a key": lambda o: o["model"].update(v=o["model"].pop("b")),
        "the keys' order": lambda o: o.update(model=dict(reversed(list(o["model"].items())))),
        "an int key": lambda o: o["optimizer"]["state"].update({1: o["optimizer"]["state"].pop(0)}),
        "a float in a list": lambda o: o["optimizer"]["param_groups"][0].update(lr=2e-3),
        "a tuple made a list": lambda o: o["random"].update(python=list(o["random"]["python"])),
        "an int made a float": lambda o: o["records"][0].update(epoch=1.0),
        "None made 0": lambda o: o.update(best=0),
        "a record dropped": lambda o: o["records"].pop(),
    }
    for what, change in changes.items():
        changed = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        change(changed)
        assert content_sha256(changed) != content_sha256(obj), f"content_sha256 does not see {what}"


def test_a_damaged_checkpoint_is_one_line(tiny_bert_dir, tmp_path, capsys):
    """Bit rot in checkpoint.pt: 256 weights' exponent bits flipped (the checksum saved with them kept), or 64
    bytes flipped anywhere in the middle of the file: one line, the checksum's or torch.load's, never a model
    scored with damaged weights. A checkpoint from before checksums loads, with a warning line."""
    path = tmp_path / "checkpoint.pt"
    make_checkpoint(tiny_bert_dir, path, seed=0)
    good = path.read_bytes()
    damaged = f"--checkpoint {path}: its contents do not match the checksum saved with it (the file was damaged " \
              f"after it was written); evaluate a copy kept elsewhere, or train the run again"
    unreadable = f"--checkpoint {path}: not a minknn checkpoint, or a damaged one ("
    raw = torch.load(path, weights_only=True)
    name = "bert.embeddings.word_embeddings.weight"
    raw["model"][name] = flip_exponents(raw["model"][name])
    torch.save(raw, path)
    with pytest.raises(MinknnError) as e:
        load_checkpoint(str(path))
        pytest.fail("a checkpoint with 256 flipped exponents loaded (its checksum was not checked)")
    assert str(e.value) == damaged, str(e.value)
    for share in (0.25, 0.5, 0.75):
        start = int(len(good) * share)
        path.write_bytes(good[:start] + bytes(b ^ 0xFF for b in good[start:start + 64]) + good[start + 64:])
        with pytest.raises(MinknnError) as e:
            load_checkpoint(str(path))
            pytest.fail(f"a checkpoint with 64 bytes flipped at byte {start} loaded")
        assert str(e.value) == damaged or str(e.value).startswith(unreadable), f"byte {start}: {e.value}"
    raw = torch.load(io.BytesIO(good), weights_only=True)
    del raw[CHECKSUM]
    torch.save(raw, path)  # as minknn wrote it before checksums
    capsys.readouterr()
    assert load_checkpoint(str(path))["epoch"] == 1
    assert capsys.readouterr().err.splitlines() == [f"warning: --checkpoint {path}: saved without a checksum (by an "
                                                    f"earlier minknn), so damage to it would go unnoticed"]


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


@pytest.mark.parametrize("saved, built", [("mean", "mean"), ("sum", "sum"), (None, "sum")],
                         ids=["mean", "sum", "from-before-the-flag"])
def test_a_checkpoint_rebuilds_mlcons_reduction(tiny_bert_dir, tmp_path, saved, built):
    """--mlcon_reduction is saved with the run's args and rebuilds the loss it trained (loss_flags); a checkpoint
    from before the flag (no such key) rebuilds the sum it trained with."""
    args = {"pooling": "mean", "loss": "mlcon", "task": "goemotions", "pair_mode": "cross", "decoupled": False,
            **({"mlcon_reduction": saved} if saved else {})}
    model = Model(BertModel.from_pretrained(tiny_bert_dir), [TASKS["goemotions"]], "mean", "cross")
    save_checkpoint(tmp_path / "checkpoint.pt", model, build_losses(model, args),
                    Tokenizer.from_folder(tiny_bert_dir, max_len=16), args, epoch=1, dev={})
    _, losses, _ = rebuild(load_checkpoint(str(tmp_path)))
    assert losses["goemotions"].metric.reduction == built, \
        f"a checkpoint saved with mlcon_reduction {saved} rebuilt {losses['goemotions'].metric.reduction}"


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


# --option pretrain: heads and proxies (two tasks, one of them siamese), and a head and the retrieval head
PRETRAIN = [({**ARGS, "option": "pretrain"}, ["sst", "sts"]),
            ({**ARGS, "option": "pretrain", "loss": "ce", "pooling": "mean", "task": "sst", "pair_mode": "cross",
              "decoupled": True}, ["sst"])]


def frozen_checkpoint(base, path, args, tasks):
    """A model of the BERT in folder `base`, frozen (--option pretrain), whose trainable weights are not the ones a
    fresh build starts from, saved as train.py saves it (base_model: without the encoder)."""
    torch.manual_seed(0)
    model = Model(BertModel.from_pretrained(base), [TASKS[t] for t in tasks], args["pooling"], args["pair_mode"],
                  "pretrain", args["decoupled"])
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p)
    losses = build_losses(model, args)
    tok = Tokenizer.from_folder(base, max_len=16)
    save_checkpoint(path, model, losses, tok, args, epoch=1, dev={}, base=base_model(base))
    return model.eval(), losses, tok


@pytest.mark.parametrize("args, tasks", PRETRAIN, ids=["heads-and-proxies", "decoupled"])
def test_a_pretrain_checkpoint_holds_only_what_trained(tiny_bert_dir, tmp_path, args, tasks):
    """No encoder tensor in it (the base model's folder has them), far smaller than the whole model's, and rebuilt
    (the encoder from that folder) to the predictions of the model it saved."""
    base = str(tmp_path / "base")
    shutil.copytree(tiny_bert_dir, base)
    model, losses, tok = frozen_checkpoint(base, tmp_path / "pretrain.pt", args, tasks)
    save_checkpoint(tmp_path / "whole.pt", model, losses, tok, args, epoch=1, dev={})  # as --option finetune does
    ckpt = load_checkpoint(str(tmp_path / "pretrain.pt"))
    encoder = [k for k in ckpt["model"] if k.startswith("bert.")]
    assert not encoder, f"the pretrain checkpoint holds {len(encoder)} tensors of the frozen encoder: {encoder[:3]}"
    sha = hashlib.sha256(open(os.path.join(base, "model.safetensors"), "rb").read()).hexdigest()
    assert ckpt["base_model"] == {"folder": os.path.abspath(base), "sha256": sha}, ckpt["base_model"]
    small, whole = (os.path.getsize(tmp_path / f) for f in ("pretrain.pt", "whole.pt"))
    assert small < whole / 4, f"the pretrain checkpoint has {small} bytes, the whole model's {whole}"

    again, losses_again, tok_again = rebuild(ckpt)
    batch = tok_again(["the film is great", "dull"])
    for task in tasks:
        out, out_again = model(task, **batch), again.eval()(task, **batch)
        torch.testing.assert_close(out_again.logits, out.logits, rtol=0, atol=0,
                                   msg=lambda m: f"{task}: the rebuilt model's outputs differ from the saved one's: {m}")
        if args["decoupled"]:
            torch.testing.assert_close(out_again.retrieval, out.retrieval, rtol=0, atol=0,
                                       msg=lambda m: f"{task}: the rebuilt retrieval head differs: {m}")
    for k, v in losses.state_dict().items():
        torch.testing.assert_close(losses_again.state_dict()[k], v, rtol=0, atol=0,
                                   msg=lambda m: f"rebuilt loss state {k} differs: {m}")
    # the kNN datastore's fingerprint reads the file's bytes: the same heads on another base model differ
    other = {**ckpt["base_model"], "sha256": "0" * 64}
    save_checkpoint(tmp_path / "other.pt", model, losses, tok, args, epoch=1, dev={}, base=other)
    assert fingerprint(tmp_path / "pretrain.pt", "mean", []) != fingerprint(tmp_path / "other.pt", "mean", [])


def test_a_pretrain_checkpoint_needs_its_base_model_unchanged(tiny_bert_dir, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(tiny_bert_dir, base)
    frozen_checkpoint(str(base), tmp_path / "checkpoint.pt", *PRETRAIN[0])
    before = load_checkpoint(str(tmp_path))["base_model"]["sha256"]
    weights = load_safetensors(base / "model.safetensors")
    weights["pooler.dense.bias"][0] += 1  # one number of the encoder
    save_safetensors(weights, base / "model.safetensors")
    after = hashlib.sha256(open(base / "model.safetensors", "rb").read()).hexdigest()
    with pytest.raises(MinknnError) as e:
        rebuild(load_checkpoint(str(tmp_path)))
    assert str(e.value) == (f"--checkpoint {tmp_path / 'checkpoint.pt'}: the base model {base} changed since the "
                            f"run: its weights' sha256 is {after}, not {before}"), str(e.value)
    shutil.rmtree(base)
    with pytest.raises(MinknnError, match=f"^--checkpoint .*checkpoint.pt: its base model {base} is not a folder "
                                          f"here; the run froze BERT"):
        rebuild(load_checkpoint(str(tmp_path)))


def test_a_missing_or_damaged_json_file_is_one_line_naming_it(tmp_path):
    """read_json serves run folders (run.json, summary.json) and model folders (config.json):
    only a model folder's config.json may add what a model folder needs."""
    with pytest.raises(MinknnError) as e:
        read_json(str(tmp_path / "summary.json"))
    assert str(e.value) == f"{tmp_path / 'summary.json'}: not found", \
        f"a run folder's missing summary.json: {e.value} (only the path and 'not found')"
    for reader in (BertModel.from_pretrained, backbones.from_pretrained):  # bert.py's, any kind's
        with pytest.raises(MinknnError) as e:
            reader(str(tmp_path))
        assert "config.json: not found (a model folder needs config.json" in str(e.value), \
            f"an empty model folder, {reader.__module__}: {e.value} (the line says what a model " \
            f"folder needs)"
    (tmp_path / "run.json").write_text('{"args": ')
    with pytest.raises(MinknnError, match=r"run.json: not valid JSON"):
        read_json(str(tmp_path / "run.json"))
