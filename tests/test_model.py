import pytest
import torch

from minknn.model import Classifier, pool


def test_pooling_ignores_padding():
    h = torch.tensor([[[1.0, 5.0], [3.0, -1.0], [100.0, 100.0]]])  # (1, 3, 2), the last token is padding
    mask = torch.tensor([[1, 1, 0]])
    assert pool(h, mask, "cls").tolist() == [[1.0, 5.0]]
    assert pool(h, mask, "mean").tolist() == [[2.0, 2.0]]
    assert pool(h, mask, "max").tolist() == [[3.0, 5.0]]
    with pytest.raises(ValueError, match="unknown pooling 'sum'"):
        pool(h, mask, "sum")


def test_classifier_shapes_and_pretrain_freezes_bert(tiny_bert):
    model = Classifier(tiny_bert, num_labels=5, pooling="mean", option="pretrain")
    ids = torch.randint(5, 50, (3, 6))
    out = model(ids, torch.ones_like(ids))
    assert out.logits.shape == (3, 5) and out.embeddings.shape == (3, 32)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"}
