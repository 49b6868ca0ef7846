"""BERT, written out by hand (Devlin et al. 2019, "BERT: Pre-training of Deep
Bidirectional Transformers"; the layer itself is Vaswani et al. 2017's post-LN transformer).

    embeddings   E = LayerNorm(word[x] + position[i] + token_type[t]), then dropout
    each layer   a = LayerNorm(h + Dropout(Attention(h) W_o))        # attention block
                 h = LayerNorm(a + Dropout(GELU(a W_1) W_2))          # feed-forward block
    pooler       pooled = tanh(h[:, 0] W_p)                          # the [CLS] vector

Module and parameter names follow the Hugging Face checkpoints (`encoder.layer.3.attention.
self.query.weight`, ...), so `from_pretrained` loads any BERT folder by name, with no
renaming table to read. RoBERTa and DistilBERT are this model with a few changes, each written
where it acts in minknn/backbones.py, which also decides from config.json which one a folder holds;
so is MPNet, whose one change inside attention (a bias added to the scores for each relative
position) reaches attention() below as part of its additive mask.

Padding costs little here: the layers run on the batch's real tokens only, packed into one (N, H)
matrix (`Packing`), and give each real token what its example gets run alone (tests/test_bert.py);
attention alone puts them back into the padded (B, T) layout, or, with --attention packed on a
GPU, runs over the packed tokens too. minknn/packed.py says how, and why the padded call stays
the default.
Shapes in comments: B batch, T tokens, N real tokens, H hidden, nh heads, hs = H / nh.
"""
import math
import os
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from minknn import MinknnError
from minknn.packed import Packing, packed_attention, packed_kernel
from minknn.tools.files import read_json
from minknn.tools.packaged import notes_left_out
from minknn.tools.weights import (FOLDER_NEEDS, check_config, check_finite, check_fits, check_sizes,
                                  read_weights, resolve_model_path)


HEADS = ("cls.", "classifier.", "qa_outputs.")  # pre-training and task heads in BERT checkpoints
# --attention: "explicit" runs attention() below, as written; "fused" runs PyTorch's
# F.scaled_dot_product_attention, which computes the same thing in one kernel (tests/test_bert.py
# checks they agree, dropout included), over the padded (B, T) layout; "packed" runs PyTorch's
# kernels over the packed tokens where packed_kernel() finds a way (on a GPU; minknn/packed.py),
# else as "fused".
# The student edition (minknn/assignment/edition.py) writes "explicit" here, so that the attention a
# student writes is the one that trains.
ATTENTIONS = ("explicit", "fused", "packed")
ATTENTION = "fused"

# The kernels F.scaled_dot_product_attention may choose from: all but cuDNN's. On an H100 or H200
# PyTorch picks cuDNN's for a masked call, and cuDNN plans a kernel for each new shape; a batch
# padded to its longest brings a new T almost every step, and the planning made train.py's first
# SST epoch 3.3x slower on an H200 (20 s against 6 s, RESULTS.md "How does minknn run on a GPU?").
# The others take any shape as it comes (flash attention without a mask, memory-efficient with one).
SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    model_type: str = "bert"  # weights.ARCHITECTURES' (minknn/backbones.py: what each changes)
    relative_attention_num_buckets: int = 32  # MPNet's relative positions (BERT's: unused)

    @property
    def max_tokens(self):
        """The longest sequence the position table holds: RoBERTa's and MPNet's positions start
        after their padding index (minknn/backbones.py), so 514 positions hold 512 tokens."""
        if self.model_type in ("roberta", "mpnet"):
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    @classmethod
    def from_dict(cls, d, source="config.json"):
        """Reads the keys above from a Hugging Face config.json (source: its path, for errors),
        refuses NOT_IMPLEMENTED options and values the encoder cannot run (minknn/tools/weights.py
        check_config) and ignores the rest (dropout of a task head, use_cache,
        chunk_size_feed_forward: none changes the encoder's output)."""
        check_config(d, fields(cls), source)
        config = cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        check_sizes(config, source)
        return config


def attention(q, k, v, mask, dropout_p=0.0):
    """Scaled dot-product attention, written out.

    q, k, v: (B, nh, T, hs). mask: (B, 1, 1, T) in q's dtype, 0 where a key is a real token and
    the dtype's most negative number where it is padding, so that softmax gives padding weight 0
    (or None when nothing is padded). Not -inf: a row whose keys are all padding would be
    softmax(-inf, ..) = 0/0 = NaN; with a finite number its weights are uniform and finite.
    (MPNet's mask is (B, nh, T, T): the padding's, plus a learned bias for each query's distance
    to each key, minknn/backbones.py. Added to the scores all the same.)
        Attention(Q, K, V) = softmax(Q K^T / sqrt(hs) + mask) V
    """
    # The scores (B, nh, T, T): one per query and key. Add the mask before the softmax, over the
    # keys (the last dimension). Dropout acts on the weights (F.dropout(probs, p=dropout_p)),
    # as BERT's does, not on the scores or the output.
    # BEGIN part attention
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, nh, T, T)
    if mask is not None:
        scores = scores + mask
    probs = F.softmax(scores, dim=-1)
    probs = F.dropout(probs, p=dropout_p)  # BERT drops attention weights, not just outputs
    return probs @ v  # (B, nh, T, hs)
    # END part attention


class BertSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.kernel = ATTENTION  # one of ATTENTIONS: BertModel.set_attention

    def forward(self, h, packing):
        """h: (N, H), the real tokens packed; returns (N, H)."""
        B, T, H = packing.B, packing.T, h.size(-1)
        # Q, K and V in one (H -> 3H) matmul: one big matmul runs closer to peak than three
        # small ones
        w = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # (3H, H)
        b = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = F.linear(h, w, b).view(-1, 3, self.num_heads, H // self.num_heads)  # (N, 3, nh, hs)
        p = self.dropout_p if self.training else 0.0
        how = packed_kernel(self.kernel, qkv, p, packing)
        if how:  # each row's tokens attend to each other where they lie: no padding at all
            return packed_attention(how, *qkv.unbind(1), packing, p).reshape(-1, H)
        qkv = packing.unpack(qkv)  # (B, T, 3, nh, hs): the padded call needs the sequences
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, nh, T, hs): a head per subspace
        mask = packing.mask(q.dtype)  # padding (and MPNet's bias): built once, for every layer
        if self.kernel in ("fused", "packed"):
            with sdpa_kernel(SDPA_KERNELS):  # not cuDNN's (SDPA_KERNELS says why)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            out = attention(q, k, v, mask, p)
        # concatenate the heads again, and keep the real tokens' rows (padding queries are dropped)
        return packing.pack(out.transpose(1, 2).reshape(B, T, H))


class BertOutput(nn.Module):
    """Project back to H, dropout, add the residual, LayerNorm. Used twice per layer: after the
    attention (in_features H, W_o) and after the feed-forward's GELU (in_features 4H, W_2)."""
    def __init__(self, config, in_features):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x, residual):
        """x: the sub-layer's output (N, in_features); residual: the sub-layer's input (N, H).
        Returns (N, H)."""
        # Post-LN, as BERT and Vaswani et al.: the norm comes after the residual add,
        #     LayerNorm(residual + Dropout(x W^T + b))
        # self.dense, self.dropout (active in training only) and self.LayerNorm are built above.
        # BEGIN part layer
        return self.LayerNorm(residual + self.dropout(self.dense(x)))
        # END part layer


class BertAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertOutput(config, config.hidden_size)

    def forward(self, h, packing):
        """h: (N, H), the real tokens packed; returns a, (N, H)."""
        # The attention block: a = LayerNorm(h + Dropout(Attention(h) W_o)). self.self is the
        # multi-head self-attention (given), self.output the add-and-norm above with W_o.
        # BEGIN part layer
        return self.output(self.self(h, packing), h)
        # END part layer


class BertIntermediate(nn.Module):  # the feed-forward block's first half: GELU(a W_1)
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, a):
        """a: (N, H); returns GELU(a W_1^T + b_1), (N, intermediate_size)."""
        # BERT's "gelu" is the exact one, GELU(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), which
        # is F.gelu's default; not the tanh approximation (approximate="tanh"), nor ReLU.
        # BEGIN part layer
        return F.gelu(self.dense(a))
        # END part layer


class BertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config, config.intermediate_size)

    def forward(self, h, packing):
        """h: (N, H), the real tokens packed; returns the layer's output, (N, H)."""
        # The attention block (self.attention), then the feed-forward block on its output a:
        #     LayerNorm(a + Dropout(GELU(a W_1) W_2))     self.intermediate, then self.output
        # Each block's residual is that block's own input.
        # BEGIN part layer
        a = self.attention(h, packing)
        return self.output(self.intermediate(a), a)
        # END part layer


class BertEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, h, packing):
        for layer in self.layer:
            h = layer(h, packing)
        return h


class BertEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, packing):
        """input_ids, token_type_ids: (B, T). Returns the real tokens' embeddings, packed: (N, H).
            E = Dropout(LayerNorm(word[x] + position[i] + token_type[t]))"""
        # A token's position i is its index in its own row, 0 to T - 1: build the positions in
        # the padded (B, T) layout, then keep the real tokens of ids, positions and types with
        # packing.pack ((B, T) -> (N,)). Sum the three embeddings (N, H), LayerNorm the sum, and
        # dropout last (self.dropout: active in training only).
        # BEGIN part embeddings
        positions = torch.arange(input_ids.size(1), device=input_ids.device).expand_as(input_ids)
        ids, positions, types = (packing.pack(x) for x in (input_ids, positions, token_type_ids))
        e = (self.word_embeddings(ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(types))
        return self.dropout(self.LayerNorm(e))
        # END part embeddings


class BertPooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, h):
        return torch.tanh(self.dense(h[:, 0]))  # (B, H), from the [CLS] token only


