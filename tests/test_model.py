"""Tests of minknn/model.py. Part 4 pooling (minknn/assignment/edition.py, PARTS) comes first: pool() on
fixed hidden states, the usual mistakes named, then each example against its formula, then the
stored reference outputs (tests/fixtures/references/pooling.pt, tests/grading.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from elsewhere import check_on_second_device
from formula import fixed_cotangent, readings_that_fit, run, same_as_formula
from grading import check, close, graded, matches_reference
from minknn.model import POOLINGS, Model, pool
from minknn.tasks.registry import TASKS


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
    encoder trains through z). A failure first names the readings of the formula (
    POOLING_READINGS) whose output and gradient pool's are."""
    h, mask = hidden_states()
    for how in POOLINGS:
        fits = readings_that_fit("pooling", how, lambda h: pool(h, mask, how),
                                 lambda h: pooling_formula(h, mask, how),
                                 {f"{how} pooling as {what}": (lambda r: lambda h: pooling_formula(
                                     h, mask, how, r))(r)
                                  for what, r in POOLING_READINGS[how].items()}, {"h": h.double()})
        check("pooling", not fits, f"{how} pooling: its output and its gradient in h are those "
              f"of {' or of '.join(fits)}")
        x = h.clone().requires_grad_()
        z = pooled(x, mask, how)
        check("pooling", z.requires_grad, f"{how} pooling: z is not connected to h in autograd's "
              f"graph (requires_grad False): no gradient reaches the encoder through z")
        graded("pooling", f"backward of a weighted sum of {how} pooling's z",
               (z * wave(*z.shape, phase=0.3)).sum().backward)
        g = x.grad
        check("pooling", g is not None, f"{how} pooling: backward of a weighted sum of z gave h "
              f"no gradient (h.grad is None): z is not connected to h in autograd's graph")
        for b in range(3):
            real = mask[b].bool()
            if g[b][real].abs().sum() > 0:
                continue
            padding = [t for t in range(h.size(1)) if not real[t] and g[b, t].abs().sum() > 0]
            check("pooling", not padding, f"{how} pooling: backward of a weighted sum of z gave "
                  f"example {b}'s real tokens (positions {real.nonzero().flatten().tolist()}) no "
                  f"gradient, and its padding at position(s) {padding} one: z[{b}] is computed "
                  f"from h at padding positions, which no pooling reads")
            check("pooling", False, f"{how} pooling: backward of a weighted sum of z gave example "
                  f"{b}'s h no gradient at any position: z[{b}] (= {z[b].detach().tolist()}) "
                  f"does not change with h[{b}] in autograd's graph")


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


def pooling_formula(h, mask, how, reading=None):
    """z of each example from its formula, vectorised, in h's dtype: [CLS] h[:, 0], the mean
    over the real tokens, or their max; or another reading, the mistakes a failure is checked
    against (POOLING_READINGS)."""
    m = mask[..., None].to(h.dtype)
    if how == "cls":
        if reading == "last position":
            return h[:, -1]
        if reading == "last real token":
            return h[torch.arange(len(h)), mask.sum(1) - 1]
        return h[:, 0]
    if how == "mean":
        total = (h * m).sum(1)
        return {"over all T": h.mean(1), "divided by T": total / h.size(1),
                "divided by the batch's count": total / m.sum(), "the sum": total,
                "detached": (h.detach() * m).sum(1) / m.sum(1).clamp(min=1)}.get(
            reading, total / m.sum(1).clamp(min=1))
    filled = {"padding included": h, "padding 0": h.masked_fill(m == 0, 0),
              "real tokens masked": h.masked_fill(m == 1, torch.finfo(h.dtype).min)}.get(
        reading, h.masked_fill(m == 0, torch.finfo(h.dtype).min))
    return filled.max(1).values


POOLING_READINGS = {
    "cls": {"the last position, h[:, -1]": "last position",
            "each row's last real token ([SEP])": "last real token"},
    "mean": {"the mean over all T positions, padding included": "over all T",
             "the sum over the real tokens divided by T": "divided by T",
             "the sum over the real tokens divided by the whole batch's count of them":
                 "divided by the batch's count", "the sum over the real tokens, not divided":
                 "the sum", "h detached (no gradient reaches the encoder)": "detached"},
    "max": {"the max over every position, padding included": "padding included",
            "the padding filled with 0 before the max": "padding 0",
            "the real tokens filled instead of the padding": "real tokens masked"},
}


@pytest.mark.parametrize("how", POOLINGS)
def test_pooling_forward_and_backward_match_the_formula(how):
    """pool() against its formula, in float64, forward and backward (the gradient of h reaches
    the real tokens only), on rows with padding inside and at the end, one of them all negative,
    and on a batch of one row (tests/formula.py)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    h[2] = -h[2].abs() - 0.1
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0], [1, 1, 1, 0, 0]])
    padding = (mask == 0)[..., None].expand(h.shape)
    for rows in (3, 1):
        same_as_formula("pooling", f"{how} pooling of {rows} row(s) of 5 (padding inside row 1 "
                        f"and at the end of rows 1 and 2)", lambda h: pool(h, mask[:rows], how),
                        lambda h: pooling_formula(h, mask[:rows], how), {"h": h[:rows]},
                        axes=("example", "feature"), grad_axes={"h": ("example", "position",
                                                                      "feature")},
                        mistakes={f"{how} pooling as {what}": (lambda r: lambda h: pooling_formula(
                            h, mask[:rows], how, r))(r) for what, r in POOLING_READINGS[how].items()})
        _, grads = run(lambda h: pool(h, mask[:rows], how), {"h": h[:rows]}, {},
                       fixed_cotangent())
        at_padding = grads["h"][padding[:rows]] if grads["h"] is not None else torch.zeros(0)
        leak = at_padding.abs().max().item() if at_padding.numel() else 0.0
        check("pooling", leak == 0, f"{how} pooling: h's gradient at padding positions is up to "
              f"{leak:.3g}; no gradient may reach the padding")


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


@pytest.mark.parametrize("how", POOLINGS)
def test_pooling_runs_on_the_inputs_device(how):
    """On a second device (tests/elsewhere.py): a tensor made without device= fails as on a GPU."""
    h, mask = hidden_states()
    check_on_second_device("pooling", f"pool(h, attention_mask, {how!r})",
                           lambda _, h, mask: pool(h, mask, how), {"h": h, "mask": mask})


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
