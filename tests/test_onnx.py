"""What a receiver of an exported folder runs (python -m minknn.tools.export RUN OUT --onnx --knn:
minknn/tools/export.py, minknn/tools/card.py, minknn/tools/onnx_export.py), held against minknn's own answers
(minknn/tools/inference.py load, the Python API predict uses):

    the card's snippets   README.md's ```python blocks, run as written (only their `texts = `
                          line swapped for the test's texts): the head on sentence-transformers'
                          z, kNN with faiss, onnxruntime on classifier.onnx. Each gives minknn's
                          predictions, its probabilities within 1e-5.
    onnx/model.onnx       SentenceTransformer(OUT, backend="onnx") gives minknn's z within 1e-5.
    classifier.onnx       probabilities, and proxy inference's, within 1e-5 of minknn's.
    the pipeline          transformers' pipeline("text-classification") on the folder does NOT
                          give minknn's answers, and the card says so first.

On every backbone (tiny random BERT, RoBERTa, DistilBERT, MPNet) with every pooling, on texts of
mixed lengths (one past --max_len), and on trained runs of a proxy loss with kNN (classify) and of
a multi-label task. The test extra: transformers, sentence-transformers, onnxruntime, and
optimum-onnx, which sentence-transformers' ONNX backend imports; onnx and onnxscript, which the
export needs (the onnx extra).
"""
import json
import os
import re
import sys

import numpy as np
import pytest
import torch

from helpers import required
required("onnxruntime")
required("onnxscript")
required("optimum.onnxruntime")
transformers = required("transformers")
sentence_transformers = required("sentence_transformers")

import evaluate  # noqa: E402
import minknn.tools.export  # noqa: E402
from minknn.tools.inference import load  # noqa: E402
from minknn.tools.weights import load_safetensors  # noqa: E402
from test_export import TEXTS, differs, fabricated_run, offline, refused  # noqa: E402,F401 (offline: autouse)
from test_own_task import reviews, write_csv, write_jsonl  # noqa: E402
from test_predict import DEV, trained  # noqa: E402


def exported(run_folder, out, *flags):
    minknn.tools.export.main([str(run_folder), str(out), *flags])
    return str(out)


def snippets(out):
    """The card's python blocks, as written."""
    return re.findall(r"```python\n(.*?)```", open(os.path.join(out, "README.md")).read(), re.S)


def ran(block, texts):
    """Runs a card's snippet with its texts swapped for these; returns its variables."""
    code, n = re.subn(r"^texts = .*$", lambda _: f"texts = {json.dumps(texts)}", block, flags=re.M)
    assert n == 1, f"the snippet has {n} `texts = ` lines:\n{block}"
    found = {}
    exec(compile(code, "README.md", "exec"), found)
    return found


def same_answers(what, theirs, ours, multilabel=False):
    """Probabilities within 1e-5 (differs), and the same predictions: each arg max, or each label
    above 0.5."""
    theirs = torch.as_tensor(np.asarray(theirs)).double()
    ours = torch.as_tensor(np.asarray(ours)).double()
    differs(what, "probabilities", theirs, ours)
    pick = (lambda p: p > 0.5) if multilabel else (lambda p: p.argmax(-1))
    assert torch.equal(pick(theirs), pick(ours)), f"{what}: predictions {pick(theirs).tolist()}, " \
                                                  f"minknn's {pick(ours).tolist()}"


def onnx_session(out, file="classifier.onnx"):
    import onnxruntime
    return onnxruntime.InferenceSession(os.path.join(out, "onnx", file))


CASES = [(kind, pooling) for kind in ("bert", "roberta", "distilbert", "mpnet")
         for pooling in ("cls", "mean", "max")]


@pytest.mark.parametrize("kind,pooling", CASES)
def test_the_cards_snippets_and_the_onnx_graphs_give_minknns_answers(kind, pooling, request,
                                                                    tmp_path):
    folder = request.getfixturevalue(f"tiny_{kind}_dir")
    fabricated_run(folder, tmp_path / "run", pooling)
    out = exported(tmp_path / "run", tmp_path / "out", "--onnx")
    ours = load(str(tmp_path / "run"))
    what = f"{kind}, --pooling {pooling}"
    head, onnx = snippets(out)
    # the head on sentence-transformers' z; onnxruntime on classifier.onnx, a batch of mixed
    # lengths and a batch of one
    same_answers(f"{what}: the card's sentence-transformers snippet",
                 ran(head, TEXTS)["probabilities"], ours.predict_proba(TEXTS))
    same_answers(f"{what}: the card's onnxruntime snippet", ran(onnx, TEXTS)["probabilities"],
                 ours.predict_proba(TEXTS))
    same_answers(f"{what}: the card's onnxruntime snippet, one text",
                 ran(onnx, TEXTS[-1:])["probabilities"], ours.predict_proba(TEXTS[-1:]))
    # model.onnx itself: minknn's last hidden states on the real tokens, zeros at the padding
    batch = ran(onnx, TEXTS)["batch"]
    encoder = onnx_session(out, "model.onnx")
    h = torch.from_numpy(encoder.run(None, {i.name: batch[i.name] for i in encoder.get_inputs()})[0])
    ids = {name: torch.from_numpy(batch[name]) for name in ("input_ids", "attention_mask")}
    with torch.inference_mode():
        theirs = ours.model.bert(ids["input_ids"], ids["attention_mask"],
                                 torch.zeros_like(ids["input_ids"]))
    real = ids["attention_mask"].bool()
    differs(what, "model.onnx's last_hidden_state", h[real].double(), theirs[real].double())
    assert not h[~real].any(), f"{what}: model.onnx's last_hidden_state is not 0 at the padding"
    st = sentence_transformers.SentenceTransformer(
        out, backend="onnx", device="cpu", model_kwargs={"file_name": "onnx/model.onnx"})
    differs(what, "sentence-transformers' ONNX backend's z",
            st.encode(TEXTS, convert_to_tensor=True).double(),
            torch.from_numpy(ours.encode(TEXTS)).double())


