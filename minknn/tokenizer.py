"""WordPiece tokenisation for BERT, DistilBERT and MPNet, byte-level BPE for RoBERTa, through the
`tokenizers` package.

    "A great film!"           -> [CLS] a great film ! [SEP]                token types 0 ... 0
    ("Is it?", "Yes it is.")  -> [CLS] is it ? [SEP] yes it is . [SEP]   token types 0 ... 0 1 ... 1

BERT's and DistilBERT's vocabulary is the folder's vocab.txt, else tokenizer.json's WordPiece
model (what transformers 5 saves): the same tokens in the same order. Before splitting, BERT
normalises the text as the folder's tokenizer_config.json says (Hugging Face BertTokenizer's
options and defaults; they override tokenizer.json's normaliser there too, so it is not read):
    do_lower_case           lower-case                                    (default true)
    strip_accents           "café" -> "cafe"; null: strip when lower-casing  (default null)
    tokenize_chinese_chars  a space around each CJK character, so each is a word  (default true)

RoBERTa (RobertaTokenizer) splits bytes, not words: vocab.json + merges.txt are GPT-2's byte-level
BPE (Radford et al. 2019), so no text is [UNK] and nothing is lower-cased; a space belongs to the
word after it ("Ġgreat"). Its templates:
    "A great film!"           -> <s> A Ġgreat Ġfilm ! </s>
    ("Is it?", "Yes it is.")  -> <s> Is Ġit ? </s></s> Yes Ġit Ġis . </s>     token types all 0

MPNet (MPNetTokenizer) is BERT's WordPiece, read and normalised as BERT's, in RoBERTa's templates.

A batch is padded to its longest sequence, not to --max_len: SST sentences average ~25
tokens, so padding every batch to 64 or 128 would spend most of the CPU time on padding.
Sequences longer than max_len are truncated (for pairs, the longer text loses tokens first).
"""
import json
import os

import torch
from tokenizers import AddedToken, BertWordPieceTokenizer
from tokenizers import Tokenizer as BpeEngine
from tokenizers import models, pre_tokenizers, processors

from minknn import MinknnError
from minknn.backbones import read_config
from minknn.tools.files import read_json

# tokenizer_config.json key -> (our option, default, the values it may take)
OPTIONS = {"do_lower_case": ("lowercase", True, (True, False)),
           "strip_accents": ("strip_accents", None, (True, False, None)),
           "tokenize_chinese_chars": ("chinese_chars", True, (True, False))}


