"""Proxies: where they start (train.py --proxy_init), and how they vote at inference.

Where they start. A proxy loss's proxies start at random (torch.randn, the default), or with
--proxy_init names at the classes' names. This is AncSetFit's idea (Pauli et al. 2023, "Anchoring
Fine-tuning of Sentence Transformer with Semantic Label Information for Efficient Truly Few-shot
Classification": each class anchored at the embedding of a text describing it), not its loss:
here the names only give the proxies their start, and the proxy loss trains them as usual.

    P_c = sqrt(H) z(name_c) / ||z(name_c)||        z(name_c): the encoder's z of class c's name

name_c is the task's readable name of class c (minknn/tasks/registry.py, Task.names: its label where
that is a word, 'very negative', ..., 'very positive' for SST-5; the dataset's documented meaning
where the label is a code, 'human being' for TREC's HUM), encoded as the task's texts are (the same
tokenizer, --max_len and --pooling), by the encoder as loaded, before the first step, with
dropout off (predict: eval mode, inference mode). The losses read only a proxy's direction
(both normalise it). The length sqrt(H) is that of the random proxy it replaces
(E ||randn(H)|| ~ sqrt(H)): AdamW moves each coordinate by about --proxy_lr a step whatever the
length, so at z's own length (5 to 8 for MiniLM's SST-5 names,
against sqrt(384) = 19.6) the same steps would turn a proxy 2.5 to 4 times faster.
The random proxies are drawn all the same, then overwritten, so that every later draw (dropout,
batches) is a random run's. A resumed run takes its proxies from last.pt, never from the names.
Under torchrun every rank computes the same start, and build() broadcasts rank 0's anyway.
Proxy Anchor and ProxyNCA only (a loss's `one_proxy`): SoftTriple's K centres a class would all
start at one point, where they get the same gradients and never part.

How they vote ("Revisiting Distance Metric Learning for Few-Shot Natural Language
Classification", eq. 10): after training with a proxy loss, the class proxies vote alongside the
linear head.

    p(c | x) = softmax_c( (1 - alpha) F(z)_c + alpha * s * cos(z, P_c) )

F(z) the linear head's logits, z the pooled representation (the paper's h), P_c class c's
proxy, alpha the mix (--proxy_alpha, default 0.5). The scale s puts the cosine, which lies in
[-1, 1], on the scale of logits; we take the scale the proxy loss itself trained with, so that
s * cos(z, P_c) are the very logits that loss put on the classes (each loss's `class_logits`):
    proxyanchor  s = alpha_PA = 32:     32 cos(z, P_c)
    proxynca     -s d(z, P_c) = 2 s cos(z, P_c) - 2 s; the constant -2 s is the same for every
                 class, and softmax ignores it, so the effective scale is 2 s = 18 (s = 9)
    softtriple   lambda S_c(z) = 20 S_c(z): for its K centres per class, the class's score is
                 the softmax-weighted similarity to its centres (S_c of softtriple.py) in place
                 of one cosine
alpha = 0 is the linear head alone; alpha = 1 predicts the nearest proxy (the class with the
largest similarity).
"""
import math

import torch
import torch.nn.functional as F

from minknn.tasks.data import Example
from minknn.tools.engine import predict


def has_proxies(loss):
    """Whether a task's loss (an Objective) trained proxies: they have class_logits."""
    return hasattr(getattr(loss, "metric", None), "class_logits")


@torch.no_grad()
def start_at_names(model, tokenizer, task, loss, device, precision=None):
    """--proxy_init names: loss.proxies (C, H), one a class, set in place to sqrt(H) times the
    unit vector of z(name_c) (the module docstring), name_c task.names[c]. A task of one
    text (checks.py refuses pairs). Leaves the model in training mode (its callers train next).
    Returns z (C, H), the names' representations."""
    names = [Example(text=name) for name in task.names]
    _, z = predict(model, tokenizer, task, names, len(names), device, precision=precision)
    loss.proxies.copy_(math.sqrt(z.shape[1]) * F.normalize(z, dim=-1).to(loss.proxies))
    model.train()  # predict() left it in eval mode
    return z


def proxy_logits(objective, logits, z, alpha):
    """The mixed logits (B, C); their softmax is p(c | x). alpha in [0, 1]."""
    # logits (B, C): the linear head's F(z). objective.metric.class_logits(z) (B, C): the
    # proxies' side, the logits the proxy loss itself puts on the classes, on its own scale (the
    # docstring's table). Mix logits, not probabilities (the softmax comes after); alpha is the
    # proxies' share.
    # BEGIN part proxy-inference
    return (1 - alpha) * logits + alpha * objective.metric.class_logits(z)
    # END part proxy-inference


def proxy_cosines(objective, z):
    """Each class proxy's cosine with each z, (N, C), what predict --explain shows: cos(z, P_c);
    for SoftTriple's K centres a class, its S_c (the centres' cosines, softmax-weighted: the
    class similarity its loss and proxy inference use)."""
    metric = objective.metric
    with torch.no_grad():
        if hasattr(metric, "proxies"):
            return F.normalize(z.float(), dim=-1) @ F.normalize(metric.proxies.float(), dim=-1).T
        return metric.similarity(z.float())
