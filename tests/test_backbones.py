"""RoBERTa, DistilBERT and MPNet (minknn/backbones.py) and their tokenizers (minknn/tokenizer.py)."""
import copy
import json
import os
import shutil

import pytest
import torch
from tokenizers import BertWordPieceTokenizer
from tokenizers import Tokenizer as BpeEngine
from tokenizers import models

import evaluate
import minknn.bert
import minknn.tools.trainer
import train
from hf_folders import write_distilbert, write_roberta
from minknn import MinknnError, backbones
from minknn.bert import (BertAttention, BertEmbeddings, BertIntermediate, BertLayer, BertModel,
                         BertOutput)
from minknn.packed import Packing
from minknn.pcgrad import PCGrad
from minknn.tasks.data import load_split
from minknn.tasks.registry import TASKS
from minknn.tokenizer import Tokenizer
from minknn.tools.checkpoint import load_checkpoint, rebuild
from minknn.tools.engine import predict
from minknn.tools.weights import save_safetensors
from helpers import lines_of, run_grid
from test_runs import assert_same_run, flags, keep_last, stop_at
from test_train import run_multitask, run_train

# Parity with transformers, from stored outputs
#
# tests/fixtures/backbones_golden.pt holds what Hugging Face transformers' tokenizers
# (RobertaTokenizerFast, DistilBertTokenizerFast, MPNetTokenizerFast) and encoders (RobertaModel,
# DistilBertModel, MPNetModel, eager attention, eval, fp32) give on the tiny random folders of
# tests/hf_folders.py (seed 0; the conftest fixtures tiny_roberta_dir, tiny_distilbert_dir and
# tiny_mpnet_dir), for four batches (MPNet five: "long"): single texts and
# pairs, padded, and the same truncated at max_len 16, with accents, emoji, Japanese, Cyrillic,
# Arabic, double and leading spaces, digits and punctuation. tests/fixtures/make_backbones.py made
# it (it needs transformers; these tests do not). Ids must be identical; hidden states equal within
# atol 1e-5, rtol 1e-4 on real tokens (padding positions are not compared: transformers computes
# values there, minknn leaves zeros): room for another library's order of operations and another
# CPU's kernels (under `pytest --kernels` one-thread, no-mkldnn and avx2 the largest difference
# seen was 1.2% of it).

GOLDEN = torch.load(os.path.join(os.path.dirname(__file__), "fixtures", "backbones_golden.pt"),
                    weights_only=True)
KINDS = ("roberta", "distilbert", "mpnet")
BATCHES = ("singles", "pairs", "truncated singles", "truncated pairs")
# MPNet's also: one text of 242 tokens, so that queries and keys lie more than 128 apart (where its
# relative buckets stop growing) and every one of the 32 buckets is read
CASES = [pytest.param(kind, batch, id=f"{kind}-{batch.replace(' ', '_')}")
         for kind in KINDS for batch in BATCHES + (("long",) if kind == "mpnet" else ())]
REFERENCE = f"transformers {GOLDEN['transformers_version']}'s (tests/fixtures/backbones_golden.pt)"


@pytest.fixture
def folder(request):
    kind = request.node.callspec.params["kind"]
    return request.getfixturevalue(f"tiny_{kind}_dir")


def texts_of(golden, i):
    a, b = golden["texts"][i], golden["texts_b"] and golden["texts_b"][i]
    return repr(a) if b is None else f"({a!r}, {b!r})"


def assert_same_ids(got, g, what):
    """Each text's real token ids in `got` (a tokenizer's batch) against the stored ones."""
    for i in range(len(g["texts"])):
        ours = got["input_ids"][i][got["attention_mask"][i].bool()].tolist()
        theirs = g["input_ids"][i][g["attention_mask"][i].bool()].tolist()
        assert ours == theirs, (f"{what}: the token ids of text {i} {texts_of(g, i)} differ from "
                                f"{REFERENCE}:\n  minknn       {ours}\n  transformers {theirs}")


def assert_close_on_real_tokens(h, g, what):
    """h (B, T, H) against the stored last hidden states on real tokens; the message names `what`,
    and the text and token where the difference is largest."""
    real = g["attention_mask"].bool()
    assert h.shape[:2] == real.shape, f"{what}: hidden states of shape {tuple(h.shape)}, " \
                                      f"for a batch of {tuple(real.shape)} tokens"
    diff = ((h - g["last_hidden_state"]).abs().amax(-1) * real).nan_to_num(float("inf"))
    i, t = divmod(diff.argmax().item(), diff.size(1))
    torch.testing.assert_close(h[real], g["last_hidden_state"][real], atol=1e-5, rtol=1e-4,
                               msg=lambda m: f"{what}: the last hidden states on real tokens "
                               f"differ from {REFERENCE}, most at text {i} {texts_of(g, i)}, "
                               f"token {t} of {real[i].sum().item()}: {m}")


