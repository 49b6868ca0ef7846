"""WordPiece tokenisation for BERT, through the `tokenizers` package.

    "A great film!"           -> [CLS] a great film ! [SEP]                token types 0 ... 0
    ("Is it?", "Yes it is.")  -> [CLS] is it ? [SEP] yes it is . [SEP]   token types 0 ... 0 1 ... 1

Before splitting, BERT normalises the text as the folder's tokenizer_config.json says (Hugging Face
BertTokenizer's options and defaults; its fast tokenizer lets them override tokenizer.json too):
    do_lower_case           lower-case                                    (default true)
    strip_accents           "café" -> "cafe"; null: strip when lower-casing  (default null)
    tokenize_chinese_chars  a space around each CJK character, so each is a word  (default true)

A batch is padded to its longest sequence, not to --max_len: SST sentences average ~25
tokens, so padding every batch to 64 or 128 would spend most of the CPU time on padding.
Sequences longer than max_len are truncated (for pairs, the longer text loses tokens first).
"""
import json
import os

import torch
from tokenizers import BertWordPieceTokenizer

from minknn import MinknnError
from minknn.bert import read_config, read_json

# tokenizer_config.json key -> (our option, default, the values it may take)
OPTIONS = {"do_lower_case": ("lowercase", True, (True, False)),
           "strip_accents": ("strip_accents", None, (True, False, None)),
           "tokenize_chinese_chars": ("chinese_chars", True, (True, False))}


class Tokenizer:
    def __init__(self, vocab, lowercase=True, max_len=128, strip_accents=None, chinese_chars=True):
        """vocab: the list of WordPiece tokens, in id order (the lines of vocab.txt); the other
        options as in tokenizer_config.json (above)."""
        self.vocab, self.max_len = list(vocab), max_len
        self.options = dict(lowercase=lowercase, strip_accents=strip_accents,
                            chinese_chars=chinese_chars)
        self.lowercase = lowercase  # the one option checkpoints stored before `options`
        for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]"):
            if special not in self.vocab:
                raise MinknnError(f"the vocabulary has no {special} token")
        self.tok = BertWordPieceTokenizer({w: i for i, w in enumerate(self.vocab)},
                                          lowercase=lowercase, strip_accents=strip_accents,
                                          handle_chinese_chars=chinese_chars)
        self.tok.enable_truncation(max_len)
        self.pad_id = self.vocab.index("[PAD]")

    @classmethod
    def from_folder(cls, path, max_len=128):
        """Reads vocab.txt and tokenizer_config.json from a BERT folder, and checks them against
        its config.json: every token needs a row of the embedding, and max_len a position."""
        vocab_path = os.path.join(path, "vocab.txt")
        if not os.path.exists(vocab_path):
            raise MinknnError(f"{vocab_path}: not found (a BERT folder needs vocab.txt)")
        try:
            with open(vocab_path, encoding="utf-8") as f:
                vocab = [line.rstrip("\n") for line in f]
        except UnicodeDecodeError as e:
            raise MinknnError(f"{vocab_path}: not UTF-8 text ({e})") from None
        config = read_config(path)
        if len(vocab) > config.vocab_size:
            raise MinknnError(f"{vocab_path}: {len(vocab)} tokens, but config.json's vocab_size "
                              f"gives the embedding only {config.vocab_size} rows")
        if len(vocab) < 0.9 * config.vocab_size:  # a few spare rows are common; most, never
            raise MinknnError(f"{vocab_path}: {len(vocab)} tokens for a {config.vocab_size}-row "
                              f"embedding (config.json's vocab_size); the vocabulary and the "
                              f"weights do not belong together")
        if max_len > config.max_position_embeddings:
            raise MinknnError(f"--max_len {max_len} is longer than the model's "
                              f"{config.max_position_embeddings} positions (config.json's "
                              f"max_position_embeddings); use at most that")
        return cls(vocab, max_len=max_len, **read_options(path))

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
