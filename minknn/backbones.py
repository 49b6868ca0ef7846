"""RoBERTa and DistilBERT: BERT (minknn/bert.py) with a few changes, each written where it acts.
This file is also the one place that reads which of them a model folder holds (config.json's
`model_type`) and builds it.

    RoBERTa (Liu et al. 2019)   the same post-LN transformer and the same weight names under
                                `roberta.`; what differs:
        positions               numbered from padding_idx + 1, not 0 (RobertaPositions)
        token types             a table of one row: every token is type 0, and a pair is told
                                apart by its separators, <s> a </s></s> b </s> (minknn/tokenizer.py)
        tokenizer               byte-level BPE (vocab.json + merges.txt), not WordPiece
        pooler                  none trained: roberta-base's checkpoint carries no pooler weights,
                                and minknn pools the hidden states itself (minknn/model.py)
    DistilBERT (Sanh et al. 2019)   BERT with half the layers, distilled; what differs:
        token types             none (NoTokenTypes)
        attention output        added to its input without dropout (DistilBertModel)
        config.json, weights    other names for the same numbers (DISTILBERT_CONFIG and
                                DISTILBERT_NAMES translate them to BERT's)
        pooler                  none

--pooling cls pools the first token, [CLS] for BERT and DistilBERT, <s> for RoBERTa.
"""
import json
import os

import torch
import torch.nn as nn

from minknn import MinknnError
from minknn.bert import HEADS, BertConfig, BertEmbeddings, BertModel
from minknn.files import read_json
from minknn.weights import ARCHITECTURES, FOLDER_NEEDS, read_weights, resolve_model_path


class RobertaPositions(nn.Embedding):
    """RoBERTa's position table. It keeps fairseq's numbering: row padding_idx belongs to padding,
    and the token at index i of its row (0, 1, ..., as BERT counts) reads row padding_idx + 1 + i;
    hence roberta-base's 514 rows for 512 tokens. Read from row 0, as BERT's, it would give every
    token another position's vector."""

    def __init__(self, config):
        super().__init__(config.max_position_embeddings, config.hidden_size)
        self.first = config.pad_token_id + 1

    def forward(self, positions):
        return super().forward(positions + self.first)


class RobertaEmbeddings(BertEmbeddings):
    """BERT's embeddings (BertEmbeddings.forward, unchanged) with RoBERTa's position table. Its
    token-type table has one row (type_vocab_size 1): every token is type 0.
    (transformers counts positions over the ids that are not <pad>, so there a "<pad>" written
    inside a text takes no position; here, as every other token, it takes the next one.)"""

    def __init__(self, config):
        super().__init__(config)
        self.position_embeddings = RobertaPositions(config)


class RobertaModel(BertModel):
    embeddings_class, pooler_class, prefix = RobertaEmbeddings, None, "roberta."
    heads = ("lm_head.", "classifier.", "pooler.")  # a pooler, when a checkpoint has one, unused


class NoTokenTypes(nn.Module):
    """DistilBERT has no token-type (segment) table: a token's type adds nothing (zeros, (N, H)),
    and a pair's types are ignored (DistilBERT was trained without them). Nothing to load."""

    def __init__(self, config):
        super().__init__()
        self.register_buffer("zeros", torch.zeros(config.hidden_size), persistent=False)

    def forward(self, types):
        return self.zeros.expand(*types.shape, -1)


class DistilBertEmbeddings(BertEmbeddings):
    """BERT's embeddings (BertEmbeddings.forward, unchanged) without the token types:
    E = Dropout(LayerNorm(word[x] + position[i]))."""

    def __init__(self, config):
        super().__init__(config)
        self.token_type_embeddings = NoTokenTypes(config)


# DistilBERT's config.json keys -> BERT's, with DistilBERT's defaults (transformers'
# DistilBertConfig); its LayerNorm eps is fixed at 1e-12, BERT's default.
DISTILBERT_CONFIG = {"dim": ("hidden_size", 768), "n_layers": ("num_hidden_layers", 6),
                     "n_heads": ("num_attention_heads", 12),
                     "hidden_dim": ("intermediate_size", 3072),
                     "dropout": ("hidden_dropout_prob", 0.1),
                     "attention_dropout": ("attention_probs_dropout_prob", 0.1),
                     "activation": ("hidden_act", "gelu"), "vocab_size": ("vocab_size", 30522),
                     "max_position_embeddings": ("max_position_embeddings", 512),
                     "pad_token_id": ("pad_token_id", 0)}
