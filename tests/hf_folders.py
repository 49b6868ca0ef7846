"""Tiny random RoBERTa, DistilBERT and MPNet folders in the Hugging Face layout, for the parity
tests.

Each writer makes what transformers' `save_pretrained` would for a RobertaForMaskedLM,
DistilBertForMaskedLM or MPNetForMaskedLM checkpoint and its tokenizer: config.json,
model.safetensors and the tokenizer's files. The tensor names and shapes below are read off
transformers' own modelling code (models/roberta/modeling_roberta.py,
models/distilbert/modeling_distilbert.py, models/mpnet/modeling_mpnet.py), NOT off
minknn's loader, so that a naming mistake in minknn is not copied into the fixture;
tests/fixtures/make_backbones.py checks them against transformers' own `save_pretrained`.

The values are random, seeded, and not the usual 1 and 0 of LayerNorm weights and biases:
    matrices and embeddings   N(0, 0.02)
    LayerNorm weights         1 + N(0, 0.1)    (the only 1-D tensors named .weight)
    every bias                N(0, 0.02)
so a LayerNorm or a bias loaded into the wrong place, or not at all, changes the outputs.

    write_roberta(folder, seed=0, pooler=False, vocab=None, merges=None, **config)
        vocab.json + merges.txt: tests/fixtures/bpe unless given; no pooler, as roberta-base
    write_distilbert(folder, seed=0, vocab=None, **config)
        vocab.txt: helpers.tiny_vocab() unless given; tokenizer_config.json: do_lower_case
    write_mpnet(folder, seed=0, vocab=None, **config)
        vocab.txt: MPNet's special tokens around helpers.tiny_vocab() unless given (as
        all-mpnet-base-v2's: <s> <pad> </s> <unk> first, <mask> last); 256 positions, so that
        query-to-key distances reach past the 128 where MPNet's relative buckets stop growing
(**config: config.json's keys to change, e.g. hidden_size=768.)
"""
import json
import os

import torch

from helpers import FIXTURES, tiny_vocab
from minknn.tools.weights import save_safetensors

BPE = os.path.join(FIXTURES, "bpe")  # a byte-level BPE trained on fixtures/data (make_backbones.py)

# roberta-base's config.json, made tiny: 64 tokens fit, as positions start after padding_idx = 1
ROBERTA = dict(model_type="roberta", architectures=["RobertaForMaskedLM"], hidden_size=32,
               num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
               eos_token_id=2, layer_norm_eps=1e-5, hidden_act="gelu", hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1, initializer_range=0.02)
# distilbert-base-uncased's config.json, made tiny (its LayerNorm eps is fixed in the code: 1e-12)
DISTILBERT = dict(model_type="distilbert", architectures=["DistilBertForMaskedLM"], dim=32,
                  n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64,
                  activation="gelu", sinusoidal_pos_embds=False, pad_token_id=0, dropout=0.1,
                  attention_dropout=0.1, initializer_range=0.02, qa_dropout=0.1,
                  seq_classif_dropout=0.2)


# all-mpnet-base-v2's config.json, made tiny, with 258 positions (256 tokens: positions start after
# padding_idx = 1); relative_attention_num_buckets is the 32 MPNet's code always uses
MPNET = dict(model_type="mpnet", architectures=["MPNetForMaskedLM"], hidden_size=32,
             num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=258, relative_attention_num_buckets=32, pad_token_id=1,
             bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, hidden_act="gelu",
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)
MPNET_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0-3, then the WordPiece; <mask> last


def linear(name, n_out, n_in):
    return {f"{name}.weight": (n_out, n_in), f"{name}.bias": (n_out,)}  # nn.Linear stores (out, in)


def layer_norm(name, n):
    return {f"{name}.weight": (n,), f"{name}.bias": (n,)}


