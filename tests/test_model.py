"""Tests of minknn/model.py. Part 4 pooling (minknn/assignment.py, PARTS) comes first: pool() on
fixed hidden states, the usual mistakes named, then each example against its formula, then the
stored reference outputs (tests/fixtures/references/pooling.pt, tests/grading.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from grading import check, close, graded, matches_reference
from minknn.model import POOLINGS, Model, pool
from minknn.tasks import TASKS


def wave(*shape, phase=0.0):
    """A fixed tensor of the shape, from a formula: sin(1.3 n + phase), n = 0, 1, ..."""
    return torch.sin(1.3 * torch.arange(math.prod(shape), dtype=torch.float64) + phase).view(
        shape).float()


def hidden_states():
    """h (3, 4, 5) and its mask: example 0 has 4 real tokens; example 1 has 2, then padding that
    holds 100 (pool must not read it); example 2 has 2 whose values are all negative, then
    padding that holds 0, as BertModel writes."""
    h = wave(3, 4, 5)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]])
    h[1, 2:] = 100.0
    h[2, :2] = -h[2, :2].abs() - 0.1
    h[2, 2:] = 0.0
    return h, mask


def pooling_oracle(h, mask, how):
    """Each example's z from the formula, over its real tokens only."""
    z = []
    for b in range(h.size(0)):
        real = [h[b, t] for t in range(h.size(1)) if mask[b, t]]
        if how == "cls":
            z.append(h[b, 0])
        elif how == "mean":
            z.append(sum(real) / len(real))
        else:
            z.append(torch.stack([torch.tensor(max(x[d].item() for x in real))
                                  for d in range(h.size(2))]))
    return torch.stack(z)


def pooled(h, mask, how):
    """pool(h, mask, how), an error in it naming the part."""
    return graded("pooling", f"pool(h, attention_mask, {how!r}) on h {tuple(h.shape)}", pool, h,
                  mask, how)


def test_pooling_shapes():
    h, mask = hidden_states()
    for how in POOLINGS:
        z = pooled(h, mask, how)
        check("pooling", z.shape == (3, 5), f"{how} pooling of h (B, T, H) = (3, 4, 5) must give "
              f"one vector per example, (B, H) = (3, 5); got {tuple(z.shape)}")
        if z.dtype != h.dtype and how == "max":
            m = mask[..., None] == 0
            indices = h.masked_fill(m, torch.finfo(h.dtype).min).max(1).indices
            check("pooling", not torch.equal(z, indices), f"max pooling of float32 h gave "
                  f"{z.dtype} values, the positions of each feature's max (.max(1)[1], its "
                  f"indices), not the max itself (.max(1).values)")
        check("pooling", z.dtype == h.dtype, f"{how} pooling of float32 h must give float32 "
              f"vectors, h's dtype; got {z.dtype}")


def test_pooling_passes_the_gradient_to_h():
    """Backward of a weighted sum of z: h gets a gradient in each example's real tokens (the
    encoder trains through z)."""
    h, mask = hidden_states()
    for how in POOLINGS:
        x = h.clone().requires_grad_()
        z = pooled(x, mask, how)
        check("pooling", z.requires_grad, f"{how} pooling: z is not connected to h in autograd's "
              f"graph (requires_grad False): no gradient reaches the encoder through z")
        graded("pooling", f"backward of a weighted sum of {how} pooling's z",
               (z * wave(*z.shape, phase=0.3)).sum().backward)
        g = x.grad
        for b in range(3):
            got = 0.0 if g is None else g[b][mask[b].bool()].abs().sum().item()
            check("pooling", got > 0, f"{how} pooling: backward of a weighted sum of z gave "
                  f"example {b}'s real tokens of h no gradient (h.grad "
                  f"{'is None' if g is None else 'is 0 there'}): z must stay connected to h in "
                  f"autograd's graph, so that the encoder trains through it")


def test_pooling_reads_the_real_tokens_only():
    h, mask = hidden_states()
    m = mask[..., None].float()
    mistakes = {
        "cls": {"it takes the last position; [CLS] is the first, h[:, 0]": h[:, -1]},
        "mean": {
            "it is the sum over each row's real tokens, not divided by their count":
                (h * m).sum(1),
            "it averages over all T positions, padding included": h.mean(1),
            "it divides the sum over real tokens by T; divide by each row's count of real tokens":
                (h * m).sum(1) / h.size(1),
            "it divides by the whole batch's count of real tokens; divide by each row's":
                (h * m).sum(1) / m.sum(),
        },
        "max": {
            "padding is included in the max": h.max(1).values,
            "padding is filled with 0 before the max, which beats real values that are all "
            "negative (example 2); fill it with torch.finfo(h.dtype).min":
                h.masked_fill(m == 0, 0).max(1).values,
        },
    }
    for how in POOLINGS:
        z = pooled(h, mask, how)
        for mistake, wrong in mistakes[how].items():
            check("pooling", not torch.allclose(z, wrong), f"{how} pooling: {mistake}")
        if how == "cls":
            for b in range(3):
                if not torch.equal(z[b], h[b, 0]):
                    at = [t for t in range(4) if torch.equal(z[b], h[b, t])]
                    check("pooling", False, f"cls pooling of example {b} must be its first "
                          f"token's vector h[{b}, 0] ([CLS]), exactly; " + (
                              f"it equals h[{b}, {at[0]}]" if at else f"it is up to "
                              f"{(z[b] - h[b, 0]).abs().max().item():.3g} away from it"))
        if how == "max":
            for b in range(3):
                real = h[b][mask[b].bool()]  # (its real tokens, H)
                for d in range(h.size(2)):
                    top = real[:, d].max().item()
                    got = z[b, d].item()
                    check("pooling", abs(got - top) <= 1e-6 * max(1.0, abs(top)), f"max pooling "
                          f"of example {b} ({real.size(0)} real tokens of 4), feature {d}: got "
                          f"{got:.6g}; the largest of its real tokens' values "
                          f"{[round(v, 6) for v in real[:, d].tolist()]} is {top:.6g}"
                          + ("" if any(abs(got - v) < 1e-6 for v in h[b, :, d].tolist())
                             else "; the value got is none of the row's values, real or padding"))
        moved = h.clone()
        moved[1, 2:] = -50.0  # example 1's padding: 100 -> -50
        gap = (pooled(moved, mask, how) - z).abs().max().item()
        check("pooling", gap == 0, f"{how} pooling must read the real tokens only: changing "
              f"example 1's padding (positions 2 and 3, mask 0) from 100 to -50 moved the output "
              f"by up to {gap:.3g}")
        expected = pooling_oracle(h, mask, how)
        for b in range(3):
            close("pooling", z[b], expected[b], f"{how} pooling of example {b} "
                  f"({int(mask[b].sum())} real tokens of 4)")


