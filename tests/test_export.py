"""python -m minknn.tools.export (minknn/tools/export.py), held against the libraries it writes for:
transformers' AutoModel gives the run's last hidden states and sentence-transformers the z it
pools, within 1e-5, on each backbone (BERT, RoBERTa, DistilBERT, MPNet: tiny random folders,
tests/conftest.py), with the tokenizer copied from the base folder or written from the checkpoint,
an old run's checkpoint and the real all-MiniLM-L6-v2 too; the heads are in head.safetensors and
the labels in config.json, and the export says in one line that transformers' classifiers do not
read them; bad input is one line and leaves nothing behind. (The card, its snippets and the ONNX
graphs: tests/test_onnx.py.)

A run here is a checkpoint.pt saved as train.py saves it (save_checkpoint) from a model whose
weights were all moved off the base folder's, as training moves them: an export that read the
base folder's weights instead of the run's would differ. transformers and sentence-transformers
are the test extra (pip install -e '.[test]'); nothing here reaches the network (offline).
"""
import errno
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import DATA, FIXTURES, required
transformers = required("transformers")
sentence_transformers = required("sentence_transformers")
import huggingface_hub.constants  # noqa: E402 (installed with transformers)

from minknn import backbones  # noqa: E402
from minknn.losses import build_losses  # noqa: E402
from minknn.model import Model  # noqa: E402
from minknn.tasks.data import load_split  # noqa: E402
from minknn.tasks.registry import TASKS  # noqa: E402
from minknn.tokenizer import Tokenizer  # noqa: E402
from minknn.tools.checkpoint import base_model, load_checkpoint, rebuild, save_checkpoint  # noqa: E402
from minknn.tools.cli import run  # noqa: E402
import minknn.tools.export  # noqa: E402
from minknn.tools.weights import load_safetensors, resolve_model_path  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 1e-5
# real sentences (SST's fixture dev set), one longer than the runs' --max_len 16 (truncated), one
# with capitals and accents (lower-cased, and stripped, by the WordPiece tokenizers)
SST = [e.text for e in load_split(TASKS["sst"], "dev", DATA)]
TEXTS = SST[:6] + [" ".join(SST[6:10]), "Café NAÏVE, really!"]
# transformers' RobertaModel and MPNetModel have a pooler, which minknn's runs hold none of
NO_POOLER = {"roberta": {"pooler.dense.weight", "pooler.dense.bias"},
             "mpnet": {"pooler.dense.weight", "pooler.dense.bias"}}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Nothing reaches the network: the Hub's offline switches (huggingface_hub reads them when it
    is imported, so its constant too)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def fabricated_run(folder, run, pooling, model_arg=None, tasks=("sst",), pair_mode="cross",
                   frozen=False, max_len=16):
    """A run folder whose checkpoint.pt holds `folder`'s model with its weights moved (the heads'
    only, frozen: --option pretrain, whose checkpoint names the base folder). model_arg: the run's
    --model as recorded (default: folder; a folder that is gone, for a run moved elsewhere).
    Returns the model, in eval mode, and its tokenizer."""
    torch.manual_seed(0)
    option = "pretrain" if frozen else "finetune"
    model = Model(backbones.from_pretrained(folder), [TASKS[t] for t in tasks], pooling, pair_mode,
                  option)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    args = {"task": tasks[0] if len(tasks) == 1 else "multitask", "tasks": list(tasks),
            "model": model_arg or folder, "pooling": pooling, "pair_mode": pair_mode,
            "decoupled": False, "loss": "ce", "sts_loss": "mse", "option": option,
            "max_len": max_len}
    tokenizer = Tokenizer.from_folder(folder, max_len=max_len)
    save_checkpoint(os.path.join(run, "checkpoint.pt"), model, build_losses(model, args), tokenizer,
                    args, epoch=1, dev={}, base=base_model(folder) if frozen else None)
    return model.eval(), tokenizer