def roberta_shapes(c, pooler=False):
    """{name: shape} of a RobertaForMaskedLM checkpoint (RobertaModel without its pooler, as
    roberta-base ships, then the masked-LM head; its decoder is tied to the word embedding, so
    save_pretrained leaves it out)."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    shapes = {"roberta.embeddings.word_embeddings.weight": (V, H),
              "roberta.embeddings.position_embeddings.weight": (c["max_position_embeddings"], H),
              "roberta.embeddings.token_type_embeddings.weight": (c["type_vocab_size"], H),
              **layer_norm("roberta.embeddings.LayerNorm", H)}
    for i in range(c["num_hidden_layers"]):
        p = f"roberta.encoder.layer.{i}."
        shapes.update({**linear(p + "attention.self.query", H, H),
                       **linear(p + "attention.self.key", H, H),
                       **linear(p + "attention.self.value", H, H),
                       **linear(p + "attention.output.dense", H, H),
                       **layer_norm(p + "attention.output.LayerNorm", H),
                       **linear(p + "intermediate.dense", I, H),
                       **linear(p + "output.dense", H, I),
                       **layer_norm(p + "output.LayerNorm", H)})
    if pooler:
        shapes.update(linear("roberta.pooler.dense", H, H))
    shapes.update({**linear("lm_head.dense", H, H), **layer_norm("lm_head.layer_norm", H),
                   "lm_head.bias": (V,)})
    return shapes


def distilbert_shapes(c):
    """{name: shape} of a DistilBertForMaskedLM checkpoint (no token types, no pooler; its
    vocab_projector's weight is tied to the word embedding, so save_pretrained leaves it out)."""
    D, F, V = c["dim"], c["hidden_dim"], c["vocab_size"]
    shapes = {"distilbert.embeddings.word_embeddings.weight": (V, D),
              "distilbert.embeddings.position_embeddings.weight": (c["max_position_embeddings"], D),
              **layer_norm("distilbert.embeddings.LayerNorm", D)}
    for i in range(c["n_layers"]):
        p = f"distilbert.transformer.layer.{i}."
        shapes.update({**linear(p + "attention.q_lin", D, D), **linear(p + "attention.k_lin", D, D),
                       **linear(p + "attention.v_lin", D, D),
                       **linear(p + "attention.out_lin", D, D),
                       **layer_norm(p + "sa_layer_norm", D),
                       **linear(p + "ffn.lin1", F, D), **linear(p + "ffn.lin2", D, F),
                       **layer_norm(p + "output_layer_norm", D)})
    shapes.update({**linear("vocab_transform", D, D), **layer_norm("vocab_layer_norm", D),
                   "vocab_projector.bias": (V,)})
    return shapes


def mpnet_shapes(c):
    """{name: shape} of an MPNetForMaskedLM checkpoint (MPNetModel without its pooler, then the
    masked-LM head, whose decoder is tied to the word embedding). The attention's four matrices
    are attn.q, .k, .v, .o, its LayerNorm one level up; the relative-position bias is one table
    under the encoder, (buckets, heads)."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    shapes = {"mpnet.embeddings.word_embeddings.weight": (V, H),
              "mpnet.embeddings.position_embeddings.weight": (c["max_position_embeddings"], H),
              **layer_norm("mpnet.embeddings.LayerNorm", H)}
    for i in range(c["num_hidden_layers"]):
        p = f"mpnet.encoder.layer.{i}."
        shapes.update({**linear(p + "attention.attn.q", H, H),
                       **linear(p + "attention.attn.k", H, H),
                       **linear(p + "attention.attn.v", H, H),
                       **linear(p + "attention.attn.o", H, H),
                       **layer_norm(p + "attention.LayerNorm", H),
                       **linear(p + "intermediate.dense", I, H),
                       **linear(p + "output.dense", H, I),
                       **layer_norm(p + "output.LayerNorm", H)})
    shapes["mpnet.encoder.relative_attention_bias.weight"] = (
        c["relative_attention_num_buckets"], c["num_attention_heads"])
    shapes.update({**linear("lm_head.dense", H, H), **layer_norm("lm_head.layer_norm", H),
                   "lm_head.bias": (V,)})
    return shapes


def random_weights(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in shapes.items():
        x = torch.randn(shape, generator=g)
        layer_norm_weight = len(shape) == 1 and name.endswith(".weight")
        weights[name] = 1 + 0.1 * x if layer_norm_weight else 0.02 * x
    return weights


def write_folder(folder, config, weights):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_safetensors(weights, os.path.join(folder, "model.safetensors"))


def bpe_vocab():
    """The committed BPE: ({token: id} of vocab.json, the lines of merges.txt)."""
    with open(os.path.join(BPE, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(BPE, "merges.txt"), encoding="utf-8") as f:
        merges = f.read().splitlines()
    return vocab, merges


def write_roberta(folder, seed=0, pooler=False, vocab=None, merges=None, **overrides):
    """A random RoBERTa folder; vocab ({token: id}) and merges (merges.txt's lines, its
    "#version" header included) default to the committed BPE. Returns {name: tensor}."""
    if vocab is None:
        vocab, merges = bpe_vocab()
    config = {**ROBERTA, "vocab_size": len(vocab), **overrides}
    weights = random_weights(roberta_shapes(config, pooler), seed)
    write_folder(folder, config, weights)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(merges) + "\n")
    return weights


def write_distilbert(folder, seed=0, vocab=None, **overrides):
    """A random DistilBERT folder; vocab (vocab.txt's lines) defaults to helpers.tiny_vocab(),
    lower-cased WordPiece. Returns {name: tensor}."""
    if vocab is None:
        vocab = tiny_vocab()
    config = {**DISTILBERT, "vocab_size": len(vocab), **overrides}
    weights = random_weights(distilbert_shapes(config), seed)
    write_folder(folder, config, weights)
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True}, f)
    return weights


def mpnet_vocab():
    """A tiny MPNet vocabulary: <s> <pad> </s> <unk>, helpers.tiny_vocab()'s WordPiece (with
    BERT's [PAD] [UNK] [CLS] [SEP] [MASK], as all-mpnet-base-v2's vocab.txt keeps them), <mask>."""
    return MPNET_SPECIAL + tiny_vocab() + ["<mask>"]


def write_mpnet(folder, seed=0, vocab=None, **overrides):
    """A random MPNet folder; vocab (vocab.txt's lines) defaults to mpnet_vocab(). The relative
    bias is drawn 50 times larger than the other weights (N(0, 1)), so that a bias in the wrong
    place, or missing, moves the outputs well past the tests' tolerance. Returns {name: tensor}."""
    if vocab is None:
        vocab = mpnet_vocab()
    config = {**MPNET, "vocab_size": len(vocab), **overrides}
    weights = random_weights(mpnet_shapes(config), seed)
    weights["mpnet.encoder.relative_attention_bias.weight"] *= 50
    write_folder(folder, config, weights)
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "MPNetTokenizer"}, f)
    return weights
