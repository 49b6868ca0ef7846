import copy
import json
import os
import re

import pytest
import torch

from minknn import MinknnError
from minknn.bert import NOT_IMPLEMENTED, BertConfig, BertModel, attention
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
        model.set_attention("fused" if fast else "explicit")
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


def test_padded_batch_equals_each_example_run_alone_outputs_and_gradients(tiny_bert):
    """The encoder packs the real tokens and runs its matmuls, GELUs and LayerNorms on them alone
    (bert.Packing). A padded batch must give every real token the hidden state, and every weight
    the gradient, that its example gets alone with no padding at all: a wrong index, a padding
    row let into attention, or a token packed into another row's place breaks one of the two."""
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
                                   f"batch's differs from the sum of the examples' run alone: {m}")


def test_no_linear_layer_sees_a_padding_token(tiny_bert):
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


def test_explicit_and_fast_attention_agree(tiny_bert):
    ids, mask = random_batch(tiny_bert.config.vocab_size, [12, 7, 3])
    outs = []
    for fast in (True, False):
        tiny_bert.set_attention("fused" if fast else "explicit")
        with torch.no_grad():
            outs.append(tiny_bert(ids, mask))
    tiny_bert.set_attention("fused")
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
            tiny_bert.set_attention("fused" if path == "fast" else "explicit")
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                out[precision, path] = tiny_bert(ids, mask)
            assert torch.isfinite(out[precision, path]).all(), f"{path} attention in {precision}: non-finite h"
    tiny_bert.set_attention("fused")
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
    others = {"model_type": "roberta", "hidden_act": "gelu_new", "position_embedding_type": "relative_key",
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
])
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
    with pytest.raises(MinknnError, match="neither 'minilm' nor a folder"):
        BertModel.from_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(MinknnError, match="config.json: not found"):
        BertModel.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "num_attention_heads": 2}')
    with pytest.raises(MinknnError, match="neither model.safetensors nor pytorch_model.bin"):
        BertModel.from_pretrained(str(tmp_path))
    torch.save([torch.zeros(2)], tmp_path / "pytorch_model.bin")
    with pytest.raises(MinknnError, match="pytorch_model.bin: not a state dict"):
        BertModel.from_pretrained(str(tmp_path))