class Tokenizer:
    SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")  # what the templates and padding use
    CLS, SEP, PAD, UNK, MASK = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"

    def __init__(self, vocab, lowercase=True, max_len=128, strip_accents=None, chinese_chars=True,
                 source="the vocabulary"):
        """vocab: the list of WordPiece tokens, in id order (the lines of vocab.txt); the other
        options as in tokenizer_config.json (above); source: where vocab came from, for errors."""
        self.vocab, self.max_len = list(vocab), max_len
        self.options = dict(lowercase=lowercase, strip_accents=strip_accents,
                            chinese_chars=chinese_chars)
        self.lowercase = lowercase  # the one option checkpoints stored before `options`
        check_special(self.vocab, self.SPECIAL, source)
        ids = {w: i for i, w in enumerate(self.vocab)}
        self.tok = BertWordPieceTokenizer(ids, lowercase=lowercase, strip_accents=strip_accents,
                                          handle_chinese_chars=chinese_chars, cls_token=self.CLS,
                                          sep_token=self.SEP, pad_token=self.PAD,
                                          unk_token=self.UNK, mask_token=self.MASK)
        self.templates(ids)
        self.tok.enable_truncation(max_len)
        self.pad_id = ids[self.PAD]

    def templates(self, ids):
        """The pair and single templates. BERT's, [CLS] a [SEP] and [CLS] a [SEP] b [SEP] with
        types 0 then 1, are BertWordPieceTokenizer's own (its BertProcessing): nothing to do."""

    @classmethod
    def from_folder(cls, path, max_len=128):
        """The tokenizer of a model folder, as its config.json's model_type says: RoBERTa's BPE
        (RobertaTokenizer), else WordPiece from vocab.txt (else tokenizer.json's vocabulary, the
        same tokens) and tokenizer_config.json. Checked
        against config.json: every token needs a row of the embedding, and max_len a position."""
        config = read_config(path)
        if config.model_type == "roberta":
            return RobertaTokenizer.read(path, config, max_len)
        if config.model_type == "mpnet":  # WordPiece too, with its own special tokens
            cls = MPNetTokenizer
        vocab_path, json_path = (os.path.join(path, f) for f in ("vocab.txt", "tokenizer.json"))
        if os.path.exists(vocab_path):
            try:
                with open(vocab_path, encoding="utf-8-sig") as f:
                    vocab = [line.rstrip("\n") for line in f]
            except UnicodeDecodeError as e:
                raise MinknnError(f"{vocab_path}: not UTF-8 text ({e})") from None
        elif os.path.exists(json_path):  # what transformers 5 saves, without vocab.txt
            vocab, vocab_path = read_wordpiece(json_path), json_path
        else:
            raise MinknnError(f"{path}: has neither vocab.txt nor tokenizer.json (a "
                              f"{config.model_type} folder needs its WordPiece vocabulary)")
        check_fits_config(vocab_path, len(vocab), config, max_len)
        return cls(vocab, max_len=max_len, source=vocab_path, **read_options(path))

    def encode(self, texts, texts_b=None):
        """texts (and texts_b for pairs): lists of strings. Returns each example's token ids and
        token type ids, truncated but not padded: a list of (ids, type_ids) pairs."""
        batch = self.tok.encode_batch(list(texts) if texts_b is None else list(zip(texts, texts_b)))
        return [(e.ids, e.type_ids) for e in batch]

    def pad(self, encodings):
        """Pads a list of (ids, type_ids) to the longest one. Returns a dict of (B, T) long
        tensors input_ids, attention_mask and token_type_ids, ready for BertModel."""
        T = max(len(ids) for ids, _ in encodings)
        return {
            "input_ids": torch.tensor([ids + [self.pad_id] * (T - len(ids))
                                       for ids, _ in encodings]),
            "attention_mask": torch.tensor([[1] * len(ids) + [0] * (T - len(ids))
                                            for ids, _ in encodings]),
            "token_type_ids": torch.tensor([types + [0] * (T - len(types))
                                            for _, types in encodings]),
        }

    def __call__(self, texts, texts_b=None):
        return self.pad(self.encode(texts, texts_b))


class MPNetTokenizer(Tokenizer):
    """MPNet's: BERT's WordPiece (vocab.txt, lower-cased, tokenizer_config.json's options), with
    RoBERTa's special tokens and templates, token types all 0 (MPNet has no token-type table):
        "A great film!"           -> <s> a great film ! </s>
        ("Is it?", "Yes it is.")  -> <s> is it ? </s></s> yes it is . </s>
    Its vocab.txt keeps BERT's [CLS], [SEP] and [PAD] too: unused, never written."""
    SPECIAL = ("<s>", "<pad>", "</s>", "[UNK]", "<mask>")
    CLS, SEP, PAD, UNK, MASK = "<s>", "</s>", "<pad>", "[UNK]", "<mask>"

    def templates(self, ids):
        self.tok.post_processor = processors.RobertaProcessing((self.SEP, ids[self.SEP]),
                                                               (self.CLS, ids[self.CLS]))
        # "<unk>" (id 3 of MPNet's vocabulary, fairseq's unknown token) stays whole when a text
        # holds it, after lower-casing ("<UNK>" too), as all-mpnet-base-v2's tokenizer.json has
        # it; the tokens above are kept whole by BertWordPieceTokenizer already
        if "<unk>" in ids:
            self.tok.add_special_tokens([AddedToken("<unk>", normalized=True)])


