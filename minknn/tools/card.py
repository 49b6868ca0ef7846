"""The exported folder's model card, OUT/README.md (python -m minknn.tools.export), for whoever
receives the folder and nothing else: what it holds and what it does not, the run's task, labels,
settings and scores, and how to classify with it, first of all that transformers' pipeline cannot.

It opens with the metadata block the Hugging Face Hub reads (YAML between two --- lines: the
library, the pipeline tag, the base model where it is one of the Hub's, tags), then says in its
first lines that `pipeline("text-classification")` and AutoModelForSequenceClassification load
the encoder with a random head of their own (export.py says why theirs cannot be minknn's). Its
snippets are code blocks that tests/test_export.py runs as they are written: the head on
sentence-transformers' z, and with --onnx, onnxruntime on the whole classifier; each gives
minknn's predictions.

The scores are the run's: its best epoch's dev scores (the checkpoint's, what chose the epoch),
and the test split's where `evaluate.py --split test` scored this checkpoint (its
predictions-test-metrics.json, read when it names the same checkpoint and epoch).
"""
import json
import os

from minknn.kinds import kind_of
from minknn.proxy import has_proxies
from minknn.tools.files import read_json

# what each proxy loss's class logits are (its class_logits, minknn/proxy.py), its scale s put in
PROXY_LOGITS = {"ProxyAnchorLoss": "{s:g} cos(z, P_c)",
                "ProxyNCALoss": "-{s:g} (2 - 2 cos(z, P_c))",
                "SoftTripleLoss": "{s:g} S_c(z), the cosines to class c's centres weighted by a "
                                  "softmax at gamma {gamma:g}"}
# --model's names for the packaged weights -> their names on the Hub (minknn/tools/weights.py)
HUB_NAMES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2",
             "mpnet": "sentence-transformers/all-mpnet-base-v2"}


def base_model(args):
    """The run's --model as the card names it: a Hub name for the packaged weights, else the
    folder's name (a folder on the machine that trained it), and whether it is the Hub's."""
    name = args.get("model") or "minilm"
    return (HUB_NAMES[name], True) if name in HUB_NAMES else (os.path.basename(
        os.path.normpath(str(name))), False)


def test_scores(ckpt, task):
    """The task's test scores by its head, where evaluate.py --split test scored this checkpoint
    (the whole split: no --max_eval), else None."""
    folder = os.path.dirname(ckpt.get("file", ""))
    path = os.path.join(folder, "predictions-test-metrics.json")
    if not folder or not os.path.exists(path):
        return None
    try:
        found = read_json(path)
    except (OSError, ValueError):
        return None
    same = (os.path.abspath(str(found.get("checkpoint"))) == os.path.abspath(ckpt["file"])
            and found.get("epoch") == ckpt.get("epoch"))
    scores = found.get(task.name) if same else None
    if not isinstance(scores, dict):
        return None
    return {m: scores[m] for m in task_metrics(task) if m in scores} or None


def task_metrics(task):
    return getattr(task, "metrics", None) or kind_of(task).metrics


def describe(scores):
    return ", ".join(f"{m} {v:.4f}" for m, v in scores.items() if isinstance(v, (int, float)))


