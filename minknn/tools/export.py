"""A run as a Hugging Face folder that other libraries load, and that says what it is:
python -m minknn.tools.export RUN OUT [--onnx] [--knn].

RUN is a folder train.py wrote (its checkpoint.pt, or the file itself), read as evaluate.py reads
it (minknn/tools/run.py run_checkpoint, minknn/tools/checkpoint.py rebuild; old checkpoints, and a
frozen encoder read back from its base folder, included). OUT, a new folder (or an empty one), then
holds:

    README.md           the model card (minknn/tools/card.py): what the folder is and is not, the
    run's
                        task, labels, settings and scores, and code that classifies with it
    config.json         the encoder's BertConfig as transformers reads it for its model_type:
                        backbones.config_from_dict read backwards (DistilBERT's own names,
                        DISTILBERT_CONFIG; MPNet's relative_attention_num_buckets), the bare
                        model as its architecture (BertModel, RobertaModel, ...), and a one-task
                        run's labels (id2label, label2id)
    model.safetensors   the encoder's tensors, fp32, written by weights.save_safetensors under
                        transformers' names: BERT's and RoBERTa's are minknn's own, DistilBERT's
                        and MPNet's layers are renamed back (DISTILBERT_NAMES, MPNET_NAMES, through
                        each model's file_name)
    the tokenizer       copied from the base model's folder where it is here and tokenises as the
                        run did (vocab.txt, tokenizer.json, ...); else written from the checkpoint:
                        vocab.txt (RoBERTa: vocab.json + merges.txt) and tokenizer_config.json
                        with the run's options (tokenizer.OPTIONS read backwards)
    modules.json, sentence_bert_config.json, 1_Pooling/config.json
                        sentence-transformers' pipeline: the encoder, then the run's --pooling
                        (cls, mean or max, as minknn/model.py pools), max_seq_length the run's
                        --max_len. minknn's z is not normalised, so there is no Normalize module.
    head.safetensors    the heads (head_tensors): weight and bias, the labels in its metadata,
                        and the proxies of a proxy loss, the --decoupled retrieval head
    datastore.safetensors   with --knn: kNN's keys and labels, K, phi and the vote
    onnx/               with --onnx: model.onnx (the encoder) and classifier.onnx (ids to
                        probabilities), minknn/tools/onnx_export.py

transformers' AutoModel.from_pretrained(OUT) then gives minknn's last hidden states, and
SentenceTransformer(OUT).encode the z minknn pools (tests/test_export.py: within 1e-5); the
card's code, z times the head, gives minknn's predictions (tests/test_onnx.py).

No transformers class runs the head. Each is a linear layer on z (minknn/model.py), and for none
of these backbones does AutoModelForSequenceClassification compute that: between the encoder and
its linear layer it puts
    BertForSequenceClassification        tanh(W_p h_[CLS] + b_p)    BERT's pooler
    RobertaForSequenceClassification     tanh(W_d h_<s> + b_d)      a dense layer of its own
    MPNetForSequenceClassification       tanh(W_d h_<s> + b_d)      likewise
    DistilBertForSequenceClassification  ReLU(W_p h_[CLS] + b_p)    pre_classifier
and no weights make a tanh or a ReLU the identity. So the head is its own file, the export says
so in one line, and the card's first lines say that pipeline("text-classification") answers from
a random head (tests/test_onnx.py checks that it does not give minknn's answers).
"""
import dataclasses
import fcntl
import json
import os
import re
import secrets
import shutil

import torch

from minknn import MinknnError
from minknn.backbones import DISTILBERT_CONFIG, config_from_dict
from minknn.model import POOLINGS
from minknn.proxy import has_proxies
from minknn.tokenizer import OPTIONS, Tokenizer
from minknn.tools.card import card
from minknn.tools.checkpoint import rebuild
from minknn.tools.cli import Parser, run
from minknn.tools.onnx_export import check_onnx, onnx_inputs, write_onnx
from minknn.tools.files import is_there, read_json, read_jsonl
from minknn.tools.run import no_checkpoint, run_checkpoint, run_status, training
from minknn.tools.weights import resolve_model_path, save_safetensors