def export(run, out, capsys):
    """Exports run to out; returns the lines it printed."""
    capsys.readouterr()  # what came before (the base folder's load notes) is not the export's
    minknn.tools.export.main([str(run), str(out)])
    return capsys.readouterr().out.splitlines()


def differs(kind, what, theirs, ours):
    """The largest |difference| of two tensors, asserted within TOLERANCE, the message naming
    the quantity and by how much it is off."""
    assert theirs.shape == ours.shape, f"{kind}: {what}: shape {tuple(theirs.shape)}, minknn's " \
                                       f"{tuple(ours.shape)}"
    d = (theirs - ours).abs().max().item()
    print(f"{kind}: {what}: max |difference| {d:.1e}")
    assert d <= TOLERANCE, f"{kind}: {what} differ from minknn's by up to {d:.2e} " \
                           f"(tolerance {TOLERANCE:g})"
    return d


@torch.no_grad()
def read_back(kind, out, model, tokenizer, texts=TEXTS):
    """transformers' tokenizer and AutoModel, and SentenceTransformer, loaded from out, against
    the run's tokenizer, hidden states (real tokens) and z on texts."""
    ours = tokenizer(texts)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    theirs = hf_tokenizer(texts, padding=True, truncation=True, max_length=tokenizer.max_len,
                          return_tensors="pt")
    for text, a, b in zip(texts, theirs["input_ids"].tolist(), ours["input_ids"].tolist()):
        assert a == b, f"{kind}: transformers' tokenizer from {out} gives other ids than the " \
                       f"run's for {text!r}: {a}, the run's {b}"
    hf, loading = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    unexplained = {k: sorted(set(v) - (NO_POOLER.get(kind, set()) if k == "missing_keys" else set()))
                   for k, v in loading.items() if k != "error_msgs"}
    assert not any(unexplained.values()), f"{kind}: transformers loading {out}: {unexplained}"
    real = ours["attention_mask"].bool()
    hf_out = hf.eval()(**theirs)
    h = model.bert(ours["input_ids"], ours["attention_mask"], ours["token_type_ids"])
    differs(kind, "transformers' hidden states", hf_out.last_hidden_state[real], h[real])
    if model.bert.pooler is not None:  # BERT's: unused by minknn's heads, but AutoModel's output
        differs(kind, "transformers' pooler output", hf_out.pooler_output, model.bert.pooler(h))
    st = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    assert st.max_seq_length == tokenizer.max_len, f"{kind}: max_seq_length {st.max_seq_length}"
    differs(kind, "sentence-transformers' embeddings", st.encode(texts, convert_to_tensor=True),
            model(next(iter(model.tasks)), **ours).z)


CASES = [("bert", "copied", "mean"), ("bert", "written", "cls"),
         ("roberta", "copied", "cls"), ("roberta", "written", "max"),
         ("distilbert", "copied", "max"), ("distilbert", "written", "mean"),
         ("distilbert", "frozen", "cls"),
         ("mpnet", "copied", "mean"), ("mpnet", "written", "max")]


