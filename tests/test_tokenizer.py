import json
import os
import re
import unicodedata

import pytest
import tokenizers
import torch

from minknn import MinknnError
from minknn.tokenizer import RobertaTokenizer, Tokenizer
from minknn.tools.weights import resolve_model_path

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


def saved_by_transformers_5(vocab_folder):
    """The folder as transformers 5's save_pretrained writes it: tokenizer.json (here the `tokenizers`
    library's WordPiece of the same vocabulary, its normaliser lower-casing, as BertWordPieceTokenizer
    writes it) and no vocab.txt; tokenizer_config.json and config.json kept."""
    path = os.path.join(vocab_folder, "vocab.txt")
    vocab = open(path, encoding="utf-8").read().splitlines()
    tokenizers.BertWordPieceTokenizer({w: i for i, w in enumerate(vocab)}).save(
        os.path.join(vocab_folder, "tokenizer.json"))
    os.remove(path)
    return vocab_folder


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: json.dumps(o))
def test_a_folder_with_tokenizer_json_and_no_vocab_txt_tokenises_as_with_it(tmp_path, options):
    """transformers 5 saves tokenizer.json and no vocab.txt: its WordPiece vocabulary is the same
    tokens, ids and special tokens, and tokenizer_config.json's options (do_lower_case false too)
    win over tokenizer.json's normaliser, as in transformers' BertTokenizer."""
    vocab = list(dict.fromkeys(accent_vocab()))  # once each, as in a real vocab.txt ("?" is twice)
    with_txt = Tokenizer.from_folder(folder(tmp_path / "txt", vocab, options))
    json_only = Tokenizer.from_folder(saved_by_transformers_5(folder(tmp_path / "json", vocab, options)))
    assert json_only.vocab == vocab and json_only.pad_id == vocab.index("[PAD]")
    assert json_only.options == with_txt.options
    ref = reference(vocab, **options)
    for text in STRINGS:
        assert json_only.encode([text])[0][0] == ref.encode(text).ids, f"{options}: {text!r} tokenises otherwise"
    pairs = (STRINGS[:6], STRINGS[6:12])
    for key, value in with_txt(*pairs).items():
        assert torch.equal(json_only(*pairs)[key], value), f"{options}: pairs' {key} differ from vocab.txt's"


def test_a_bert_folder_with_neither_vocabulary_file_is_one_line_naming_both(tmp_path):
    path = folder(tmp_path, accent_vocab())
    os.remove(os.path.join(path, "vocab.txt"))
    with pytest.raises(MinknnError) as e:
        Tokenizer.from_folder(path)
    assert str(e.value).startswith(f"{path}: has neither vocab.txt nor tokenizer.json") and \
        "\n" not in str(e.value), str(e.value)
    tokenizers.Tokenizer(tokenizers.models.BPE({"[UNK]": 0}, [])).save(os.path.join(path, "tokenizer.json"))
    with pytest.raises(MinknnError, match=re.escape(f'{path}/tokenizer.json: not a WordPiece tokenizer '
                                                    f'(model type "BPE")')):
        Tokenizer.from_folder(path)


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


# RoBERTa's byte-level BPE (RobertaTokenizer), on a hand-made vocabulary: its specials, the 256
# byte characters, and a few merges, so that the tokens of a text can be written out by hand.
SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]
MERGES = ["h e", "t he", "Ġ the", "f i", "l m", "fi lm", "Ġ film", "Ġ a"]


def bpe_vocab():
    """{token: id}: the specials, the byte alphabet, the merges' results, <mask> last (as in
    roberta-base's vocab.json)."""
    tokens = SPECIAL + sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tokens += [m.replace(" ", "") for m in MERGES] + ["<mask>"]
    return {t: i for i, t in enumerate(tokens)}


def bpe_folder(tmp_path, vocab=None, merges=None, tokenizer_config=None, **config):
    """A RoBERTa tokenizer folder: vocab.json and merges.txt (its "#version" header first, as
    GPT-2's), config.json (vocab_size fits the vocabulary unless given) and, when given,
    tokenizer_config.json (a dict, or the file's text)."""
    vocab = bpe_vocab() if vocab is None else vocab
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + (MERGES if merges is None else merges)
    (tmp_path / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "roberta", "vocab_size": len(vocab) if isinstance(vocab, dict) else 300,
        "pad_token_id": 1, "max_position_embeddings": 514, **config}))
    if tokenizer_config is not None:
        text = tokenizer_config if isinstance(tokenizer_config, str) else json.dumps(tokenizer_config)
        (tmp_path / "tokenizer_config.json").write_text(text)
    return str(tmp_path)


def tokens(tok, texts, texts_b=None):
    """Each text's tokens, as strings."""
    return [[tok.vocab[i] for i in ids] for ids, _ in tok.encode(texts, texts_b)]