def test_golden_covers_what_it_claims():
    """The fixture itself: padding, truncation at max_len, pairs and non-Latin text in it, so a
    regenerated file that lost one of them does not pass the tests below for nothing."""
    for kind in KINDS:
        g = GOLDEN[kind]
        assert g["singles"]["attention_mask"].min() == 0 and g["pairs"]["texts_b"], kind
        for batch in ("truncated singles", "truncated pairs"):
            lengths = g[batch]["attention_mask"].sum(1)
            assert (lengths == g[batch]["max_len"]).any() and (lengths < g[batch]["max_len"]).any()
        texts = " ".join(g["singles"]["texts"] + g["pairs"]["texts"] + g["pairs"]["texts_b"])
        for sample in ("é", "ï", "😀", "日本", "Москва", "هذا", "  "):
            assert sample in texts, (kind, sample)
    long = GOLDEN["mpnet"]["long"]["attention_mask"].sum(1)  # one text past distance 128, one short
    assert long.max() > 160 and long.min() < 20, long


@pytest.mark.parametrize("kind,batch", CASES)
def test_tokenizer_ids_equal_transformers(kind, batch, folder):
    """minknn's tokenizer (Tokenizer.from_folder) gives transformers' ids and attention mask,
    exactly: the BPE or WordPiece split, the special tokens and pair template, the truncation of
    the longer text first, the padding id; and for RoBERTa every token type 0."""
    g = GOLDEN[kind][batch]
    got = Tokenizer.from_folder(folder, max_len=g["max_len"])(g["texts"], g["texts_b"])
    want_ids, want_mask = g["input_ids"], g["attention_mask"]
    assert_same_ids(got, g, f"{kind}, batch '{batch}' (max_len {g['max_len']})")
    assert got["input_ids"].shape == want_ids.shape, (
        f"{kind}, batch '{batch}': input_ids padded to {tuple(got['input_ids'].shape)}, "
        f"transformers to {tuple(want_ids.shape)} (the longest example's length)")
    assert got["attention_mask"].tolist() == want_mask.tolist(), (
        f"{kind}, batch '{batch}': the attention mask differs from {REFERENCE} (1 on each text's "
        f"tokens, 0 on the padding after them)")
    pads = [x[want_mask == 0].unique().tolist() for x in (got["input_ids"], want_ids)]
    assert pads[0] == pads[1], (f"{kind}, batch '{batch}': minknn pads with ids {pads[0]}, "
                                f"{REFERENCE} with {pads[1]} (the pad token's id)")
    if kind == "roberta":  # type_vocab_size 1: a pair is told apart by </s></s>, not by type 1
        for i, types in enumerate(got["token_type_ids"].tolist()):
            assert not any(types), (
                f"roberta, batch '{batch}': the token types of text {i} {texts_of(g, i)} are "
                f"{types}; RoBERTa has one token type (type_vocab_size 1), so every token, of "
                f"either text, is type 0")


@pytest.mark.parametrize("how", ("fused", "explicit"))
@pytest.mark.parametrize("kind,batch", CASES)
def test_hidden_states_equal_transformers(kind, batch, how, folder):
    """minknn's encoder (backbones.from_pretrained) on transformers' own ids gives its last hidden
    states on every real token: the weight names, RoBERTa's positions from padding_idx + 1 and its
    one-row token-type table, DistilBERT's layer, MPNet's relative-position bias in every layer,
    the attention mask."""
    g = GOLDEN[kind][batch]
    model = backbones.from_pretrained(folder).eval()
    model.set_attention(how)
    with torch.no_grad():
        h = model(g["input_ids"], g["attention_mask"])
    assert_close_on_real_tokens(h, g, f"{kind}, batch '{batch}', {how} attention")


@pytest.mark.parametrize("kind,batch", CASES)
def test_text_to_hidden_states_equal_transformers(kind, batch, folder):
    """The whole path a run takes, texts -> minknn's tokenizer -> minknn's encoder, token types
    included, gives transformers' hidden states (a tokenizer and an encoder that each pass alone
    but disagree on what the token types mean fail here)."""
    g = GOLDEN[kind][batch]
    model = backbones.from_pretrained(folder).eval()
    batch_in = Tokenizer.from_folder(folder, max_len=g["max_len"])(g["texts"], g["texts_b"])
    with torch.no_grad():
        h = model(batch_in["input_ids"], batch_in["attention_mask"], batch_in["token_type_ids"])
    assert_close_on_real_tokens(h, g, f"{kind}, batch '{batch}', from the texts through "
                                      f"minknn's tokenizer and encoder")


@pytest.mark.parametrize("merges_as", ("pairs", "strings"))
def test_roberta_tokenizer_json_gives_transformers_ids(merges_as, tiny_roberta_dir, tmp_path):
    """A RoBERTa folder with tokenizer.json instead of vocab.json + merges.txt gives the same ids.
    Its merges are ["a", "b"] pairs as tokenizers writes them now, or "a b" strings as older files
    (roberta-base's own tokenizer.json) hold them."""
    folder = tmp_path / "roberta"
    shutil.copytree(tiny_roberta_dir, folder, ignore=shutil.ignore_patterns("vocab.json", "merges.txt"))
    bpe = models.BPE.from_file(*(os.path.join(tiny_roberta_dir, f) for f in ("vocab.json", "merges.txt")))
    BpeEngine(bpe).save(str(folder / "tokenizer.json"))
    if merges_as == "strings":
        saved = json.loads((folder / "tokenizer.json").read_text())
        saved["model"]["merges"] = [" ".join(m) for m in saved["model"]["merges"]]
        (folder / "tokenizer.json").write_text(json.dumps(saved))
    for batch in BATCHES:
        g = GOLDEN["roberta"][batch]
        got = Tokenizer.from_folder(str(folder), max_len=g["max_len"])(g["texts"], g["texts_b"])
        assert_same_ids(got, g, f"roberta from tokenizer.json (merges as {merges_as}), batch "
                                f"'{batch}'")


