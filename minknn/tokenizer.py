"""WordPiece tokenisation for BERT, through the `tokenizers` package.

    "A great film!"           -> [CLS] a great film ! [SEP]                token types 0 ... 0
    ("Is it?", "Yes it is.")  -> [CLS] is it ? [SEP] yes it is . [SEP]   token types 0 ... 0 1 ... 1

A batch is padded to its longest sequence, not to --max_len: SST sentences average ~25
tokens, so padding every batch to 64 or 128 would spend most of the CPU time on padding.
Sequences longer than max_len are truncated (for pairs, the longer text loses tokens first).
"""
import json
import os

import torch
from tokenizers import BertWordPieceTokenizer

from minknn import MinknnError


class Tokenizer:
    def __init__(self, vocab, lowercase=True, max_len=128):
        """vocab: the list of WordPiece tokens, in id order (the lines of vocab.txt)."""
        self.vocab, self.lowercase, self.max_len = list(vocab), lowercase, max_len
        for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]"):
            if special not in self.vocab:
                raise MinknnError(f"the vocabulary has no {special} token")
        self.tok = BertWordPieceTokenizer({w: i for i, w in enumerate(self.vocab)},
                                          lowercase=lowercase)
        self.tok.enable_truncation(max_len)
        self.pad_id = self.vocab.index("[PAD]")

    @classmethod
    def from_folder(cls, path, max_len=128):
        """Reads vocab.txt from a BERT folder; lower-cases when tokenizer_config.json says
        do_lower_case (the default for the uncased models, and when the file is absent)."""
        vocab_path = os.path.join(path, "vocab.txt")
        if not os.path.exists(vocab_path):
            raise MinknnError(f"{vocab_path}: not found (a BERT folder needs vocab.txt)")
        with open(vocab_path, encoding="utf-8") as f:
            vocab = [line.rstrip("\n") for line in f]
        lowercase = True
        config_path = os.path.join(path, "tokenizer_config.json")
        if os.path.exists(config_path):
            with open(config_path) as f:
                lowercase = json.load(f).get("do_lower_case", True)
        return cls(vocab, lowercase, max_len)

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