def test_a_trained_proxy_run_with_knn_explains_itself_and_its_files_answer_as_minknn(
        tiny_bert_dir, tmp_path):
    """A run of a CSV with --loss proxyanchor, exported with --onnx --knn: the card's head and
    kNN snippet, onnxruntime's probabilities and proxy inference, the datastore's keys; the card
    says what the folder is, its labels and scores (test only once evaluate.py scored it)."""
    test = write_csv(tmp_path / "test.csv", ["text", "label"],
                     [(t, "positive" if i % 2 == 0 else "negative") for i, t in enumerate(DEV)])
    run_folder = trained(tiny_bert_dir, tmp_path, "--train_file",
                         write_csv(tmp_path / "train.csv", ["text", "label"], reviews(3)),
                         "--test_file", test, "--loss", "proxyanchor")
    out = exported(run_folder, tmp_path / "out", "--onnx", "--knn", "--k", "8")
    ours = load(run_folder, k=8)
    texts = DEV + ["a gripping film and wonderful acting, though a tedious story"]
    head, onnx = snippets(out)
    found = ran(head, texts)
    same_answers("the card's snippet", found["probabilities"], ours.predict_proba(texts))
    same_answers("the card's kNN snippet (faiss)", found["mixed"], ours.predict_proba(texts, "knn"))
    session = onnx_session(out)
    assert [o.name for o in session.get_outputs()] == ["probabilities", "proxy_probabilities"]
    same_answers("the card's onnxruntime snippet", ran(onnx, texts)["probabilities"],
                 ours.predict_proba(texts))
    batch = ran(onnx, texts)["batch"]
    proxy = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})[1]
    same_answers("classifier.onnx's proxy_probabilities", proxy, ours.predict_proba(texts, "proxy"))
    # the files: the proxies, the datastore's keys, labels and ids, as the run holds them
    tensors = load_safetensors(os.path.join(out, "head.safetensors"))
    assert torch.equal(tensors["proxies"], ours.losses[ours.task().name].metric.proxies.detach()), \
        "head.safetensors' proxies are not the run's"
    store = load_safetensors(os.path.join(out, "datastore.safetensors"))
    datastore = ours.datastore(ours.task())
    assert torch.equal(store["keys"], torch.from_numpy(datastore.keys)) and \
        torch.equal(store["labels"], datastore.labels), "datastore.safetensors is not the run's"
    # the card: what it is first, then the labels in order and the dev scores of the checkpoint
    card = open(os.path.join(out, "README.md")).read()
    body = [line for line in card.split("---\n", 2)[2].splitlines() if line]  # past the metadata
    assert body[0].startswith("# out: a minknn run of") and \
        body[1].startswith("**Not a transformers classifier.**"), body[:2]
    assert "labels in order: negative, positive" in card or "labels in order: positive, negative" \
        in card, card
    name = ours.task().name
    dev = ours.ckpt["dev"][name]
    assert f"dev (chose the epoch): acc {dev['acc']:.4f}" in card and "test: not scored" in card, card
    # scored on test, exported again: the card gives evaluate.py's test scores
    result = evaluate.main(["--checkpoint", run_folder, "--split", "test"])
    again = open(os.path.join(exported(run_folder, tmp_path / "again"), "README.md")).read()
    assert f"test: acc {result[name]['acc']:.4f}, macro_f1 {result[name]['macro_f1']:.4f}" \
        in again, again
    # scores of another epoch's checkpoint (the run went on after evaluate.py) are not this one's
    path = os.path.join(run_folder, "predictions-test-metrics.json")
    stale = json.load(open(path))
    json.dump({**stale, "epoch": stale["epoch"] - 1}, open(path, "w"))
    later = open(os.path.join(exported(run_folder, tmp_path / "later"), "README.md")).read()
    assert "test: not scored" in later, "the card gives test scores of another epoch's checkpoint"