def test_distilbert_tokenizer_json_without_vocab_txt_gives_transformers_ids(tiny_distilbert_dir, tmp_path):
    """A DistilBERT folder as transformers 5 saves it (tokenizer.json, no vocab.txt) gives the ids
    transformers gave from vocab.txt, and its encoder loads."""
    folder = tmp_path / "distilbert"
    shutil.copytree(tiny_distilbert_dir, folder, ignore=shutil.ignore_patterns("vocab.txt"))
    vocab = open(os.path.join(tiny_distilbert_dir, "vocab.txt"), encoding="utf-8").read().splitlines()
    BertWordPieceTokenizer({w: i for i, w in enumerate(vocab)}).save(str(folder / "tokenizer.json"))
    for batch in BATCHES:
        g = GOLDEN["distilbert"][batch]
        got = Tokenizer.from_folder(str(folder), max_len=g["max_len"])(g["texts"], g["texts_b"])
        assert_same_ids(got, g, f"distilbert from tokenizer.json, batch '{batch}'")
    assert backbones.from_pretrained(str(folder)).config.model_type == "distilbert"


# Configs, weights and names
#
# One place reads a folder's architecture (backbones.config_from_dict): what it refuses, and
# where DistilBERT's keys land. Then the weights: every tensor of a Hugging Face checkpoint loads
# where a transcription of transformers' modelling code says it belongs (not backbones.py's
# table), and the heads it leaves out are named.

ARCHS = "bert, roberta, distilbert, mpnet"


def one_line(e):
    return "\n" not in str(e.value)