@pytest.mark.parametrize("kind,tokenizer_from,pooling", CASES)
def test_transformers_and_sentence_transformers_read_the_run_as_minknn(kind, tokenizer_from, pooling,
                                                                      request, tmp_path, capsys):
    """tokenizer_from: copied (the base folder is here), written (it is gone: the checkpoint's
    vocabulary and options), frozen (--option pretrain: the encoder read back from the base)."""
    folder = request.getfixturevalue(f"tiny_{kind}_dir")
    gone = str(tmp_path / "gone") if tokenizer_from == "written" else None
    model, tokenizer = fabricated_run(folder, tmp_path / "run", pooling, gone,
                                      frozen=tokenizer_from == "frozen")
    said = export(tmp_path / "run", tmp_path / "out", capsys)
    written = "written from the checkpoint" in said[0]
    assert written == (tokenizer_from == "written"), f"{kind}: {said[0]}"
    read_back(kind, tmp_path / "out", model, tokenizer)
    config = json.load(open(tmp_path / "out" / "config.json"))
    labels = list(TASKS["sst"].labels)
    assert config.get("id2label") == {str(i): c for i, c in enumerate(labels)} and \
        config.get("label2id") == {c: i for i, c in enumerate(labels)}, \
        f"{kind}: config.json's labels {config.get('id2label')}, {config.get('label2id')}; the run's {labels}"
    head = load_safetensors(str(tmp_path / "out" / "head.safetensors"))
    assert sorted(head) == ["bias", "weight"], f"{kind}: head.safetensors holds {sorted(head)}"
    for name in head:
        assert torch.equal(head[name], getattr(model.heads["sst"], name)), \
            f"{kind}: head.safetensors' {name} is not the run's head's"
    # the last line (before it, a frozen run's rebuild notes the base folder's unused tensors)
    assert said[-1].startswith("note: transformers' pipeline(\"text-classification\") and "
                               "AutoModelForSequenceClassification do not read head.safetensors"), \
        f"{kind}: the head's line: {said[1:]}"


@pytest.mark.parametrize("tasks,pair_mode,shapes", [
    (("sst", "sts"), "cross", {"sst.weight": (5, 32), "sst.bias": (5,), "sts.weight": (1, 32),
                               "sts.bias": (1,)}),
    (("quora",), "siamese", {"weight": (2, 96), "bias": (2,)})])
def test_a_multitask_or_siamese_runs_heads_are_written_and_the_card_says_encode_cannot_feed_them(
        tasks, pair_mode, shapes, tiny_bert_dir, tmp_path, capsys):
    """Several heads go into head.safetensors after their task's name; a siamese pair's reads
    [u, v, |u - v|] (3H). Neither has a sentence-transformers snippet (encode gives one text's z),
    and config.json names no labels where there is not one classifier."""
    model, _ = fabricated_run(tiny_bert_dir, tmp_path / "run", "mean", tasks=tasks, pair_mode=pair_mode)
    said = export(tmp_path / "run", tmp_path / "out", capsys)
    assert len(said) == 3 and "head.safetensors" in said[1], said
    head = load_safetensors(str(tmp_path / "out" / "head.safetensors"))
    assert {k: tuple(v.shape) for k, v in head.items()} == shapes, {k: tuple(v.shape) for k, v in head.items()}
    card = (tmp_path / "out" / "README.md").read_text()
    assert "```python" not in card and "does not read one text's z" in card, card
    config = json.load(open(tmp_path / "out" / "config.json"))
    assert ("id2label" in config) == (len(tasks) == 1), config


def test_an_old_run_exports_into_an_empty_folder(tmp_path, capsys):
    """tests/fixtures/old's run (minknn at 8dc0bf9; its base folder long gone; stopped after epoch 1 of 2), read
    through minknn/tools/checkpoint.py's loaders; OUT an empty folder, which the export fills."""
    (tmp_path / "out").mkdir()
    model, _, tokenizer = rebuild(load_checkpoint(os.path.join(FIXTURES, "old", "run")))
    said = export(os.path.join(FIXTURES, "old", "run"), tmp_path / "out", capsys)
    # the old run stopped after its first epoch (its summary.json): said first
    assert said[0].startswith(f"note: RUN {os.path.join(FIXTURES, 'old', 'run')}: the run stopped after epoch 1 "
                              f"of 2 (not finished)"), said
    assert "written from the checkpoint" in said[1], said
    read_back("bert (old run)", tmp_path / "out", model.eval(), tokenizer)


def test_the_real_minilm_with_its_tokenizer_json(tmp_path, capsys):
    """all-MiniLM-L6-v2 (the default model): its tokenizer files copied, tokenizer.json with them."""
    folder = resolve_model_path("minilm")
    model, tokenizer = fabricated_run(folder, tmp_path / "run", "mean", max_len=64)
    said = export(tmp_path / "run", tmp_path / "out", capsys)
    assert f"from {folder}" in said[0] and (tmp_path / "out" / "tokenizer.json").exists(), said
    read_back("minilm", tmp_path / "out", model, tokenizer, SST + ["Café NAÏVE, really!"])


