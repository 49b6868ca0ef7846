"""Proxy inference (minknn/proxy.py): alpha = 0 is the linear head, alpha = 1 the nearest proxy.
Part proxy-inference (minknn/assignment/edition.py): its sanity check is test_sanity_check_the_mix; the
tests after it diagnose the mix, first with a stand-in for the proxy loss (its class_logits a
known scaled cosine), then with the proxy losses themselves."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from minknn.losses import METRIC_LOSSES, Objective
from minknn.losses import PROXY_LOSSES
from minknn.proxy import has_proxies, proxy_logits

from elsewhere import check_on_second_device
from formula import same_as_formula
from grading import as_formula, as_mix, check, close, diagnose, graded, matches_reference

PART = "proxy-inference"
C, D = 5, 16


def mixed(objective, logits, z, alpha):
    """proxy_logits, an exception in it failing as the part's."""
    return graded(PART, "proxy_logits", proxy_logits, objective, logits, z, alpha)


def stand_in(seed=0, B=6, scale=10.0):
    """An objective whose proxy loss scores class c by scale * cos(z, P_c), the head's logits and
    the embeddings: (objective, logits (B, C), z (B, D), the proxies' logits (B, C))."""
    g = torch.Generator().manual_seed(seed)
    proxies = torch.randn(C, D, generator=g)

    def class_logits(z):
        return scale * F.normalize(z, dim=-1) @ F.normalize(proxies, dim=-1).T

    # what a proxy loss offers: its class logits, its proxies and its scale
    objective = SimpleNamespace(metric=SimpleNamespace(class_logits=class_logits,
                                                       proxies=proxies, scale=scale))
    logits, z = torch.randn(B, C, generator=g), torch.randn(B, D, generator=g)
    return objective, logits, z, class_logits(z)


def test_the_mix_weighs_the_head_by_1_minus_alpha_and_the_proxies_by_alpha():
    """The mix read back as a F(z) + b s cos(z, P_c) (grading.as_mix): at each alpha, a must be
    1 - alpha and b alpha; a mix that is no such sum mixes something else than the two logits
    (probabilities, say)."""
    objective, logits, z, proxies = stand_in()
    for alpha in (0.3, 0.0, 1.0):  # 0.3 first: there alpha, 1 - alpha, 0 and 1 all differ
        a, b, off = as_mix(mixed(objective, logits, z, alpha), logits, proxies)
        got = mixed(objective, logits, z, alpha)
        if off >= 1e-4:  # named only when the mix is that of the probabilities, recomputed
            probabilities = (1 - alpha) * logits.softmax(-1) + alpha * proxies.softmax(-1)
            check(PART, not torch.allclose(got, probabilities, atol=1e-5, rtol=1e-4), f"with "
                  f"alpha = {alpha}, the mix is {1 - alpha:.3g} softmax(F(z)) + {alpha:.3g} "
                  f"softmax(s cos(z, P_c)), the probabilities mixed; the rule mixes the two "
                  f"logits, the softmax after the mix")
        check(PART, off < 1e-4, f"with alpha = {alpha}, the mix is not a weighted sum of the "
              f"linear head's logits F(z) and the proxies' s cos(z, P_c): the best such sum "
              f"misses it by up to {off:.3g}")
        symbols = {"alpha": alpha, "1 - alpha": 1 - alpha, "1": 1.0, "0": 0.0,
                   "alpha / s": alpha / 10, "(1 - alpha) / s": (1 - alpha) / 10}
        said = as_formula((a, b), symbols, ("F(z)", "s cos(z, P_c)")) if alpha == 0.3 else None
        check(PART, abs(a - (1 - alpha)) < 1e-4 and abs(b - alpha) < 1e-4, f"with alpha = "
              f"{alpha}, the mix must be {1 - alpha:.3g} F(z) + {alpha:.3g} s cos(z, P_c) "
              f"(1 - alpha on the linear head's logits, alpha on the proxies'); it is {a:.3g} "
              f"F(z) + {b:.3g} s cos(z, P_c)" + (
                  f": the code computes {said} (s = 10 here), the formula (1 - alpha) F(z) + "
                  f"alpha s cos(z, P_c)" if said else ""))


def test_the_mix_by_hand():
    """(1 - alpha) F(z) + alpha s cos(z, P_c), on logits (the softmax comes after): alpha = 0 is the
    head alone, alpha = 1 the proxies alone, alpha = 0.3 gives the proxies 30 %."""
    objective, logits, z, proxies = stand_in()
    for alpha, expected, what in (
            (0.0, logits, "with alpha = 0, the linear head's logits alone: the mix"),
            (1.0, proxies, "with alpha = 1, the proxies' scaled cosines alone: the mix"),
            (0.3, 0.7 * logits + 0.3 * proxies,
             "with alpha = 0.3, 0.7 F(z) + 0.3 s cos(z, P_c), the mix")):
        # each the mix under that mistake, recomputed: named only when the output is it
        diagnose(PART, mixed(objective, logits, z, alpha), expected, what, {
            "it is alpha F(z) + (1 - alpha) s cos(z, P_c), the weights swapped":
                alpha * logits + (1 - alpha) * proxies,
            "it is F(z) + alpha s cos(z, P_c), the head's logits not weighted by 1 - alpha":
                logits + alpha * proxies,
            "it is (1 - alpha) F(z) + s cos(z, P_c), the proxies' not weighted by alpha":
                (1 - alpha) * logits + proxies,
            "it is the probabilities mixed, (1 - alpha) softmax(F(z)) + alpha softmax(s cos)":
                (1 - alpha) * logits.softmax(-1) + alpha * proxies.softmax(-1)})