@pytest.mark.parametrize("model_type", ["gpt2", "xlm-roberta", "albert", 7])
def test_an_unknown_model_type_is_one_line_naming_the_field(model_type, tmp_path):
    says = (f"config.json: model_type {json.dumps(model_type)} is not implemented; minknn's encoder "
            f"runs {ARCHS}")
    with pytest.raises(MinknnError) as e:
        backbones.config_from_dict({"model_type": model_type, "hidden_size": 32})
    assert str(e.value) == says, str(e.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    for load in (backbones.from_pretrained, Tokenizer.from_folder):  # either reads it first
        with pytest.raises(MinknnError) as e:
            load(str(tmp_path))
        assert str(e.value) == f"{tmp_path}/{says}" and one_line(e), f"{load.__qualname__}: {e.value}"


def test_a_config_without_model_type_is_bert():
    assert backbones.config_from_dict({"hidden_size": 32, "num_attention_heads": 4}).model_type == "bert"


def test_distilbert_sine_positions_are_refused_saying_why():
    for value in (True, 1):
        with pytest.raises(MinknnError) as e:
            backbones.config_from_dict({"model_type": "distilbert", "sinusoidal_pos_embds": value})
        assert str(e.value).startswith(f"config.json: sinusoidal_pos_embds {json.dumps(value)} is "
                                       f"not implemented (fixed sine positions; the released "
                                       f"DistilBERT checkpoints learn their positions") and one_line(e)
    for value in (False, 0):  # transformers reads the flag as a truth value
        assert backbones.config_from_dict({"model_type": "distilbert", "sinusoidal_pos_embds": value})


def test_distilbert_activation_other_than_gelu_is_refused_naming_it():
    with pytest.raises(MinknnError) as e:
        backbones.config_from_dict({"model_type": "distilbert", "activation": "relu"})
    assert str(e.value).startswith('config.json: activation "relu" is not implemented') and one_line(e)
    backbones.config_from_dict({"model_type": "distilbert", "activation": "gelu"})  # its default


# transformers' DistilBertConfig: its key, the BERT field that means the same, its default there
# (models/distilbert/configuration_distilbert.py; LayerNorm eps is 1e-12 in its modelling code)
DISTILBERT_KEYS = [("dim", "hidden_size", 768), ("n_layers", "num_hidden_layers", 6),
                   ("n_heads", "num_attention_heads", 12), ("hidden_dim", "intermediate_size", 3072),
                   ("dropout", "hidden_dropout_prob", 0.1),
                   ("attention_dropout", "attention_probs_dropout_prob", 0.1),
                   ("vocab_size", "vocab_size", 30522),
                   ("max_position_embeddings", "max_position_embeddings", 512),
                   ("pad_token_id", "pad_token_id", 0)]


def test_distilbert_keys_land_in_bert_fields_with_distilberts_defaults():
    """Each key set to a value no other key has, so a key read into the wrong field shows."""
    theirs = dict(dim=48, n_layers=3, n_heads=6, hidden_dim=80, dropout=0.15, attention_dropout=0.05,
                  vocab_size=101, max_position_embeddings=77, pad_token_id=2)
    config = backbones.config_from_dict({"model_type": "distilbert", **theirs})
    for key, field, _ in DISTILBERT_KEYS:
        assert getattr(config, field) == theirs[key], \
            f"DistilBERT's {key} {theirs[key]} should be BertConfig.{field}, which is {getattr(config, field)}"
    defaults = backbones.config_from_dict({"model_type": "distilbert"})
    for key, field, default in DISTILBERT_KEYS:
        assert getattr(defaults, field) == default, f"DistilBERT's default {key} is {default}"
    assert (defaults.layer_norm_eps, defaults.model_type) == (1e-12, "distilbert")


def test_robertas_defaults_are_robertas():
    """transformers' RobertaConfig: pad_token_id 1 (where its positions start) and 50,265 tokens,
    when a config.json leaves them out; the rest as BERT's."""
    config = backbones.config_from_dict({"model_type": "roberta"})
    assert (config.pad_token_id, config.vocab_size) == (1, 50265), \
        f"RoBERTa's defaults are pad_token_id 1 and vocab_size 50265, not {config.pad_token_id}, {config.vocab_size}"


def test_robertas_positions_hold_two_fewer_tokens(tmp_path, tiny_roberta_dir):
    """roberta-base's 514 positions hold 512 tokens (its positions start at padding_idx + 1 = 2):
    --max_len 512 is its longest, and the tiny one's 66 positions run 64 tokens, not 65."""
    config = backbones.config_from_dict({"model_type": "roberta", "max_position_embeddings": 514,
                                         "pad_token_id": 1})
    assert config.max_tokens == 512
    assert backbones.config_from_dict({"max_position_embeddings": 512}).max_tokens == 512  # BERT's
    folder = str(tmp_path / "roberta-514")
    write_roberta(folder, max_position_embeddings=514)
    assert Tokenizer.from_folder(folder, max_len=512).max_len == 512
    with pytest.raises(MinknnError) as e:
        Tokenizer.from_folder(folder, max_len=513)
    assert str(e.value).startswith("--max_len 513 is longer than the model's 512 positions") and one_line(e)
    model = backbones.from_pretrained(tiny_roberta_dir).eval()
    ids = torch.full((1, 64), 5)
    assert model(ids, torch.ones_like(ids)).shape == (1, 64, 32)  # the last position row: 65
    with pytest.raises(MinknnError, match="sequence of 65 tokens is longer than the model's 64 positions"):
        model(torch.full((1, 65), 5), torch.ones(1, 65, dtype=torch.long))


def transcribed_name(theirs):
    """minknn's name for a Hugging Face tensor, or None for a head: written out here from
    transformers' RobertaModel and DistilBertModel against BertModel, independently of
    backbones.py's tables."""
    name = theirs.removeprefix("roberta.").removeprefix("distilbert.")
    if name.startswith(("lm_head.", "pooler.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.")):
        return None
    distilbert_layer = {"attention.q_lin": "attention.self.query", "attention.k_lin": "attention.self.key",
                        "attention.v_lin": "attention.self.value",
                        "attention.out_lin": "attention.output.dense",  # W_o
                        "sa_layer_norm": "attention.output.LayerNorm",  # after the attention
                        "ffn.lin1": "intermediate.dense", "ffn.lin2": "output.dense",  # W_1, W_2
                        "output_layer_norm": "output.LayerNorm"}  # after the feed-forward
    if name.startswith("transformer.layer."):
        _, _, n, rest = name.split(".", 3)
        module, param = rest.rsplit(".", 1)
        return f"encoder.layer.{n}.{distilbert_layer[module]}.{param}"
    return name  # RoBERTa's, and DistilBERT's embeddings: BERT's names


@pytest.mark.parametrize("kind, pooler", [("roberta", False), ("roberta", True), ("distilbert", False)])
def test_every_tensor_of_a_checkpoint_loads_where_it_belongs(kind, pooler, tmp_path, capsys):
    """None missing, none unexpected, none in another tensor's place; the masked-LM head (and a
    RoBERTa pooler) left out, each named in the one note."""
    folder = str(tmp_path / kind)
    weights = write_roberta(folder, pooler=True) if pooler else \
        (write_roberta if kind == "roberta" else write_distilbert)(folder)
    model = backbones.from_pretrained(folder)
    note = capsys.readouterr().out
    own = model.state_dict()
    loaded = set()
    for theirs, tensor in weights.items():
        ours = transcribed_name(theirs)
        if ours is None:
            head = theirs.removeprefix(f"{kind}.").split(".")[0] + ".*"
            assert head in note, f"{kind}: {theirs} left out without a note: {note!r}"
            continue
        assert ours in own, f"{kind}: {theirs} should load into {ours}, which the model does not have"
        torch.testing.assert_close(own[ours], tensor, rtol=0, atol=0,
                                   msg=lambda m: f"{kind}: {ours} does not hold the checkpoint's {theirs}: {m}")
        loaded.add(ours)
    assert sorted(set(own) - loaded) == [], f"{kind}: tensors the checkpoint did not fill"
    assert note.count("\n") == 1 and ("pooler.* (2)" in note) == pooler, note


def rewrite_weights(folder, weights):
    save_safetensors(weights, os.path.join(folder, "model.safetensors"))


def test_distilberts_names_matter_query_and_key_swapped_load_otherwise(tmp_path):
    """The renaming is not cosmetic: q_lin and k_lin swapped in the file load each into the
    other's place, and the encoder computes something else."""
    folder = str(tmp_path / "d")
    weights = write_distilbert(folder)
    model = backbones.from_pretrained(folder).eval()
    q, k = (f"distilbert.transformer.layer.0.attention.{m}.weight" for m in ("q_lin", "k_lin"))
    rewrite_weights(folder, {**weights, q: weights[k], k: weights[q]})
    swapped = backbones.from_pretrained(folder).eval()
    attention = model.encoder.layer[0].attention.self
    assert torch.equal(attention.query.weight, weights[q]) and torch.equal(attention.key.weight, weights[k])
    assert torch.equal(swapped.encoder.layer[0].attention.self.query.weight, weights[k])
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        assert not torch.allclose(model(ids, torch.ones_like(ids)), swapped(ids, torch.ones_like(ids)))


@pytest.mark.parametrize("kind, drop, says", [
    ("roberta", "roberta.encoder.layer.1.attention.self.key.weight",
     "missing ['encoder.layer.1.attention.self.key.weight']"),
    ("distilbert", "distilbert.transformer.layer.1.ffn.lin2.bias",  # named as the file names it
     "missing ['transformer.layer.1.ffn.lin2.bias']"),
    ("distilbert", "distilbert.embeddings.position_embeddings.weight",
     "missing ['embeddings.position_embeddings.weight']"),
])
def test_a_missing_tensor_is_named(kind, drop, says, tmp_path):
    folder = str(tmp_path / kind)
    weights = (write_roberta if kind == "roberta" else write_distilbert)(folder)
    rewrite_weights(folder, {n: v for n, v in weights.items() if n != drop})
    with pytest.raises(MinknnError) as e:
        backbones.from_pretrained(folder)
    assert str(e.value).startswith(f"{folder}/model.safetensors: ") and says in str(e.value), str(e.value)
    assert one_line(e)


def test_an_unexpected_tensor_is_named(tmp_path):
    """A layer more in the file than config.json's num_hidden_layers."""
    folder = str(tmp_path / "r")
    weights = write_roberta(folder)
    extra = "roberta.encoder.layer.2.output.dense.bias"
    rewrite_weights(folder, {**weights, extra: weights[extra.replace(".2.", ".1.")]})
    with pytest.raises(MinknnError, match=r"unexpected \['encoder.layer.2.output.dense.bias'\]"):
        backbones.from_pretrained(folder)


@pytest.mark.parametrize("kind", KINDS)
def test_bert_from_pretrained_refuses_another_architecture(kind, request):
    folder = request.getfixturevalue(f"tiny_{kind}_dir")
    with pytest.raises(MinknnError) as e:
        BertModel.from_pretrained(folder)
    assert str(e.value) == f"{folder}: holds a {kind} model; load it with minknn.backbones.from_pretrained"


@pytest.mark.parametrize("kind", KINDS)
def test_pooled_is_refused_without_a_pooler(kind, request):
    model = backbones.from_pretrained(request.getfixturevalue(f"tiny_{kind}_dir"))
    ids = torch.tensor([[0, 10, 2]])
    with pytest.raises(MinknnError) as e:
        model(ids, torch.ones_like(ids), pooled=True)
    assert str(e.value) == f"{kind} has no pooler; pool the hidden states (--pooling)"


# The differences, each where it acts, against a slow transcription of transformers' code

def tiny_config(kind, **changes):
    d = {"roberta": dict(model_type="roberta", vocab_size=40, hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=12,
                         type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5),
         "distilbert": dict(model_type="distilbert", vocab_size=40, dim=16, n_layers=1, n_heads=2,
                            hidden_dim=32, max_position_embeddings=12),
         "bert": dict(model_type="bert", vocab_size=40, hidden_size=16, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=32, max_position_embeddings=12)}[kind]
    return backbones.config_from_dict({**d, **changes})


def randomise_layer_norms(module, seed=0):
    """LayerNorm weights and biases away from 1 and 0, so that one applied or skipped shows."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.weight.data = 1 + 0.1 * torch.randn(m.weight.shape, generator=g)
            m.bias.data = 0.1 * torch.randn(m.bias.shape, generator=g)
    return module


def transformers_roberta_positions(input_ids, padding_idx):
    """transformers' create_position_ids_from_input_ids, transcribed: a token's position is
    padding_idx + the count of non-padding ids up to it; a padding id's is padding_idx."""
    mask = (input_ids != padding_idx).long()
    return torch.cumsum(mask, dim=1) * mask + padding_idx


def test_robertas_positions_start_after_the_padding_index():
    """A padded batch through RobertaEmbeddings equals LayerNorm(word + position + type) with
    transformers' positions, on every real token. (Rows with "<pad>" written inside a text are
    left out: transformers gives that token no position, minknn the next one, as to any token;
    backbones.RobertaEmbeddings says so.)"""
    torch.manual_seed(0)
    config = tiny_config("roberta")
    emb = randomise_layer_norms(backbones.build(config).embeddings).eval()
    pad = config.pad_token_id
    input_ids = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 2, pad, pad, pad], [0, 2, pad, pad, pad, pad]])
    attention_mask = (input_ids != pad).long()
    types = torch.zeros_like(input_ids)
    positions = transformers_roberta_positions(input_ids, pad)
    assert positions[:2].tolist() == [[2, 3, 4, 5, 6, 7], [2, 3, 4, 1, 1, 1]]
    want = emb.LayerNorm(emb.word_embeddings.weight[input_ids] + emb.position_embeddings.weight[positions]
                         + emb.token_type_embeddings.weight[types])
    with torch.no_grad():
        got = Packing(attention_mask).unpack(emb(input_ids, types, Packing(attention_mask)))
    for row, what in enumerate(["a full row", "a padded row", "a row of <s> </s>"]):
        real = attention_mask[row].bool()
        torch.testing.assert_close(got[row][real], want[row][real], msg=lambda m: (
            f"RoBERTa's embeddings, {what}: not LayerNorm(word + position + type) with positions "
            f"{positions[row][real].tolist()} (padding_idx {pad} + 1 + the token's index): {m}"))