# transformers' name of each architecture: <Name>Model, <Name>Tokenizer, ...
NAMES = {"bert": "Bert", "roberta": "Roberta", "distilbert": "DistilBert", "mpnet": "MPNet"}
# a model folder's tokenizer files, whichever it has (added_tokens.json is left out: tokens
# minknn's tokenizer does not add)
TOKENIZER_FILES = ("vocab.txt", "vocab.json", "merges.txt", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json")
# --pooling -> sentence-transformers' pooling mode (1_Pooling/config.json)
ST_POOLING = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
              "max": "pooling_mode_max_tokens"}
assert tuple(ST_POOLING) == POOLINGS, "a new --pooling needs its sentence-transformers mode"


def hf_config(config, task=None):
    """config.json's contents for the run's BertConfig: backbones.config_from_dict backwards; with
    the task of a one-task run of classes, its labels (id2label, label2id), as transformers names
    a classifier's outputs."""
    d = dataclasses.asdict(config)
    kind = d["model_type"]
    if kind == "distilbert":  # its own keys; no layer_norm_eps (its code fixes BERT's 1e-12)
        d = {theirs: d.get(ours, default) for theirs, (ours, default) in DISTILBERT_CONFIG.items()}
        d.update(model_type="distilbert", sinusoidal_pos_embds=False)
    else:
        d["hidden_act"] = "gelu"
        if kind != "mpnet":  # the relative positions are MPNet's alone
            del d["relative_attention_num_buckets"]
    d["architectures"] = [f"{NAMES[kind]}Model"]
    assert config_from_dict(d) == config, f"config.json {d} does not read back as {config}"
    if task is not None and task.labels:
        d["id2label"] = {str(i): str(label) for i, label in enumerate(task.labels)}
        d["label2id"] = {str(label): i for i, label in enumerate(task.labels)}
    return d


def hf_weights(bert):
    """The encoder's tensors under transformers' names (the model's file_name), in fp32."""
    return {bert.file_name(k): v.detach().float().contiguous() for k, v in
            bert.state_dict().items()}


def base_folder(ckpt, tokenizer):
    """The base model's folder (the frozen encoder's, else the run's --model) where it is here and
    tokenises as the run did: the same kind of tokenizer, vocabulary, options and merges."""
    name = ckpt.get("base_model", {}).get("folder") or ckpt["args"].get("model")
    if not isinstance(name, str):
        return None
    try:
        folder = resolve_model_path(name)
        theirs = Tokenizer.from_folder(folder, tokenizer.max_len)
    except MinknnError:  # gone, or not a model folder any more
        return None

    def what(t):
        return type(t), t.vocab, t.options, getattr(t, "merges", None)  # merges: RoBERTa's
    return folder if what(theirs) == what(tokenizer) else None


def write_tokenizer(tokenizer, kind, out):
    """The run's tokenizer as transformers' <Name>Tokenizer reads it, from the checkpoint alone."""
    if kind == "roberta":  # byte-level BPE: the tokens with their ids, the merges in order
        write_json(os.path.join(out, "vocab.json"), {t: i for i, t in enumerate(tokenizer.vocab)})
        write_text(os.path.join(out, "merges.txt"), ["#version: 0.2", *tokenizer.merges])
        options = dict(tokenizer.options)  # add_prefix_space, under the same name
    else:  # WordPiece: one token a line, in id order
        write_text(os.path.join(out, "vocab.txt"), tokenizer.vocab)
        options = {key: tokenizer.options[ours] for key, (ours, _, _) in OPTIONS.items()}
    write_json(os.path.join(out, "tokenizer_config.json"),
               {"tokenizer_class": f"{NAMES[kind]}Tokenizer", **options,
                "model_max_length": tokenizer.max_len})