class BertModel(nn.Module):
    # What RoBERTa, DistilBERT and MPNet change of this class (minknn/backbones.py): the
    # embeddings, the encoder (MPNet's), the pooler (RoBERTa and DistilBERT have none), the
    # checkpoints' prefix and heads, and the weights' names.
    embeddings_class, encoder_class, pooler_class = BertEmbeddings, BertEncoder, BertPooler
    prefix, heads = "bert.", HEADS

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = self.embeddings_class(config)
        self.encoder = self.encoder_class(config)
        self.pooler = self.pooler_class(config) if self.pooler_class else None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):  # BERT's init, for models trained from scratch (e.g. the tests' tiny one)
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask, token_type_ids=None, pooled=False, pack=True):
        """input_ids, attention_mask, token_type_ids: (B, T) integer tensors; attention_mask is
        1 for real tokens and 0 for padding. Returns the last hidden states (B, T, H), and with
        pooled=True also the pooler's output (B, H). pack=False runs the padding through the
        layers too (Packing's pack, for the ONNX export): the same on every real token."""
        if input_ids.size(1) > self.config.max_tokens:
            raise MinknnError(f"sequence of {input_ids.size(1)} tokens is longer than the model's "
                              f"{self.config.max_tokens} positions; lower --max_len")
        if pooled and self.pooler is None:
            raise MinknnError(f"{self.config.model_type} has no pooler; pool the hidden states "
                              f"(--pooling)")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        packing = Packing(attention_mask, pack)  # the layers see the real tokens only (packed.py)
        h = self.encoder(self.embeddings(input_ids, token_type_ids, packing), packing)
        h = packing.unpack(h)  # (B, T, H), zeros at the padding
        return (h, self.pooler(h)) if pooled else h

    def set_attention(self, how):
        """Every layer's attention: "explicit" (attention() above), "fused" or "packed"
        (ATTENTIONS)."""
        if how not in ATTENTIONS:
            raise MinknnError(f"--attention '{how}'; choose one of: {', '.join(ATTENTIONS)}")
        for layer in self.encoder.layer:
            layer.attention.self.kernel = how
        return self

    @classmethod
    def from_pretrained(cls, path):
        """Builds the model from a Hugging Face-format BERT folder: config.json and
        model.safetensors (or pytorch_model.bin). Every weight is loaded by name. (Any of
        ARCHITECTURES' folders: minknn.backbones.from_pretrained.)"""
        path = resolve_model_path(path)
        config = read_config(path)
        if config.model_type != "bert":
            raise MinknnError(f"{path}: holds a {config.model_type} model; load it with "
                              f"minknn.backbones.from_pretrained")
        model = cls(config)
        model.load_weights(*read_weights(path))
        return model

    def load_weights(self, state, source="the weights"):
        """Loads a Hugging Face state dict (source: its file, for messages), dropping the prefix
        of task models (`bert.`). Task and pre-training heads (self.heads) are left out, named in
        one printed note (once for a folder of minknn's cache: packaged.notes_left_out); a
        missing, unexpected, wrongly shaped or non-finite tensor is an error."""
        weights, heads = {}, {}
        for name, v in state.items():
            k = self.own_name(name.removeprefix(self.prefix))
            if k.startswith(self.heads):
                head = k.split(".")[0] + ".*"
                heads[head] = heads.get(head, 0) + 1
            elif k not in BUFFERS:
                check_finite(name, v, source)
                weights[k] = v
        if heads and notes_left_out(os.path.dirname(source)):
            print(f"note: {source}: ignoring {sum(heads.values())} tensors the encoder does not "
                  f"use: {', '.join(f'{h} ({n})' for h, n in heads.items())}")
        check_fits(self.state_dict(), weights, source, "config.json", self.file_name)
        self.load_state_dict({k: v.float() for k, v in weights.items()})

    @staticmethod
    def own_name(name):
        """A checkpoint's tensor name as this model calls it: BERT's are the same."""
        return name

    @staticmethod
    def file_name(name):
        """own_name's inverse, for messages: BERT's names are the file's."""
        return name


# buffers some checkpoints hold (0, 1, 2, ... and zeros): nothing learned, so nothing to load
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def read_config(path):
    """The BertConfig of a model folder's config.json."""
    file = os.path.join(path, "config.json")
    return BertConfig.from_dict(read_json(file, FOLDER_NEEDS), file)