class RobertaTokenizer(Tokenizer):
    SPECIAL = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")

    def __init__(self, vocab, merges, max_len=128, add_prefix_space=False, source="the vocabulary"):
        """vocab: the BPE tokens in id order (vocab.json's keys sorted by id); merges: the merge
        rules in order, each "a b" (the lines of merges.txt); add_prefix_space as in
        tokenizer_config.json (a space before the first word, so it reads as one mid-sentence);
        source: where vocab came from, for errors."""
        self.vocab, self.merges, self.max_len = list(vocab), list(merges), max_len
        self.options, self.lowercase = dict(add_prefix_space=add_prefix_space), False
        ids = {w: i for i, w in enumerate(self.vocab)}
        check_special(ids, self.SPECIAL, source)
        self.tok = BpeEngine(models.BPE(ids, [tuple(m.split(" ")) for m in self.merges]))
        # bytes -> printable characters (a space is Ġ), split as GPT-2 splits words
        self.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        # <s> a </s> and <s> a </s></s> b </s>, token types all 0 (the module docstring)
        self.tok.post_processor = processors.RobertaProcessing(
            ("</s>", ids["</s>"]), ("<s>", ids["<s>"]), add_prefix_space=add_prefix_space)
        # the special tokens stay whole when a text contains them; <mask> takes the space before
        # it, as RoBERTa's own tokenizer does
        self.tok.add_special_tokens([AddedToken(t, lstrip=t == "<mask>") for t in self.SPECIAL])
        self.tok.enable_truncation(max_len)
        self.pad_id = ids["<pad>"]

    @classmethod
    def read(cls, path, config, max_len):
        """From a RoBERTa folder: vocab.json + merges.txt, else tokenizer.json's BPE model."""
        vocab_file, merges_file = (os.path.join(path, f) for f in ("vocab.json", "merges.txt"))
        if os.path.exists(vocab_file) and os.path.exists(merges_file):
            vocab, merges = read_json(vocab_file), read_merges(merges_file)
            source, rules = vocab_file, merges_file
        elif os.path.exists(os.path.join(path, "tokenizer.json")):
            source = rules = os.path.join(path, "tokenizer.json")
            model = tokenizer_model(source, "BPE", "RoBERTa's is BPE")
            if not isinstance(model.get("merges"), list):
                raise MinknnError(f"{source}: its BPE model has no list of merges")
            # newer files write each rule as ["a", "b"], older ones as "a b"
            vocab, merges = model.get("vocab"), [" ".join(m) if isinstance(m, list) else m
                                                 for m in model["merges"]]
        else:
            raise MinknnError(f"{path}: has neither vocab.json + merges.txt nor tokenizer.json "
                              f"(a roberta folder needs its BPE vocabulary)")
        if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
            raise MinknnError(f"{source}: the vocabulary is not a map of tokens to the ids "
                              f"0, 1, 2, ... (one each)")
        check_fits_config(source, len(vocab), config, max_len)
        check_merges(merges, vocab, rules, source)
        file = os.path.join(path, "tokenizer_config.json")
        options = read_json(file) if os.path.exists(file) else {}
        if not isinstance(options, dict):
            raise MinknnError(f"{file}: not a JSON object")
        prefix = options.get("add_prefix_space", False)
        if not isinstance(prefix, bool):
            raise MinknnError(f"{file}: add_prefix_space is {json.dumps(prefix)}; it must be true "
                              f"or false")
        return cls(sorted(vocab, key=vocab.get), merges, max_len, add_prefix_space=prefix,
                   source=source)


def tokenizer_model(path, kind, whose):
    """The model of the tokenizer.json at path, checked to be of `kind` (its "type"); whose: the
    message's reason, which architectures use that kind."""
    model = read_json(path)
    model = model.get("model") if isinstance(model, dict) else None
    found = model.get("type") if isinstance(model, dict) else None
    if found != kind:
        raise MinknnError(f"{path}: not a {kind} tokenizer (model type {json.dumps(found)}); "
                          f"{whose}")
    return model