def snippet(task, out, labels, knn=None):
    """The sentence-transformers snippet, for a one-task run of single texts with a head (classify
    or multi-label), else None; knn: datastore.safetensors' metadata, for the kNN vote with faiss
    where it can be a few lines (a classify task's cosine vote over z)."""
    if task.pair or task.kind not in ("classify", "multilabel"):
        return None
    vote = []
    if knn and task.kind == "classify" and knn["vote"] == "cosine" and knn["key"] != "decoupled":
        phi = float(knn["phi"])
        vote = ["",
                "# kNN: the training set's keys, the K nearest by cosine, one vote each, mixed "
                "at phi",
                "import faiss",
                "store = load_file(f\"{folder}/datastore.safetensors\")",
                "keys, queries = store[\"keys\"].numpy().copy(), z.numpy().copy()",
                "faiss.normalize_L2(keys)",
                "faiss.normalize_L2(queries)",
                "index = faiss.IndexFlatIP(keys.shape[1])",
                "index.add(keys)",
                f"_, rows = index.search(queries, {int(knn['k'])})  # K",
                "votes = torch.nn.functional.one_hot(store[\"labels\"][torch.from_numpy(rows)], "
                "len(labels)).double().mean(1)",
                f"mixed = {1 - phi:g} * probabilities + {phi:g} * votes  # phi {phi:g}",
                "print([labels[i] for i in mixed.argmax(-1)])"]
    if task.kind == "classify":
        answer = ["probabilities = torch.softmax(logits, dim=-1)",
                  "for text, p in zip(texts, probabilities):",
                  "    print(f\"{labels[p.argmax()]}  {p.max():.3f}  {text}\")"]
    else:
        answer = ["probabilities = torch.sigmoid(logits)  # each label's own probability",
                  "for text, p in zip(texts, probabilities):",
                  "    print([labels[i] for i in (p > 0.5).nonzero().flatten()], text)"]
    return ["import torch",
            "from safetensors.torch import load_file",
            "from sentence_transformers import SentenceTransformer",
            "",
            f"folder = {json.dumps(out)}  # this folder, from where the export ran: "
            "the path to it where you use it",
            "encoder = SentenceTransformer(folder, device=\"cpu\")",
            "head = load_file(f\"{folder}/head.safetensors\")",
            f"labels = {json.dumps(labels)}",
            f"texts = {json.dumps(['a gripping film', 'a dull one'])}",
            "z = encoder.encode(texts, convert_to_tensor=True)  # (N, H): the run's z",
            "logits = z @ head[\"weight\"].T + head[\"bias\"]", *answer, *vote]


def onnx_snippet(out, max_len, inputs, task):
    """The onnxruntime snippet: the folder's tokenizer, then classifier.onnx."""
    pair = ", [t[1] for t in texts]" if task.pair else ""
    texts = [["a gripping film", "a dull one"]] if task.pair else ["a gripping film", "a dull one"]
    return ["import onnxruntime",
            "from transformers import AutoTokenizer",
            "",
            f"folder = {json.dumps(out)}  # this folder, from where the export ran: "
            "the path to it where you use it",
            "tokenizer = AutoTokenizer.from_pretrained(folder)",
            "session = onnxruntime.InferenceSession(f\"{folder}/onnx/classifier.onnx\")",
            f"texts = {json.dumps(texts)}",
            f"batch = tokenizer({'[t[0] for t in texts]' if task.pair else 'texts'}{pair}, "
            f"padding=True, truncation=True, max_length={max_len}, return_tensors=\"np\")",
            "probabilities = session.run(None, {name: batch[name] for name in "
            f"{json.dumps(inputs)}}})[0]",
            f"labels = {json.dumps([str(x) for x in task.labels])}",
            "print([labels[i] for i in probabilities.argmax(-1)])" if task.kind == "classify"
            else "print(probabilities)"]


