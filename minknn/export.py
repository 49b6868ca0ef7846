"""A run as a Hugging Face folder that other libraries load: python -m minknn.export RUN OUT.

RUN is a folder train.py wrote (its checkpoint.pt, or the file itself), read as evaluate.py reads
it (minknn/status.py run_checkpoint, minknn/checkpoint.py rebuild; old checkpoints, and a frozen
encoder read back from its base folder, included). OUT, a new folder (or an empty one), then holds:

    config.json         the encoder's BertConfig as transformers reads it for its model_type:
                        backbones.config_from_dict read backwards (DistilBERT's own names,
                        DISTILBERT_CONFIG; MPNet's relative_attention_num_buckets), and the bare
                        model as its architecture (BertModel, RobertaModel, ...)
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

transformers' AutoModel.from_pretrained(OUT) then gives minknn's last hidden states, and
SentenceTransformer(OUT).encode the z minknn pools (tests/test_export.py: within 1e-5).

The heads are not written. Each is a linear layer on z (minknn/model.py), and for none of these
backbones does AutoModelForSequenceClassification compute that: between the encoder and its
linear layer it puts
    BertForSequenceClassification        tanh(W_p h_[CLS] + b_p)    BERT's pooler
    RobertaForSequenceClassification     tanh(W_d h_<s> + b_d)      a dense layer of its own
    MPNetForSequenceClassification       tanh(W_d h_<s> + b_d)      likewise
    DistilBertForSequenceClassification  ReLU(W_p h_[CLS] + b_p)    pre_classifier
and no weights make a tanh or a ReLU the identity. The export says so in one line and writes the
encoder. kNN and proxy inference, and the --decoupled retrieval head, are minknn's own: not
written either (SentenceTransformer(OUT) gives the z a datastore of the run's --pooling holds).
"""
import dataclasses
import json
import os
import shutil
import tempfile

from minknn import MinknnError
from minknn.backbones import DISTILBERT_CONFIG, config_from_dict
from minknn.checkpoint import rebuild
from minknn.cli import Parser, run
from minknn.model import POOLINGS
from minknn.status import no_checkpoint, run_checkpoint
from minknn.tokenizer import OPTIONS, Tokenizer
from minknn.weights import resolve_model_path, save_safetensors

# transformers' name of each architecture: <Name>Model, <Name>Tokenizer, ...
NAMES = {"bert": "Bert", "roberta": "Roberta", "distilbert": "DistilBert", "mpnet": "MPNet"}
# what <Name>ForSequenceClassification puts between the encoder and its linear layer (above)
THEIR_HEADS = {"bert": "BERT's pooler, tanh(W h[CLS] + b),",
               "roberta": "a dense layer and tanh on <s>", "mpnet": "a dense layer and tanh on <s>",
               "distilbert": "pre_classifier and a ReLU on [CLS]"}
# a model folder's tokenizer files, whichever it has (added_tokens.json is left out: tokens
# minknn's tokenizer does not add)
TOKENIZER_FILES = ("vocab.txt", "vocab.json", "merges.txt", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json")
# --pooling -> sentence-transformers' pooling mode (1_Pooling/config.json)
ST_POOLING = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
              "max": "pooling_mode_max_tokens"}
assert tuple(ST_POOLING) == POOLINGS, "a new --pooling needs its sentence-transformers mode"


def hf_config(config):
    """config.json's contents for the run's BertConfig: backbones.config_from_dict backwards."""
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


def head_note(model, out):
    """The one line that says why the run's heads are not in OUT (the module docstring), or None
    for a run with no head (a siamese similarity task's score is a cosine)."""
    heads = list(model.heads)
    if not heads:
        return None
    kind = model.bert.config.model_type
    if len(heads) > 1:
        what = (f"the heads of {', '.join(heads)}: AutoModelForSequenceClassification holds one "
                f"head")
    elif model.siamese(model.tasks[heads[0]]):
        what = (f"the {heads[0]} head, on [u, v, |u - v|] of two texts encoded alone "
                f"(--pair_mode siamese), which AutoModelForSequenceClassification does not compute")
    else:
        what = (f"the {heads[0]} head, a linear layer on z (--pooling {model.pooling}): "
                f"{NAMES[kind]}ForSequenceClassification puts {THEIR_HEADS[kind]} before its "
                f"linear layer")
    return f"note: not written: {what}; {out} holds the encoder and z (sentence-transformers)"


def export(ckpt, out, name):
    """Writes the checkpoint's run to the folder `out` (which exists, empty) and returns the lines
    that say what it holds, the folder called `name` there."""
    model, _, tokenizer = rebuild(ckpt)
    config = model.bert.config
    write_json(os.path.join(out, "config.json"), hf_config(config))
    save_safetensors(hf_weights(model.bert), os.path.join(out, "model.safetensors"))
    base = base_folder(ckpt, tokenizer)
    if base:
        for file in TOKENIZER_FILES:
            if os.path.exists(os.path.join(base, file)):
                shutil.copy(os.path.join(base, file), out)
    else:
        write_tokenizer(tokenizer, config.model_type, out)
    write_sentence_transformers(out, model.pooling, config.hidden_size, tokenizer.max_len)
    said = (f"{name}: the {config.model_type} encoder, its tokenizer "
            f"({f'from {base}' if base else 'written from the checkpoint'}), and "
            f"sentence-transformers' --pooling {model.pooling}, max_seq_length {tokenizer.max_len}")
    return [said] + [line for line in [head_note(model, name)] if line]


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("run", metavar="RUN", help="a run folder train.py wrote, or its checkpoint.pt")
    p.add_argument("out", metavar="OUT", help="the folder to write: a new one, or empty")
    args = p.parse_args(argv)
    out = os.path.normpath(args.out)
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise MinknnError(f"OUT {args.out}: already exists and is not an empty folder; the export "
                          f"never overwrites (give a new folder)")
    if not os.path.exists(args.run):
        raise MinknnError(f"RUN {args.run}: not found")
    if os.path.isdir(args.run) and not no_checkpoint(args.run) and \
            not os.path.exists(os.path.join(args.run, "checkpoint.pt")):
        raise MinknnError(f"RUN {args.run}: has no checkpoint.pt (give a folder train.py wrote "
                          f"with --out, or its checkpoint file)")
    ckpt = run_checkpoint(args.run, "RUN", "exporting")  # a run that kept none, or has none yet
    # written into a temporary folder beside OUT and renamed at the end: OUT is whole or absent
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # a folder's usual mode, not mkdtemp's private 0700
    try:
        lines = export(ckpt, tmp, args.out)
        os.rename(tmp, out)
    except OSError as e:
        raise MinknnError(f"OUT {args.out}: cannot be written ({e.strerror})") from None
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    for line in lines:
        print(line)
    return out


if __name__ == "__main__":
    run(main)
