"""Proxy-based inference ("Revisiting Distance Metric Learning for Few-Shot Natural Language
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


def has_proxies(loss):
    """Whether a task's loss (an Objective) trained proxies: they have class_logits."""
    return hasattr(getattr(loss, "metric", None), "class_logits")


def proxy_logits(objective, logits, z, alpha):
    """The mixed logits (B, C); their softmax is p(c | x). alpha in [0, 1]."""
    # logits (B, C): the linear head's F(z). objective.metric.class_logits(z) (B, C): the
    # proxies' side, the logits the proxy loss itself puts on the classes, on its own scale (the
    # docstring's table). Mix logits, not probabilities (the softmax comes after); alpha is the
    # proxies' share.
    # BEGIN part proxy-inference
    return (1 - alpha) * logits + alpha * objective.metric.class_logits(z)
    # END part proxy-inference