def test_robertas_embeddings_gradients_and_the_position_rows_they_reach():
    """gradcheck (float64) of the embeddings' output in their weights; and a backward pass reaches
    exactly the position rows padding_idx + 1 ... padding_idx + T of a row of T tokens."""
    torch.manual_seed(0)
    config = tiny_config("roberta", hidden_size=4, num_attention_heads=1, vocab_size=9, max_position_embeddings=8)
    emb = backbones.build(config).embeddings.double().eval()
    input_ids = torch.tensor([[0, 4, 5, 2], [0, 6, 2, 1]])
    attention_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    names = [n for n, _ in emb.named_parameters()]

    def embeddings(*weights):
        params = dict(zip(names, weights))
        return torch.func.functional_call(emb, params, (input_ids, torch.zeros_like(input_ids),
                                                        Packing(attention_mask)))
    weights = tuple(p.detach().clone().requires_grad_() for p in emb.parameters())
    assert torch.autograd.gradcheck(embeddings, weights)
    emb.zero_grad()
    emb(input_ids, torch.zeros_like(input_ids), Packing(attention_mask)).pow(2).sum().backward()
    reached = emb.position_embeddings.weight.grad.abs().sum(1).nonzero().squeeze(1).tolist()
    assert reached == [2, 3, 4, 5], \
        f"RoBERTa's 4-token row reads position rows {reached}, not 2 to 5 (padding_idx 1 + 1 on)"