def test_roberta_templates_and_token_types(tmp_path):
    """<s> a </s> and <s> a </s></s> b </s>, every token type 0 (RoBERTa has one type), padding
    with <pad>; a space belongs to the word after it (Ġfilm), and the first word has none."""
    tok = Tokenizer.from_folder(bpe_folder(tmp_path))
    assert isinstance(tok, RobertaTokenizer), "a roberta folder's tokenizer is RobertaTokenizer"
    assert tokens(tok, ["the film", "a"]) == [["<s>", "the", "Ġfilm", "</s>"], ["<s>", "a", "</s>"]]
    assert tokens(tok, ["the film"], ["a film"]) == [
        ["<s>", "the", "Ġfilm", "</s>", "</s>", "a", "Ġfilm", "</s>"]], \
        "RoBERTa's pair template is <s> a </s></s> b </s> (two </s> between the texts)"
    batch = tok(["the film", "a"], ["a film", "the"])
    assert batch["token_type_ids"].tolist() == [[0] * 8] * 2, \
        "RoBERTa's token types are all 0, in either text (type_vocab_size 1)"
    assert batch["input_ids"][1].tolist()[-2:] == [1, 1] and tok.pad_id == 1, "pad with <pad>"
    assert batch["attention_mask"].tolist() == [[1] * 8, [1] * 6 + [0] * 2]


def test_roberta_truncates_to_max_len_the_longer_text_first(tmp_path):
    tok = Tokenizer.from_folder(bpe_folder(tmp_path), max_len=8)
    long = "the film the film the film"
    assert tokens(tok, [long]) == [["<s>", "the", "Ġfilm", "Ġthe", "Ġfilm", "Ġthe", "Ġfilm", "</s>"]]
    assert tokens(tok, [long + " the film"]) == tokens(tok, [long]), "truncated to max_len 8"
    assert tokens(tok, [long], ["a film"]) == [["<s>", "the", "Ġfilm", "</s>", "</s>", "a", "Ġfilm", "</s>"]], \
        "a pair loses tokens from its longer text first"
    assert tokens(tok, ["a film"], [long]) == [["<s>", "a", "Ġfilm", "</s>", "</s>", "the", "Ġfilm", "</s>"]]
    assert tokens(tok, [long], [long]) == [["<s>", "the", "Ġfilm", "</s>", "</s>", "the", "Ġfilm", "</s>"]], \
        "two long texts: each loses tokens in turn"


def test_roberta_special_tokens_in_text_stay_whole(tmp_path):
    """<mask> (and every special token) written in a text is that token, not its characters;
    <mask> takes the space before it, as roberta-base's tokenizer does."""
    tok = Tokenizer.from_folder(bpe_folder(tmp_path))
    assert tokens(tok, ["the <mask> film", "a</s>the"]) == [
        ["<s>", "the", "<mask>", "Ġfilm", "</s>"], ["<s>", "a", "</s>", "the", "</s>"]]


def test_roberta_add_prefix_space_from_tokenizer_config(tmp_path):
    """add_prefix_space: a space before the first word (of each text), so it is tokenised as it
    would be mid-sentence: Ġthe, not the."""
    on = Tokenizer.from_folder(bpe_folder(tmp_path / "on", tokenizer_config={"add_prefix_space": True}))
    assert on.options == {"add_prefix_space": True}
    assert tokens(on, ["the film"], ["a film"]) == [
        ["<s>", "Ġthe", "Ġfilm", "</s>", "</s>", "Ġa", "Ġfilm", "</s>"]], \
        "tokenizer_config.json's add_prefix_space true must reach the BPE's pre-tokenizer"
    for config in ({"add_prefix_space": False}, {}, None):
        off = Tokenizer.from_folder(bpe_folder(tmp_path / "off", tokenizer_config=config))
        assert tokens(off, ["the film"]) == [["<s>", "the", "Ġfilm", "</s>"]], \
            f"tokenizer_config.json {config}: add_prefix_space is false (its default)"


