"""Tests of the hand-written BERT (minknn/bert.py).

The assignment's parts come first (minknn/assignment/parts.py, PARTS): part 1 embeddings, part 2
attention, part 3 layer, each graded by `python -m pytest -q tests/test_bert.py -k NAME`. Each
part is tested alone, on a small module whose weights come from a formula (no random generator:
the stored reference outputs of the sanity checks stay the same on any machine), so that one
part's tests never run another part's code. Each part's tests look for the usual mistakes first,
to name them, then compare with an oracle written out from the equation, then with the stored
reference outputs (tests/fixtures/references/, tests/grading.py). The whole model's tests follow.
"""
import contextlib
import copy
import dataclasses
import itertools
import json
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

from elsewhere import check_on_second_device
from formula import readings_that_fit, same_as_formula
from grading import check, close, diagnose, graded, matches_reference, named
from minknn import MinknnError, backbones
from minknn import bert, packed
from minknn.assignment.parts import label
from minknn.bert import (BertConfig, BertEmbeddings, BertIntermediate, BertLayer, BertModel,
                         BertOutput, attention)
from minknn.packed import Packing
from minknn.tools.weights import NOT_IMPLEMENTED, load_safetensors, save_safetensors

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "minilm_golden.pt")
SMALL = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                   intermediate_size=16, max_position_embeddings=16)
# a padded batch for the small modules: 3 rows of 6, 11 real tokens; pad id 0
IDS = torch.tensor([[2, 7, 11, 5, 7, 3], [2, 9, 3, 0, 0, 0], [2, 7, 11, 5, 3, 0]])
TYPES = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0]])
MASK = (IDS != 0).long()


def wave(*shape, phase=0.0, scale=1.0):
    """A fixed tensor of the shape, from a formula: scale sin(1.3 n + phase), n = 0, 1, ..."""
    n = torch.arange(math.prod(shape), dtype=torch.float64)
    return (scale * torch.sin(1.3 * n + phase)).view(shape).float()


def fixed(module):
    """The module in eval mode, every parameter set by wave(): LayerNorm weights near 1."""
    with torch.no_grad():
        for i, (name, p) in enumerate(module.named_parameters()):
            w = wave(*p.shape, phase=0.7 * i)
            p.copy_(1 + 0.2 * w if name.endswith("LayerNorm.weight") else 0.5 * w)
    return module.eval()


def layer_norm(x, norm):
    """nn.LayerNorm `norm` written out: (x - mean) / sqrt(var + eps) weight + bias, over the last
    dimension, the variance biased (divided by H)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def linear(x, dense):
    return x @ dense.weight.T + dense.bias


def seeded(f, seed=0):
    """f() with the global random generator seeded, which is restored afterwards: two calls draw
    the same dropout masks if they drop tensors of the same shapes in the same order."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return f()


def no_known_mistake(part, actual, mistakes, what):
    """Names the first mistake whose output `actual` equals: mistakes maps a description to what
    that mistake computes."""
    for mistake, wrong in mistakes.items():
        if actual.shape == wrong.shape and torch.allclose(actual, wrong, atol=1e-5, rtol=1e-4):
            check(part, False, f"{what}: {mistake}")


def where(index, names):
    return ", ".join(f"{n} {i}" for n, i in zip(names, index))


# --- part 1 embeddings: E = Dropout(LayerNorm(word[x] + position[i] + token_type[t])) ---

def embeddings_oracle(emb, ids, types, mask):
    """Each real token's embedding, in row order, one token at a time."""
    rows = []
    for b in range(ids.size(0)):
        for i in range(ids.size(1)):
            if mask[b, i]:
                e = (emb.word_embeddings.weight[ids[b, i]] + emb.position_embeddings.weight[i]
                     + emb.token_type_embeddings.weight[types[b, i]])
                rows.append(layer_norm(e, emb.LayerNorm))
    return torch.stack(rows)


def embed(emb, ids=IDS, types=TYPES, mask=MASK):
    with torch.no_grad():
        return graded("embeddings", "BertEmbeddings.forward", emb, ids, types, Packing(mask))


def test_embeddings_are_the_real_tokens_packed():
    emb = fixed(BertEmbeddings(SMALL))
    out = embed(emb)
    N, H = int(MASK.sum()), SMALL.hidden_size
    check("embeddings", out.shape == (N, H), f"a (3, 6) batch with {N} real tokens must give "
          f"their embeddings packed, (N, H) = {(N, H)}; got {tuple(out.shape)} (the real tokens' "
          f"ids, positions and types, each packed with packing.pack)")
    again = embed(emb)
    check("embeddings", torch.equal(out, again), f"two calls in eval mode differ, by up to "
          f"{(out - again).abs().max().item():.3g}; in eval mode nothing is random (dropout acts "
          f"in training only: self.dropout)")


def embeddings_under(emb, ids, types, mask, positions="row", with_positions=True,
                     with_types=True):
    """What the embeddings of the real tokens are under a choice: positions "row" (each token's
    index in its row, the formula) or "packed" (its place among the packed tokens, 0 to N - 1);
    the position or token-type embeddings left out."""
    keep = mask.bool()
    index = (torch.arange(ids.size(1)).expand_as(ids)[keep] if positions == "row"
             else torch.arange(int(keep.sum())))
    e = emb.word_embeddings.weight[ids[keep]]
    if with_positions:
        e = e + emb.position_embeddings.weight[index]
    if with_types:
        e = e + emb.token_type_embeddings.weight[types[keep]]
    return layer_norm(e, emb.LayerNorm)


def test_embeddings_positions_count_from_0_in_each_row():
    emb = fixed(BertEmbeddings(SMALL))
    ids = torch.tensor([[2, 7, 7, 3], [2, 7, 7, 0]])  # row 1: row 0's first 3 tokens, then padding
    types, mask = torch.zeros_like(ids), (ids != 0).long()
    out = embed(emb, ids, types, mask)
    with torch.no_grad():
        mistakes = {
            "the output equals the embeddings without the position embeddings; each token adds "
            "position_embeddings(its index in its row)":
                embeddings_under(emb, ids, types, mask, with_positions=False),
            "the output equals the embeddings with each token's position its place among the "
            "packed tokens (0 to N - 1); a token's position is its index in its own row (0 to "
            "T - 1, built before packing)": embeddings_under(emb, ids, types, mask, "packed"),
        }
    no_known_mistake("embeddings", out, mistakes, "rows [2, 7, 7, 3] and [2, 7, 7, <pad>]")
    check("embeddings", not torch.allclose(out[1], out[2]), "token 7 at positions 1 and 2 of row 0 "
          "got the same embedding; a token's position (its index in its row) must change it")
    for i in range(3):
        gap = (out[i] - out[4 + i]).abs().max().item()
        check("embeddings", torch.allclose(out[i], out[4 + i], atol=1e-6),
              f"the same token at position {i} of rows 0 and 1 got embeddings up to {gap:.3g} "
              f"apart; they must be equal (a token's position is its index in its own row, 0 to "
              f"T - 1, whatever row it is in)")


def test_embeddings_use_the_token_types():
    emb = fixed(BertEmbeddings(SMALL))
    zeros, ones = embed(emb, types=torch.zeros_like(IDS)), embed(emb, types=MASK)
    with torch.no_grad():
        without = embeddings_under(emb, IDS, MASK, MASK, with_types=False)
    no_known_mistake("embeddings", ones, {
        "the output equals the embeddings without the token-type embeddings; each token adds "
        "token_type_embeddings(its type)": without}, "token_type_ids 1 on every real token")
    check("embeddings", not torch.allclose(zeros, ones), "token_type_ids 0 and 1 gave the same "
          "embeddings; a token's type must change its embedding (token_type_embeddings rows 0 "
          "and 1 differ)")


def test_embeddings_are_normalised_after_the_sum():
    emb = fixed(BertEmbeddings(SMALL))
    out = embed(emb)
    z = (out - emb.LayerNorm.bias) / emb.LayerNorm.weight  # LayerNorm's own scale and shift undone
    mean, var = z.mean(-1), z.var(-1, unbiased=False)
    normed = (mean.abs() < 1e-4) & ((var - 1).abs() < 1e-3)
    if not normed.all():
        t = int((~normed).nonzero()[0, 0])
        check("embeddings", False, f"the output must be LayerNorm of the three embeddings' sum "
              f"(then dropout): with LayerNorm's weight and bias undone, packed token {t} has mean "
              f"{mean[t]:.3g} and variance {var[t]:.3g}, not 0 and 1")


def test_embeddings_add_the_three_tables_with_weight_1():
    """One token whose word, position and token-type rows are orthogonal and of mean 0, with
    LayerNorm's weight 1 and bias 0: the output is the sum's direction, whose coordinates along
    the three rows read back how much of each the sum holds."""
    emb = fixed(BertEmbeddings(SMALL))
    rows = torch.zeros(3, SMALL.hidden_size)
    for j in range(3):
        rows[j, 2 * j], rows[j, 2 * j + 1] = 1.0, -1.0
    with torch.no_grad():
        emb.word_embeddings.weight[2] = rows[0]
        emb.position_embeddings.weight[0] = rows[1]
        emb.token_type_embeddings.weight[0] = rows[2]
        emb.LayerNorm.weight.fill_(1.0)
        emb.LayerNorm.bias.zero_()
    ids = torch.tensor([[2]])
    out = embed(emb, ids, torch.zeros_like(ids), torch.ones_like(ids))
    check("embeddings", out.shape == (1, SMALL.hidden_size), f"one real token must give (1, H) = "
          f"(1, {SMALL.hidden_size}); got {tuple(out.shape)}")
    coef = (out[0] @ rows.T / 2).double()
    in_span = torch.allclose(coef @ rows.double(), out[0].double(), atol=1e-4)
    if in_span and coef.abs().max() > 1e-6:
        ratio = coef / coef.abs().max()
        check("embeddings", torch.allclose(ratio, torch.ones(3, dtype=torch.float64), atol=1e-3),
              f"one token whose word, position and token-type rows are orthogonal (each of "
              f"mean 0, LayerNorm's weight 1 and bias 0): its output holds them in the ratio "
              f"{ratio[0]:.4g} : {ratio[1]:.4g} : {ratio[2]:.4g} (word : position : type); "
              f"E = LayerNorm(word + position + type) holds them 1 : 1 : 1")