def test_distilbert_has_no_token_types():
    """DistilBERT's embeddings are LayerNorm(word + position): no token-type table, and token
    types given (a pair's 1s) change nothing."""
    torch.manual_seed(0)
    emb = randomise_layer_norms(backbones.build(tiny_config("distilbert")).embeddings).eval()
    assert not [n for n in emb.state_dict() if "token_type" in n], "DistilBERT has no token-type embeddings"
    input_ids = torch.tensor([[2, 5, 6, 3, 7, 3]])
    mask = torch.ones_like(input_ids)
    want = emb.LayerNorm(emb.word_embeddings.weight[input_ids] + emb.position_embeddings.weight[:6])
    with torch.no_grad():
        for types in (torch.zeros_like(input_ids), torch.tensor([[0, 0, 0, 0, 1, 1]])):
            torch.testing.assert_close(emb(input_ids, types, Packing(mask)), want[0], msg=lambda m: (
                f"DistilBERT's embeddings with token types {types.tolist()}: not LayerNorm(word + position): {m}"))


def attention_block_without_dropout(layer, h):
    """LayerNorm(h + (softmax(Q K^T / sqrt(hs)) V) W_o), one sequence h (T, H), written out
    head by head as DistilBERT's MultiHeadSelfAttention and sa_layer_norm compute it."""
    attention = layer.attention.self
    nh, T, H = attention.num_heads, h.size(0), h.size(1)
    hs = H // nh
    q, k, v = (m(h).view(T, nh, hs).transpose(0, 1) for m in (attention.query, attention.key, attention.value))
    heads = torch.stack([torch.softmax(q[i] @ k[i].T / hs ** 0.5, dim=-1) @ v[i] for i in range(nh)])
    out = layer.attention.output
    return out.LayerNorm(h + out.dense(heads.transpose(0, 1).reshape(T, H)))


@pytest.mark.parametrize("kind, attention_dropped", [("distilbert", False), ("bert", True)])
def test_distilbert_drops_out_its_feed_forward_output_but_not_its_attention_output(kind, attention_dropped):
    """In training, with dropout 0.5 on the sub-layers' outputs and none on the attention weights:
    DistilBERT's attention block is exactly the transcription without dropout (transformers'
    TransformerBlock: sa_layer_norm(attention(x) + x)), BERT's is not (it drops its attention
    output); both drop the feed-forward's output, so the layer's output differs from eval's."""
    torch.manual_seed(0)
    config = tiny_config(kind, **({"dropout": 0.5, "attention_dropout": 0.0} if kind == "distilbert" else
                                  {"hidden_dropout_prob": 0.5, "attention_probs_dropout_prob": 0.0}))
    layer = randomise_layer_norms(backbones.build(config).encoder.layer[0]).train()
    h = torch.randn(5, 16)
    packing = Packing(torch.ones(1, 5, dtype=torch.long))
    with torch.no_grad():
        want = attention_block_without_dropout(layer, h)
        got = layer.attention(h, packing)
        same = torch.allclose(got, want, atol=1e-6, rtol=1e-5)
        assert same != attention_dropped, (
            f"{kind}: in training its attention block's output is {'' if same else 'not '}the one without dropout; "
            f"{kind} {'drops' if attention_dropped else 'does not drop'} its attention output "
            f"(DistilBertModel sets that dropout's p to 0)")
        trained, evaluated = layer(h, packing), layer.eval()(h, packing)
    assert not torch.allclose(trained, evaluated), f"{kind}: its feed-forward output is not dropped out in training"


