"""MPNet (minknn/backbones.py): its relative-position bias, each of its changes to BERT where it
acts, against slow transcriptions of its formulas; the parity with transformers' MPNetModel on
tiny random folders is in tests/test_backbones.py (KINDS), that on the real all-mpnet-base-v2 at
the end of this file."""
import math
import os

import pytest
import torch
import torch.nn.functional as F

from minknn import MinknnError, backbones
import minknn.bert
from minknn.model import pool
from minknn.packed import Packing
from minknn.tokenizer import MPNetTokenizer, Tokenizer


def tiny_mpnet(**changes):
    config = dict(model_type="mpnet", vocab_size=40, hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=202,
                  layer_norm_eps=1e-5)
    torch.manual_seed(0)
    model = backbones.build(backbones.config_from_dict({**config, **changes}))
    with torch.no_grad():  # biases of the size all-mpnet-base-v2's have (std 2), not N(0, 0.02)
        model.encoder.relative_attention_bias.weight.normal_(0, 2)
    return model


def bucket_by_the_formula(i, j, num_buckets=32, max_distance=128):
    """The bucket of query i and key j, written out from the formula (backbones.relative_buckets'
    docstring; T5's bucketing, Raffel et al. 2020, section 2.1, as MPNet's code uses it)."""
    half = num_buckets // 2
    max_exact = half // 2
    n = abs(i - j)
    if n < max_exact:
        b = n
    else:
        b = max_exact + math.floor(math.log(n / max_exact) / math.log(max_distance / max_exact)
                                   * (half - max_exact))
        b = min(b, half - 1)
    return b + half if j > i else b


def test_relative_buckets_are_the_formulas():
    """Every (query, key) of a 300-token sequence: distances 0 to 7 exact, 8 to 127 on a log
    scale, 128 and beyond in one bucket, and keys after the query in the other half."""
    T = 300
    got = backbones.relative_buckets(T)
    want = torch.tensor([[bucket_by_the_formula(i, j) for j in range(T)] for i in range(T)])
    wrong = (got != want).nonzero()
    if len(wrong):
        i, j = wrong[0].tolist()
        raise AssertionError(
            f"relative_buckets: {len(wrong)} of {T * T} (query, key) pairs in the wrong bucket; "
            f"the first, query {i} and key {j} (key {'after' if j > i else 'at or before'} the "
            f"query, distance {abs(i - j)}), is in bucket {got[i, j].item()}, the formula's is "
            f"{want[i, j].item()}")
    read = set(got.unique().tolist())  # all but 16: a key after the query is 1 or more away
    assert read == set(range(32)) - {16}, f"a 300-token sequence reads buckets {sorted(read)}"


def test_keys_before_and_after_the_query_read_different_buckets():
    """Bidirectional: the key one token after the query and the one token before it read different
    rows of the table (a one-sided bucketing, as a decoder's, would give both the same)."""
    b = backbones.relative_buckets(5)
    assert b[2, 3] != b[2, 1], (f"query 2: the key after it (3) is in bucket {b[2, 3].item()}, the "
                                f"key before it (1) in {b[2, 1].item()}: they must differ")
    assert b[2, 2] == 0 and b[2, 1] == 1 and b[2, 3] == 17, b[2].tolist()


