import os

import torch

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