def test_embeddings_match_the_formula():
    emb = fixed(BertEmbeddings(SMALL))
    out = embed(emb)
    with torch.no_grad():
        expected = embeddings_oracle(emb, IDS, TYPES, MASK)
        word = emb.word_embeddings.weight[IDS[MASK.bool()]]
        pos = emb.position_embeddings.weight[torch.arange(6).expand(3, 6)[MASK.bool()]]
        types = emb.token_type_embeddings.weight[TYPES[MASK.bool()]]
        norm = emb.LayerNorm
        mistakes = {
            "LayerNorm is applied to the word embeddings alone, before adding the position and "
            "token-type embeddings; it normalises their sum": layer_norm(word, norm) + pos + types,
            "LayerNorm is applied to the word embeddings alone, then to the sum; only the sum is "
            "normalised": layer_norm(layer_norm(word, norm) + pos + types, norm),
            "the positions start at 1; they are 0 to T - 1":
                layer_norm(word + emb.position_embeddings.weight[
                    torch.arange(1, 7).expand(3, 6)[MASK.bool()]] + types, norm),
        }
    no_known_mistake("embeddings", out, mistakes, "the embeddings of a padded batch")
    close("embeddings", out, expected, "the embeddings of a padded batch (real tokens, row order; "
          "eval mode)")


def embeddings_formula(emb, ids, types, mask, positions="row", left_out=None, norm="sum",
                       dropout="last", cut=None):
    """E = Dropout(LayerNorm(word[x] + position[i] + token_type[t])) of the real tokens, in row
    order, vectorised; the other readings a failure is checked against: positions "packed"
    (counted over the packed tokens) or "from 1"; a table `left_out`; norm "word" (LayerNorm on
    the word embeddings alone) or "none"; dropout "first" (before LayerNorm), "none" or "twice";
    a table `cut` (detached: it gets no gradient)."""
    keep = mask.bool()
    index = {"row": torch.arange(ids.size(1)).expand_as(ids)[keep],
             "from 1": torch.arange(1, ids.size(1) + 1).expand_as(ids)[keep],
             "packed": torch.arange(int(keep.sum()))}[positions]
    tables = {"word": (emb.word_embeddings.weight, ids[keep]),
              "position": (emb.position_embeddings.weight, index),
              "token type": (emb.token_type_embeddings.weight, types[keep])}
    rows = {name: (w.detach() if cut == name else w)[i] for name, (w, i) in tables.items()
            if name != left_out}
    p = emb.dropout.p if emb.training else 0.0
    if norm == "word":
        rows["word"] = layer_norm(rows["word"], emb.LayerNorm)
    e = sum(rows.values())
    if dropout in ("first", "twice"):
        e = F.dropout(e, p)
    e = layer_norm(e, emb.LayerNorm) if norm == "sum" else e
    return e if dropout == "first" or dropout == "none" else F.dropout(e, p)


EMBEDDINGS_READINGS = {
    "positions counted over the packed tokens (0 to N - 1), not within each row": {
        "positions": "packed"},
    "positions from 1, not 0": {"positions": "from 1"},
    **{f"the {t} embeddings left out of the sum": {"left_out": t}
       for t in ("word", "position", "token type")},
    "LayerNorm on the word embeddings alone, before the sum": {"norm": "word"},
    "no LayerNorm": {"norm": "none"},
    "dropout before LayerNorm, not after it": {"dropout": "first"},
    "no dropout": {"dropout": "none"},
    "dropout twice, before and after LayerNorm": {"dropout": "twice"},
    **{f"no gradient reaching the {t} table (its rows detached)": {"cut": t}
       for t in ("word", "position", "token type")},
}


@pytest.mark.parametrize("mode", ["eval", "training"])
def test_embeddings_forward_and_backward_match_the_formula(mode):
    """BertEmbeddings.forward against its formula, in float64, forward and backward: the
    gradient of each table and of LayerNorm's weight and bias (tests/formula.py). Rows with
    padding inside and at the end, and a row of one token."""
    emb = fixed(BertEmbeddings(dataclasses.replace(SMALL, hidden_dropout_prob=0.3))).double()
    emb.train(mode == "training")
    ids = torch.tensor([[2, 7, 11, 5, 7], [2, 9, 0, 4, 0], [2, 0, 0, 0, 0]])
    mask, types = (ids != 0).long(), torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 1, 0], [0] * 5])
    same_as_formula("embeddings", f"BertEmbeddings.forward in {mode} mode",
                    lambda: emb(ids, types, Packing(mask)),
                    lambda: embeddings_formula(emb, ids, types, mask), {},
                    params=dict(emb.named_parameters()), rng_seed=0, axes=("token", "feature"),
                    mistakes={what: (lambda kw: lambda: embeddings_formula(
                        emb, ids, types, mask, **kw))(kw)
                        for what, kw in EMBEDDINGS_READINGS.items()})


def check_dropout_at_half(part, dropped, plain, none_dropped, kept, mistakes=()):
    """dropped: `plain` through dropout with p = 0.5: about half the values 0, the others
    plain / (1 - p). none_dropped: what was expected when nothing was dropped; mistakes: {what a
    mistake gives, in words: its output, recomputed with the same random draws}, named only when
    `dropped` equals that output (no_known_mistake)."""
    zero = dropped == 0
    if not zero.any():
        no_known_mistake(part, dropped, dict(mistakes), none_dropped)
        gap = (dropped - plain).abs().max().item()
        check(part, False, f"{none_dropped}; the output is up to {gap:.3g} away from the one "
              f"without dropout")
    share = zero.float().mean().item()
    check(part, 0.35 < share < 0.65, f"with dropout p 0.5, {share:.0%} of the values were dropped")
    ratio = dropped[~zero] / plain[~zero]
    r = ratio.median().item()
    unscaled = abs(r - 1) < 1e-3 and torch.allclose(ratio, torch.ones_like(ratio))
    check(part, not torch.allclose(ratio, torch.full_like(ratio, r)) or abs(r - 2) < 1e-3,
          f"with dropout p 0.5, the values kept are {r:.3g} times their value without dropout; "
          f"dropout scales them by 1 / (1 - p) = 2" + (" (F.dropout does; the values kept here "
                                                        "are unscaled, as a mask alone leaves "
                                                        "them)" if unscaled else ""))
    no_known_mistake(part, dropped, dict(mistakes), "with dropout p 0.5")
    close(part, dropped[~zero], (plain / 0.5)[~zero], kept)


def test_embeddings_dropout_comes_last_and_only_in_training():
    emb = fixed(BertEmbeddings(dataclasses.replace(SMALL, hidden_dropout_prob=0.5)))
    plain = embed(emb)
    dropped = seeded(lambda: embed(emb.train()))
    with torch.no_grad():  # the sum before LayerNorm, for the mistakes' outputs
        e = (emb.word_embeddings.weight[IDS[MASK.bool()]]
             + emb.position_embeddings.weight[torch.arange(6).expand(3, 6)[MASK.bool()]]
             + emb.token_type_embeddings.weight[TYPES[MASK.bool()]])
        before = seeded(lambda: layer_norm(F.dropout(e, 0.5), emb.LayerNorm))
        twice = seeded(lambda: F.dropout(layer_norm(F.dropout(e, 0.5), emb.LayerNorm), 0.5))
    check_dropout_at_half("embeddings", dropped, plain, "in training mode with p 0.5 no value was "
                          "dropped (set to 0); the output is Dropout(LayerNorm(sum)), dropout "
                          "last", "in training mode, the values kept by dropout (LayerNorm's "
                          "output scaled by 1 / (1 - p); dropout is the last step)", {
                              "the output equals the eval-mode output: no dropout acts in "
                              "training mode": plain,
                              "the output equals LayerNorm(Dropout(sum)), with the same draws: "
                              "dropout comes after LayerNorm, which would fill the zeros again":
                                  before,
                              "the output equals Dropout(LayerNorm(Dropout(sum))), with the same "
                              "draws: dropout acts twice; it acts once, after LayerNorm": twice})


# RoBERTa and DistilBERT (minknn/backbones.py) run the same BertEmbeddings.forward with other
# tables: RoBERTa's position table (RobertaPositions) starts at row padding_idx + 1, DistilBERT
# has no token-type table (NoTokenTypes). A "<pad>" written inside a text (attention mask 1) takes
# the next position, as every token does.

BACKBONE_FOLDERS = {"bert": "tiny_bert_dir", "roberta": "tiny_roberta_dir",
                    "distilbert": "tiny_distilbert_dir"}


def backbone_batch(config):
    """ids, types, mask (3, 6): a full row; a row with the pad id written at index 2 (a real
    token, mask 1), then padding; a row of 2 tokens. Types 1 on the second segment where the
    model has a token-type table of 2 rows (DistilBERT's are given and ignored)."""
    pad = config.pad_token_id
    words = [i for i in range(3, 30) if i != pad]
    ids = torch.tensor([words[:6], words[6:8] + [pad] + words[8:10] + [pad],
                        words[10:12] + [pad] * 4])
    mask = torch.tensor([[1] * 6, [1] * 5 + [0], [1] * 2 + [0] * 4])
    types = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    if config.model_type == "roberta":
        types = torch.zeros_like(ids)  # one row: every token is type 0
    return ids, types, mask


def backbone_embeddings_oracle(emb, ids, types, mask, positions):
    """Each real token's embedding, one at a time: LayerNorm(word[x] + position[row] + type[t]),
    position[row] the row the token's position reads (RoBERTa: padding_idx + 1 + i), type[t] 0
    for DistilBERT, which has none."""
    rows = []
    for b in range(ids.size(0)):
        for i in range(ids.size(1)):
            if mask[b, i]:
                e = emb.word_embeddings.weight[ids[b, i]] + emb.position_embeddings.weight[
                    positions[b, i]]
                if isinstance(emb.token_type_embeddings, torch.nn.Embedding):
                    e = e + emb.token_type_embeddings.weight[types[b, i]]
                rows.append(layer_norm(e, emb.LayerNorm))
    return torch.stack(rows)