def test_every_layer_adds_the_bias_of_each_query_and_key_to_its_scores(monkeypatch):
    """The mask each layer's attention() receives is the padding's plus the table's row for each
    (query, key) bucket, head by head: (B, nh, T, T), the same in every layer."""
    model = tiny_mpnet().eval().set_attention("explicit")
    masks = []
    written = minknn.bert.attention
    monkeypatch.setattr(minknn.bert, "attention", lambda q, k, v, mask, p=0.0: masks.append(mask)
                        or written(q, k, v, mask, p))
    ids = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 2, 1, 1, 1]])
    mask = (ids != 1).long()
    with torch.no_grad():
        model(ids, mask)
    table = model.encoder.relative_attention_bias.weight  # (32, nh)
    T = ids.size(1)
    bias = torch.stack([torch.tensor([[table[bucket_by_the_formula(i, j), h].item()
                                       for j in range(T)] for i in range(T)])
                        for h in range(table.size(1))])  # (nh, T, T)
    padding = torch.where(mask == 0, torch.finfo(torch.float32).min, 0.0)[:, None, None, :]
    want = bias[None] + padding
    assert len(masks) == model.config.num_hidden_layers, \
        f"attention() ran {len(masks)} times for {model.config.num_hidden_layers} layers"
    for layer, got in enumerate(masks):
        assert got is not None, f"layer {layer}'s attention got no mask, so no relative bias"
        got = got.expand_as(want)
        torch.testing.assert_close(got, want, msg=lambda m: (
            f"layer {layer}: the additive term of its attention scores is not the padding's mask "
            f"plus the relative bias of each query and key (table[bucket(i, j), head]): {m}"))


def test_a_padded_batch_equals_each_example_alone_outputs_and_gradients():
    """Packed and padded: every real token's hidden state, and every weight's gradient (the
    bias table's included), as each example gives alone with no padding."""
    model = tiny_mpnet(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).double()
    lengths = [150, 3, 40, 1]  # 150: distances past 128, where the buckets stop growing
    g = torch.Generator().manual_seed(3)
    T = max(lengths)
    ids = torch.randint(3, 40, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, 1)
    probe = torch.randn(16, dtype=torch.float64, generator=g)

    def loss_and_grads(ids, mask):
        model.zero_grad()
        h = model(ids, mask)
        ((h * mask[..., None]).sum(1) @ probe).sum().backward()
        return h, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    h, grads = loss_and_grads(ids, mask)
    summed = {}
    for i, n in enumerate(lengths):
        h_alone, g_alone = loss_and_grads(ids[i:i + 1, :n], mask[i:i + 1, :n])
        torch.testing.assert_close(h[i, :n], h_alone[0], msg=lambda m: (
            f"example {i} (length {n}): its hidden states in the padded batch differ from the "
            f"example run alone: {m}"))
        for name, grad in g_alone.items():
            summed[name] = summed.get(name, 0) + grad
    for name in grads:
        torch.testing.assert_close(grads[name], summed[name], msg=lambda m: (
            f"gradient of {name}: the padded batch's is not the sum of the examples' alone: {m}"))


def test_the_bias_gradient_gradcheck_and_the_buckets_it_reaches():
    """gradcheck (float64) of the encoder's output in the bias table; a backward pass reaches
    exactly the rows of the buckets a 20-token sequence reads (0 to 9 back, 16 to 25 ahead)."""
    model = tiny_mpnet(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).double()
    ids = torch.tensor([[0] + list(range(3, 21)) + [2], [0, 5, 6, 2] + [1] * 16])
    mask = (ids != 1).long()
    name = "encoder.relative_attention_bias.weight"

    probe = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def encoded(table):  # (B, T): each token's hidden state along one direction
        return torch.func.functional_call(model, {name: table}, (ids, mask)) @ probe
    table = model.encoder.relative_attention_bias.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(encoded, (table,))
    encoded(table).pow(2).sum().backward()
    reached = table.grad.abs().sum(1).nonzero().squeeze(1).tolist()
    want = sorted(set(backbones.relative_buckets(20).flatten().tolist()))
    assert reached == want, f"the gradient reaches bias rows {reached}, not the buckets read, {want}"


