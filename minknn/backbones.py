"""RoBERTa, DistilBERT and MPNet: BERT (minknn/bert.py) with a few changes, each written where
it acts. This file is also the one place that reads which of them a model folder holds
(config.json's `model_type`) and builds it.

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
    MPNet (Song et al. 2020)    the same post-LN transformer, pre-trained by a mix of masked and
                                permuted language modelling; what differs:
        relative positions      each layer adds to its attention scores a learned bias for each
                                head and each query-to-key distance, read from one table of 32
                                buckets that all layers share (MPNetEncoder, relative_buckets)
        positions               also absolute, numbered from padding_idx + 1 as RoBERTa's
        token types             none (NoTokenTypes); a pair is <s> a </s></s> b </s>
        tokenizer               BERT's lower-cased WordPiece with RoBERTa's special tokens
                                (minknn/tokenizer.py MPNetTokenizer)
        config.json, weights    MPNetConfig's defaults (MPNET_FIXED: what its code fixes); the
                                attention's weights under other names (MPNET_NAMES)
        pooler                  none used: all-mpnet-base-v2 carries BERT's (trained for no
                                task of its own; it is mean-pooled), a masked-LM checkpoint none

--pooling cls pools the first token, [CLS] for BERT and DistilBERT, <s> for RoBERTa and MPNet.
"""
import json
import math
import os

import torch
import torch.nn as nn

from minknn import MinknnError
from minknn.bert import HEADS, BertConfig, BertEmbeddings, BertEncoder, BertModel
from minknn.tools.files import read_json
from minknn.tools.weights import ARCHITECTURES, FOLDER_NEEDS, read_weights, resolve_model_path


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
        """transformer.layer.3.ffn.lin1.weight -> encoder.layer.3.intermediate.dense.weight. The
        embeddings' names are BERT's; anything else is refused by name."""
        return renamed(name, DISTILBERT_NAMES, "transformer.layer.", "encoder.layer.")

    @staticmethod
    def file_name(name):
        """encoder.layer.3.intermediate.dense.weight -> transformer.layer.3.ffn.lin1.weight, so
        that a message names a tensor as the file does."""
        return renamed(name, {ours: theirs for theirs, ours in DISTILBERT_NAMES.items()},
                       "encoder.layer.", "transformer.layer.")


def renamed(name, names, layers="encoder.layer.", to="encoder.layer."):
    """A layer's tensor name, <layers>N.<old>.rest -> <to>N.<new>.rest, for the first (old, new)
    of `names` whose old begins the part after the layer's number; any other name unchanged."""
    if name.startswith(layers):
        n, rest = name[len(layers):].split(".", 1)
        for old, new in names.items():
            if rest.startswith(old + "."):
                return f"{to}{n}.{new}{rest[len(old):]}"
    return name


def relative_buckets(T, num_buckets=32, max_distance=128, device=None):
    """The bucket of each (query i, key j) pair of a T-token sequence, (T, T) longs: MPNet's
    relative positions, bucketed as T5's (Raffel et al. 2020, section 2.1; transformers'
    modeling_mpnet.py relative_position_bucket is MPNet's code). Half the buckets are for keys at
    or before the query, half for keys after it; in each half, distances 0 to 7 (max_exact) have
    a bucket each, and distances 8 to 127 share the other 8 buckets on a log scale (the farther,
    the coarser); 128 and beyond all fall in the last:
        n = |i - j|,  b = n                                             if n < max_exact
                      b = min(max_exact + floor(log(n / max_exact) / log(max_distance / max_exact)
                                             * (half - max_exact)), half - 1)    otherwise
        bucket = b + half if j > i else b          (half = num_buckets / 2, max_exact = half / 2)
    """
    half = num_buckets // 2
    max_exact = half // 2
    i = torch.arange(T, device=device)[:, None]  # queries, down the rows
    j = torch.arange(T, device=device)[None, :]  # keys, along the columns
    n = (i - j).abs()
    # float32, as MPNet's code computes it, so that a distance on a bucket's edge rounds the same
    far = max_exact + (torch.log(n.clamp(min=max_exact).float() / max_exact)
                       / math.log(max_distance / max_exact) * (half - max_exact)).long()
    b = torch.where(n < max_exact, n, far.clamp(max=half - 1))
    return b + half * (j > i)


