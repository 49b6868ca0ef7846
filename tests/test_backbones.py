"""RoBERTa and DistilBERT (minknn/backbones.py) and their tokenizers (minknn/tokenizer.py)."""
import json
import os
import shutil

import pytest
import torch
from tokenizers import Tokenizer as BpeEngine
from tokenizers import models

from minknn import backbones
from minknn.tokenizer import Tokenizer

# Parity with transformers, from stored outputs
#
# tests/fixtures/backbones_golden.pt holds what Hugging Face transformers' tokenizers
# (RobertaTokenizerFast, DistilBertTokenizerFast) and encoders (RobertaModel, DistilBertModel,
# eager attention, eval, fp32) give on the tiny random folders of tests/hf_folders.py (seed 0; the
# conftest fixtures tiny_roberta_dir and tiny_distilbert_dir), for four batches: single texts and
# pairs, padded, and the same truncated at max_len 16, with accents, emoji, Japanese, Cyrillic,
# Arabic, double and leading spaces, digits and punctuation. tests/fixtures/make_backbones.py made
# it (it needs transformers; these tests do not). Ids must be identical; hidden states equal within
# atol 1e-5, rtol 1e-4 on real tokens (padding positions are not compared: transformers computes
# values there, minknn leaves zeros).

GOLDEN = torch.load(os.path.join(os.path.dirname(__file__), "fixtures", "backbones_golden.pt"),
                    weights_only=True)
KINDS = ("roberta", "distilbert")
BATCHES = ("singles", "pairs", "truncated singles", "truncated pairs")
CASES = [pytest.param(kind, batch, id=f"{kind}-{batch.replace(' ', '_')}")
         for kind in KINDS for batch in BATCHES]
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
    one-row token-type table, DistilBERT's layer, the attention mask."""
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