def setup(name):
    """A proxy loss's objective, as trained, with 40 examples' logits and embeddings."""
    torch.manual_seed(0)
    return Objective(name, C, D), torch.randn(40, C), torch.randn(40, D)


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_alpha_zero_is_the_linear_head(name):
    objective, logits, z = setup(name)
    close(PART, mixed(objective, logits, z, 0.0), logits,
          f"with --loss {name} and alpha = 0, the mix (it must be the linear head's logits)")


@pytest.mark.parametrize("name", ["proxyanchor", "proxynca"])
def test_alpha_one_predicts_the_nearest_proxy(name):
    objective, logits, z = setup(name)
    proxies = objective.metric.proxies
    cos = F.cosine_similarity(z[:, None, :], proxies[None, :, :], dim=-1)   # (N, C)
    distances = (F.normalize(z, dim=-1)[:, None, :] - F.normalize(proxies, dim=-1)).norm(dim=-1)
    nearest = distances.argmin(1)
    assert torch.equal(cos.argmax(1), nearest)
    assert len(set(nearest.tolist())) > 1  # the test is not trivial
    predicted = mixed(objective, logits, z, 1.0).argmax(1)
    wrong = (predicted != nearest).nonzero().flatten().tolist()
    check(PART, not wrong, f"with --loss {name} and alpha = 1, the prediction must be the nearest "
          f"proxy; {len(wrong)} of {len(z)} examples are not, the first: example {wrong[:1]}")


def test_proxyanchor_mix_is_the_formula():
    objective, logits, z = setup("proxyanchor")
    cos = F.cosine_similarity(z[:, None, :], objective.metric.proxies[None, :, :], dim=-1)
    close(PART, mixed(objective, logits, z, 0.3), 0.7 * logits + 0.3 * 32 * cos,
          "with --loss proxyanchor (s = 32) and alpha = 0.3, the mix", atol=1e-5, rtol=1e-4)


def test_softtriple_scores_a_class_by_its_centres():
    objective, logits, z = setup("softtriple")
    x, w = F.normalize(z, dim=-1), F.normalize(objective.metric.centres, dim=-1)
    sim = torch.einsum("nd,ckd->nck", x, w)
    S = (torch.softmax(sim / 0.1, -1) * sim).sum(-1)       # SoftTriple S_c
    # S_c is a weighted mean of the class's similarities, so never above the largest
    assert torch.all(S <= sim.max(-1).values + 1e-6)
    predicted = mixed(objective, logits, z, 1.0).argmax(1)
    check(PART, torch.equal(predicted, S.argmax(1)), "with --loss softtriple and alpha = 1, the "
          "prediction must be the class of the largest S_c (the softmax-weighted similarity to "
          "its centres)")


@pytest.mark.parametrize("name", ["proxyanchor", "softtriple"])
def test_the_mix_forward_and_backward_match_the_formula(name):
    """proxy_logits against its formula, (1 - alpha) F(z) + alpha class_logits(z), in float64,
    forward and backward: the gradients of the head's logits, of z and of the loss's proxies
    (tests/formula.py), at alpha 0.3."""
    objective, logits, z = setup(name)
    objective = objective.double()
    metric = objective.metric

    def formula(logits, z, alpha=0.3, probabilities=False):
        if probabilities:
            return (1 - alpha) * logits.softmax(-1) + alpha * metric.class_logits(z).softmax(-1)
        return (1 - alpha) * logits + alpha * metric.class_logits(z)
    same_as_formula(PART, f"proxy_logits with --loss {name}, alpha 0.3",
                    lambda logits, z: proxy_logits(objective, logits, z, 0.3), formula,
                    {"logits": logits.double(), "z": z.double()},
                    params=dict(metric.named_parameters()), axes=("example", "class"),
                    mistakes={"alpha on the head and 1 - alpha on the proxies":
                              lambda logits, z: formula(logits, z, 0.7),
                              "the probabilities mixed, not the logits":
                              lambda logits, z: formula(logits, z, probabilities=True)})


@pytest.mark.parametrize("name", ["proxyanchor", "softtriple"])
def test_the_mix_runs_on_the_inputs_device(name):
    """proxy_logits with the logits, z and the loss's proxies on a second device
    (tests/elsewhere.py): a tensor made without device= fails as on a GPU."""
    objective, logits, z = setup(name)
    check_on_second_device(PART, f"proxy_logits with --loss {name}, alpha 0.3",
                           lambda objective, logits, z: proxy_logits(objective, logits, z, 0.3),
                           {"logits": logits, "z": z}, objective)


def test_the_proxy_losses_are_those_with_class_logits():
    """PROXY_LOSSES is derived from the registry: a new proxy loss with class_logits joins it."""
    assert {"softtriple", "proxynca", "proxyanchor"} <= set(PROXY_LOSSES)
    for name in ("ce", *METRIC_LOSSES):
        assert has_proxies(Objective(name, C, D)) == (name in PROXY_LOSSES), name


def test_sanity_check_the_mix():
    """The sanity check: the mix on fixed logits and cosines, against the solution's stored outputs
    (tests/fixtures/references/proxy-inference.pt)."""
    objective, logits, z, _ = stand_in()
    matches_reference(PART, "mix with alpha 0.3", mixed(objective, logits, z, 0.3))
