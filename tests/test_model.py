import pytest
import torch
import torch.nn.functional as F

from minknn.model import Model, pool
from minknn.tasks import TASKS


def test_pooling_ignores_padding():
    h = torch.tensor([[[1.0, 5.0], [3.0, -1.0], [100.0, 100.0]]])  # (1, 3, 2), the last token is padding
    mask = torch.tensor([[1, 1, 0]])
    assert pool(h, mask, "cls").tolist() == [[1.0, 5.0]]
    assert pool(h, mask, "mean").tolist() == [[2.0, 2.0]]
    assert pool(h, mask, "max").tolist() == [[3.0, 5.0]]
    with pytest.raises(ValueError, match="unknown pooling 'sum'"):
        pool(h, mask, "sum")


def test_classifier_shapes_and_pretrain_freezes_bert(tiny_bert):
    model = Model(tiny_bert, [TASKS["sst"]], pooling="mean", option="pretrain")
    ids = torch.randint(5, 50, (3, 6))
    out = model("sst", ids, torch.ones_like(ids))
    assert out.logits.shape == (3, 5) and out.embeddings.shape == (3, 32)
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
    u, v = sts.embeddings.chunk(2)
    torch.testing.assert_close(sts.logits, 2.5 * (F.cosine_similarity(u, v) + 1), msg="siamese sts: 2.5 (cos + 1)")
    head = model.heads["mrpc"]  # [u, v, |u - v|] -> two logits (dropout is off in eval mode)
    torch.testing.assert_close(para.logits, head(torch.cat([u, v, (u - v).abs()], -1)),
                               msg="siamese mrpc: the head must read [u, v, |u - v|]")
    assert para.logits.shape == (4, 2) and sts.logits.shape == (4,)