class MPNetEncoder(BertEncoder):
    """BERT's layers, and the table of relative-position biases they all share: one row per
    bucket, one column per head (relative_attention_bias, (num_buckets, nh)). The bias of a
    (query, key) pair is its bucket's row: computed once per batch, added to the attention scores
    of every layer, beside the padding's mask (packing.bias, which Packing.mask adds to it)."""

    def __init__(self, config):
        super().__init__(config)
        self.num_buckets = config.relative_attention_num_buckets
        self.relative_attention_bias = nn.Embedding(self.num_buckets,
                                                    config.num_attention_heads)

    def forward(self, h, packing):
        buckets = relative_buckets(packing.T, self.num_buckets, device=h.device)  # (T, T)
        # (T, T, nh) -> (1, nh, T, T): a head's bias for each query (row) and key (column)
        packing.bias = self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)
        return super().forward(h, packing)


class MPNetEmbeddings(BertEmbeddings):
    """BERT's embeddings (BertEmbeddings.forward, unchanged) with RoBERTa's position table
    (numbered from padding_idx + 1) and no token types:
    E = Dropout(LayerNorm(word[x] + position[i]))."""

    def __init__(self, config):
        super().__init__(config)
        self.position_embeddings = RobertaPositions(config)
        self.token_type_embeddings = NoTokenTypes(config)


# an MPNet layer's attention tensors -> the same tensors in BERT's layer (the same maths:
# LayerNorm(h + Dropout(Attention(h) W_o)), with W_o called `o` and its norm one level up)
MPNET_NAMES = {"attention.attn.q": "attention.self.query",
               "attention.attn.k": "attention.self.key",
               "attention.attn.v": "attention.self.value",
               "attention.attn.o": "attention.output.dense",
               "attention.LayerNorm": "attention.output.LayerNorm"}


class MPNetModel(BertModel):
    embeddings_class, encoder_class, pooler_class = MPNetEmbeddings, MPNetEncoder, None
    prefix, heads = "mpnet.", ("lm_head.", "classifier.", "pooler.")  # a pooler, when one, unused

    @staticmethod
    def own_name(name):
        """encoder.layer.3.attention.attn.q.weight -> encoder.layer.3.attention.self.query.weight"""
        return renamed(name, MPNET_NAMES)

    @staticmethod
    def file_name(name):
        return renamed(name, {ours: theirs for theirs, ours in MPNET_NAMES.items()})



MODELS = {"bert": BertModel, "roberta": RobertaModel, "distilbert": DistilBertModel,
          "mpnet": MPNetModel}
assert tuple(MODELS) == ARCHITECTURES


# what MPNet's code (transformers' modeling_mpnet.py) fixes whatever config.json says: another
# value there would not be the model the weights were trained as
MPNET_FIXED = (("pad_token_id", 1, "MPNet's positions start after index 1 and its padding is 1"),
               ("relative_attention_num_buckets", 32,
                "MPNet's code buckets relative positions into 32, whatever config.json says"))


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
    if model_type == "mpnet":  # transformers' MPNetConfig defaults, where they are not BERT's
        d = {"pad_token_id": 1, "vocab_size": 30527, "max_position_embeddings": 512,
             "layer_norm_eps": 1e-12, "type_vocab_size": 1, **d}
        for key, only, why in MPNET_FIXED:
            if d.get(key, only) != only:
                raise MinknnError(f"{source}: {key} {json.dumps(d[key])} is not implemented; "
                                  f"{why}")
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
