"""Proxy inference (minknn/proxy.py): alpha = 0 is the linear head, alpha = 1 the nearest proxy."""
import pytest
import torch
import torch.nn.functional as F

from minknn.losses import METRIC_LOSSES, Objective
from minknn.proxy import PROXY_LOSSES, has_proxies, proxy_logits

C, D = 5, 16


def setup(name):
    torch.manual_seed(0)
    return Objective(name, C, D), torch.randn(40, C), torch.randn(40, D)


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_alpha_zero_is_the_linear_head(name):
    objective, logits, h = setup(name)
    assert torch.equal(proxy_logits(objective, logits, h, 0.0), logits)


@pytest.mark.parametrize("name", ["proxyanchor", "proxynca"])
def test_alpha_one_predicts_the_nearest_proxy(name):
    objective, logits, h = setup(name)
    cos = F.cosine_similarity(h[:, None, :], objective.metric.proxies[None, :, :], dim=-1)   # (N, C)
    nearest = (F.normalize(h, dim=-1)[:, None, :] - F.normalize(objective.metric.proxies, dim=-1)).norm(dim=-1).argmin(1)
    assert torch.equal(cos.argmax(1), nearest)
    assert torch.equal(proxy_logits(objective, logits, h, 1.0).argmax(1), nearest)
    assert len(set(nearest.tolist())) > 1  # the test is not trivial


def test_proxyanchor_mix_is_the_formula():
    objective, logits, h = setup("proxyanchor")
    cos = F.cosine_similarity(h[:, None, :], objective.metric.proxies[None, :, :], dim=-1)
    expected = 0.7 * logits + 0.3 * 32 * cos
    assert torch.allclose(proxy_logits(objective, logits, h, 0.3), expected, atol=1e-5)


def test_softtriple_scores_a_class_by_its_centres():
    objective, logits, h = setup("softtriple")
    x, w = F.normalize(h, dim=-1), F.normalize(objective.metric.centres, dim=-1)
    sim = torch.einsum("nd,ckd->nck", x, w)
    S = (torch.softmax(sim / 0.1, -1) * sim).sum(-1)       # SoftTriple S_c
    assert torch.equal(proxy_logits(objective, logits, h, 1.0).argmax(1), S.argmax(1))
    # S_c is a weighted mean of the class's similarities, so never above the largest
    assert torch.all(S <= sim.max(-1).values + 1e-6)


def test_the_proxy_losses_are_those_with_class_logits():
    """PROXY_LOSSES is derived from the registry: a new proxy loss with class_logits joins it."""
    assert {"softtriple", "proxynca", "proxyanchor"} <= set(PROXY_LOSSES)
    for name in ("ce", *METRIC_LOSSES):
        assert has_proxies(Objective(name, C, D)) == (name in PROXY_LOSSES), name