def test_pooling_keeps_the_dtype():
    h, mask = hidden_states()
    for how in POOLINGS:
        z = pooled(h.bfloat16(), mask, how)
        check("pooling", z.dtype == torch.bfloat16, f"{how} pooling of bfloat16 hidden states "
              f"(bf16 autocast) must stay bfloat16, the dtype of h; got {z.dtype}")


def test_pooling_mean_of_a_row_without_real_tokens_is_0():
    h, mask = hidden_states()
    mask[1] = 0
    z = pooled(h, mask, "mean")
    check("pooling", bool(torch.isfinite(z).all()) and bool((z[1] == 0).all()), f"mean pooling of "
          f"an example with no real token must give 0, its sum over no token divided by its "
          f"count clamped at 1; got {z[1].tolist()}"
          + ("; NaN is 0/0, the count not clamped" if bool(z[1].isnan().all()) else ""))


def test_pooling_max_of_a_row_without_real_tokens_is_finite():
    h, mask = hidden_states()
    mask[1] = 0
    z = pooled(h, mask, "max")
    neg_inf = bool((z[1] == float("-inf")).all())
    check("pooling", bool(torch.isfinite(z).all()), f"max pooling of an example with no real "
          f"token must stay finite (the padding's fill is the lowest finite value, "
          f"torch.finfo(h.dtype).min); got {z[1].tolist()}"
          + ("; -inf is the max of padding filled with -inf" if neg_inf else ""))


def test_pooling_ignores_padding():
    h = torch.tensor([[[1.0, 5.0], [3.0, -1.0], [100.0, 100.0]]])  # (1, 3, 2), the last: padding
    mask = torch.tensor([[1, 1, 0]])
    for how, expected in (("cls", [[1.0, 5.0]]), ("mean", [[2.0, 2.0]]), ("max", [[3.0, 5.0]])):
        close("pooling", pooled(h, mask, how), torch.tensor(expected), f"{how} pooling of "
              f"[[1, 5], [3, -1], padding]")
    with pytest.raises(ValueError, match="unknown pooling 'sum'"):
        pool(h, mask, "sum")


def test_pooling_sanity_check():
    h, mask = wave(3, 4, 5, phase=0.5), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    for how in POOLINGS:
        matches_reference("pooling", how, pool(h, mask, how))


def test_classifier_shapes_and_pretrain_freezes_bert(tiny_bert):
    model = Model(tiny_bert, [TASKS["sst"]], pooling="mean", option="pretrain")
    ids = torch.randint(5, 50, (3, 6))
    out = model("sst", ids, torch.ones_like(ids))
    assert out.logits.shape == (3, 5) and out.z.shape == (3, 32)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"heads.sst.weight", "heads.sst.bias"}


def test_each_kind_gets_its_head(tiny_bert):
    """classify: C logits; multilabel: C logits; similarity: one score (cross) or no head (siamese);
    a siamese classification head reads [u, v, |u - v|], 3H wide."""
    tasks = [TASKS["sst"], TASKS["reuters"], TASKS["sts"], TASKS["mrpc"]]
    cross = Model(tiny_bert, tasks, "mean", "cross")
    assert {n: h.out_features for n, h in cross.heads.items()} == {"sst": 5, "reuters": 90, "sts": 1, "mrpc": 2}
    assert cross.heads["mrpc"].in_features == 32
    siamese = Model(tiny_bert, tasks, "mean", "siamese")
    assert "sts" not in siamese.heads and siamese.heads["mrpc"].in_features == 3 * 32
    assert siamese.heads["sst"].in_features == 32  # a single-sentence task is the same in both modes


def test_siamese_heads_follow_their_formulas(tiny_bert):
    model = Model(tiny_bert, [TASKS["sts"], TASKS["mrpc"]], "mean", "siamese").eval()
    ids = torch.randint(5, 50, (8, 6))  # 4 pairs: the 4 first texts, then the 4 second ones
    with torch.no_grad():
        sts, para = model("sts", ids, torch.ones_like(ids)), model("mrpc", ids, torch.ones_like(ids))
    u, v = sts.z.chunk(2)
    torch.testing.assert_close(sts.logits, 2.5 * (F.cosine_similarity(u, v) + 1), msg="siamese sts: 2.5 (cos + 1)")
    head = model.heads["mrpc"]  # [u, v, |u - v|] -> two logits (dropout is off in eval mode)
    torch.testing.assert_close(para.logits, head(torch.cat([u, v, (u - v).abs()], -1)),
                               msg="siamese mrpc: the head must read [u, v, |u - v|]")
    assert para.logits.shape == (4, 2) and sts.logits.shape == (4,)
