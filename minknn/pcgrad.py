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
the same as for the summed loss), then K (K + 1) / 2 dot products and one weighted sum over the P
shared parameters. Every adjusted gradient is a combination of the original ones, g_i^PC =
sum_j C_ij g_j (C starts as the identity, and a projection subtracts from C's row i), and the dot
products the algorithm needs are g_i^PC . g_j = sum_l C_il G_lj with G the Gram matrix g_i . g_j. So
Algorithm 1 runs on K x K numbers (`pcgrad_coefficients`, the part a student writes: Algorithm 1
line by line, on the coefficients), and only G and the final sum touch the gradients themselves;
tests/test_pcgrad.py holds it to Algorithm 1 written out on the gradients (its oracle). The (K, P)
gradients live in one buffer kept from step to step:
a fresh 270 MB buffer per step (22.7M parameters, 3 tasks) cost more than the surgery, because the
operating system zeroes every new page.

Under DDP (minknn/tools/distributed.py) the surgery runs on the global gradients, never on each
rank's: PCGrad(shared, reduce=all_reduce_mean, heads=...) averages each task's g_k over the ranks as
soon as it is taken (one all-reduce per task), so every rank builds the same Gram matrix and the
same g^PC (with the same rng: the run's, seeded alike on every rank by trainer.build). Projecting
per rank would not be PCGrad: the projection is not linear in g_k, so the mean of per-rank surgeries
is not the surgery of the means. trainer.forward runs a PCGrad step's forward outside DDP's hooks
(on the wrapped module, as no_sync() would), so that DDP's own all-reduce does not average the
gradients a second time; the model's other trainable parameters (`heads`, each its own task's) are
then averaged here in one all-reduce, as DDP would have. A loss's proxies need nothing: every rank
computes the same loss, so their gradient is the same on every rank.
"""
import random

import torch

from minknn.tools.distributed import all_reduce_grads


def pcgrad_coefficients(gram, rng=random):
    """Algorithm 1 on the Gram matrix G (K, K), G_ij = g_i . g_j: the coefficients C (K, K) of the
    adjusted gradients, g_i^PC = sum_j C_ij g_j. Each task's others come in a random order, drawn
    from rng (the tests draw the same one)."""
    G = gram.double()
    C = torch.eye(len(G), dtype=torch.float64, device=G.device)  # g_i^PC <- g_i: row i is e_i
    for i in range(len(G)):                    # for T_i in the tasks
        others = [j for j in range(len(G)) if j != i]
        rng.shuffle(others)                    # the other tasks, in a random order
        # For each j in that order: if g_i^PC . g_j < 0 (a conflict; a dot of exactly 0 is none),
        # g_i^PC <- g_i^PC - (g_i^PC . g_j / ||g_j||^2) g_j, with g_j the ORIGINAL gradient. On the
        # coefficients: g_i^PC . g_j = sum_l C_il G_lj = C[i] @ G[:, j], ||g_j||^2 = G_jj, and
        # subtracting c g_j from g_i^PC subtracts c from C_ij alone.
        # BEGIN part pcgrad
        for j in others:
            dot = C[i] @ G[:, j]  # g_i^PC . g_j
            if dot < 0:  # g_i^PC <- g_i^PC - (g_i^PC . g_j / ||g_j||^2) g_j
                C[i, j] -= dot / G[j, j]  # a zero g_j has dot 0: never divided by ||g_j|| = 0
        # END part pcgrad
    return C


class PCGrad:
    """PCGrad for the parameters every task shares (the BERT encoder's), with the buffer of the
    task gradients kept for the whole run."""

    def __init__(self, shared, reduce=None, heads=()):
        """shared: the encoder's trainable parameters. Under DDP only: reduce, the average over
        the ranks (distributed.all_reduce_mean) of each task's flattened g_k, in place; heads, the
        other trainable parameters of the model, whose .grad are averaged (all_reduce_grads)."""
        self.shared, self.reduce, self.heads = list(shared), reduce, list(heads)
        self.grads = self.update = None  # (K, P) and (P,), made at the first step

    def backward(self, losses, rng=random):
        """Backpropagates each task's loss on its own, then sets the shared parameters' .grad to
        sum_k g_k^PC. Every other parameter accumulates its task's gradient as usual. Call it in
        place of sum(losses).backward(), before gradient clipping and optimizer.step(). Returns
        how many pairs of tasks had conflicting gradients (g_i . g_j < 0), of the K (K - 1) / 2.

        losses: the tasks' scalar losses, each from its own forward pass (each backward frees its
        graph)"""
        if self.shared:
            conflicts = self.surgery(losses, rng)
        else:  # nothing shared (a frozen encoder): the tasks cannot conflict
            sum(losses).backward()
            conflicts = 0
        if self.reduce is not None:  # under DDP: the heads, as DDP would have averaged them
            all_reduce_grads(self.heads)
        return conflicts

    def surgery(self, losses, rng):
        """backward()'s work when the encoder trains: each g_k taken, the surgery, g^PC set."""
        P = sum(p.numel() for p in self.shared)
        if self.grads is None or self.grads.shape[0] != len(losses):
            self.grads = torch.empty(len(losses), P, device=self.shared[0].device,
                                     dtype=torch.promote_types(self.shared[0].dtype, torch.float32))
            self.update = torch.empty(P, device=self.grads.device, dtype=self.grads.dtype)
        grads, reached = self.grads, set()  # reached: the parameters some loss reaches
        for k, loss in enumerate(losses):
            loss.backward()  # the shared .grad are None before, so they now hold g_k alone
            offset = 0
            for n, p in enumerate(self.shared):
                if p.grad is None:
                    grads[k, offset:offset + p.numel()].zero_()
                else:
                    grads[k, offset:offset + p.numel()].copy_(p.grad.reshape(-1))
                    p.grad = None  # the next task's backward starts from None again
                    reached.add(n)
                offset += p.numel()
            if self.reduce is not None:
                self.reduce(grads[k])  # the global g_k, the same on every rank
        gram = grads @ grads.T  # (K, K)
        # Algorithm 1 on K x K numbers, on the CPU (on a GPU each `if dot < 0` would wait for it)
        weights = pcgrad_coefficients(gram.cpu(), rng).sum(0).to(grads)  # (K,): sum_i C_ij
        update = torch.mv(grads.T, weights, out=self.update)  # (P,): sum_k w_k g_k = sum_k g_k^PC
        offset = 0
        for n, p in enumerate(self.shared):
            # None: no loss reached it (BERT's pooler under mean pooling), as with the sum
            if n in reached:
                p.grad = update[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        return int((gram.triu(1) < 0).sum())
