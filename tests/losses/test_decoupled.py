"""Liang et al.'s decoupled retrieval head: the triplet draws of appendix B, eq. 4 against a loop,
gradcheck, and the head's output is what the datastore stores."""
import copy

import pytest
import torch

from minknn.losses.decoupled import DecoupledTripletLoss, decoupled_triplet, sample_triplets
from minknn.model import Model
from minknn.tasks.data import load_split
from minknn.tasks.registry import get_task
from minknn.tokenizer import Tokenizer
from minknn.tools.engine import predict


@pytest.mark.parametrize("labels", [[0, 0, 1, 1, 1, 2, 3, 3], [0, 1, 2], [2, 2, 2, 2], [1]])
def test_triplet_draws_follow_appendix_b(labels):
    y = torch.tensor(labels)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        positive, negative = sample_triplets(y, g)
        for i in range(len(y)):
            others_same = [j for j in range(len(y)) if j != i and y[j] == y[i]]
            others_diff = [j for j in range(len(y)) if y[j] != y[i]]
            assert positive[i].item() in (others_same or [i])  # no positive in the batch: the anchor itself
            if others_diff:
                assert negative[i].item() in others_diff
            elif len(y) > 1:
                assert negative[i].item() != i  # no negative: any other example
            else:
                assert negative[i].item() == i


def test_triplet_draws_cover_every_candidate():
    y = torch.tensor([0, 0, 0, 1, 1])
    g = torch.Generator().manual_seed(0)
    seen = {sample_triplets(y, g)[0][0].item() for _ in range(100)}
    assert seen == {1, 2}  # both other class-0 examples get drawn as anchor 0's positive


def test_matches_equation_4():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(6, 5, dtype=torch.float64, generator=g)
    positive, negative = sample_triplets(torch.tensor([0, 0, 1, 1, 2, 2]), g)
    d = lambda a, b: sum((a[k] - b[k]) ** 2 for k in range(len(a)))
    expected = sum(max(d(r[i], r[positive[i]]) - d(r[i], r[negative[i]]) + 1.0, 0) for i in range(6)) / 6
    assert decoupled_triplet(r, positive, negative, 1.0).item() == pytest.approx(float(expected), abs=1e-12)


def test_gradcheck():
    r = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    positive, negative = sample_triplets(torch.tensor([0, 0, 1, 1, 2, 0]), torch.Generator().manual_seed(0))
    assert torch.autograd.gradcheck(lambda r: decoupled_triplet(r, positive, negative, 5.0), (r,))


def test_loss_module_defaults_are_the_papers():
    loss = DecoupledTripletLoss()
    assert loss.lam == 0.5 and loss.margin == 1.0


def test_the_head_changes_the_datastore_keys(tiny_bert, tiny_bert_dir, data_dir):
    torch.manual_seed(0)
    sst = get_task("sst")
    model = Model(copy.deepcopy(tiny_bert), [sst], "mean", decoupled=True)
    plain = Model(copy.deepcopy(tiny_bert), [sst], "mean")
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    train = load_split(sst, "train", data_dir)[:12]
    cpu = torch.device("cpu")
    _, z = predict(model, tokenizer, sst, train, 8, cpu)
    _, r = predict(model, tokenizer, sst, train, 8, cpu, key="decoupled")
    assert r.shape == z.shape and not torch.allclose(r, z)
    with torch.no_grad():
        assert torch.allclose(r, model.retrieval(z.clone()), atol=1e-5)  # r = MLP(z)
    _, z_plain = predict(plain, tokenizer, sst, train, 8, cpu)
    assert torch.allclose(z, z_plain, atol=1e-6)  # the head does not touch z
    _, cls = predict(model, tokenizer, sst, train, 8, cpu, key="cls")
    assert not torch.allclose(cls, z)