@pytest.mark.parametrize("change, says", [
    ("no vocabulary files", "{path}: has neither vocab.json + merges.txt nor tokenizer.json"),
    ("no merges.txt", "{path}: has neither vocab.json + merges.txt nor tokenizer.json"),
    ("ids not 0..n-1", "{path}/vocab.json: the vocabulary is not a map of tokens to the ids 0, 1, 2"),
    ("a list, not a map", "{path}/vocab.json: the vocabulary is not a map of tokens to the ids 0, 1, 2"),
    ("not JSON", "{path}/vocab.json: not valid JSON"),
    ("a rule of three tokens", "{path}/merges.txt: rule 3 'Ġ t he' is not two tokens separated by a space"),
    ("a rule of an unknown token", "{path}/merges.txt: rule 2 'zz q': 'zz' is not a token of vocab.json"),
    ("a rule whose result is unknown", "{path}/merges.txt: rule 1 'h e': its result 'he' is not a token of vocab.json"),
    ("add_prefix_space a string", '{path}/tokenizer_config.json: add_prefix_space is "yes"; it must be true or false'),
    ("tokenizer_config.json a list", "{path}/tokenizer_config.json: not a JSON object"),
    ("no <pad>", "{path}/vocab.json: has no <pad> token"),
    ("vocab_size too small",
     "{path}/vocab.json: {n} tokens, but config.json's vocab_size gives the embedding only {m} rows"),
    ("tokenizer.json of WordPiece", '{path}/tokenizer.json: not a BPE tokenizer (model type "WordPiece")'),
    ("tokenizer.json with a rule of three tokens", "{path}/tokenizer.json: rule 2 't he x' is not two tokens"),
    ("tokenizer.json a list", "{path}/tokenizer.json: not a BPE tokenizer (model type null)"),
    ("tokenizer.json without merges", "{path}/tokenizer.json: its BPE model has no list of merges"),
])
def test_bad_roberta_folders_are_one_line_naming_the_file(tmp_path, change, says):
    vocab, merges, config, tokenizer_config = bpe_vocab(), list(MERGES), {}, None
    if change == "ids not 0..n-1":
        vocab["<mask>"] += 1
    elif change == "a list, not a map":
        vocab = list(vocab)
    elif change == "a rule of three tokens":
        merges[2] = "Ġ t he"
    elif change == "a rule of an unknown token":
        merges.insert(1, "zz q")
    elif change == "a rule whose result is unknown":
        del vocab["he"]
        vocab = {t: i for i, t in enumerate(vocab)}
    elif change == "add_prefix_space a string":
        tokenizer_config = {"add_prefix_space": "yes"}
    elif change == "tokenizer_config.json a list":
        tokenizer_config = "[true]"
    elif change == "no <pad>":
        vocab = {t: i for i, t in enumerate(t for t in vocab if t != "<pad>")}
    elif change == "vocab_size too small":
        config = {"vocab_size": len(vocab) - 1}
    path = bpe_folder(tmp_path, vocab, merges, tokenizer_config, **config)
    if change == "no vocabulary files":
        os.remove(os.path.join(path, "vocab.json"))
        os.remove(os.path.join(path, "merges.txt"))
    elif change == "no merges.txt":
        os.remove(os.path.join(path, "merges.txt"))
    elif change == "not JSON":
        (tmp_path / "vocab.json").write_text("{<s>: 0}")
    elif change == "tokenizer.json of WordPiece":
        os.remove(os.path.join(path, "merges.txt"))
        wordpiece = tokenizers.Tokenizer(tokenizers.models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
        wordpiece.save(os.path.join(path, "tokenizer.json"))
    elif change == "tokenizer.json with a rule of three tokens":
        os.remove(os.path.join(path, "merges.txt"))
        model = {"type": "BPE", "vocab": vocab, "merges": [["h", "e"], ["t", "he", "x"]]}
        (tmp_path / "tokenizer.json").write_text(json.dumps({"model": model}))
    elif change == "tokenizer.json without merges":
        os.remove(os.path.join(path, "merges.txt"))
        (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    elif change == "tokenizer.json a list":
        os.remove(os.path.join(path, "merges.txt"))
        (tmp_path / "tokenizer.json").write_text("[]")
    with pytest.raises(MinknnError) as e:
        Tokenizer.from_folder(path)
    want = says.format(path=path, n=len(vocab), m=len(vocab) - 1)
    assert str(e.value).startswith(want) and "\n" not in str(e.value), str(e.value)


def test_a_wordpiece_vocabulary_without_its_special_tokens_names_vocab_txt(tmp_path):
    path = folder(tmp_path, [t for t in accent_vocab() if t != "[SEP]"])
    with pytest.raises(MinknnError, match=re.escape(f"{path}/vocab.txt: has no [SEP] token")):
        Tokenizer.from_folder(path)


def test_a_byte_order_mark_or_crlf_in_vocab_txt_and_merges_txt_changes_no_token(tmp_path):
    """A vocab.txt or merges.txt saved by an editor that writes a BOM, or \\r\\n line ends, holds the same tokens
    and rules: the BOM is not part of the first token ([PAD], or merges.txt's #version line) and no token ends in
    \\r."""
    vocab = list(dict.fromkeys(accent_vocab()))
    plain = Tokenizer.from_folder(folder(tmp_path / "plain", vocab))
    edited = folder(tmp_path / "edited", vocab)
    path = os.path.join(edited, "vocab.txt")
    text = open(path, encoding="utf-8").read()
    with open(path, "wb") as f:
        f.write(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    tok = Tokenizer.from_folder(edited)
    assert tok.vocab == plain.vocab, f"vocab.txt with a BOM and \\r\\n read as {tok.vocab[:3]}, not {plain.vocab[:3]}"
    assert tok(STRINGS[:4])["input_ids"].tolist() == plain(STRINGS[:4])["input_ids"].tolist()
    bpe = bpe_folder(tmp_path / "bpe")
    merges = os.path.join(bpe, "merges.txt")
    text = open(merges, encoding="utf-8").read()
    with open(merges, "wb") as f:
        f.write(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    assert tokens(Tokenizer.from_folder(bpe), ["the film"]) == [["<s>", "the", "Ġfilm", "</s>"]], \
        "merges.txt with a BOM and \\r\\n tokenises otherwise"