@pytest.mark.parametrize("kind", list(BACKBONE_FOLDERS))
def test_embeddings_of_each_backbone_match_the_formula(kind, request):
    """BertEmbeddings.forward under BERT, RoBERTa and DistilBERT (their tables, from the tiny
    folders) against a literal oracle, with a "<pad>" id written inside a text."""
    emb = backbones.from_pretrained(request.getfixturevalue(BACKBONE_FOLDERS[kind])).embeddings
    emb.eval()
    config = backbones.read_config(request.getfixturevalue(BACKBONE_FOLDERS[kind]))
    ids, types, mask = backbone_batch(config)
    tables = {"bert": "BERT's tables", "roberta": "RoBERTa's tables (positions from row "
              f"padding_idx + 1 = {config.pad_token_id + 1}: RobertaPositions)",
              "distilbert": "DistilBERT's tables (no token types: NoTokenTypes, a module with no "
              "weight)"}[kind]
    with torch.no_grad():
        got = graded("embeddings", f"BertEmbeddings.forward with {tables}", emb, ids, types,
                     Packing(mask))
        first = config.pad_token_id + 1 if kind == "roberta" else 0
        index = torch.arange(ids.size(1)).expand_as(ids)
        counted = (ids != config.pad_token_id).cumsum(1) - 1   # over the ids that are not <pad>
        mistakes = {
            f"the positions are counted over the ids that are not the pad id "
            f"{config.pad_token_id}; a token's position is its index in its row (the pad id at "
            f"index 2 of row 1 is a real token, mask 1)":
                backbone_embeddings_oracle(emb, ids, types, mask, first + counted.clamp(min=0)),
        }
        if first:
            mistakes["the position table's rows are read from row 0 (its weight indexed); "
                     f"RoBERTa's positions start at row {first}, which "
                     "self.position_embeddings(positions) adds"] = \
                backbone_embeddings_oracle(emb, ids, types, mask, index)
        diagnose("embeddings", got, backbone_embeddings_oracle(emb, ids, types, mask,
                                                               first + index),
                 f"the embeddings of a padded batch with {tables}", mistakes)


def test_embeddings_every_table_gets_a_gradient():
    """Backward of a weighted sum of the output: each table's rows the batch uses (word ids,
    positions 0 to 5, token types 0 and 1) get a gradient; fine-tuning trains all three."""
    emb = fixed(BertEmbeddings(SMALL))
    out = graded("embeddings", "BertEmbeddings.forward", emb, IDS, TYPES, Packing(MASK))
    check("embeddings", out.requires_grad, "the output is not connected to the tables in "
          "autograd's graph (requires_grad False): backward() gives the embedding tables no "
          "gradient")
    graded("embeddings", "backward of a weighted sum of BertEmbeddings' output",
           (out * wave(*out.shape, phase=0.4)).sum().backward)
    keep = MASK.bool()
    for name, table, rows in (
            ("word", emb.word_embeddings, IDS[keep].unique()),
            ("position", emb.position_embeddings, torch.arange(IDS.size(1))),
            ("token type", emb.token_type_embeddings, TYPES[keep].unique())):
        g = table.weight.grad
        got = None if g is None else g[rows].abs().sum(-1)
        check("embeddings", got is not None and bool((got > 0).all()), f"backward of a weighted "
              f"sum of the output gave the {name} table ({name.replace(' ', '_')}_embeddings."
              f"weight) no gradient" + ("" if g is None else f" at rows "
                                        f"{rows[got == 0].tolist()}, which the batch uses")
              + f": the output must stay connected to each of the three tables in autograd's "
              f"graph, so that fine-tuning trains them")


def test_embeddings_sanity_check():
    emb = fixed(BertEmbeddings(SMALL))
    matches_reference("embeddings", "padded", embed(emb))


@pytest.mark.parametrize("rows", [3, 1])  # with padding (pack indexes), one row without
def test_embeddings_run_on_the_inputs_device(rows):
    """On a second device (tests/elsewhere.py): a tensor made without device= fails as on a GPU."""
    check_on_second_device("embeddings", f"BertEmbeddings.forward on {rows} row(s) of 6",
                           lambda emb, ids, types, mask: emb(ids, types, Packing(mask)),
                           {"ids": IDS[:rows], "types": TYPES[:rows], "mask": MASK[:rows]},
                           fixed(BertEmbeddings(SMALL)).train())


# --- part 2 attention: softmax(Q K^T / sqrt(hs) + mask) V, dropout on the weights ---

def attention_inputs(B=2, nh=2, T=5, hs=4):
    """q, k, v (B, nh, T, hs) and the additive mask (B, 1, 1, T): the last 2 keys of example 1 are
    padding."""
    q, k, v = (wave(B, nh, T, hs, phase=p) for p in (0.0, 1.0, 2.0))
    mask = torch.zeros(B, 1, 1, T)
    mask[1, ..., T - 2:] = torch.finfo(torch.float32).min
    return q, k, v, mask


def attention_oracle(q, k, v, mask):
    """Attention(Q, K, V) for each example, head and query, in Python loops, in float64."""
    B, nh, T, hs = q.shape
    out = torch.zeros(B, nh, T, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for h in range(nh):
            for i in range(T):
                scores = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(hs)
                          + (float(mask[b, 0, 0, j]) if mask is not None else 0.0)
                          for j in range(T)]
                e = [math.exp(s - max(scores)) for s in scores]
                for j in range(T):
                    out[b, h, i] += e[j] / sum(e) * v[b, h, j].double()
    return out


def weights(q, k, mask, dropout_p=0.0):
    """attention()'s weights: with V the identity (T, T), softmax(...) V is the weights."""
    eye = torch.eye(q.size(2), dtype=q.dtype).expand(*q.shape[:2], -1, -1)
    return graded("attention", "attention()", attention, q, k, eye, mask, dropout_p)


def scale_read_back(w, s):
    """Example 0 (nothing padded, T = 5 keys, hs = 4): the weights are softmax(c Q K^T) for one
    factor c when only the scale is off; read c back from log w_ij - log w_i0 = c (s_ij - s_i0)
    and check it is 1 / sqrt(hs) = 0.5."""
    logw, s0 = w[0].double().log(), s[0].double()
    dl, ds = (logw - logw[..., :1]).flatten(), (s0 - s0[..., :1]).flatten()
    if not (torch.isfinite(dl).all() and ds.abs().max() > 0):
        return
    c = float(dl @ ds / (ds @ ds))
    hs, T, H = 4, 5, 8  # the inputs' head size, keys and heads times head size
    said = named(c, {"1 (not scaled)": 1.0, "1 / hs": 1 / hs, "1 / sqrt(T), T the number of "
                     "keys": 1 / math.sqrt(T), "1 / sqrt(nh hs), the whole hidden size":
                     1 / math.sqrt(H), "sqrt(hs) (multiplied, not divided)": math.sqrt(hs),
                     "1 / T": 1 / T}, tol=1e-3)
    if (dl - c * ds).abs().max() < 1e-4 and abs(c - 0.5) > 1e-4 and said:
        check("attention", False, f"the scores are scaled by {c:.4g} = {said} (read back from the "
              f"weights of example 0, which has no padding: softmax({c:.4g} Q K^T)); the "
              f"formula's factor is 1 / sqrt(hs) = 1 / sqrt(4) = 0.5, hs = q.size(-1) the head "
              f"size (here T = 5 keys, hs = 4)")
    if (dl - c * ds).abs().max() < 1e-4 and abs(c - 0.5) > 1e-4:
        check("attention", False, f"the scores are scaled by {c:.4g} (read back from the "
              f"weights of example 0, which has no padding: they are softmax({c:.4g} Q K^T)); "
              f"the formula's factor is 1 / sqrt(hs) = 1 / sqrt(4) = 0.5, hs = q.size(-1) the "
              f"head size (here T = 5 keys, hs = 4)"
              + (f"; {c:.4g} = 1 / sqrt({1 / c ** 2:.4g})" if c > 0 else ""))


def test_attention_weights_are_a_softmax_over_the_real_keys():
    q, k, _, mask = attention_inputs()
    w = weights(q, k, mask)
    check("attention", w.shape == (2, 2, 5, 5), f"attention(q, k, v) with q, k (2, 2, 5, 4) and v "
          f"(2, 2, 5, 5) must return (2, 2, 5, 5), one row per query; got {tuple(w.shape)}")
    s = q @ k.transpose(-2, -1)
    if not torch.isfinite(w).all():
        i = tuple(int(x) for x in (~torch.isfinite(w)).nonzero()[0])
        check("attention", False, f"the attention weights must be finite (a softmax over the "
              f"keys of the scores plus the mask, which is 0 or the dtype's most negative finite "
              f"number); got {w[i].item()} at {where(i, ('example', 'head', 'query', 'key'))}")
    sums = w.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
        no_known_mistake("attention", w, {
            "they equal softmax(Q K^T / sqrt(hs) + mask) over the queries (dim -2); the softmax "
            "runs over the keys, the last dimension": F.softmax(s / 2 + mask, -2),
            "they equal softmax(Q K^T / sqrt(hs)) + mask, the mask added after the softmax; it "
            "is added to the scores, before it": F.softmax(s / 2, -1) + mask,
        }, "the attention weights do not sum to 1 over the keys")
        i = tuple(int(x) for x in (~((sums - 1).abs() <= 1e-5)).nonzero()[0])
        check("attention", False, f"each query's weights must sum to 1 over the keys (a softmax "
              f"over the last dimension); at {where(i, ('example', 'head', 'query'))} they sum "
              f"to {sums[i]:.4g}")
    padded = w[1, ..., 3:]
    if padded.abs().max() > 1e-6:
        no_known_mistake("attention", w, {
            "they equal softmax(Q K^T / sqrt(hs)) without the mask; the mask is added to the "
            "scores, before the softmax": F.softmax(s / 2, -1)},
            "padded keys got weight above 0")
        i = tuple(int(x) for x in (padded.abs() > 1e-6).nonzero()[0])
        check("attention", False, f"padded keys (example 1, keys 3 and 4) must get weight 0; got "
              f"{padded[i]:.3g} at example 1, {where(i, ('head', 'query'))}, key {3 + i[2]}")
    scale_read_back(w, s)
    no_known_mistake("attention", w, {
        "the scores are not scaled; divide Q K^T by sqrt(hs), hs = q.size(-1)":
            F.softmax(s + mask, -1),
        "the scores are divided by hs; divide them by sqrt(hs)": F.softmax(s / 4 + mask, -1),
        "the scores are K Q^T (score[i, j] = k_i . q_j); they are Q K^T, query i against key j":
            F.softmax(s.transpose(-2, -1) / 2 + mask, -1),
    }, "the attention weights")
    close("attention", w, F.softmax(s / 2 + mask, -1), "the attention weights "
          "softmax(Q K^T / sqrt(hs) + mask)")


