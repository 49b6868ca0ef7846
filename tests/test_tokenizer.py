import json
import os
import re
import unicodedata

import pytest
import tokenizers
import torch

from minknn import MinknnError
from minknn.bert import resolve_model_path
from minknn.tokenizer import Tokenizer

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "minilm_golden.pt")


def test_pairs_match_the_reference_tokenizer():
    """The golden fixture holds Hugging Face BertTokenizer's ids for two padded sentence pairs."""
    golden = torch.load(GOLDEN, weights_only=True)
    tok = Tokenizer.from_folder(resolve_model_path("minilm"))
    batch = tok(golden["texts_a"], golden["texts_b"])
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(batch[key], golden[key]), key


def test_single_sentences_lowercase_and_pad_to_longest(tiny_bert_dir):
    tok = Tokenizer.from_folder(tiny_bert_dir, max_len=32)
    batch = tok(["The FILM is great .", "dull"])
    ids = batch["input_ids"]
    assert ids.shape == (2, 7)  # [CLS] the film is great . [SEP]: padded to the longest, not to 32
    words = [tok.vocab[i] for i in ids[0]]
    assert words == ["[CLS]", "the", "film", "is", "great", ".", "[SEP]"]
    assert [tok.vocab[i] for i in ids[1]] == ["[CLS]", "dull", "[SEP]", "[PAD]", "[PAD]", "[PAD]", "[PAD]"]
    assert batch["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    assert batch["token_type_ids"].sum() == 0
    assert [len(ids) for ids, _ in tok.encode(["The FILM is great .", "dull"])] == [7, 3]  # unpadded


def test_pairs_get_token_types_and_truncate(tiny_bert_dir):
    tok = Tokenizer.from_folder(tiny_bert_dir, max_len=8)
    batch = tok(["the film is great and the cast is fine"], ["dull"])
    words = [tok.vocab[i] for i in batch["input_ids"][0]]
    assert len(words) == 8 and words[0] == "[CLS]" and words[-3:] == ["[SEP]", "dull", "[SEP]"]
    assert batch["token_type_ids"][0].tolist() == [0] * 6 + [1, 1]


# Accents, CJK and other scripts: BERT's normalisation options change how these split
STRINGS = ["Café au lait", "CAFÉ", "naïve résumé", "École", "北京欢迎你", "我爱北京 Tiananmen", "Ångström 東京",
           "crème brûlée", "Zürich", "mañana", "São Paulo", "日本語のテキスト", "한국어", "Ça va?", "Ελληνικά",
           "Москва", "Café 北京", "the film is great"]


def strip(text):
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def accent_vocab():
    """Special tokens and every word and character of STRINGS in each spelling the options can give
    (as is, lower-cased, without accents), each character also as a "##" continuation: every
    normalisation tokenises into real tokens, so two normalisations that differ give different ids."""
    words = set()
    for text in STRINGS:
        for form in (text, text.lower(), strip(text), strip(text.lower())):
            words.update(form.replace("?", " ").split())
            words.update(c for c in form if not c.isspace())
    chars = sorted({c for w in words for c in w})
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "?"] + sorted(words - set(chars)) + chars + ["##" + c for c in chars]