@pytest.mark.parametrize("kind", KINDS)
def test_roberta_and_distilbert_run_the_students_parts(kind, request, monkeypatch):
    """The handout's promise (minknn/assignment/edition.py): RoBERTa's and DistilBERT's embeddings and
    layers run BERT's code, the student's parts (backbones.py changes only their tables), and
    --attention explicit runs the student's attention()."""
    model = backbones.from_pretrained(request.getfixturevalue(f"tiny_{kind}_dir")).eval().set_attention("explicit")
    for layer in model.encoder.layer:
        assert (type(layer), type(layer.attention), type(layer.intermediate), type(layer.output)) == \
            (BertLayer, BertAttention, BertIntermediate, BertOutput), f"{kind}'s layer is not BERT's (the student's)"
    assert type(model.embeddings).forward is BertEmbeddings.forward, f"{kind}'s embeddings do not run BERT's"
    calls = []
    written = minknn.bert.attention
    monkeypatch.setattr(minknn.bert, "attention", lambda *a, **k: calls.append(1) or written(*a, **k))
    ids = torch.tensor([[0, 10, 11, 2]])
    model(ids, torch.ones_like(ids))
    assert len(calls) == model.config.num_hidden_layers, f"{kind}: --attention explicit did not run attention()"


# Every mechanism on top
#
# train.py, evaluate.py, the checkpoint, MoCo, proxies, PCGrad, --option pretrain, --resume and
# the runner on each backbone, end to end on the fixture data: one short epoch each (these tests
# check the wiring, not learning; test_train.py checks that runs learn, on BERT).

def few(*extra):
    """One short epoch on 16 SST examples."""
    return ["--epochs", "1", "--max_train", "16", *extra]


def saved_at_checkpoint(monkeypatch):
    """What train.py's model and tokenizer were when it saved checkpoint.pt (copies)."""
    saved = {}
    real = minknn.tools.trainer.save_checkpoint

    def save(path, model, losses, tokenizer, *args, **kwargs):
        saved.update(model=copy.deepcopy(model), tokenizer=tokenizer)
        return real(path, model, losses, tokenizer, *args, **kwargs)
    monkeypatch.setattr(minknn.tools.trainer, "save_checkpoint", save)
    return saved


SOME_TEXTS = ["A great film!", "Café naïve 😀 日本", " two  spaces", "<mask> and </s> inside"]