def test_attention_matches_the_formula():
    q, k, v, mask = attention_inputs()
    close("attention", attention(q, k, v, mask).double(), attention_oracle(q, k, v, mask),
          "the output for a padded batch", atol=1e-5, rtol=1e-4)
    close("attention", attention(q, k, v, None).double(), attention_oracle(q, k, v, None),
          "the output with mask None (nothing padded)", atol=1e-5, rtol=1e-4)


def attention_formula(q, k, v, mask, dropout_p=0.0, cut_mask_scale=False):
    """softmax(Q K^T / sqrt(hs) + mask) V, dropout on the weights, in float64 (or, with
    cut_mask_scale, the mistake of scaling the mask with the scores: (Q K^T + mask) / sqrt(hs))."""
    scores = q @ k.transpose(-2, -1)
    scores = (scores + mask) / math.sqrt(q.size(-1)) if cut_mask_scale else \
        scores / math.sqrt(q.size(-1)) + mask
    return F.dropout(torch.softmax(scores, -1), dropout_p) @ v


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_attention_matches_pytorchs_kernel():
    q, k, v = (wave(2, 4, 5, 8, phase=p, scale=2.0) for p in (0.5, 1.5, 2.5))
    m = torch.zeros(2, 1, 1, 5)
    m[1, ..., 3:] = torch.finfo(torch.float32).min
    close("attention", attention(q, k, v, m), F.scaled_dot_product_attention(q, k, v, attn_mask=m),
          "the output for a padded batch, against F.scaled_dot_product_attention,",
          atol=1e-6, rtol=1e-5)
    close("attention", attention(q, k, v, None), F.scaled_dot_product_attention(q, k, v),
          "the output with mask None, against F.scaled_dot_product_attention,")


def test_attention_of_a_query_whose_keys_are_all_padding_stays_finite():
    """A row of padding only (an empty example) has every key masked by the dtype's most
    negative number, not -inf: its weights are uniform, not 0/0."""
    for dtype in (torch.float32, torch.bfloat16):
        q, k, _, _ = attention_inputs()
        mask = torch.zeros(2, 1, 1, 5, dtype=dtype)
        mask[1] = torch.finfo(dtype).min
        w = weights(q.to(dtype), k.to(dtype), mask)
        if not torch.isfinite(w).all():
            s = q.to(dtype) @ k.to(dtype).transpose(-2, -1) / 2
            inf = F.softmax(s.masked_fill(mask < 0, float("-inf")), -1)
            check("attention", not torch.allclose(w.float(), inf.float(), atol=1e-2, rtol=0,
                                                  equal_nan=True),
                  f"in {dtype}, example 1, whose keys are all padding, got non-finite weights "
                  f"{w[1, 0, 0].tolist()}, as a softmax whose every term in the row is 0 gives "
                  f"(0/0: the mask turned into -inf, or exp taken without subtracting the row's "
                  f"max, give these); F.softmax of the scores plus the mask as given (its most "
                  f"negative finite number) gives 1/5 each")
        check("attention", bool(torch.isfinite(w).all()), f"in {dtype}, example 1, whose keys are "
              f"all padding, got non-finite weights {w[1, 0, 0].tolist()}; with the mask added as "
              f"given (its most negative finite number) they are 1/5 each")
        close("attention", w[1].float(), torch.full((2, 5, 5), 0.2), f"in {dtype}, the weights "
              f"of a query whose keys are all padding (uniform: 1/5 each)", atol=1e-2, rtol=0)


def renormalised(w):
    return w / w.sum(-1, keepdim=True)


def test_attention_dropout_drops_the_weights():
    q, k, _, _ = attention_inputs(T=12)
    plain = weights(q, k, None)
    ones = torch.ones(2, 2, 12, 3)
    out = seeded(lambda: attention(q, k, ones, None, dropout_p=0.5))
    if not torch.allclose(out, out[..., :1].expand_as(out)):
        no_known_mistake("attention", out, {
            "it equals dropout applied to the output softmax(...) V, with the same draws; "
            "dropout acts on the weights, before multiplying by V":
                seeded(lambda: F.dropout(plain @ ones, 0.5))}, "with V all ones and dropout_p=0.5")
        spread = (out - out[..., :1]).abs().max().item()
        check("attention", False, f"with V all ones and dropout_p=0.5, the 3 outputs of a query "
              f"differ by up to {spread:.3g}; they must be equal, each the sum of its kept "
              f"weights (dropout acts on the weights, before multiplying by V)")
    w = seeded(lambda: weights(q, k, None, dropout_p=0.5))
    s = q @ k.transpose(-2, -1) / 2
    check_dropout_at_half("attention", w, plain, "with dropout_p=0.5 no weight was dropped (set to "
                          "0); dropout acts on the weights, after the softmax", "with "
                          "dropout_p=0.5, the weights kept (scaled by 1 / (1 - p), as F.dropout "
                          "does)", {
                              "the weights equal those without dropout: no dropout acts": plain,
                              "the weights equal softmax(dropout(scores)), with the same draws: "
                              "dropout acts on the weights, after the softmax, not on the scores":
                                  seeded(lambda: F.softmax(F.dropout(s, 0.5), -1)),
                              "the weights equal dropout(softmax(...)) renormalised to sum to 1 "
                              "over the keys, with the same draws: the weights kept are only "
                              "scaled by 1 / (1 - p), not renormalised":
                                  renormalised(seeded(lambda: F.dropout(plain, 0.5)))})


def test_attention_backward_in_training():
    """attention() as training runs it, dropout_p 0.1, then backward of a weighted sum of its
    output: every one of q, k and v gets a gradient."""
    q, k, v, mask = attention_inputs()
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = seeded(lambda: graded("attention", "attention() with dropout_p=0.1 (training)",
                                attention, q, k, v, mask, 0.1))
    check("attention", out.requires_grad, "with dropout_p=0.1 the output is not connected to q, "
          "k and v in autograd's graph (requires_grad False)")
    graded("attention", "backward of a weighted sum of attention()'s output with dropout_p=0.1 "
           "(training)", (out * wave(*out.shape, phase=0.6)).sum().backward)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check("attention", t.grad is not None and bool(t.grad.abs().sum() > 0), f"with "
              f"dropout_p=0.1, backward of a weighted sum of the output gave {name} no gradient: "
              f"the output must stay connected to q, k and v in autograd's graph")