# a DistilBERT layer's tensors -> the same tensors in BERT's layer (the same maths)
DISTILBERT_NAMES = {"attention.q_lin": "attention.self.query",
                    "attention.k_lin": "attention.self.key",
                    "attention.v_lin": "attention.self.value",
                    "attention.out_lin": "attention.output.dense",
                    "sa_layer_norm": "attention.output.LayerNorm",
                    "ffn.lin1": "intermediate.dense", "ffn.lin2": "output.dense",
                    "output_layer_norm": "output.LayerNorm"}


class DistilBertModel(BertModel):
    embeddings_class, pooler_class, prefix = DistilBertEmbeddings, None, "distilbert."
    heads = ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.", "pre_classifier.",
             *HEADS)

    def __init__(self, config):
        super().__init__(config)
        for layer in self.encoder.layer:  # DistilBERT's block: sa_layer_norm(attention(x) + x),
            layer.attention.output.dropout.p = 0.0  # with no dropout on the attention's output

    @staticmethod
    def own_name(name):
        """transformer.layer.3.ffn.lin1.weight -> encoder.layer.3.intermediate.dense.weight."""
        if name.startswith("transformer.layer."):
            _, _, n, rest = name.split(".", 3)
            for theirs, ours in DISTILBERT_NAMES.items():
                if rest.startswith(theirs + "."):
                    return f"encoder.layer.{n}.{ours}{rest[len(theirs):]}"
        return name  # the embeddings' names are BERT's; anything else is refused by name

    @staticmethod
    def file_name(name):
        """encoder.layer.3.intermediate.dense.weight -> transformer.layer.3.ffn.lin1.weight, so
        that a message names a tensor as the file does."""
        if name.startswith("encoder.layer."):
            _, _, n, rest = name.split(".", 3)
            for theirs, ours in DISTILBERT_NAMES.items():
                if rest.startswith(ours + "."):
                    return f"transformer.layer.{n}.{theirs}{rest[len(ours):]}"
        return name


MODELS = {"bert": BertModel, "roberta": RobertaModel, "distilbert": DistilBertModel}
assert tuple(MODELS) == ARCHITECTURES


def config_from_dict(d, source="config.json"):
    """The BertConfig of a Hugging Face config.json's contents (source: its path, for errors):
    the architecture from model_type (absent: BERT), DistilBERT's keys translated."""
    if not isinstance(d, dict):
        raise MinknnError(f"{source}: not a JSON object")
    model_type = d.get("model_type", "bert")
    if model_type not in ARCHITECTURES:
        raise MinknnError(f"{source}: model_type {json.dumps(model_type)} is not implemented; "
                          f"minknn's encoder runs {', '.join(ARCHITECTURES)}")
    if model_type == "roberta":  # transformers' RobertaConfig defaults, where they are not BERT's
        d = {"pad_token_id": 1, "vocab_size": 50265, **d}
    if model_type == "distilbert":
        sine = d.get("sinusoidal_pos_embds", False)  # transformers reads it as a truth value
        if sine:
            raise MinknnError(f"{source}: sinusoidal_pos_embds {json.dumps(sine)} is not "
                              f"implemented (fixed sine positions; the released DistilBERT "
                              f"checkpoints learn their positions, as BERT does)")
        if d.get("activation", "gelu") != "gelu":
            raise MinknnError(f"{source}: activation {json.dumps(d['activation'])} is not "
                              f"implemented (another activation); the encoder runs \"gelu\"")
        d = {ours: d.get(theirs, default) for theirs, (ours, default) in DISTILBERT_CONFIG.items()}
        d["model_type"] = "distilbert"
    return BertConfig.from_dict(d, source)


def read_config(path):
    """The BertConfig of a model folder's config.json."""
    file = os.path.join(path, "config.json")
    return config_from_dict(read_json(file, FOLDER_NEEDS), file)


def build(config):
    """A randomly initialised encoder of config's architecture."""
    return MODELS[config.model_type](config)


def from_pretrained(path):
    """The encoder of a Hugging Face-format folder of any of ARCHITECTURES ('minilm': the default
    model), its weights loaded by name."""
    path = resolve_model_path(path)
    model = build(read_config(path))
    model.load_weights(*read_weights(path))
    return model