def card(ckpt, model, losses, out, files, max_len, onnx_inputs=None, knn=None, how_far=None):
    """README.md's text. files: {file: what it holds} of the folder; out: the folder as the export
    was given it (the snippets' path); onnx_inputs: classifier.onnx's inputs, with --onnx; knn:
    datastore.safetensors' metadata, with --knn; how_far: a run that did not finish, how far it
    got ("stopped after epoch 1 of 2": export.unfinished), said under the title."""
    args = ckpt.get("args", {})
    base, on_hub = base_model(args)
    tasks = list(model.tasks.values())
    one = tasks[0] if len(tasks) == 1 else None
    tag = "sentence-similarity" if one and one.kind == "similarity" else "text-classification"
    meta = ["---", "library_name: sentence-transformers", f"pipeline_tag: {tag}"]
    meta += [f"base_model: {base}"] * on_hub
    meta += ["tags:", "- minknn", "- sentence-transformers", f"- {tag}", "---", ""]
    name = ", ".join(t.name for t in tasks)
    lines = [f"# {os.path.basename(os.path.normpath(out))}: a minknn run of {name}", "",
             "**Not a transformers classifier.** `pipeline(\"text-classification\")` and "
             "`AutoModelForSequenceClassification` load this folder's encoder with a new, random "
             "head of their own (transformers says so in its load report) and answer from it. "
             "The run's head is `head.safetensors`, a linear layer on the pooled vector z, which "
             "their classes cannot hold: classify with the code below.", ""]
    if how_far:
        lines += [f"**Not a finished run.** The run {how_far} (not finished): this is its "
                  f"epoch {ckpt.get('epoch')}, the {args.get('save') or 'best'} of those it "
                  f"trained.", ""]
    lines += ["## What this folder holds", "", "| file | what |", "| --- | --- |"]
    lines += [f"| `{f}` | {what} |" for f, what in files.items()]
    lines += ["", "Not here: the training data, and minknn's own code (python -m "
              "minknn.tools.predict answers with every rule, kNN's neighbours and the proxies, "
              "from the run folder).",
              ""]
    lines += ["## The run", ""]
    lines += [f"- base model: `{base}`, {model.bert.config.model_type}, "
              f"{sum(p.numel() for p in model.bert.parameters()) / 1e6:.1f}M parameters",
              f"- pooling: {model.pooling} (z), max length {max_len} tokens"
              + (f", pairs: {model.pair_mode}" if any(t.pair for t in tasks) else ""),
              f"- loss: {args.get('loss') or args.get('sts_loss')}"
              + (f" (lambda {args['lam']})" if args.get("lam") is not None else "")
              + f", {args.get('epochs', '?')} epochs, best dev at epoch {ckpt.get('epoch')}, "
              f"seed {args.get('seed', '?')}"]
    dev = ckpt.get("dev") or {}
    for t in tasks:
        lines.append(f"- task `{t.name}` ({t.kind}{', text pairs' if t.pair else ''})"
                     + (f", labels in order: {', '.join(map(str, t.labels))}" if t.labels else ""))
        if isinstance(dev.get(t.name), dict):
            lines.append(f"  - dev (chose the epoch): {describe(dev[t.name])}")
        test = test_scores(ckpt, t)
        lines.append(f"  - test: {describe(test)}" if test else
                     "  - test: not scored (evaluate.py --split test before exporting adds it)")
        if has_proxies(losses[t.name]):
            metric = losses[t.name].metric
            logits = PROXY_LOGITS[type(metric).__name__].format(
                s=metric.scale, gamma=getattr(metric, "gamma", 0))
            lines.append(f"  - proxies: in `head.safetensors`; proxy inference is "
                         f"softmax((1 - alpha) F(z) + alpha L(z)), F the head's logits, "
                         f"L_c(z) = {logits} (minknn/proxy.py; alpha 0.5 in "
                         f"classifier.onnx's proxy_probabilities)")
    lines.append("")
    code = snippet(one, out, [str(x) for x in one.labels], knn) if one and one.name in \
        model.heads else None
    lines += ["## Classify", ""]
    if code:
        lines += ["With sentence-transformers and a few lines of torch (gives minknn's "
                  "predictions):", "", "```python", *code, "```", ""]
    else:
        lines += ["This run's head does not read one text's z (a pair task, several tasks, or no "
                  "head): sentence-transformers' `encode` gives z for one text only. "
                  + ("`onnx/classifier.onnx` takes the token ids (below)."
                     if "onnx/classifier.onnx" in files else
                     "minknn's `python -m minknn.tools.predict` answers from the run folder."), ""]
    if onnx_inputs and one and "onnx/classifier.onnx" in files:
        lines += ["With onnxruntime alone, the whole classifier (ids to probabilities):", "",
                  "```python", *onnx_snippet(out, max_len, onnx_inputs, one), "```", ""]
    if "onnx/model.onnx" in files:
        lines += ["The encoder in ONNX, with sentence-transformers' ONNX backend (optimum-onnx "
                  "and onnxruntime): `SentenceTransformer(folder, backend=\"onnx\", "
                  "model_kwargs={\"file_name\": \"onnx/model.onnx\"})` gives the same z.", ""]
    lines += ["Written by `python -m minknn.tools.export` (minknn).", ""]
    return "\n".join(meta + lines)