ATTENTION_CASES = {  # (B, nh, T, hs): keys padded (0) per row; an MPNet bias; dropout_p
    "3 rows, a padding key inside row 1 and at the end of row 2": ((3, 2, 5, 3), [[1] * 5,
                                                                   [1, 0, 1, 1, 1],
                                                                   [1, 1, 1, 0, 0]], False, 0.0),
    "1 row, no padding": ((1, 2, 4, 3), [[1] * 4], False, 0.0),
    "MPNet's relative-position bias (B, nh, T, T) added to the padding's mask": (
        (3, 2, 5, 3), [[1] * 5, [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], True, 0.0),
    "training, dropout_p 0.3": ((3, 2, 5, 3), [[1] * 5, [1, 1, 1, 0, 0], [1] * 5], True, 0.3),
}


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention_forward_and_backward_match_the_formula(case):
    """attention() against its formula, in float64, forward and backward (the gradients of q, k,
    v and of the additive mask, through which MPNet's bias learns): tests/formula.py."""
    (B, nh, T, hs), keep, bias, p = ATTENTION_CASES[case]
    q, k, v = (rand(B, nh, T, hs, seed=s) for s in (1, 2, 3))
    mask = torch.zeros(B, 1, 1, T, dtype=torch.float64).masked_fill(
        torch.tensor(keep)[:, None, None, :] == 0, torch.finfo(torch.float64).min)
    if bias:
        mask = mask + rand(1, nh, T, T, seed=4)
    same_as_formula("attention", f"attention() on {case}", lambda **x: attention(**x, dropout_p=p),
                    lambda **x: attention_formula(**x, dropout_p=p),
                    {"q": q, "k": k, "v": v, "mask": mask}, rng_seed=0,
                    axes=("example", "head", "query", "feature"),
                    grad_axes={n: ("example", "head", "position", "feature") for n in "qkv"},
                    mistakes={"the mask divided by sqrt(hs) too: the scale applied after adding "
                              "the mask, (Q K^T + mask) / sqrt(hs)":
                              lambda **x: attention_formula(**x, dropout_p=p,
                                                            cut_mask_scale=True)})


def test_attention_sanity_check():
    q, k, v, mask = attention_inputs()
    matches_reference("attention", "padded", attention(q, k, v, mask))
    matches_reference("attention", "unpadded", attention(q, k, v, None))


def test_attention_runs_on_the_inputs_device():
    """On a second device (tests/elsewhere.py), padded and in training (dropout 0.3)."""
    q, k, v, mask = attention_inputs()
    check_on_second_device("attention", "attention(q, k, v, mask, dropout_p=0.3)",
                           lambda _, **x: attention(**x, dropout_p=0.3),
                           {"q": q, "k": k, "v": v, "mask": mask})


# --- part 3 layer: a = LayerNorm(h + Dropout(Attention(h) W_o)),
#                   LayerNorm(a + Dropout(GELU(a W_1) W_2)) ---

def small_layer(config=SMALL):
    """A fixed BertLayer whose self-attention is PyTorch's kernel: part 3 runs without part 2."""
    layer = fixed(BertLayer(config))
    layer.attention.self.kernel = "fused"
    return layer


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def layer_oracle(layer, h, packing):
    """(a, the layer's output) written out; the dropouts as F.dropout in training mode, in the
    order the layer draws them."""
    p = layer.output.dropout.p

    def drop(x):
        return F.dropout(x, p, training=layer.training)
    attn = layer.attention.self(h, packing)  # the multi-head self-attention, given
    o = layer.attention.output
    a = layer_norm(h + drop(linear(attn, o.dense)), o.LayerNorm)
    f = linear(gelu(linear(a, layer.intermediate.dense)), layer.output.dense)
    return a, layer_norm(a + drop(f), layer.output.LayerNorm)


def layer_inputs():
    packing = Packing(MASK)
    return wave(int(MASK.sum()), SMALL.hidden_size, phase=0.3), packing


def test_layer_add_and_norm_is_post_ln():
    out = fixed(BertOutput(SMALL, SMALL.hidden_size))
    x, r = wave(7, 8, phase=0.2), wave(7, 8, phase=1.1, scale=2.0)
    with torch.no_grad():
        x0, r0 = x.clone(), r.clone()
        got = graded("layer", "BertOutput.forward", out, x, r)
        for name, t, t0 in (("residual", r, r0), ("x", x, x0)):
            check("layer", torch.equal(t, t0), f"BertOutput(x, residual) changed its input "
                  f"{name} in place (by up to {(t - t0).abs().max().item():.3g}): it must leave "
                  f"x and residual as they were and return a new tensor (backward may need "
                  f"them)")
        again = out(x, r)
        if not torch.equal(got, again):
            gap = (got - again).abs().max().item()
            p, out.dropout.p = out.dropout.p, 0.0
            steady = torch.equal(*(graded("layer", "BertOutput.forward", out, x, r)
                                   for _ in range(2)))
            out.dropout.p = p
            check("layer", False, f"BertOutput: two calls in eval mode on the same x and residual "
                  f"differ, by up to {gap:.3g}" + (": with self.dropout's p set to 0 they agree, "
                                                   "so dropout acts in eval mode; it must act in "
                                                   "training only (self.dropout)"
                                                   if steady else ""))
        y, norm = linear(x, out.dense), out.LayerNorm
        want = layer_norm(r + y, norm)
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            undone = (got - norm.bias) / norm.weight
            for what, z in (("with self.LayerNorm's weight and bias undone", undone),
                            ("as it is", got)):
                mean, var = z.mean(-1), z.var(-1, unbiased=False)
                worst = int(((mean.abs() + (var - 1).abs())).argmax())
                if what == "as it is" and (mean.abs() < 1e-4).all() and ((var - 1).abs() < 1e-3).all():
                    check("layer", False, f"BertOutput(x, residual) in eval mode: each output "
                          f"row has mean 0 and variance 1 over the features as it is, so "
                          f"self.LayerNorm's weight (here 1 + 0.2 sin(...), not 1) and bias (not "
                          f"0) are not in it; LayerNorm(v) = (v - mean) / sqrt(var + eps) weight "
                          f"+ bias, the module's own weight, bias and eps (self.LayerNorm)")
                if what != "as it is" and not ((mean.abs() < 1e-4).all()
                                               and ((var - 1).abs() < 1e-3).all()):
                    continue
                break
        no_known_mistake("layer", got, {
            "the residual is missing; add the sub-layer's input": layer_norm(y, norm),
            "the norm comes before the add (pre-LN); BERT's is after it, post-LN":
                r + layer_norm(y, norm),
            "the residual alone is normed; the norm takes the sum": layer_norm(r, norm) + y,
            "LayerNorm is missing": r + y,
            "x is not projected by self.dense": layer_norm(r + x, norm),
        }, "BertOutput(x, residual)")
        close("layer", got, layer_norm(r + y, norm), "BertOutput(x, residual) = "
              "LayerNorm(residual + x W^T + b) in eval mode")


def test_layer_add_and_norm_drops_the_projection_not_the_residual():
    """BertOutput in training mode (p 0.5) with self.dense's weight 0: its output x W^T + b is
    the bias b whatever x is. With b = 0 the output is LayerNorm(residual) whatever is dropped,
    the residual untouched; with b != 0 dropout zeroes some of b's entries, so the output is not
    LayerNorm(residual + b)."""
    out = fixed(BertOutput(dataclasses.replace(SMALL, hidden_dropout_prob=0.5), SMALL.hidden_size))
    x, r = wave(7, 8, phase=0.2), wave(7, 8, phase=1.1, scale=2.0)
    norm = out.LayerNorm
    with torch.no_grad():
        out.dense.weight.zero_()
        out.dense.bias.zero_()
        got = seeded(lambda: graded("layer", "BertOutput.forward", out.train(), x, r))
        want = layer_norm(r, norm)
        gap = (got - want).abs().max().item()
        check("layer", torch.allclose(got, want, atol=1e-5, rtol=1e-4), f"BertOutput(x, "
              f"residual) in training mode (p 0.5) with self.dense's weight and bias 0, so that "
              f"x W^T + b = 0: the output must be LayerNorm(residual), the residual passing "
              f"undropped (dropout acts on x W^T + b alone); it is up to {gap:.3g} off")
        out.dense.bias.copy_(wave(8, phase=0.9, scale=2.0))
        b = out.dense.bias
        got = seeded(lambda: graded("layer", "BertOutput.forward", out.train(), x, r))
        undropped = layer_norm(r + b, norm)
        check("layer", not torch.allclose(got, undropped, atol=1e-5, rtol=1e-4), f"BertOutput("
              f"x, residual) in training mode (p 0.5) with self.dense's weight 0, so that "
              f"x W^T + b = b: the output equals LayerNorm(residual + b), b with none of its "
              f"entries dropped; dropout acts on the projection's output x W^T + b (zeroing "
              f"about half of them here)")


def test_layer_add_and_norm_drops_the_projection_in_training():
    out = fixed(BertOutput(dataclasses.replace(SMALL, hidden_dropout_prob=0.5), SMALL.hidden_size))
    x, r = wave(7, 8, phase=0.2), wave(7, 8, phase=1.1, scale=2.0)
    with torch.no_grad():
        plain = out(x, r)
        got = seeded(lambda: out.train()(x, r))
        check("layer", not torch.allclose(got, plain), "BertOutput in training mode gives eval "
              "mode's output: Dropout on x W^T + b is missing")
        y, norm = linear(x, out.dense), out.LayerNorm
        no_known_mistake("layer", got, {
            "dropout comes after LayerNorm; it acts on x W^T + b, before the add":
                seeded(lambda: F.dropout(layer_norm(r + y, norm), 0.5)),
            "dropout acts on the sum with the residual; it acts on x W^T + b alone":
                seeded(lambda: layer_norm(F.dropout(r + y, 0.5), norm)),
        }, "BertOutput(x, residual) in training mode")
        close("layer", got, seeded(lambda: layer_norm(r + F.dropout(y, 0.5), norm)),
              "BertOutput(x, residual) = LayerNorm(residual + Dropout(x W^T + b)) in training mode")


GELU_READINGS = {  # the other activations a feed-forward block is written with
    "GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))":
        lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "ReLU, max(0, x)": F.relu, "no activation at all, x": lambda x: x,
    "the sigmoid approximation of GELU, x sigmoid(1.702 x)": lambda x: x * torch.sigmoid(1.702 * x),
    "x Phi(x) with Phi the density, not the cumulative distribution": lambda x: x * torch.exp(
        -x ** 2 / 2) / math.sqrt(2 * math.pi),
    "0.5 x (1 + erf(x)), the argument of erf not divided by sqrt(2)": lambda x: 0.5 * x * (
        1 + torch.erf(x))}


def test_layer_gelu_at_known_points():
    """BertIntermediate with self.dense the identity on its first 8 outputs (and 0 on the rest):
    the output is GELU at known points, GELU(x) = x Phi(x), e.g. GELU(1) = 0.841345."""
    ff = fixed(BertIntermediate(SMALL))
    points = torch.tensor([-3.0, -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0])
    with torch.no_grad():
        ff.dense.weight.zero_()
        ff.dense.weight[:8] = torch.eye(8)
        ff.dense.bias.zero_()
        got = graded("layer", "BertIntermediate.forward", ff, points[None])
    check("layer", got.shape == (1, 16), f"BertIntermediate of (N, H) = (1, 8) must give "
          f"(N, intermediate_size) = (1, 16); got {tuple(got.shape)}")
    want = gelu(points.double())
    have = got[0, :8].double()
    bad = (have - want).abs() > 1e-5
    x = points.double()
    fits = [what for what, f in GELU_READINGS.items() if torch.allclose(have, f(x), atol=1e-5)]
    check("layer", not bad.any() or not fits, f"BertIntermediate with self.dense the identity, "
          f"at the 8 points {points.tolist()}: it gives {[round(v, 6) for v in have.tolist()]}, "
          f"{' or '.join(fits)}; BERT's is GELU(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))")
    if bad.any():
        i = int(bad.nonzero()[0])
        check("layer", False, f"BertIntermediate with self.dense the identity: GELU({points[i]:g})"
              f" is {have[i]:.6g}, expected {want[i]:.6g}; GELU(x) = x Phi(x) = 0.5 x (1 + "
              f"erf(x / sqrt(2))), exactly (GELU(1) = 0.841345, GELU(-1) = -0.158655); at the 8 "
              f"points {points.tolist()} it gives {[round(v, 6) for v in have.tolist()]}, "
              f"expected {[round(v, 6) for v in want.tolist()]}")


def test_layer_feed_forward_is_the_exact_gelu():
    ff = fixed(BertIntermediate(SMALL))
    a = wave(7, 8, phase=0.4, scale=3.0)
    with torch.no_grad():
        got, x = ff(a), linear(a, ff.dense)
        check("layer", got.shape == (7, 16), f"BertIntermediate of (N, H) = (7, 8) must give "
              f"(N, intermediate_size) = (7, 16); got {tuple(got.shape)}")
        no_known_mistake("layer", got, {
            "this is the tanh approximation of GELU; BERT's is the exact erf form":
                0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
            "this is ReLU; BERT's activation is GELU": F.relu(x),
            "the activation is missing": x,
            "GELU comes before the projection; it acts on a W_1^T + b_1": linear(gelu(a), ff.dense),
        }, "BertIntermediate")
        # atol 1e-5: near x = -3.3, 1 + erf(x / sqrt(2)) is 1e-3, and float32 GELUs lose digits
        # there that depend on the CPU's kernel (oneDNN's AVX-512 one and ATen's erf: 9e-7 apart);
        # the tanh approximation is 5e-4 off
        close("layer", got, gelu(x), "BertIntermediate: GELU(a W_1^T + b_1), GELU(x) = 0.5 x "
              "(1 + erf(x / sqrt(2))),", atol=1e-5, rtol=1e-5)


LAYER_CUTS = ("h on its way into the attention", "the attention's output",
              "the attention block's projection Attention(h) W_o", "the attention block's "
              "residual h", "a on its way into the feed-forward block", "the feed-forward's "
              "hidden GELU(a W_1)", "the feed-forward's output GELU(a W_1) W_2",
              "the feed-forward block's residual a", "a, the attention block's output")


def layer_formula(layer, h, packing, wiring=("attention", "h", "a", "a"), cut=None):
    """The layer's output written out from its formula, with the given modules (the attention
    itself, self.self, is given): a = LayerNorm(h + Dropout(Attention(h) W_o)), then
    LayerNorm(a + Dropout(GELU(a W_1) W_2)). Other readings, the mistakes a failure is checked
    against: `wiring` names what each block projects and adds (the attention block's projected
    input and residual, the feed-forward block's input and residual: "attention", "h", "a" or
    "none"), and `cut` one of LAYER_CUTS where the gradient stops (detached)."""
    p = layer.output.dropout.p

    def drop(x):
        return F.dropout(x, p, training=layer.training)

    def edge(i, x):
        return x.detach() if cut == LAYER_CUTS[i] else x
    o, ff = layer.attention.output, layer.output
    attn = edge(1, layer.attention.self(edge(0, h), packing))
    at_hand = {"attention": attn, "h": h, "none": 0.0}
    x, r = at_hand[wiring[0]], at_hand[wiring[1]]
    a = edge(8, layer_norm(edge(3, r) + drop(edge(2, linear(x, o.dense))), o.LayerNorm))
    at_hand["a"] = a
    x, r = at_hand[wiring[2]], at_hand[wiring[3]]
    hidden = edge(5, gelu(linear(edge(4, x), layer.intermediate.dense)))
    return layer_norm(edge(7, r) + drop(edge(6, linear(hidden, ff.dense))), ff.LayerNorm)


def layer_readings(layer, packing):
    """{what the layer then computes: its formula} for every other wiring and every cut."""
    names = {"attention": "the attention's output", "h": "the layer's input h", "a": "a, the "
             "attention block's output", "none": "nothing"}
    roles = ("the attention block projecting {} (the formula: {})", "the attention block "
             "adding {} as its residual (the formula: {})", "the feed-forward block reading {} "
             "(the formula: {})", "the feed-forward block adding {} as its residual (the "
             "formula: {})")
    right = ("attention", "h", "a", "a")
    readings = {}
    for wiring in itertools.product(("attention", "h"), ("h", "attention", "none"),
                                    ("a", "h", "attention"), ("a", "h", "attention", "none")):
        if wiring != right:
            what = "; ".join(role.format(names[w], names[r])
                             for role, w, r in zip(roles, wiring, right) if w != r)
            readings[what] = (lambda w: lambda h: layer_formula(layer, h, packing, w))(wiring)
    for cut in LAYER_CUTS:
        readings[f"no gradient through {cut} (detached there)"] = (
            lambda c: lambda h: layer_formula(layer, h, packing, cut=c))(cut)
    return readings


def test_layer_blocks_match_the_formula():
    layer = small_layer()
    h, packing = layer_inputs()
    double = small_layer().double()
    fits = readings_that_fit("layer", "the layer", lambda h: double(h, packing),
                             lambda h: layer_formula(double, h, packing),
                             layer_readings(double, packing), {"h": h.double()},
                             dict(double.named_parameters()))
    check("layer", not fits, f"the layer (BertLayer) in eval mode: its output and every gradient "
          f"(of h and of each parameter) are those of the formula with {' or with '.join(fits)}")
    with torch.no_grad():
        a, expected = layer_oracle(layer, h, packing)
        got_a, got = layer.attention(h, packing), layer(h, packing)
        attn, o = layer.attention.self(h, packing), layer.attention.output
        composed = o(attn, h)
        gap = (got_a - composed).abs().max().item() if got_a.shape == composed.shape else None
        no_known_mistake("layer", got_a, {
            "it equals self.self(h, packing), the multi-head attention alone: the output "
            "projection, the residual h and LayerNorm (self.output, BertOutput) are not applied":
                attn}, "the attention block (BertAttention)")
        check("layer", gap is not None and gap < 1e-5, f"the attention block (BertAttention) in "
              f"eval mode must return self.output(self.self(h, packing), h): the attention, "
              f"then the output projection W_o, the residual h and LayerNorm (BertOutput); "
              + (f"it is up to {gap:.3g} away from that, computed with its own modules"
                 if gap is not None else f"it has shape {tuple(got_a.shape)}, that "
                 f"{tuple(composed.shape)}"))
        a_own = got_a
        wired = layer.output(layer.intermediate(a_own), a_own)
        gap = (got - wired).abs().max().item() if got.shape == wired.shape else None
        check("layer", gap is not None and gap < 1e-5, f"the layer (BertLayer) in eval mode must "
              f"return self.output(self.intermediate(a), a), a = self.attention(h, packing): the "
              f"feed-forward block GELU(a W_1) W_2 with its residual a, added and normed by "
              f"BertOutput, nothing after it; "
              + (f"it is up to {gap:.3g} away from that, computed with its own modules"
                 + ("; it equals a + that: a is added again after the block's add-and-norm"
                    if gap > 1e-5 and torch.allclose(got, a_own + wired, atol=1e-5) else "")
                 if gap is not None
                 else f"it has shape {tuple(got.shape)}, that {tuple(wired.shape)}"))
        no_known_mistake("layer", got_a, {
            "its residual is the attention's output; it is the block's input h":
                layer_norm(attn + linear(attn, o.dense), o.LayerNorm),
        }, "the attention block (BertAttention)")
        close("layer", got_a, a, "the attention block (BertAttention) a = "
              "LayerNorm(h + Attention(h) W_o^T + b_o)")
        f = linear(gelu(linear(a, layer.intermediate.dense)), layer.output.dense)
        fh = linear(gelu(linear(h, layer.intermediate.dense)), layer.output.dense)
        norm = layer.output.LayerNorm
        no_known_mistake("layer", got, {
            "the feed-forward block's residual is h, the layer's input; it is a, the attention "
            "block's output": layer_norm(h + f, norm),
            "the feed-forward block reads h, the layer's input; it reads a, the attention "
            "block's output": layer_norm(a + fh, norm),
            "the feed-forward block is missing: the layer returns a": a,
        }, "the layer (BertLayer)")
        close("layer", got, expected, "the layer's output LayerNorm(a + GELU(a W_1) W_2) in "
              "eval mode")


@pytest.mark.parametrize("mode", ["eval", "training"])
def test_layer_forward_and_backward_match_the_formula(mode):
    """The whole layer against its formula, in float64, forward and backward: the gradient of h
    and of every parameter (tests/formula.py). Rows with padding inside and at the end."""
    config = dataclasses.replace(SMALL, hidden_dropout_prob=0.3 if mode == "training" else 0.1,
                                 attention_probs_dropout_prob=0.0)
    layer = small_layer(config).double().train(mode == "training")
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 0, 0], [1, 0, 1, 1, 1, 0]])
    packing = Packing(mask)
    h = wave(int(mask.sum()), SMALL.hidden_size, phase=0.3).double()
    same_as_formula("layer", f"the layer (BertLayer) in {mode} mode",
                    lambda h: layer(h, packing), lambda h: layer_formula(layer, h, packing),
                    {"h": h}, params=dict(layer.named_parameters()), rng_seed=0,
                    axes=("token", "feature"), grad_axes={"h": ("token", "feature")},
                    mistakes=layer_readings(layer, packing))