def test_mpnet_embeddings_positions_after_the_padding_index_and_no_token_types():
    """E = LayerNorm(word + position) with positions padding_idx + 1 + i (transformers'
    create_position_ids_from_input_ids on rows without padding inside), and token types given
    change nothing (MPNet has no token-type table)."""
    emb = tiny_mpnet().embeddings.eval()
    assert not [n for n in emb.state_dict() if "token_type" in n], \
        "MPNet has no token-type embeddings to load"
    ids = torch.tensor([[0, 5, 6, 2, 2, 7, 2], [0, 9, 2, 1, 1, 1, 1]])
    mask = (ids != 1).long()
    mask_ = mask.clone()
    positions = torch.cumsum(mask_, 1) * mask_ + 1
    want = emb.LayerNorm(emb.word_embeddings.weight[ids] + emb.position_embeddings.weight[positions])
    with torch.no_grad():
        for types in (torch.zeros_like(ids), (torch.arange(7) > 3).long().expand_as(ids)):
            got = Packing(mask).unpack(emb(ids, types, Packing(mask)))
            real = mask.bool()
            torch.testing.assert_close(got[real], want[real], msg=lambda m: (
                f"MPNet's embeddings with token types {types[0].tolist()}: not LayerNorm(word + "
                f"position) with positions {positions[0].tolist()} (padding_idx 1 + 1 + the "
                f"token's index): {m}"))


def test_mpnet_tokenizer_templates_and_types(tiny_mpnet_dir):
    """<s> a </s> and <s> a </s></s> b </s>, every token type 0, padded with <pad>."""
    tok = Tokenizer.from_folder(tiny_mpnet_dir, max_len=32)
    assert type(tok) is MPNetTokenizer
    ids = {w: i for i, w in enumerate(tok.vocab)}
    (single, _), (pair, types) = tok.encode(["a film"]) + tok.encode(["a film"], ["film a"])
    words = [ids["a"], ids["film"]]
    assert single == [ids["<s>"], *words, ids["</s>"]], \
        f"a single text is {[tok.vocab[i] for i in single]}, not <s> a film </s>"
    want = [ids["<s>"], *words, ids["</s>"], ids["</s>"], *words[::-1], ids["</s>"]]
    assert pair == want, f"a pair is {[tok.vocab[i] for i in pair]}, not <s> a </s></s> b </s>"
    assert not any(types), f"a pair's token types are {types}; MPNet's are all 0"
    assert tok.pad_id == ids["<pad>"] == 1
    (typed, _), = tok.encode(["a <UNK> film a<unk>"])
    want = [ids["<s>"], ids["a"], ids["<unk>"], ids["film"], ids["a"], ids["<unk>"], ids["</s>"]]
    assert typed == want, (f"'a <UNK> film a<unk>' is {[tok.vocab[i] for i in typed]}: MPNet's "
                           f"tokenizer.json keeps <unk> whole, after lower-casing")


@pytest.mark.parametrize("key, value, says", [
    ("pad_token_id", 0, "pad_token_id 0 is not implemented; MPNet's positions start after index 1"),
    ("relative_attention_num_buckets", 64,
     "relative_attention_num_buckets 64 is not implemented; MPNet's code buckets relative "
     "positions into 32"),
])
def test_what_mpnets_code_fixes_is_refused_otherwise(key, value, says):
    with pytest.raises(MinknnError) as e:
        backbones.config_from_dict({"model_type": "mpnet", key: value}, "x/config.json")
    assert str(e.value).startswith(f"x/config.json: {says}"), str(e.value)


def test_mpnets_defaults_are_mpnets():
    """config.json leaves out what equals transformers' MPNetConfig defaults."""
    c = backbones.config_from_dict({"model_type": "mpnet"})
    got = {k: getattr(c, k) for k in ("vocab_size", "pad_token_id", "max_position_embeddings",
                                      "layer_norm_eps", "relative_attention_num_buckets")}
    assert got == {"vocab_size": 30527, "pad_token_id": 1, "max_position_embeddings": 512,
                   "layer_norm_eps": 1e-12, "relative_attention_num_buckets": 32}, got
    assert c.max_tokens == 510, "512 positions, from padding_idx + 1 = 2 on, hold 510 tokens"


