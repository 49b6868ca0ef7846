"""PCGrad: gradient surgery for multi-task learning (Yu et al. 2020, "Gradient Surgery for
Multi-Task Learning", Algorithm 1).

One step of multi-task training sums the tasks' losses, so the shared parameters (BERT) move along
g = sum_k g_k. When two tasks' gradients conflict (a negative dot product), part of one undoes the
other. PCGrad removes, from each task's gradient, its component along every gradient it conflicts
with, then sums:

    Algorithm 1 (PCGrad update rule)
    Require: model parameters theta, one minibatch per task T_1 .. T_K
    g_k <- grad_theta L_k(theta)                              for every k
    g_k^PC <- g_k                                             for every k
    for T_i in the tasks:
        for T_j in the other tasks, in a random order:
            if g_i^PC . g_j < 0:
                g_i^PC <- g_i^PC - (g_i^PC . g_j / ||g_j||^2) g_j     (g_j is the ORIGINAL gradient)
    return the update direction  g^PC = sum_i g_i^PC

With two tasks this is the closed form: when g_1 . g_2 < 0, g^PC = g_1 - (g_1.g_2 / ||g_2||^2) g_2
+ g_2 - (g_1.g_2 / ||g_1||^2) g_1, and each adjusted gradient is orthogonal to the other task's;
otherwise g^PC = g_1 + g_2. With one task, or no conflict, PCGrad is plain summation.

Only the shared parameters go through the surgery. A task's own head (and a loss's proxies) gets
its own task's gradient alone, because no other task's loss reaches it (the paper does the same:
task-specific parameters are updated by their task's gradient).

The surgery happens between backward() and optimizer.step(), on .grad, so it works with any
optimizer. With AMP: bf16 autocast (our CUDA path) needs no loss scaling; with fp16 and a
GradScaler every g_k carries the same positive scale, which leaves the signs of the dot products
and the projections' directions unchanged, so PCGrad commutes with the scaling.
Cost: one backward per task (each task's batch has its own forward anyway, so the backward work is
the same as for the summed loss), plus copying K gradients of the shared parameters and K (K - 1)
dot products over them.
"""
import random

import torch


def project_conflicting(grads, rng=random):
    """Algorithm 1's inner loops. grads: (K, P), one flattened gradient per task.
    Returns the (K, P) adjusted gradients g_k^PC (their sum is the update direction)."""
    adjusted = grads.clone()
    for i in range(len(grads)):
        others = [j for j in range(len(grads)) if j != i]
        rng.shuffle(others)
        for j in others:
            dot = adjusted[i] @ grads[j]
            if dot < 0:  # a zero g_j has dot 0, so the division never meets ||g_j|| = 0
                adjusted[i] -= dot / (grads[j] @ grads[j]) * grads[j]
    return adjusted


def pcgrad_backward(losses, shared, rng=random):
    """Backpropagates each task's loss on its own, then sets the shared parameters' .grad to
    sum_k g_k^PC. Every other parameter accumulates its task's gradient as usual. Call it in
    place of sum(losses).backward(), before gradient clipping and optimizer.step(). Returns how
    many pairs of tasks had conflicting gradients (g_i . g_j < 0), of the K (K - 1) / 2.

    losses: the tasks' scalar losses, each from its own forward pass (each backward frees its graph)
    shared: the parameters every task's loss reaches (the BERT encoder's)"""
    if not shared:  # nothing shared (a frozen encoder): the tasks cannot conflict
        sum(losses).backward()
        return 0
    # one row per task, filled in place; each .grad buffer is zeroed and reused for the next task
    P = sum(p.numel() for p in shared)
    grads = torch.zeros(len(losses), P, device=shared[0].device,
                        dtype=torch.promote_types(shared[0].dtype, torch.float32))
    for k, loss in enumerate(losses):
        loss.backward()
        offset = 0
        for p in shared:
            if p.grad is not None:
                grads[k, offset:offset + p.numel()] = p.grad.reshape(-1)
                p.grad.zero_()
            offset += p.numel()
    update = project_conflicting(grads, rng).sum(0)
    offset = 0
    for p in shared:
        # None: no loss reached it (BERT's pooler under mean pooling), as with the sum
        if p.grad is not None:
            p.grad.copy_(update[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    return int(((grads @ grads.T).triu(1) < 0).sum())