def write_text(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def write_json(path, obj):  # not files.write_json: its atomic save makes private (0600) files,
    write_text(path, [json.dumps(obj, indent=2)])  # and OUT is whole or absent already


def write_sentence_transformers(out, pooling, hidden, max_len):
    """The encoder (the folder itself), then the run's pooling: what SentenceTransformer loads."""
    modules = ["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling"]
    write_json(os.path.join(out, "modules.json"),
               [{"idx": i, "name": str(i), "path": path, "type": kind}
                for i, (path, kind) in enumerate(zip(["", "1_Pooling"], modules))])
    write_json(os.path.join(out, "sentence_bert_config.json"),
               {"max_seq_length": max_len, "do_lower_case": False})  # the tokenizer lower-cases
    os.mkdir(os.path.join(out, "1_Pooling"))
    write_json(os.path.join(out, "1_Pooling", "config.json"),
               {"word_embedding_dimension": hidden,
                **{mode: pooling == ours for ours, mode in ST_POOLING.items()},
                "pooling_mode_mean_sqrt_len_tokens": False})


def head_tensors(model, losses):
    """head.safetensors: each task's head, weight (C, H) and bias (C,) (a siamese pair task's reads
    [u, v, |u - v|]: (C, 3H)), its loss's proxies where it trained some (Proxy Anchor's and
    ProxyNCA's `proxies` (C, H), SoftTriple's `centres` (C, K, H)), under their names for a
    one-task run and after "<task>." for several; and the --decoupled retrieval head (r = MLP(z),
    "retrieval.0" and "retrieval.2", nn.Sequential's). Returns (tensors, metadata)."""
    tensors, about = {}, {}
    several = len(model.heads) > 1
    for name, head in model.heads.items():
        at = f"{name}." if several else ""
        task, loss = model.tasks[name], losses[name]
        tensors[at + "weight"], tensors[at + "bias"] = head.weight, head.bias
        about[name] = {"kind": task.kind, "labels": [str(x) for x in task.labels],
                       "input": "[u, v, |u - v|]" if model.siamese(task) else "z"}
        if has_proxies(loss):
            metric = loss.metric
            which = "proxies" if hasattr(metric, "proxies") else "centres"
            tensors[at + which] = getattr(metric, which)
            about[name]["proxy_loss"] = type(metric).__name__
    if model.retrieval is not None:
        tensors.update({f"retrieval.{k}": v for k, v in model.retrieval.state_dict().items()})
    metadata = {"format": "minknn-head-1", "pooling": model.pooling, "tasks": json.dumps(about)}
    return {k: v.detach().float().contiguous() for k, v in tensors.items()}, metadata


def datastore_tensors(run, k=None):
    """datastore.safetensors: the kNN datastore of a one-task run (--knn), as evaluate.py --knn
    builds it (minknn/tools/inference.py load): keys (N, d) float32, labels (N,) class indices or
    (N, C) multi-hot rows; its example ids, key, K, phi and vote in the metadata. faiss alone
    rebuilds the search (the cosine vote: an inner-product index of the unit keys)."""
    from minknn.tools.inference import load  # the datastore's machinery, only where asked
    from minknn.knn import check_k
    trained = load(run, k=k)
    task = trained.task()
    datastore = trained.datastore(task)
    s = trained.knn_settings(task)
    check_k(s.k, len(datastore))  # as predict --knn: K beyond the training set is refused
    metadata = {"format": "minknn-datastore-export-1", "task": task.name,
                "key": trained.model.knn_key(), "k": str(s.k), "phi": str(s.phi),
                "vote": s.vote, "temperature": json.dumps(s.temperature),
                "ids": json.dumps(datastore.ids)}
    return {"keys": torch.from_numpy(datastore.keys), "labels": datastore.labels}, metadata


def export(ckpt, out, name, onnx=False, knn=False, run=None, k=None, how_far=None):
    """Writes the checkpoint's run to the folder `out` (which exists, empty) and returns the lines
    that say what it holds, the folder called `name` there. how_far: a run that did not finish,
    how far it got (unfinished), which the card says."""
    model, losses, tokenizer = rebuild(ckpt)
    config = model.bert.config
    one = next(iter(model.tasks.values())) if len(model.tasks) == 1 else None
    files = {"README.md": "this card"}
    write_json(os.path.join(out, "config.json"), hf_config(config, one))
    save_safetensors(hf_weights(model.bert), os.path.join(out, "model.safetensors"))
    files.update({"config.json": f"the encoder's {NAMES[config.model_type]}Model config"
                  + (" and the labels (id2label)" if one and one.labels else ""),
                  "model.safetensors": "the encoder's weights, fp32"})
    base = base_folder(ckpt, tokenizer)
    if base:
        for file in TOKENIZER_FILES:
            if os.path.exists(os.path.join(base, file)):
                shutil.copy(os.path.join(base, file), out)
    else:
        write_tokenizer(tokenizer, config.model_type, out)
    files["tokenizer files"] = "the run's tokenizer" + (" (the base model's)" if base else "")
    write_sentence_transformers(out, model.pooling, config.hidden_size, tokenizer.max_len)
    files["modules.json, 1_Pooling/"] = (f"sentence-transformers' pipeline: the encoder, then "
                                         f"--pooling {model.pooling} (z)")
    tensors, metadata = head_tensors(model, losses)
    if model.heads or model.retrieval is not None:
        save_safetensors(tensors, os.path.join(out, "head.safetensors"), metadata)
        files["head.safetensors"] = ("the head: logits = z W^T + b" +
                                     (", and the proxies" if any(
                                         has_proxies(losses[t]) for t in model.heads) else ""))
    knn_about = None
    if knn:
        tensors, metadata = datastore_tensors(run, k)
        knn_about = metadata
        save_safetensors(tensors, os.path.join(out, "datastore.safetensors"), metadata)
        files["datastore.safetensors"] = (
            f"kNN's datastore: the training set's {len(tensors['keys'])} keys ({metadata['key']}) "
            f"and labels; K {metadata['k']}, phi {metadata['phi']}, the {metadata['vote']} vote")
    if onnx:
        for file in write_onnx(model, losses, tokenizer.max_len, out):
            files[file] = ("the encoder, ids to last_hidden_state" if file.endswith("model.onnx")
                           else "the classifier, ids to probabilities")
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(card(ckpt, model, losses, name, files, tokenizer.max_len,
                     onnx_inputs(config.model_type) if onnx else None, knn_about, how_far))
    said = [f"{name}: the {config.model_type} encoder, its tokenizer "
            f"({f'from {base}' if base else 'written from the checkpoint'}), and "
            f"sentence-transformers' --pooling {model.pooling}, max_seq_length {tokenizer.max_len}",
            f"{name}: also " + ", ".join(f for f in files if f.endswith((".safetensors", ".onnx"))
                                         and f != "model.safetensors")
            + (", and " if len(files) > 5 else "") + "README.md, the model card"]
    if model.heads:
        said.append(f"note: transformers' pipeline(\"text-classification\") and "
                    f"AutoModelForSequenceClassification do not read head.safetensors: "
                    f"{name}/README.md says how to classify")
    return said


def unfinished(folder, epoch=0):
    """How far the run in `folder` got, in words, when it did not finish ("stopped after epoch 1
    of 2"; "diverged after ..."), else None: it finished, or `folder` holds no run.json. Its
    status is run.run_status's; the epochs done, metrics.jsonl's (or the checkpoint's `epoch`
    where later: a kill between its save and metrics.jsonl's); those planned, run.json's."""
    status, path = run_status(folder), os.path.join(folder, "run.json")
    if status == "finished" or not os.path.isfile(path):
        return None
    planned = (read_json(path).get("args") or {}).get("epochs", "?")
    metrics = os.path.join(folder, "metrics.jsonl")
    done = max(len(read_jsonl(metrics)) if os.path.exists(metrics) else 0, epoch or 0)
    return f"{status} after epoch {done} of {planned}"


def temporary_folder(out):
    """(path, descriptor): a new folder beside OUT, .<OUT's name>.<8 hex digits>.tmp, that this
    export writes into, locked (flock on the descriptor) while it does. First the temporary folders
    of earlier exports to OUT that nothing holds (a kill -9, a power cut: they had no chance to
    remove theirs) are removed; a live export's is held, and left (files.remove_leftovers does the
    same for a run's files)."""
    parent, name = os.path.split(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    ours = re.compile(re.escape(f".{name}.") + r"[0-9a-f]{8}\.tmp")
    for left in sorted(f for f in os.listdir(parent) if ours.fullmatch(f)):
        fd = hold(os.path.join(parent, left))
        if fd is not None:
            shutil.rmtree(os.path.join(parent, left), ignore_errors=True)
            os.close(fd)
    while True:
        tmp = os.path.join(parent, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            os.mkdir(tmp)  # a folder's usual mode (the umask's), not mkdtemp's private 0700
        except FileExistsError:
            continue
        fd = hold(tmp)
        if fd is not None:  # else another export to OUT took it for a leftover: another name
            return tmp, fd


def hold(folder):
    """An open descriptor of `folder` with an exclusive lock on it, or None: a live export holds
    it, or it is gone (removed as a leftover before it was locked), or it is not a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if is_there(fd, folder):
            return fd
    except BlockingIOError:
        pass
    os.close(fd)
    return None


def main(argv=None):
    p = Parser(prog="python -m minknn.tools.export", description=__doc__.split("\n")[0])
    p.add_argument("run", metavar="RUN", help="a run folder train.py wrote, or its checkpoint.pt")
    p.add_argument("out", metavar="OUT", help="the folder to write: a new one, or empty")
    p.add_argument("--onnx", action="store_true",
                   help="also onnx/model.onnx (the encoder, for sentence-transformers' ONNX "
                        "backend) and onnx/classifier.onnx (ids to probabilities, for "
                        "onnxruntime); needs pip install -e '.[onnx]'")
    p.add_argument("--knn", action="store_true",
                   help="also datastore.safetensors: the kNN datastore's keys and labels, as "
                        "evaluate.py --knn builds it (reads the run's training set)")
    p.add_argument("--k", type=int, default=None,
                   help="with --knn, the K the card's kNN code votes with (default: evaluate.py's, "
                        "64 for classification, 5 for multi-label)")
    args = p.parse_args(argv)
    if args.onnx:
        check_onnx()
    out = os.path.normpath(args.out)
    try:
        taken = os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out))
    except OSError as e:  # a folder that cannot be listed
        raise MinknnError(f"OUT {args.out}: cannot be read ({e.strerror})") from None
    if taken:
        raise MinknnError(f"OUT {args.out}: already exists and is not an empty folder; the export "
                          f"never overwrites (give a new folder)")
    if not os.path.exists(args.run):
        raise MinknnError(f"RUN {args.run}: not found")
    if os.path.isdir(args.run) and not no_checkpoint(args.run) and \
            not os.path.exists(os.path.join(args.run, "checkpoint.pt")):
        raise MinknnError(f"RUN {args.run}: has no checkpoint.pt (give a folder train.py wrote "
                          f"with --out, or its checkpoint file)")
    ckpt = run_checkpoint(args.run, "RUN", "exporting")  # a run that kept none, or has none yet
    if args.knn and len(ckpt.get("tasks", {})) != 1:
        raise MinknnError(f"--knn: writes one task's datastore; this run has the tasks "
                          f"{', '.join(ckpt.get('tasks', {}))}")
    folder = args.run if os.path.isdir(args.run) else os.path.dirname(args.run) or "."
    # a run that did not finish is said first (one still training: run_checkpoint's note said it)
    how_far = None if training(folder) else unfinished(folder, ckpt.get("epoch"))
    # written into a temporary folder beside OUT and renamed at the end: OUT is whole or absent,
    # and the temporary folder goes however the export ends (an error, Ctrl-C, SIGTERM)
    tmp, held = None, None
    try:
        tmp, held = temporary_folder(out)
        lines = export(ckpt, tmp, args.out, args.onnx, args.knn, args.run, args.k, how_far)
        os.rename(tmp, out)
    except OSError as e:  # a file the export reads (the base folder's tokenizer) names itself
        read = tmp and isinstance(e.filename, str) and not e.filename.startswith(tmp)
        raise MinknnError(f"{e.filename}: cannot be read ({e.strerror}); OUT {args.out} was not "
                          f"written" if read else
                          f"OUT {args.out}: cannot be written ({e.strerror})") from None
    finally:
        if tmp and os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        if held is not None:
            os.close(held)
    if how_far:
        lines.insert(0, f"note: RUN {args.run}: the run {how_far} (not finished); {args.out} "
                        f"holds its checkpoint.pt, epoch {ckpt.get('epoch')}, and its README.md "
                        f"says so")
    for line in lines:
        print(line)
    return out


if __name__ == "__main__":
    run(main)