# The real all-mpnet-base-v2 (conftest's mpnet_dir: assembled from its five PyPI parts into a
# session cache; skipped, saying why, where they are not installed) against transformers' outputs
# stored in tests/fixtures/mpnet_golden.pt (tests/fixtures/make_mpnet.py made it).

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "mpnet_golden.pt")


def golden():
    return torch.load(GOLDEN, weights_only=True)


def split(flat, lengths):
    return [ids.tolist() for ids in torch.split(flat.long(), lengths.tolist())]


@pytest.mark.parametrize("max_len", [None, 32])
def test_the_real_tokenizer_gives_transformers_ids_on_2000_texts(max_len, mpnet_dir):
    """MPNetTokenizer from all-mpnet-base-v2's vocab.txt and tokenizer_config.json gives, text for
    text, the ids MPNetTokenizerFast gives from its tokenizer.json: 2,000 texts (the fixture
    datasets' lines, tabs included, and lines of this repository's docs), untruncated and at 32;
    and the five pairs' ids."""
    g = golden()
    want = split(*((g["ids"], g["lengths"]) if max_len is None else (g["ids_32"], g["lengths_32"])))
    tok = Tokenizer.from_folder(mpnet_dir, max_len=max_len or 512)
    got = [ids for ids, _ in tok.encode(g["texts"])]
    wrong = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    assert not wrong, (
        f"all-mpnet-base-v2 (max_len {max_len}): the ids of {len(wrong)} of {len(want)} texts "
        f"differ from transformers {g['transformers_version']}'s; the first, text {wrong[0]} "
        f"{g['texts'][wrong[0]]!r}:\n  minknn       {got[wrong[0]]}\n  transformers {want[wrong[0]]}")
    if max_len is None:
        pairs = [ids for ids, _ in tok.encode(*g["pairs"])]
        assert pairs == g["pair_ids"], f"the pairs' ids: {pairs} against {g['pair_ids']}"
        # texts holding the <unk> token, which no text above has: MPNetTokenizerFast's ids
        # (transformers 5.23.0, typed in here)
        typed = {"The <UNK> film, a<unk>b.": [0, 2000, 3, 2147, 1014, 1041, 3, 1042, 1016, 2],
                 "unk <un k>": [0, 4899, 2247, 1030, 4899, 1051, 1032, 2]}
        got = {text: tok.encode([text])[0][0] for text in typed}
        assert got == typed, f"texts with <unk>: minknn {got}, transformers {typed}"


def test_the_real_models_sentence_embeddings_equal_transformers(mpnet_dir):
    """all-mpnet-base-v2 through minknn's tokenizer, encoder and mean pooling (minknn/model.py
    pool), made unit length: sentence-transformers' embeddings (MPNetModel, mean pooling,
    normalised) of 40 sentences within 1e-5, in batches of 8 padded to their longest; and the
    trained model's similarities (a placeholder's would not give 0.66 and about 0)."""
    g = golden()
    model = backbones.from_pretrained(mpnet_dir).eval()
    tok = Tokenizer.from_folder(mpnet_dir, max_len=512)
    out = []
    for i in range(0, len(g["sentences"]), 8):
        batch = tok(g["sentences"][i:i + 8])
        with torch.inference_mode():
            h = model(batch["input_ids"], batch["attention_mask"])
        out.append(F.normalize(pool(h, batch["attention_mask"], "mean"), dim=-1))
    got = torch.cat(out)
    worst = (got - g["embeddings"]).abs().amax(1).argmax().item()
    torch.testing.assert_close(got, g["embeddings"], atol=1e-5, rtol=1e-4, msg=lambda m: (
        f"all-mpnet-base-v2's mean-pooled embeddings differ from transformers', most for "
        f"sentence {worst} {g['sentences'][worst]!r}: {m}"))
    assert abs(got[0] @ got[1] - 0.66) < 0.01 and abs(got[0] @ got[34]) < 0.1, \
        (got[0] @ got[1], got[0] @ got[34])