@pytest.mark.parametrize("kind", KINDS)
def test_train_evaluate_and_a_rebuilt_checkpoint_on_each_backbone(kind, folder, data_dir, tmp_path,
                                                                   monkeypatch):
    """checkpoint.pt rebuilds (minknn.tools.checkpoint.rebuild) the run's architecture and tokenizer:
    it predicts exactly what the trained model did, and its tokenizer is the folder's kind with
    the same ids (RoBERTa: the BPE merges saved and restored); evaluate.py scores it as train.py
    did."""
    if kind == "roberta":  # its tokenizer option travels in the checkpoint too
        folder = str(shutil.copytree(folder, tmp_path / "roberta-with-prefix-space"))
        (tmp_path / "roberta-with-prefix-space" / "tokenizer_config.json").write_text('{"add_prefix_space": true}')
    saved = saved_at_checkpoint(monkeypatch)
    summary = run_train(folder, data_dir, tmp_path / "run", *few())
    ckpt = load_checkpoint(str(tmp_path / "run"))
    assert ckpt["bert_config"]["model_type"] == kind
    model, _, tokenizer = rebuild(ckpt)
    made = backbones.from_pretrained(folder)
    assert type(model.bert) is type(made), f"{kind}: rebuilt as {type(model.bert).__name__}"
    from_folder = Tokenizer.from_folder(folder, max_len=32)
    assert type(tokenizer) is type(from_folder), f"{kind}: the tokenizer rebuilt as {type(tokenizer).__name__}"
    assert tokenizer.encode(SOME_TEXTS, SOME_TEXTS[::-1]) == from_folder.encode(SOME_TEXTS, SOME_TEXTS[::-1]), \
        f"{kind}: the rebuilt tokenizer's ids differ from the folder's"
    task = TASKS["sst"]
    dev = load_split(task, "dev", data_dir)
    trained = predict(saved["model"], saved["tokenizer"], task, dev, 8, torch.device("cpu"))
    rebuilt = predict(model, tokenizer, task, dev, 8, torch.device("cpu"))
    for what, a, b in zip(("logits", "representations"), rebuilt, trained):
        torch.testing.assert_close(a, b, rtol=0, atol=0,
                                   msg=lambda m: f"{kind}: the rebuilt checkpoint's {what} differ: {m}")
    scored = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--device", "cpu"])["sst"]
    assert (scored["acc"], scored["macro_f1"]) == (summary["dev"]["sst"]["acc"], summary["dev"]["sst"]["macro_f1"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("loss", ["knnbert", "proxyanchor"])
def test_moco_and_proxies_then_knn_and_proxy_inference_on_each_backbone(kind, loss, folder, data_dir, tmp_path):
    """knnbert (MoCo's key encoder, a copy of the backbone, and its queue) then evaluate.py --knn;
    proxyanchor then --proxy (alpha 0 is the linear head's figure)."""
    summary = run_train(folder, data_dir, tmp_path / "run", *few("--loss", loss))
    run = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--device", "cpu"]
    if loss == "knnbert":
        memory = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["memory"]
        assert memory["keys"].shape == (16, 32) and torch.isfinite(memory["keys"]).all()
        result = evaluate.main(run + ["--knn", "--k", "4"])["sst"]
        assert 0 <= result["knn_acc"] <= 1 and 0 <= result["mix_acc"] <= 1, result
    else:
        result = evaluate.main(run + ["--proxy", "--proxy_alpha", "0"])["sst"]
        assert (result["proxy_acc"], result["proxy_macro_f1"]) == (result["acc"], result["macro_f1"])
    assert result["acc"] == summary["dev"]["sst"]["acc"]


@pytest.mark.parametrize("kind", ["roberta", "mpnet"])
def test_multitask_with_pcgrad_on_roberta_and_mpnet(kind, request, data_dir, tmp_path, monkeypatch):
    """SST with the pair tasks Quora (<s> a </s></s> b </s>) and STS, PCGrad's projected steps."""
    calls = []
    backward = PCGrad.backward
    monkeypatch.setattr(PCGrad, "backward", lambda *a: calls.append(1) or backward(*a))
    summary = run_multitask(request.getfixturevalue(f"tiny_{kind}_dir"), data_dir, tmp_path / "run",
                            "--epochs", "1", "--max_train", "8", "--pcgrad")
    assert calls, "--pcgrad took no PCGrad step"
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--device", "cpu"])
    for name in ("sst", "quora", "sts"):
        assert {k: result[name][k] for k in summary["dev"][name]} == summary["dev"][name], name


def test_a_pretrain_run_on_distilbert_reads_its_frozen_encoder_back_from_the_folder(tiny_distilbert_dir, data_dir,
                                                                                    tmp_path):
    """--option pretrain: the checkpoint leaves the encoder out and names the folder; rebuilding
    reads DistilBERT's weights back from it, under their DistilBERT names."""
    summary = run_train(tiny_distilbert_dir, data_dir, tmp_path / "run", *few("--option", "pretrain"))
    ckpt = load_checkpoint(str(tmp_path / "run"))
    assert not [k for k in ckpt["model"] if k.startswith("bert.")], "the frozen encoder was saved"
    assert ckpt["base_model"]["folder"] == os.path.abspath(tiny_distilbert_dir)
    model, _, _ = rebuild(ckpt)
    for name, tensor in backbones.from_pretrained(tiny_distilbert_dir).state_dict().items():
        assert torch.equal(model.bert.state_dict()[name], tensor), f"the rebuilt frozen encoder's {name}"
    scored = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--device", "cpu"])["sst"]
    assert scored["acc"] == summary["dev"]["sst"]["acc"]


def test_a_stopped_roberta_run_resumes_as_if_never_stopped(tiny_roberta_dir, data_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C in epoch 2, then --resume: the same weights, MoCo memory and records as the run left
    alone (last.pt rebuilt the RoBERTa, its key encoder and its tokenizer)."""
    argv = flags(tiny_roberta_dir, data_dir, *few("--epochs", "2", "--steps_per_epoch", "2", "--loss", "knnbert"))
    real_step = train.train_step
    keep_last(monkeypatch)
    train.main([*argv, "--out", str(tmp_path / "alone")])
    stop_at(monkeypatch, 3, KeyboardInterrupt)
    with pytest.raises(SystemExit) as stopped:
        train.main([*argv, "--out", str(tmp_path / "stopped")])
    assert stopped.value.code == 130, capsys.readouterr().err
    monkeypatch.setattr(train, "train_step", real_step)
    train.main(["--resume", str(tmp_path / "stopped")])
    assert_same_run(tmp_path / "alone", tmp_path / "stopped", "roberta, --loss knnbert resumed after epoch 1",
                    final=True)


@pytest.mark.parametrize("kind", ["roberta", "mpnet"])
def test_the_runner_on_a_roberta_or_mpnet_folder(kind, request, tmp_path):
    """One cell of a grid: trained, scored, its checkpoint the folder's architecture, evaluate.py's
    figure."""
    out = tmp_path / "grid"
    run_grid(request.getfixturevalue(f"tiny_{kind}_dir"), out, "--seeds", "0", "--epochs", "1", "--keep",
             tasks="sst2", methods="ce")
    [line] = lines_of(out)
    ckpt = out / "runs" / line["cell"] / "checkpoint.pt"
    assert load_checkpoint(str(ckpt))["bert_config"]["model_type"] == kind
    scored = evaluate.main(["--checkpoint", str(ckpt), "--split", "test", "--device", "cpu",
                            "--out", str(tmp_path / "check.csv")])["sst2"]
    assert scored["acc"] == pytest.approx(line["grid"][0]["test"]["acc"])