# ---------------------------------------------------------------------------- bad input

def refused(argv, capsys):
    """The one line a refused export prints, through minknn.tools.cli.run as `python -m` runs it."""
    with pytest.raises(SystemExit) as stop:
        run(lambda: minknn.tools.export.main([str(a) for a in argv]))
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, f"exit {stop.value.code}, said {err}"
    return err[0]


def test_an_out_that_holds_anything_is_refused_and_left_as_it_was(tiny_bert_dir, tmp_path, capsys):
    fabricated_run(tiny_bert_dir, tmp_path / "run", "mean")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    line = refused([tmp_path / "run", tmp_path / "out"], capsys)
    assert line.startswith(f"error: OUT {tmp_path / 'out'}: already exists"), line
    assert os.listdir(tmp_path / "out") == ["keep.txt"] and sorted(os.listdir(tmp_path)) == ["out", "run"]


def test_a_run_without_checkpoint_pt_is_one_line(tmp_path):
    """As a user types it, python -m minknn.tools.export: status 2, one line, no OUT."""
    (tmp_path / "run").mkdir()
    done = subprocess.run([sys.executable, "-m", "minknn.tools.export", str(tmp_path / "run"),
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and \
        err[0].startswith(f"error: RUN {tmp_path / 'run'}: has no checkpoint.pt"), (done.returncode, err)
    assert not (tmp_path / "out").exists()


def test_a_failed_write_leaves_no_out_and_no_temporary_folder(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    fabricated_run(tiny_bert_dir, tmp_path / "run", "mean")

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(minknn.tools.export, "save_safetensors", full)
    line = refused([tmp_path / "run", tmp_path / "out"], capsys)
    assert line == f"error: OUT {tmp_path / 'out'}: cannot be written ({os.strerror(errno.ENOSPC)})", line
    assert os.listdir(tmp_path) == ["run"], f"left behind: {os.listdir(tmp_path)}"


def test_an_out_that_cannot_be_written_is_one_line_and_leaves_nothing(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    """OUT beneath a file (no folder can be made there), or in a folder that refuses new entries (read-only: made
    so by os.mkdir failing there, as root writes anywhere): the temporary folder cannot be made, and that is one
    line naming OUT, nothing written."""
    fabricated_run(tiny_bert_dir, tmp_path / "run", "mean")
    (tmp_path / "file").write_text("not a folder")
    line = refused([tmp_path / "run", tmp_path / "file" / "out"], capsys)
    assert line.startswith(f"error: OUT {tmp_path / 'file' / 'out'}: cannot be written ("), line
    (tmp_path / "ro").mkdir()
    mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if os.path.dirname(os.path.abspath(path)) == str(tmp_path / "ro"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return mkdir(path, *args, **kwargs)
    monkeypatch.setattr(os, "mkdir", read_only)
    line = refused([tmp_path / "run", tmp_path / "ro" / "out"], capsys)
    assert line == f"error: OUT {tmp_path / 'ro' / 'out'}: cannot be written ({os.strerror(errno.EACCES)})", line
    assert sorted(os.listdir(tmp_path)) == ["file", "ro", "run"] and os.listdir(tmp_path / "ro") == []


def stopped_run(run, summary=None):
    """run's folder made a run's that planned 2 epochs and did 1: run.json, metrics.jsonl's one line, and
    summary.json as given (None: none, as a kill -9 leaves it)."""
    (run / "run.json").write_text(json.dumps({"args": {"epochs": 2, "save": "best"}, "data": {}}))
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "dev": {"overall": 0.5}}) + "\n")
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))


@pytest.mark.parametrize("summary,how", [(None, "stopped"), ({"epochs": 1, "stopped": "interrupted"}, "stopped"),
                                         ({"epochs": 1, "stopped": "diverged: the sst loss became nan"}, "diverged")])