def test_transformers_pipeline_does_not_answer_as_minknn_and_the_snippet_does(tiny_bert_dir, tmp_path):
    """What a user tries first: pipeline("text-classification") loads the folder with a random head
    of its own; its scores are not the run's. The card's snippet's are."""
    run_folder = trained(tiny_bert_dir, tmp_path, "--train_file",
                         write_csv(tmp_path / "train.csv", ["text", "label"], reviews(3)))
    out = exported(run_folder, tmp_path / "out")
    ours = load(run_folder).predict_proba(DEV)
    pipe = transformers.pipeline("text-classification", model=out, top_k=None, device="cpu")
    theirs = np.array([[next(a["score"] for a in answer if a["label"] == label)
                        for label in load(run_folder).labels] for answer in pipe(DEV)])
    gap = np.abs(theirs - ours).max()
    assert gap > 1e-3, f"the pipeline's probabilities are within {gap:.1e} of minknn's: then the " \
                       f"card's warning is wrong"
    same_answers("the card's snippet", ran(snippets(out)[0], DEV)["probabilities"], ours)


def test_a_multilabel_runs_snippets_give_each_label_above_half(tiny_bert_dir, tmp_path):
    def tags(t):
        return ["cinema"] + (["acting"] if "act" in t or "cast" in t else [])
    run_folder = trained(tiny_bert_dir, tmp_path, "--task_kind", "multilabel", "--train_file",
                         write_jsonl(tmp_path / "train.jsonl",
                                     [{"text": t, "label": tags(t) + [y]} for t, y in reviews(3)]))
    out = exported(run_folder, tmp_path / "out", "--onnx", "--knn", "--k", "4")
    ours = load(run_folder).predict_proba(DEV)
    head, onnx = snippets(out)
    assert "torch.sigmoid" in head and "faiss" not in head, head  # the euclidean vote: no snippet
    same_answers("the card's snippet", ran(head, DEV)["probabilities"], ours, multilabel=True)
    same_answers("the card's onnxruntime snippet", ran(onnx, DEV)["probabilities"], ours,
                 multilabel=True)


@pytest.mark.parametrize("loss", ["proxynca", "softtriple"])
def test_classifier_onnx_runs_each_proxy_losss_inference(loss, tiny_bert_dir, tmp_path):
    """ProxyNCA's class logits (-s d(z, P_c)) and SoftTriple's (its centres' S_c), traced into
    classifier.onnx: proxy_probabilities within 1e-5 of minknn's proxy rule (inference.py)."""
    from minknn import backbones
    from minknn.tools.inference import rule_probabilities
    from minknn.losses import build_losses
    from minknn.model import Model
    from minknn.tools.onnx_export import PROXY_ALPHA, write_onnx
    from minknn.tasks.registry import TASKS
    from minknn.tokenizer import Tokenizer
    torch.manual_seed(0)
    model = Model(backbones.from_pretrained(tiny_bert_dir), [TASKS["mr"]], "max").eval()
    losses = build_losses(model, {"loss": loss, "sts_loss": "mse", "lam": 0.5, "task": "mr",
                                  "tasks": ["mr"], "decoupled": False})
    write_onnx(model, losses, 16, str(tmp_path))
    batch = Tokenizer.from_folder(tiny_bert_dir, max_len=16)(TEXTS)
    theirs = onnx_session(str(tmp_path)).run(None, {k: v.numpy() for k, v in batch.items()})[1]
    with torch.inference_mode():
        out = model("mr", **batch)
        ours = rule_probabilities("proxy", TASKS["mr"], out.logits, out.z, losses["mr"],
                                  PROXY_ALPHA)
    same_answers(f"{loss}: classifier.onnx's proxy_probabilities", theirs, ours)


def test_a_siamese_run_gets_the_encoder_graph_and_a_card_that_promises_no_classifier(
        tiny_bert_dir, tmp_path):
    """A siamese pair task's head reads [u, v, |u - v|] of two texts encoded alone: no
    classifier.onnx, and the card sends the reader to minknn's predict, not to a missing file."""
    fabricated_run(tiny_bert_dir, tmp_path / "run", "mean", tasks=("quora",), pair_mode="siamese")
    out = exported(tmp_path / "run", tmp_path / "out", "--onnx")
    assert sorted(os.listdir(os.path.join(out, "onnx"))) == ["model.onnx"], os.listdir(out)
    card = open(os.path.join(out, "README.md")).read()
    assert "classifier.onnx" not in card and "python -m minknn.tools.predict` answers" in card, card


# ---------------------------------------------------------------------------- bad input

def test_onnx_without_its_packages_is_one_line_before_anything_is_read(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript: ImportError
    line = refused([tmp_path / "no-run", tmp_path / "out", "--onnx"], capsys)
    assert line == "error: --onnx needs the onnx and onnxscript packages (onnxscript is missing): " \
                   "pip install -e '.[onnx]'", line


def test_knn_on_a_multitask_run_is_one_line_and_leaves_nothing(tiny_bert_dir, tmp_path, capsys):
    fabricated_run(tiny_bert_dir, tmp_path / "run", "mean", tasks=("sst", "sts"))
    line = refused([tmp_path / "run", tmp_path / "out", "--knn"], capsys)
    assert line.startswith("error: --knn: writes one task's datastore; this run has the tasks "
                           "sst, sts"), line
    assert os.listdir(tmp_path) == ["run"], os.listdir(tmp_path)