def read_wordpiece(path):
    """The WordPiece tokens of a tokenizer.json, in id order: the vocab.txt it was made from. Its
    normaliser is not read: transformers' BertTokenizer (4 and 5 alike) sets it from
    tokenizer_config.json, defaults where absent, as read_options() does."""
    model = tokenizer_model(path, "WordPiece", "BERT's and DistilBERT's are WordPiece")
    prefix = model.get("continuing_subword_prefix", "##")
    if prefix != "##":
        raise MinknnError(f"{path}: continuing_subword_prefix is {json.dumps(prefix)}; BERT's "
                          f"WordPiece writes \"##\"")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise MinknnError(f"{path}: the vocabulary is not a map of tokens to the ids 0, 1, 2, ... "
                          f"(one each)")
    return sorted(vocab, key=vocab.get)


def read_merges(path):
    """merges.txt's rules, "a b" each, in order (its "#version" line and blank lines left out)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as e:
        raise MinknnError(f"{path}: not UTF-8 text ({e})") from None
    return [m for m in lines if m and not m.startswith("#version")]


def check_merges(merges, vocab, file, vocab_file):
    """Each BPE rule "a b" joins two tokens of the vocabulary into a third (`tokenizers` would
    stop with an error, or a panic, on a rule that does not)."""
    for row, m in enumerate(merges, 1):
        pair = m.split(" ") if isinstance(m, str) else None
        if pair is None or len(pair) != 2:
            raise MinknnError(f"{file}: rule {row} {m!r} is not two tokens separated by a space")
        for t in pair:
            if t not in vocab:
                raise MinknnError(f"{file}: rule {row} '{m}': '{t}' is not a token of "
                                  f"{os.path.basename(vocab_file)}")
        if "".join(pair) not in vocab:
            raise MinknnError(f"{file}: rule {row} '{m}': its result '{''.join(pair)}' is not a "
                              f"token of {os.path.basename(vocab_file)}")


def check_special(vocab, special, file="the vocabulary"):
    """A vocabulary (its tokens) must hold the special tokens its templates and padding use."""
    for t in special:
        if t not in vocab:
            raise MinknnError(f"{file}: has no {t} token (the special tokens: {' '.join(special)})")


def check_fits_config(file, n, config, max_len):
    """A vocabulary of n tokens read from `file` and --max_len, against the config.json."""
    if n > config.vocab_size:
        raise MinknnError(f"{file}: {n} tokens, but config.json's vocab_size gives the embedding "
                          f"only {config.vocab_size} rows")
    if n < 0.9 * config.vocab_size:  # a few spare rows are common; most, never
        raise MinknnError(f"{file}: {n} tokens for a {config.vocab_size}-row embedding "
                          f"(config.json's vocab_size); the vocabulary and the weights do not "
                          f"belong together")
    if max_len > config.max_tokens:
        rows = "max_position_embeddings" if config.model_type != "roberta" else \
            "max_position_embeddings less pad_token_id + 1, where RoBERTa's positions start"
        raise MinknnError(f"--max_len {max_len} is longer than the model's {config.max_tokens} "
                          f"positions (config.json's {rows}); use at most that")


def read_options(path):
    """The options of a BERT folder's tokenizer_config.json (OPTIONS), defaults where absent."""
    file = os.path.join(path, "tokenizer_config.json")
    saved = read_json(file) if os.path.exists(file) else {}
    if not isinstance(saved, dict):
        raise MinknnError(f"{file}: not a JSON object")
    options = {}
    for key, (name, default, allowed) in OPTIONS.items():
        value = saved.get(key, default)
        if not any(value is a for a in allowed):  # `is`: 0 and 1 are not false and true
            raise MinknnError(f"{file}: {key} is {json.dumps(value)}; it must be one of "
                              f"{', '.join(json.dumps(a) for a in allowed)}")
        options[name] = value
    return options