def test_a_run_that_did_not_finish_is_said_first_and_in_the_card(summary, how, tiny_bert_dir, tmp_path, capsys):
    """A run killed (no summary.json), stopped (Ctrl-C, SIGTERM) or diverged after epoch 1 of 2: the export's
    first line says so, and so does its model card; a finished run's says nothing of it."""
    fabricated_run(tiny_bert_dir, tmp_path / "run", "mean")
    stopped_run(tmp_path / "run", summary)
    said = export(tmp_path / "run", tmp_path / "out", capsys)
    assert said[0].startswith(f"note: RUN {tmp_path / 'run'}: the run {how} after epoch 1 of 2 (not finished)"), said
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"The run {how} after epoch 1 of 2 (not finished)" in card, card[:1500]
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"epochs": 2}))  # finished
    said = export(tmp_path / "run", tmp_path / "done", capsys)
    assert not any("not finished" in line for line in said), said
    assert "not finished" not in (tmp_path / "done" / "README.md").read_text()


@pytest.mark.parametrize("stop,status", [(KeyboardInterrupt, 130), (minknn.Terminated, 143)])
def test_ctrl_c_or_sigterm_mid_export_leaves_no_temporary_folder(stop, status, tiny_bert_dir, tmp_path, capsys,
                                                                  monkeypatch):
    """Ctrl-C, or SIGTERM (which minknn.tools.cli.run raises as Terminated), while the export writes: its exit
    status, and neither OUT nor the temporary folder left."""
    fabricated_run(tiny_bert_dir, tmp_path / "run", "mean")

    def stopped(*args):
        raise stop()
    monkeypatch.setattr(minknn.tools.export, "save_safetensors", stopped)
    with pytest.raises(SystemExit) as exit_:
        run(lambda: minknn.tools.export.main([str(tmp_path / "run"), str(tmp_path / "out")]))
    assert exit_.value.code == status and os.listdir(tmp_path) == ["run"], (exit_.value.code, os.listdir(tmp_path))


def test_a_killed_exports_temporary_folder_goes_at_the_next_but_not_a_live_ones(tiny_bert_dir, tmp_path, capsys):
    """kill -9 gives an export no chance to remove its temporary folder; the next export to the same OUT removes
    it. One a live export holds (its lock: a process that made one and waits) stays while that process lives,
    and so do the temporary folders of other OUTs' exports."""
    fabricated_run(tiny_bert_dir, tmp_path / "run", "mean")
    others = [".out.b.0123abcd.tmp", ".outer.0123abcd.tmp", ".out.0123abcd.tmp.x"]  # not OUT's own
    for name in others:
        (tmp_path / name).mkdir()
    (tmp_path / ".out.0123abcd.tmp").mkdir()  # a kill -9's, with what it had written
    (tmp_path / ".out.0123abcd.tmp" / "config.json").write_text("{}")
    live = subprocess.Popen([sys.executable, "-c", "import sys, time; import minknn.tools.export as e; "
                             "print(e.temporary_folder(sys.argv[1])[0], flush=True); time.sleep(120)",
                             str(tmp_path / "out")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        held = live.stdout.readline().strip()
        assert os.path.isdir(held), f"the live export's temporary folder: {held!r}"
        export(tmp_path / "run", tmp_path / "out", capsys)
        assert sorted(os.listdir(tmp_path)) == sorted(others + [os.path.basename(held), "out", "run"]), \
            os.listdir(tmp_path)
        live.kill()  # kill -9: its folder stays, unheld
        live.wait()
        assert os.path.isdir(held)
        export(tmp_path / "run", tmp_path / "again", capsys)  # another OUT's export leaves it
        assert os.path.isdir(held)
        (tmp_path / "out").rename(tmp_path / "first")
        export(tmp_path / "run", tmp_path / "out", capsys)
        assert sorted(os.listdir(tmp_path)) == sorted(others + ["again", "first", "out", "run"]), os.listdir(tmp_path)
    finally:
        live.kill()
        live.wait()