def folder(tmp_path, vocab, tokenizer_config=None, **config):
    """A tokenizer folder: vocab.txt, config.json (vocab_size fits the vocab unless given) and, when
    given, tokenizer_config.json (a dict, or the file's text)."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": len(vocab), **config}))
    if tokenizer_config is not None:
        text = tokenizer_config if isinstance(tokenizer_config, str) else json.dumps(tokenizer_config)
        (tmp_path / "tokenizer_config.json").write_text(text)
    return str(tmp_path)


def reference(vocab, do_lower_case=True, strip_accents=None, tokenize_chinese_chars=True):
    """Hugging Face's BertTokenizerFast for these tokenizer_config.json options, assembled from the
    `tokenizers` parts as transformers' converter does (its BertNormalizer reads strip_accents None
    as "follow lowercase", as BertTokenizer does). minknn's tokenizer is built from the same
    parts, so this checks that each option reaches the right part under the right name; the
    by-hand test below checks what the options mean."""
    ids = {w: i for i, w in enumerate(vocab)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = tokenizers.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=tokenize_chinese_chars, strip_accents=strip_accents,
        lowercase=do_lower_case)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.post_processor = tokenizers.processors.BertProcessing(("[SEP]", ids["[SEP]"]), ("[CLS]", ids["[CLS]"]))
    return tok


OPTIONS = [{}, {"do_lower_case": True, "strip_accents": False}, {"do_lower_case": False},
           {"do_lower_case": False, "strip_accents": True}, {"tokenize_chinese_chars": False},
           {"do_lower_case": False, "strip_accents": False, "tokenize_chinese_chars": False}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: json.dumps(o))
def test_tokenizer_config_options_match_the_reference(tmp_path, options):
    vocab = accent_vocab()
    tok = Tokenizer.from_folder(folder(tmp_path, vocab, options))
    ref = reference(vocab, **options)
    for text in STRINGS:
        assert tok.encode([text])[0][0] == ref.encode(text).ids, f"{options}: {text!r} tokenises otherwise"


def test_accents_and_chinese_characters_by_hand(tmp_path):
    """What each option does, written out (Hugging Face's semantics), on "Café 北京"."""
    vocab = accent_vocab()
    expected = [({}, ["cafe", "北", "京"]),  # strip_accents None follows do_lower_case
                ({"do_lower_case": True, "strip_accents": False}, ["café", "北", "京"]),
                ({"do_lower_case": False}, ["Café", "北", "京"]),
                ({"do_lower_case": False, "strip_accents": True}, ["Cafe", "北", "京"]),
                ({"tokenize_chinese_chars": False}, ["cafe", "北京"])]
    for i, (options, words) in enumerate(expected):
        tok = Tokenizer.from_folder(folder(tmp_path / str(i), vocab, options))
        got = [tok.vocab[j] for j in tok.encode(["Café 北京"])[0][0]]
        assert got == ["[CLS]", *words, "[SEP]"], f"{options}: {got}"


def test_default_model_matches_its_own_tokenizer_json():
    """The default folder's tokenizer.json is the reference's fast tokenizer: same ids on STRINGS."""
    path = resolve_model_path("minilm")
    ref = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    ref.no_padding()
    tok = Tokenizer.from_folder(path)
    for text in STRINGS:
        assert tok.encode([text])[0][0] == ref.encode(text).ids, f"{text!r} tokenises otherwise"


@pytest.mark.parametrize("tokenizer_config, says", [
    ("{do_lower_case: true}", "tokenizer_config.json: not valid JSON"),
    ("[true]", "tokenizer_config.json: not a JSON object"),
    ({"do_lower_case": "false"}, 'tokenizer_config.json: do_lower_case is "false"; it must be one of true, false'),
    ({"strip_accents": 0}, "tokenizer_config.json: strip_accents is 0; it must be one of true, false, null"),
    ({"tokenize_chinese_chars": None}, "tokenizer_config.json: tokenize_chinese_chars is null"),
])
def test_bad_tokenizer_config_is_one_line(tmp_path, tokenizer_config, says):
    path = folder(tmp_path, accent_vocab(), tokenizer_config)
    with pytest.raises(MinknnError, match=re.escape(os.path.join(path, says))):
        Tokenizer.from_folder(path)


def test_vocabulary_and_max_len_must_fit_the_model(tmp_path):
    vocab = accent_vocab()
    path = folder(tmp_path, vocab, vocab_size=len(vocab) - 1)
    with pytest.raises(MinknnError, match=f"vocab.txt: {len(vocab)} tokens, but config.json's vocab_size gives the "
                                          f"embedding only {len(vocab) - 1} rows"):
        Tokenizer.from_folder(path)
    path = folder(tmp_path, vocab, vocab_size=2 * len(vocab))
    with pytest.raises(MinknnError, match=f"vocab.txt: {len(vocab)} tokens for a {2 * len(vocab)}-row embedding .*"
                                          f"do not belong together"):
        Tokenizer.from_folder(path)
    Tokenizer.from_folder(folder(tmp_path, vocab, vocab_size=len(vocab) + 8))  # spare rows: fine
    path = folder(tmp_path, vocab, max_position_embeddings=64)
    Tokenizer.from_folder(path, max_len=64)
    with pytest.raises(MinknnError, match="--max_len 65 is longer than the model's 64 positions"):
        Tokenizer.from_folder(path, max_len=65)