def test_layer_drops_out_in_both_blocks_in_training():
    layer = small_layer(dataclasses.replace(SMALL, hidden_dropout_prob=0.5,
                                            attention_probs_dropout_prob=0.0)).train()
    h, packing = layer_inputs()
    with torch.no_grad():
        got = seeded(lambda: layer(h, packing))
        _, expected = seeded(lambda: layer_oracle(layer, h, packing))
    close("layer", got, expected, "the layer's output in training mode (dropout on each "
          "block's projection, before its add and norm: first the attention block's, then the "
          "feed-forward block's)")


def test_layer_sanity_check():
    h, packing = layer_inputs()
    with torch.no_grad():
        matches_reference("layer", "padded", small_layer()(h, packing))


def test_layer_runs_on_the_inputs_device():
    """On a second device (tests/elsewhere.py), in training (its dropouts drawn alike)."""
    h, _ = layer_inputs()
    check_on_second_device("layer", "the layer (BertLayer) in training mode",
                           lambda layer, h, mask: layer(h, Packing(mask)), {"h": h, "mask": MASK},
                           small_layer(dataclasses.replace(SMALL, hidden_dropout_prob=0.3)).train())


# --- the whole model ---

def random_batch(vocab_size, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(5, vocab_size, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask  # pad id 0 at the padded positions


@contextlib.contextmanager
def kernel(model, how):
    """The model with every layer's attention set to `how` ("explicit" or "fused"), put back as
    it was afterwards: the model is shared between tests."""
    before = [layer.attention.self.kernel for layer in model.encoder.layer]
    model.set_attention(how)
    try:
        yield model
    finally:
        for layer, k in zip(model.encoder.layer, before):
            layer.attention.self.kernel = k


def test_parity_with_reference_bert_on_default_weights():
    """The hand-written BERT on all-MiniLM-L6-v2 against Hugging Face transformers' outputs
    (stored in the fixture by tests/fixtures/make_golden.py), on a padded batch of sentence pairs."""
    golden = torch.load(GOLDEN, weights_only=True)
    model = BertModel.from_pretrained("minilm").eval()
    assert golden["attention_mask"].min() == 0 and golden["token_type_ids"].max() == 1  # padding and pairs
    parts = ", ".join(label(n) for n in ("embeddings", "attention", "layer"))
    for how in ("fused", "explicit"):
        model.set_attention(how)
        with torch.no_grad():
            h, pooled = model(golden["input_ids"], golden["attention_mask"], golden["token_type_ids"], pooled=True)
        real = golden["attention_mask"].bool()
        for what, got, want in (("last hidden states", h[real], golden["last_hidden_state"][real]),
                                ("pooled outputs", pooled, golden["pooler_output"])):
            diff = (got - want).abs().max().item()  # 1e-4: another library's sums, another
            # CPU's kernels (seen: 3e-6; under `pytest --kernels` no-mkldnn or avx2, 2e-6)
            assert diff < 1e-4, (f"BERT ({parts}): with {how} attention, all-MiniLM-L6-v2's {what} "
                                 f"differ from Hugging Face's by up to {diff:.3g} (1e-4 allowed); "
                                 f"each part's own tests say which is off")


def test_padding_does_not_change_real_tokens(tiny_bert):
    ids, mask = random_batch(tiny_bert.config.vocab_size, [9, 9])
    with torch.no_grad():
        alone = tiny_bert(ids[:1], mask[:1])
        padded_ids = torch.cat([ids[:1], torch.zeros(1, 6, dtype=torch.long)], 1)
        padded_mask = torch.cat([mask[:1], torch.zeros(1, 6, dtype=torch.long)], 1)
        padded = tiny_bert(padded_ids, padded_mask)
    torch.testing.assert_close(padded[:, :9], alone, atol=1e-5, rtol=1e-5)


def test_padded_batch_equals_each_example_run_alone_outputs_and_gradients(tiny_bert):
    """The encoder packs the real tokens and runs its matmuls, GELUs and LayerNorms on them alone
    (minknn/packed.py, Packing). A padded batch must give every real token the hidden state, and
    every weight the gradient, that its example gets alone with no padding at all: a wrong index, a
    padding row let into attention, or a token packed into another row's place breaks one of the two."""
    model = copy.deepcopy(tiny_bert).double()
    lengths = [11, 3, 7, 1]  # the 1: a row of [CLS] alone
    ids, mask = random_batch(model.config.vocab_size, lengths, seed=3)
    types = (torch.arange(ids.size(1)) >= 2).long().expand_as(ids) * mask  # segment B after 2
    probe = torch.randn(model.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def loss_and_grads(ids, mask, types):
        model.zero_grad()
        h, pooled = model(ids, mask, types, pooled=True)
        loss = (h * mask[..., None]).sum(1) @ probe + pooled.sum(-1)  # (B,): each example's
        loss.sum().backward()
        return h, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    h, grads = loss_and_grads(ids, mask, types)
    summed = {}
    for i, n in enumerate(lengths):
        h_alone, g_alone = loss_and_grads(ids[i:i + 1, :n], mask[i:i + 1, :n], types[i:i + 1, :n])
        torch.testing.assert_close(h[i, :n], h_alone[0], msg=lambda m: f"example {i} (length {n}): its hidden "
                                   f"states in the padded batch differ from the example run alone: {m}")
        assert (h[i, n:] == 0).all(), f"example {i}: padding positions of h should be 0"
        for name, g in g_alone.items():
            summed[name] = summed.get(name, 0) + g
    assert set(grads) == set(summed), "the padded batch and the examples alone reach different weights"
    for name in grads:
        torch.testing.assert_close(grads[name], summed[name], msg=lambda m: f"gradient of {name}: the padded "
                                   f"batch's is not the sum of the examples' run alone: {m}")


def test_no_matmul_sees_a_padding_token(tiny_bert):
    """Unpadding is a speed claim: every matmul of the encoder gets N rows, the real tokens, not B T."""
    lengths = [9, 2, 5]
    ids, mask = random_batch(tiny_bert.config.vocab_size, lengths)
    rows = {}

    def count(module, inputs, output):
        rows[module] = inputs[0].shape[:-1].numel()  # the rows of (..., in_features)
    linears = {m: name for name, m in tiny_bert.encoder.named_modules() if isinstance(m, torch.nn.Linear)}
    hooks = [m.register_forward_hook(count) for m in linears]
    try:
        with torch.no_grad():
            tiny_bert(ids, mask)
    finally:  # the model is shared with other tests
        for h in hooks:
            h.remove()
    rows = {linears[m]: n for m, n in rows.items()}
    padded = {name: n for name, n in rows.items() if n != sum(lengths)}
    assert rows and not padded, (f"these linear layers ran on {padded} rows, not the {sum(lengths)} real "
                                 f"tokens of a ({len(lengths)}, {max(lengths)}) batch")


def test_explicit_and_fused_kernels_agree_in_the_model(tiny_bert):
    """The model's two --attention kernels agree (attention() itself against PyTorch's kernel:
    test_attention_matches_pytorchs_kernel)."""
    ids, mask = random_batch(tiny_bert.config.vocab_size, [12, 7, 3])
    outs = {}
    for how in ("fused", "explicit"):
        with kernel(tiny_bert, how), torch.no_grad():
            outs[how] = tiny_bert(ids, mask)
    real = mask.bool()
    close("attention", outs["explicit"][real], outs["fused"][real], "the tiny BERT's hidden "
          "states with --attention explicit (against fused)", atol=1e-5, rtol=1e-4)


def test_packed_kernels_equal_the_padded_call_outputs_and_gradients(tiny_bert, monkeypatch):
    """On a GPU, --attention packed runs attention over the packed tokens (packed.packed_attention,
    here its nested-tensor path, run on the CPU for the test): every real token's hidden state
    and every weight's gradient must be the padded call's. A wrong span (a row's tokens attending
    to its neighbour's) or heads mixed up in the (N, nh, hs) view breaks one of the two."""
    monkeypatch.setattr(packed, "PACKED_DEVICES", ("cpu",))
    ran = []
    written = packed.packed_attention  # bert.py calls it by the name it imported
    monkeypatch.setattr(bert, "packed_attention", lambda how, *a: ran.append(how) or written(how, *a))
    model = copy.deepcopy(tiny_bert).double()
    ids, mask = random_batch(model.config.vocab_size, [11, 3, 7, 1], seed=4)
    probe = torch.randn(model.config.hidden_size, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(2))
    out = {}
    for how in ("fused", "packed"):
        model.set_attention(how).zero_grad()
        h = model(ids, mask)
        ((h * mask[..., None]).sum(1) @ probe).sum().backward()
        out[how] = h.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    layers = model.config.num_hidden_layers
    assert ran == ["nested"] * layers, (f"--attention packed on a packing device ran the packed kernel "
                                        f"{ran} in a {layers}-layer model; expected 'nested' in each layer")
    real = mask.bool()  # (packed.packed_attention, not a student's part: both calls run the parts alike)
    torch.testing.assert_close(out["packed"][0][real], out["fused"][0][real], atol=1e-10, rtol=1e-10,
                               msg=lambda m: f"packed.packed_attention: real tokens' hidden states differ from "
                               f"the padded call's: {m}")
    for name, g in out["fused"][1].items():
        torch.testing.assert_close(out["packed"][1][name], g, atol=1e-10, rtol=1e-8,
                                   msg=lambda m: f"packed.packed_attention: the gradient of {name} is not "
                                   f"the padded call's: {m}")


def test_the_fused_kernel_never_lets_cudnn_plan_one_per_shape(tiny_bert, monkeypatch):
    """--attention fused calls F.scaled_dot_product_attention with cuDNN's backend off
    (bert.SDPA_KERNELS): on an H200 its planning of each new padded shape made the first SST epoch
    3.3x slower. The flags are PyTorch's, read inside the call (on any device), and put back after."""
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    ids, mask = random_batch(tiny_bert.config.vocab_size, [6, 3])
    with kernel(tiny_bert, "fused"), torch.no_grad():
        tiny_bert(ids, mask)
    assert seen and not any(seen), (f"cuDNN's attention was enabled in {sum(seen)} of {len(seen)} calls of "
                                    f"F.scaled_dot_product_attention")
    assert torch.backends.cuda.cudnn_sdp_enabled() == before, "the cuDNN attention flag was not put back"


def test_one_padding_mask_a_batch_serves_every_block(tiny_bert, monkeypatch):
    """The padded call's additive mask (Packing.mask) is built once a batch and dtype, not once a
    layer: every layer's attention() gets the same tensor, in q's dtype (bf16 under autocast), the
    dtype's most negative number at padding keys and 0 elsewhere."""
    for dtype in (torch.float32, torch.bfloat16):
        seen = []

        def spy(q, k, v, mask, dropout_p):
            seen.append((mask, q.dtype))
            return attention(q, k, v, mask, dropout_p)  # the real one, imported above
        monkeypatch.setattr(bert, "attention", spy)
        ids, mask = random_batch(tiny_bert.config.vocab_size, [6, 3])
        with kernel(tiny_bert, "explicit"), torch.no_grad(), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            tiny_bert(ids, mask)
        layers = tiny_bert.config.num_hidden_layers
        assert len(seen) == layers, f"attention() ran {len(seen)} times for {layers} layers"
        assert len({id(m) for m, _ in seen}) == 1, \
            f"{dtype}: the layers got {len({id(m) for m, _ in seen})} different masks, not the batch's one"
        got, q_dtype = seen[0]
        assert got.dtype == q_dtype, f"{dtype}: the mask is {got.dtype}, q is {q_dtype}"
        want = torch.zeros(mask.shape, dtype=q_dtype).masked_fill(mask == 0, torch.finfo(q_dtype).min)
        assert torch.equal(got, want[:, None, None, :]), \
            f"{dtype}: the mask is not 0 at real keys and finfo.min at padding keys, (B, 1, 1, T)"


def test_packed_kernel_is_chosen_only_where_it_applies(monkeypatch):
    """packed.packed_kernel, the one place that chooses: the packed kernels take no additive term and
    run only on the devices listed, so MPNet's bias, --attention explicit or fused, a batch without
    padding and a row with no real token keep the padded call."""
    monkeypatch.setattr(packed, "PACKED_DEVICES", ("cpu",))
    qkv = torch.zeros(4, 3, 2, 8)
    ragged = Packing(torch.tensor([[1, 1, 1], [1, 0, 0]]))
    biased = Packing(torch.tensor([[1, 1, 1], [1, 0, 0]]))
    biased.bias = torch.zeros(1, 2, 3, 3)
    cases = {"packed, padding": ("packed", ragged, "nested"),
             "explicit": ("explicit", ragged, None), "fused": ("fused", ragged, None),
             "no padding": ("packed", Packing(torch.ones(2, 3, dtype=torch.long)), None),
             "MPNet's bias": ("packed", biased, None),
             "an empty row": ("packed", Packing(torch.tensor([[1, 1, 0], [0, 0, 0]])), None)}
    for case, (kernel, packing, want) in cases.items():
        got = packed.packed_kernel(kernel, qkv, 0.0, packing)
        assert got == want, f"packed_kernel for {case}: {got!r}, expected {want!r}"
    monkeypatch.setattr(packed, "PACKED_DEVICES", ("cuda",))
    assert packed.packed_kernel("packed", qkv, 0.0, ragged) is None, "the CPU is not a packing device here"
    # on CUDA (a stand-in of qkv's device, dtype and head size): flash varlen in bf16 evaluation, where this
    # torch has it (imported on first use: packed.varlen_kernel), nested tensors with dropout or in fp32
    on_gpu = type("QKV", (), {"device": torch.device("cuda"), "size": lambda self, d: 16})
    varlen = "varlen" if packed.varlen_kernel() is not None else "nested"
    for dtype, dropout, want in ((torch.bfloat16, 0.0, varlen), (torch.bfloat16, 0.1, "nested"),
                                 (torch.float32, 0.0, "nested")):
        qkv_gpu = on_gpu()
        qkv_gpu.dtype = dtype
        got = packed.packed_kernel("packed", qkv_gpu, dropout, ragged)
        assert got == want, f"packed_kernel on CUDA, {dtype}, dropout {dropout}: {got!r}, expected {want!r}"


def test_fused_kernel_drops_the_weights_too():
    """--attention fused and explicit agree with dropout too: both drop attention weights and scale
    the kept ones by 1 / (1 - p) (test_attention_dropout_drops_the_weights, for attention())."""
    q, k, _, _ = attention_inputs(T=12)
    eye = torch.eye(12).expand(2, 2, 12, 12)
    plain = F.scaled_dot_product_attention(q, k, eye)
    w = seeded(lambda: F.scaled_dot_product_attention(q, k, eye, dropout_p=0.5))
    kept = w != 0
    assert 0.35 < kept.float().mean() < 0.65
    torch.testing.assert_close(w[kept], plain[kept] / 0.5)


def test_a_fully_padded_row_stays_finite_in_bf16(tiny_bert):
    """Under bf16 autocast q is bf16, and fp32's most negative number rounds to -inf there: a row whose
    keys are all padding (the second below) was softmax(-inf, ..) = NaN on the explicit path. Each
    path in fp32 and in bf16: finite everywhere, the two paths agree, bf16 near fp32 on real tokens."""
    ids, mask = random_batch(tiny_bert.config.vocab_size, [9, 0, 4])
    out = {}
    for precision in ("fp32", "bf16"):
        for path in ("fast", "explicit"):
            with kernel(tiny_bert, "fused" if path == "fast" else "explicit"), torch.no_grad(), \
                    torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                out[precision, path] = tiny_bert(ids, mask)
            assert torch.isfinite(out[precision, path]).all(), f"{path} attention in {precision}: non-finite h"
    for precision in ("fp32", "bf16"):
        torch.testing.assert_close(out[precision, "explicit"], out[precision, "fast"], atol=1e-2, rtol=1e-2,
                                   msg=f"{precision}: explicit and fast attention differ (padded rows included)")
    real = mask.bool()
    torch.testing.assert_close(out["bf16", "explicit"][real], out["fp32", "explicit"][real], atol=0.1, rtol=0.1,
                               msg="explicit attention: bf16 hidden states far from fp32 on real tokens")


def test_output_shapes(tiny_bert):
    ids, mask = random_batch(tiny_bert.config.vocab_size, [6, 4])
    h, pooled = tiny_bert(ids, mask, pooled=True)
    assert h.shape == (2, 6, 32) and pooled.shape == (2, 32)
    types = torch.ones_like(ids)
    assert not torch.allclose(tiny_bert(ids, mask, types), h)  # token types are used


def copy_folder(tiny_bert_dir, tmp_path, names=("config.json", "vocab.txt")):
    for name in names:
        (tmp_path / name).write_bytes(open(os.path.join(tiny_bert_dir, name), "rb").read())


def test_loads_prefixed_weights_and_names_the_heads_it_ignores(tiny_bert_dir, tmp_path, capsys):
    state = load_safetensors(os.path.join(tiny_bert_dir, "model.safetensors"))
    prefixed = {"bert." + k: v for k, v in state.items()}
    prefixed.update({"cls.predictions.bias": torch.zeros(3), "cls.predictions.transform.dense.weight": torch.zeros(2, 2),
                     "cls.seq_relationship.bias": torch.zeros(2), "classifier.weight": torch.zeros(2, 32)})
    prefixed["bert.embeddings.position_ids"] = torch.arange(64)[None]  # a buffer: dropped without a word
    copy_folder(tiny_bert_dir, tmp_path)
    torch.save(prefixed, tmp_path / "pytorch_model.bin")  # the .bin path too
    capsys.readouterr()
    model = BertModel.from_pretrained(str(tmp_path))
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), f"{k}: not the file's tensor"
    assert capsys.readouterr().out == (f"note: {tmp_path / 'pytorch_model.bin'}: ignoring 4 tensors the encoder does not "
                                       f"use: cls.* (3), classifier.* (1)\n")
    BertModel.from_pretrained(tiny_bert_dir)
    assert capsys.readouterr().out == "", "a folder without heads needs no note"


def test_non_finite_weights_are_blamed_on_the_file(tiny_bert_dir, tmp_path):
    state = load_safetensors(os.path.join(tiny_bert_dir, "model.safetensors"))
    copy_folder(tiny_bert_dir, tmp_path)
    bad = {"bert." + k: v.clone() for k, v in state.items()}
    bad["bert.encoder.layer.0.attention.self.query.weight"][3, :2] = torch.tensor([float("nan"), float("-inf")])
    save_safetensors(bad, tmp_path / "model.safetensors")
    with pytest.raises(MinknnError, match=f"^{re.escape(str(tmp_path / 'model.safetensors'))}: bert.encoder.layer.0.attention.self.query.weight "
                                          f"holds 2 non-finite values"):
        BertModel.from_pretrained(str(tmp_path))
    bad = dict(state, **{"cls.predictions.bias": torch.full((3,), float("nan"))})  # in an ignored head: harmless
    save_safetensors(bad, tmp_path / "model.safetensors")
    BertModel.from_pretrained(str(tmp_path))


def test_config_options_the_model_does_not_implement_are_refused(tiny_bert_dir):
    config = json.load(open(os.path.join(tiny_bert_dir, "config.json")))
    others = {"hidden_act": "gelu_new", "position_embedding_type": "relative_key",
              "is_decoder": True, "add_cross_attention": True, "pruned_heads": {"1": [0, 2]}}
    assert set(others) == set(NOT_IMPLEMENTED)
    for key, value in others.items():
        with pytest.raises(MinknnError, match=f"^config.json: {key} {re.escape(json.dumps(value))} is not implemented"):
            BertConfig.from_dict(dict(config, **{key: value}))
    # the implemented values, written out, and options that do not change the encoder's output
    defaults = {key: only for key, (only, _) in NOT_IMPLEMENTED.items()}
    BertConfig.from_dict(dict(config, **defaults, chunk_size_feed_forward=16, use_cache=False, classifier_dropout=0.3))


@pytest.mark.parametrize("key, value, says", [
    ("hidden_size", "32", 'hidden_size is "32"; it must be a whole number >= 1'),
    ("num_hidden_layers", 2.0, "num_hidden_layers is 2.0; it must be a whole number >= 1"),
    ("num_attention_heads", True, "num_attention_heads is true; it must be a whole number >= 1"),
    ("vocab_size", 0, "vocab_size is 0; it must be a whole number >= 1"),
    ("hidden_dropout_prob", 1.5, r"hidden_dropout_prob is 1.5; it must be a number in \[0, 1\)"),
    ("attention_probs_dropout_prob", None, "attention_probs_dropout_prob is null"),
    ("layer_norm_eps", 0, r"layer_norm_eps is 0; it must be a number in \(0, 1\)"),
    ("pad_token_id", -1, "pad_token_id is -1; it must be a whole number >= 0, or null"),
    ("pad_token_id", 10 ** 6, "pad_token_id 1000000 is not a row of the"),
    ("num_attention_heads", 5, "hidden_size 32 is not a multiple of num_attention_heads 5"),
    ("model_type", "gpt2", 'model_type is "gpt2"; it must be one of bert, roberta, distilbert, mpnet'),
], ids=["string", "float", "bool", "zero", "above-1", "null", "eps-0", "negative", "beyond-vocab",
        "not-a-divisor", "architecture"])  # short ids: -k attention, -k layer select the parts' tests alone
def test_config_values_are_checked(tiny_bert_dir, key, value, says):
    config = json.load(open(os.path.join(tiny_bert_dir, "config.json")))
    with pytest.raises(MinknnError, match="^config.json: " + says):
        BertConfig.from_dict(dict(config, **{key: value}))


def test_config_file_errors_name_the_file(tiny_bert_dir, tmp_path):
    copy_folder(tiny_bert_dir, tmp_path, ("vocab.txt", "model.safetensors"))
    for text, says in (('{"hidden_size": 32,', "not valid JSON"), ("[1, 2]", "not a JSON object")):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(MinknnError, match=f"^{re.escape(str(tmp_path / 'config.json'))}: {says}"):
            BertModel.from_pretrained(str(tmp_path))


def test_missing_or_unexpected_weights_are_named(tiny_bert_dir, tmp_path):
    state = load_safetensors(os.path.join(tiny_bert_dir, "model.safetensors"))
    copy_folder(tiny_bert_dir, tmp_path)
    broken = dict(state)
    del broken["encoder.layer.1.output.dense.weight"]
    broken["encoder.layer.9.extra"] = torch.zeros(1)
    save_safetensors(broken, tmp_path / "model.safetensors")
    with pytest.raises(MinknnError, match=r"model.safetensors: does not fit the model built from config.json: "
                       r"missing \['encoder.layer.1.output.dense.weight'\]; unexpected \['encoder.layer.9.extra'\]$"):
        BertModel.from_pretrained(str(tmp_path))
    broken = dict(state, **{"pooler.dense.bias": torch.zeros(5)})
    save_safetensors(broken, tmp_path / "model.safetensors")
    with pytest.raises(MinknnError, match="'pooler.dense.bias' has shape"):
        BertModel.from_pretrained(str(tmp_path))


def test_bad_model_folder_errors(tmp_path):
    with pytest.raises(MinknnError, match="neither 'minilm', 'mpnet' nor a folder"):
        BertModel.from_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(MinknnError, match="config.json: not found"):
        BertModel.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "num_attention_heads": 2}')
    with pytest.raises(MinknnError, match="neither model.safetensors nor pytorch_model.bin"):
        BertModel.from_pretrained(str(tmp_path))
    torch.save([torch.zeros(2)], tmp_path / "pytorch_model.bin")
    with pytest.raises(MinknnError, match="pytorch_model.bin: not a state dict"):
        BertModel.from_pretrained(str(tmp_path))
