import os

import pytest
import torch

from minknn import MinknnError
from minknn.bert import BertModel, attention
from minknn.safetensors import load_safetensors, save_safetensors

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "minilm_golden.pt")


def random_batch(vocab_size, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(5, vocab_size, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask  # pad id 0 at the padded positions


def test_parity_with_reference_bert_on_default_weights():
    """The hand-written BERT on all-MiniLM-L6-v2 against Hugging Face transformers' outputs
    (stored in the fixture by tests/fixtures/make_golden.py), on a padded batch of sentence pairs."""
    golden = torch.load(GOLDEN, weights_only=True)
    model = BertModel.from_pretrained("minilm").eval()
    assert golden["attention_mask"].min() == 0 and golden["token_type_ids"].max() == 1  # padding and pairs
    for fast in (True, False):
        model.set_fast_attention(fast)
        with torch.no_grad():
            h, pooled = model(golden["input_ids"], golden["attention_mask"], golden["token_type_ids"], pooled=True)
        real = golden["attention_mask"].bool()
        assert (h - golden["last_hidden_state"])[real].abs().max() < 1e-4
        assert (pooled - golden["pooler_output"]).abs().max() < 1e-4


def test_padding_does_not_change_real_tokens(tiny_bert):
    ids, mask = random_batch(tiny_bert.config.vocab_size, [9, 9])
    with torch.no_grad():
        alone = tiny_bert(ids[:1], mask[:1])
        padded_ids = torch.cat([ids[:1], torch.zeros(1, 6, dtype=torch.long)], 1)
        padded_mask = torch.cat([mask[:1], torch.zeros(1, 6, dtype=torch.long)], 1)
        padded = tiny_bert(padded_ids, padded_mask)
    torch.testing.assert_close(padded[:, :9], alone, atol=1e-5, rtol=1e-5)


def test_explicit_and_fast_attention_agree(tiny_bert):
    ids, mask = random_batch(tiny_bert.config.vocab_size, [12, 7, 3])
    outs = []
    for fast in (True, False):
        tiny_bert.set_fast_attention(fast)
        with torch.no_grad():
            outs.append(tiny_bert(ids, mask))
    tiny_bert.set_fast_attention(True)
    real = mask.bool()
    torch.testing.assert_close(outs[0][real], outs[1][real], atol=1e-5, rtol=1e-4)
    # and the written-out function against PyTorch's kernel directly, with a padding mask
    q, k, v = torch.randn(3, 2, 4, 5, 8).unbind(0)
    m = torch.zeros(2, 1, 1, 5)
    m[1, ..., 3:] = torch.finfo(torch.float32).min
    fast = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    torch.testing.assert_close(attention(q, k, v, m), fast, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(attention(q, k, v, None), torch.nn.functional.scaled_dot_product_attention(q, k, v))


def test_a_fully_padded_row_stays_finite_in_bf16(tiny_bert):
    """Under bf16 autocast q is bf16, and fp32's most negative number rounds to -inf there: a row whose
    keys are all padding (the second below) was softmax(-inf, ..) = NaN on the explicit path. Each
    path in fp32 and in bf16: finite everywhere, the two paths agree, bf16 near fp32 on real tokens."""
    ids, mask = random_batch(tiny_bert.config.vocab_size, [9, 0, 4])
    out = {}
    for precision in ("fp32", "bf16"):
        for path in ("fast", "explicit"):
            tiny_bert.set_fast_attention(path == "fast")
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                out[precision, path] = tiny_bert(ids, mask)
            assert torch.isfinite(out[precision, path]).all(), f"{path} attention in {precision}: non-finite h"
    tiny_bert.set_fast_attention(True)
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


def test_loads_prefixed_weights_and_ignores_heads(tiny_bert_dir, tmp_path):
    state = load_safetensors(os.path.join(tiny_bert_dir, "model.safetensors"))
    prefixed = {"bert." + k: v for k, v in state.items()}
    prefixed["cls.predictions.bias"] = torch.zeros(3)
    prefixed["bert.embeddings.position_ids"] = torch.arange(64)[None]
    for name in ("config.json", "vocab.txt"):
        (tmp_path / name).write_bytes(open(os.path.join(tiny_bert_dir, name), "rb").read())
    torch.save(prefixed, tmp_path / "pytorch_model.bin")  # the .bin path too
    model = BertModel.from_pretrained(str(tmp_path))
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k])


def test_missing_or_unexpected_weights_are_named(tiny_bert_dir, tmp_path):
    state = load_safetensors(os.path.join(tiny_bert_dir, "model.safetensors"))
    for name in ("config.json", "vocab.txt"):
        (tmp_path / name).write_bytes(open(os.path.join(tiny_bert_dir, name), "rb").read())
    broken = dict(state)
    del broken["encoder.layer.1.output.dense.weight"]
    broken["encoder.layer.9.extra"] = torch.zeros(1)
    save_safetensors(broken, tmp_path / "model.safetensors")
    with pytest.raises(MinknnError, match=r"missing \['encoder.layer.1.output.dense.weight'\].*unexpected \['encoder.layer.9.extra'\]"):
        BertModel.from_pretrained(str(tmp_path))
    broken = dict(state, **{"pooler.dense.bias": torch.zeros(5)})
    save_safetensors(broken, tmp_path / "model.safetensors")
    with pytest.raises(MinknnError, match="'pooler.dense.bias' has shape"):
        BertModel.from_pretrained(str(tmp_path))


def test_bad_model_folder_errors(tmp_path):
    with pytest.raises(MinknnError, match="neither 'minilm' nor a folder"):
        BertModel.from_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(MinknnError, match="config.json: not found"):
        BertModel.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "num_attention_heads": 2}')
    with pytest.raises(MinknnError, match="neither model.safetensors nor pytorch_model.bin"):
        BertModel.from_pretrained(str(tmp_path))
