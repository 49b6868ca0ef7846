"""minknn/probe.py: the logistic regression is scikit-learn's objective solved to its optimum, and
fit_head writes it into the model's head so that the head predicts what the regression does."""
import pytest
import torch

from minknn.bert import BertModel
from minknn.model import Model
from minknn.probe import fit_head, fit_logistic
from minknn.tasks.data import load_split
from minknn.tasks.registry import TASKS
from minknn.tokenizer import Tokenizer
from minknn.tools.engine import predict


def objective(W, b, z, y, C, kind):
    """scikit-learn's objective, written out literally per example (the oracle)."""
    total = 0.5 * (W ** 2).sum()
    for i in range(len(z)):
        s = W @ z[i] + b
        if kind == "binary":   # one vector: s has one entry
            sign = 1.0 if y[i] == 1 else -1.0
            total = total + C * torch.log1p(torch.exp(-sign * s[0]))
        elif kind == "multilabel":
            for k in range(len(s)):
                total = total + C * (torch.log1p(torch.exp(s[k])) - y[i, k] * s[k])
        else:
            total = total + C * (torch.logsumexp(s, 0) - s[y[i]])
    return total


def data(n=24, d=6, classes=3, seed=0, multilabel=False):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g, dtype=torch.float64) * 2
    if multilabel:
        y = (torch.rand(n, classes, generator=g) < 0.4).double()
    else:
        y = torch.arange(n) % classes
    return z, y


@pytest.mark.parametrize("kind,classes,C", [("multiclass", 3, 1.0), ("multiclass", 4, 0.1),
                                            ("binary", 2, 1.0), ("multilabel", 3, 1.0)])
def test_the_fit_is_the_objectives_optimum(kind, classes, C):
    """At the optimum of a smooth convex objective its gradient is zero: computed on the literal
    oracle, not on the file's own objective, so a wrong penalty (on the bias, without the 1/2, C
    on the penalty instead of the data) or a mean instead of a sum is caught."""
    z, y = data(classes=classes, multilabel=kind == "multilabel")
    W, b = fit_logistic(z, y, classes, C=C, multilabel=kind == "multilabel")
    W, b = W.double(), b.double()
    if kind == "binary":  # rows -w/2, +w/2 hold the one vector w
        torch.testing.assert_close(W[0], -W[1], msg="probe: a two-class head's rows must be -w/2 "
                                   "and +w/2")
        W, b = (W[1] - W[0])[None], (b[1] - b[0])[None]
    W.requires_grad_(True)
    b.requires_grad_(True)
    objective(W, b, z, y, C, kind).backward()
    for name, g in (("weights", W.grad), ("bias", b.grad)):
        # float32 weights, so the gradient is near zero, not exactly
        assert g.abs().max() < 1e-3 * max(1.0, W.detach().abs().max()), (
            f"probe ({kind}, C={C}): the objective's gradient in the {name} is "
            f"{g.abs().max():.2e} at the fit; it is not scikit-learn's optimum")


def test_separable_data_gets_finite_weights_whose_size_the_penalty_sets():
    """Two separable classes: without the penalty the weights would grow without bound; with it
    they stay finite, and a smaller C (a stronger penalty) gives smaller ones."""
    z = torch.tensor([[1.0, 0.0], [2.0, 0.1], [-1.0, 0.0], [-2.0, -0.1]])
    y = torch.tensor([1, 1, 0, 0])
    strong, _ = fit_logistic(z, y, 2, C=0.1)
    weak, _ = fit_logistic(z, y, 2, C=10.0)
    assert torch.isfinite(weak).all()
    assert strong.norm() < weak.norm(), (
        f"probe: C=0.1 gave weights of norm {strong.norm():.3f}, C=10 {weak.norm():.3f}; "
        f"C must weigh the data, 1/2 ||W||^2 the penalty")
    logits = z @ weak.T
    assert (logits.argmax(1) == y).all(), "probe: separable data must be fit"


def test_fit_head_writes_the_regression_into_the_models_head(tiny_bert_dir, data_dir):
    """fit_head: the head's logits are z W^T + b of the regression fit on the model's own z
    (without dropout), so the model predicts what the regression does."""
    task = TASKS["sst"]
    examples = load_split(task, "dev", data_dir)[:40]
    torch.manual_seed(0)
    model = Model(BertModel.from_pretrained(tiny_bert_dir), [task]).train()
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    z = fit_head(model, tokenizer, task, examples, 8, torch.device("cpu"))
    W, b = fit_logistic(z, torch.tensor([e.label for e in examples]), len(task.labels))
    torch.testing.assert_close(model.heads[task.name].weight.detach(), W, atol=1e-4, rtol=1e-3,
                               msg="fit_head: the head's weight is not the regression's")
    logits, z2 = predict(model, tokenizer, task, examples, 8, torch.device("cpu"))
    torch.testing.assert_close(z2, z, msg="fit_head: fit on other representations than the "
                               "model's z at inference")
    torch.testing.assert_close(logits, z @ W.T + b, atol=1e-4, rtol=1e-3,
                               msg="fit_head: the model's logits are not the regression's")
