"""PCGrad (minknn/pcgrad.py) on hand-made gradients, against the paper's Algorithm 1 and the
two-task closed form, and on a small shared-encoder model with one head per task. Part pcgrad
(minknn/assignment/parts.py): its sanity check is test_sanity_check_the_projections; the tests after it
diagnose the projections, read off pcgrad_coefficients' C as the adjusted gradients C g. No
second-device test (tests/elsewhere.py): the part runs on the K x K Gram matrix, which
PCGrad.surgery moves to the CPU first (a GPU would wait on each `if dot < 0`)."""
import random

import pytest
import torch
import torch.nn as nn

from minknn.pcgrad import PCGrad, pcgrad_coefficients

from grading import check, close, graded, matches_reference

PART = "pcgrad"


def algorithm_1(grads, rng):
    """A literal transcription of Yu et al.'s Algorithm 1, on lists of floats: the oracle."""
    return [sum(col) for col in zip(*adjusted_rows(grads, rng))]


def adjusted_rows(grads, rng, mistake=None):
    """Algorithm 1's g_i^PC, one list of floats each; under a mistake, to name it only where the
    code's output equals it: "original dot" (the conflict tested and projected with the original
    g_i . g_j), "restart" (each projection from the original g_i: only the last kept), "onto
    adjusted" (projected onto g_j^PC as the loop has left it), "fixed order" (the other tasks in
    ascending order, whatever the shuffle drew)."""
    def dot(a, b):
        return sum(x * y for x, y in zip(a, b))
    g = [list(map(float, row)) for row in grads]
    g_pc = [list(row) for row in g]
    for i in range(len(g)):
        others = [j for j in range(len(g)) if j != i]
        rng.shuffle(others)
        if mistake == "fixed order":
            others.sort()
        for j in others:
            onto = g_pc[j] if mistake == "onto adjusted" else g[j]
            d = dot(g[i] if mistake == "original dot" else g_pc[i], g[j])  # tested against g_j
            if d < 0:
                c = d / dot(onto, onto)
                start = g[i] if mistake == "restart" else g_pc[i]
                g_pc[i] = [x - c * y for x, y in zip(start, onto)]
    return g_pc


def equals(tensor, rows):
    return torch.allclose(tensor, torch.tensor(rows, dtype=tensor.dtype), atol=1e-10, rtol=0)


def coefficients(grads, seed):
    """pcgrad_coefficients' C on the gradients' Gram matrix, the others' order drawn from seed."""
    return graded(PART, "pcgrad_coefficients", pcgrad_coefficients, grads @ grads.T,
                  random.Random(seed))


def projected(grads, seed):
    """The adjusted gradients g_i^PC = sum_j C_ij g_j (K, P)."""
    return coefficients(grads, seed).to(grads.dtype) @ grads


def from_gram(grads, seed):
    """The update direction sum_i g_i^PC = sum_j w_j g_j, w_j = sum_i C_ij."""
    return coefficients(grads, seed).sum(0).to(grads.dtype) @ grads


def conflicting(seed, K=4, P=6):
    """K gradients in which task 0 conflicts with tasks 1 and 2 (a negative dot product)."""
    g = torch.randn(K, P, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    g[1] = -g[0] + 0.5 * g[1]
    g[2] = -0.5 * g[0] + 0.5 * g[2]
    return g


def conflicting_pair(seed, P=50):
    g = torch.randn(2, P, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return g if g[0] @ g[1] < 0 else torch.stack([g[0], -g[1]])


@pytest.mark.parametrize("seed", range(5))
def test_two_conflicting_gradients_stop_conflicting(seed):
    g = conflicting_pair(seed)
    adjusted = projected(g, seed)
    for i, j in ((0, 1), (1, 0)):
        dot = (adjusted[i] @ g[j]).item()
        check(PART, abs(dot) < 1e-10,
              f"two conflicting gradients (g_1 . g_2 = {(g[0] @ g[1]).item():.3g}): after the "
              f"projection g_{i + 1}^PC . g_{j + 1} = {dot:.3g}, but removing g_{i + 1}'s "
              f"component along g_{j + 1} leaves a vector orthogonal to g_{j + 1}")


def test_gradients_without_conflict_pass_through_unchanged():
    g = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 3.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    orthogonal = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # a dot of exactly 0 is not a conflict
    for grads, what in ((g, "three gradients whose dot products are all positive"),
                        (orthogonal, "two orthogonal gradients (a dot of 0 is no conflict)")):
        moved = [i + 1 for i in (projected(grads, 0) != grads).any(1).nonzero()[:, 0].tolist()]
        check(PART, not moved, f"pcgrad_coefficients on {what} changed g_"
              f"{moved[0] if moved else 0}: only a conflict, g_i^PC . g_j < 0, is projected (if "
              f"dot < 0)")
        C = coefficients(grads, 0)
        check(PART, torch.equal(C, torch.eye(len(grads), dtype=C.dtype)), f"pcgrad_coefficients "
              f"on {what} gives C = {C.tolist()}; without a conflict it stays the identity (each "
              f"g_i^PC = g_i): only a conflict, g_i^PC . g_j < 0, is projected (if dot < 0)")


@pytest.mark.parametrize("seed", range(3))
def test_a_projection_runs_along_the_original_gradient(seed):
    """Two tasks: what the projection takes off g_i is a multiple of g_j as it came in, not of the
    g_j^PC the loop has already adjusted."""
    g = conflicting_pair(seed)
    adjusted = projected(g, seed)
    for i, j in ((0, 1), (1, 0)):
        change = adjusted[i] - g[i]
        off = (change - (change @ g[j]) / (g[j] @ g[j]) * g[j]).norm().item()
        onto = equals(adjusted, adjusted_rows(g.tolist(), random.Random(seed), "onto adjusted"))
        check(PART, off < 1e-10, f"two conflicting gradients: g_{i + 1}^PC - g_{i + 1} must be a "
              f"multiple of the original g_{j + 1} (a change to C[i, j] alone, the original "
              f"g_j's coefficient); {off:.3g} of it lies off g_{j + 1}" + (
                  f", as projecting onto g_{j + 1}^PC, already adjusted, gives" if onto else ""))


def test_each_projection_starts_from_the_one_before():
    """g_1 conflicts with g_2 and g_3, which are orthogonal: both projections apply, one after the
    other, and g_1^PC ends orthogonal to both."""
    g = torch.tensor([[-1.0, -2.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    adjusted = projected(g, 0)
    dots = [round((adjusted[0] @ g[j]).item(), 12) + 0.0 for j in (1, 2)]
    restart = equals(adjusted, adjusted_rows(g.tolist(), random.Random(0), "restart"))
    check(PART, dots == [0, 0], f"g_1 = (-1, -2, 1) conflicts with g_2 = (1, 0, 0) and g_3 = (0, "
          f"1, 0): after both projections g_1^PC = (0, 0, 1), orthogonal to both; got g_1^PC = "
          f"{[round(x, 6) + 0.0 for x in adjusted[0].tolist()]}, its dots with them {dots}" + (
              ", the original g_1 with only its last projection taken off: each projection "
              "starts from the one before (C[i, j] -= ...)" if restart else ""))


@pytest.mark.parametrize("seed", range(4))
def test_the_conflict_is_measured_on_the_adjusted_gradient(seed):
    """g_1 conflicts with g_2 and g_3, which are not orthogonal: the second projection's dot is that
    of g_1^PC after the first, so the last projection leaves g_1^PC orthogonal to its g_j."""
    g = torch.tensor([[-1.0, -1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    order = [1, 2]
    random.Random(seed).shuffle(order)   # the order pcgrad_coefficients draws for g_1
    last = order[-1]
    adjusted = projected(g, seed)
    dot = round((adjusted[0] @ g[last]).item(), 12) + 0.0
    original = equals(adjusted, adjusted_rows(g.tolist(), random.Random(seed), "original dot"))
    fixed = equals(adjusted, adjusted_rows(g.tolist(), random.Random(seed), "fixed order"))
    check(PART, dot == 0 or not fixed or order == sorted(order), f"g_1 = (-1, -1, 0) conflicts "
          f"with g_2 = (1, 0, 0) and g_3 = (1, 1, 0): the adjusted gradients are Algorithm 1's "
          f"with the other tasks visited in ascending order (2, then 3), not in the order the "
          f"shuffle of rng drew ({order[0] + 1}, then {last + 1}): each task's others are "
          f"visited in the order rng.shuffle(others) leaves them")
    check(PART, dot == 0, f"g_1 = (-1, -1, 0) conflicts with g_2 = (1, 0, 0) and g_3 = (1, 1, 0); "
          f"in the order rng's shuffle draws here ({order[0] + 1}, then {last + 1}), Algorithm "
          f"1's last projection leaves g_1^PC orthogonal to g_{last + 1}; the adjusted g_1 has "
          f"dot {dot:.3g} with it" + (
              ", as testing and projecting with the original g_1 . g_j gives: the dot is the "
              "current g_i^PC . g_j (C[i] @ G[:, j])" if original else ""))


def test_the_gram_form_by_hand():
    """g_1 = (2, 0), g_2 = (-1, 1): G = [[4, -2], [-2, 2]], a conflict. g_1^PC = g_1 - (-2 / 2) g_2
    = g_1 + g_2 (C_12 = 1), g_2^PC = g_2 - (-2 / 4) g_1 = g_2 + 0.5 g_1 (C_21 = 0.5); w sums C's
    columns: (1.5, 2)."""
    G = torch.tensor([[4.0, -2.0], [-2.0, 2.0]], dtype=torch.float64)
    w = graded(PART, "pcgrad_coefficients", pcgrad_coefficients, G, random.Random(0)).sum(0).tolist()
    check(PART, w == [1.5, 2.0], f"pcgrad_coefficients for g_1 = (2, 0), g_2 = (-1, 1) (G = [[4, -2], "
          f"[-2, 2]]): g_1^PC = g_1 + g_2 and g_2^PC = g_2 + 0.5 g_1, so w = (C_11 + C_21, "
          f"C_12 + C_22) = (1.5, 2); got w = {w}" + (
              ", as adding the projection's coefficient gives (C_12 = -1, C_21 = -0.5): a "
              "conflict SUBTRACTS g_i^PC.g_j / G_jj from C_ij" if w == [0.5, 0.0] else
              " (a conflict subtracts g_i^PC.g_j / G_jj, G_jj the squared norm of g_j, from "
              "C_ij: row i the gradient adjusted, column j the one projected off)"))


@pytest.mark.parametrize("seed", range(4))
def test_the_gram_form_measures_the_conflict_on_the_adjusted_gradient(seed):
    """The gradients of test_the_conflict_is_measured_on_the_adjusted_gradient, through the Gram
    form: only g_1's second projection depends on the dot being g_1^PC's, C_1 . G_:j, not G_1j."""
    g = torch.tensor([[-1.0, -1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    want = algorithm_1(g.tolist(), random.Random(seed))
    got = [round(x, 12) + 0.0 for x in from_gram(g, seed).tolist()]
    rows = adjusted_rows(g.tolist(), random.Random(seed), "original dot")
    original = all(abs(a - b) < 1e-10 for a, b in zip(got, [sum(c) for c in zip(*rows)]))
    check(PART, got == want, f"pcgrad_coefficients on g_1 = (-1, -1, 0), g_2 = (1, 0, 0), g_3 = (1, 1, "
          f"0) (seed {seed}): g_1 is projected off g_2 and g_3 in turn, and Algorithm 1's "
          f"direction is {want}; sum_j w_j g_j is {got}" + (
              ", as testing and projecting with the original G_ij gives: the dot is the current "
              "g_i^PC . g_j = C[i] @ G[:, j]" if original else ""))


@pytest.mark.parametrize("seed", range(5))
def test_two_tasks_equal_the_closed_form(seed):
    g1, g2 = conflicting_pair(seed)
    d = g1 @ g2
    expected = g1 - d / (g2 @ g2) * g2 + g2 - d / (g1 @ g1) * g1
    g = torch.stack([g1, g2])
    what = ("direction for two conflicting tasks (the closed form g_1 - (g_1.g_2 / ||g_2||^2) g_2 "
            "+ g_2 - (g_1.g_2 / ||g_1||^2) g_1)")
    close(PART, from_gram(g, seed), expected, f"pcgrad_coefficients' {what}", atol=1e-12, rtol=0)


def test_one_task_is_the_identity():
    g = torch.randn(1, 20, dtype=torch.float64)
    close(PART, projected(g, 0), g, "the adjusted gradient of one task, which must be its input "
          "unchanged,", atol=0, rtol=0)


@pytest.mark.parametrize("seed", range(6))
def test_k_tasks_match_algorithm_1(seed):
    """Three and four tasks, random orders: the code against the transcription, with the same
    random order of the other tasks (both draw it from the same seeded rng). Projecting onto the
    other task's already adjusted gradient, or restarting from the original g_i, shows here."""
    K = 3 + seed % 2
    g = torch.randn(K, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if seed % 2:
        g = conflicting(seed, K, 8)
    expected = torch.tensor(algorithm_1(g.tolist(), random.Random(seed)), dtype=torch.float64)
    conflicts = int(((g @ g.T).triu(1) < 0).sum())
    close(PART, from_gram(g, seed), expected, f"the sum of the adjusted gradients "
          f"({K} tasks, {conflicts} conflicting pairs; the oracle: Algorithm 1 written out)",
          atol=1e-12, rtol=0)


def test_a_zero_gradient_is_harmless():
    g = torch.tensor([[1.0, -1.0], [0.0, 0.0]])
    got = projected(g, 0)
    bad = [tuple(i) for i in (~torch.isfinite(got)).nonzero().tolist()]
    check(PART, not bad, f"the adjusted gradients of g_1 = [1, -1] and a zero g_2 = [0, 0] hold "
          f"{got[bad[0]].item() if bad else ''} at {bad}: the dot g_1 . g_2 is exactly 0, no "
          f"conflict (a projection only where the dot is < 0), so both must pass unchanged, and "
          f"nothing divides by ||g_2||^2 = 0")
    close(PART, got, g, "the adjusted gradients with a zero gradient (its dot is 0, no "
          "conflict, and nothing divides by its norm 0)", atol=0, rtol=0)


@pytest.mark.parametrize("scale", [1e-4, 1e-8])
def test_a_conflict_of_any_size_is_projected(scale):
    """Algorithm 1 projects wherever g_i^PC . g_j < 0, however small: the coefficients C of
    gradients all scaled by s are those of the gradients themselves (the dots scale by s^2, each
    projection's c by 1). A BERT task's gradient can be small (its loss near 0)."""
    for seed in range(3):
        g = conflicting(seed)
        big, small = coefficients(g, seed), coefficients(scale * g, seed)
        gap = (small - big).abs().max().item()
        if gap > 1e-9:
            kept = [(i, j) for i in range(4) for j in range(4) if i != j
                    and big[i, j] != 0 and small[i, j] == 0]
            check(PART, False, f"with the 4 gradients all scaled by {scale:g} (their dot products "
                  f"by {scale ** 2:g}), C moved by up to {gap:.3g}; Algorithm 1's C does not "
                  f"change with the scale"
                  + (f": the projections of task(s) {sorted({i for i, _ in kept})} were skipped "
                     f"at that scale (C's entries {kept} are 0, at scale 1 they are not), so the "
                     f"test for a conflict depends on the size of g_i^PC . g_j; it is < 0, "
                     f"exactly" if kept else ""))


@pytest.mark.parametrize("seed", range(8))
def test_the_gram_matrix_version_equals_algorithm_1(seed):
    """pcgrad_coefficients runs Algorithm 1 on the K x K Gram matrix; sum_j w_j g_j must be the
    transcription's direction, for 2 to 5 tasks drawn with and without conflicts (a mistake in the
    coefficient update, or a different random order, shows here)."""
    g = torch.randn(2 + seed % 4, 16, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)
    if seed % 3 == 0:
        g[1] = -g[0] + 0.1 * g[1]  # a strong conflict
    expected = torch.tensor(algorithm_1(g.tolist(), random.Random(seed)), dtype=torch.float64)
    close(PART, from_gram(g, seed), expected, f"PCGrad's direction from the Gram matrix "
          f"({len(g)} tasks; the oracle: Algorithm 1 written out)", atol=1e-12, rtol=1e-12)


def test_a_runs_pcgrad_reuses_its_buffer_and_stays_exact():
    """The run's PCGrad keeps its (K, P) buffer: a second and third step (fresh losses, and .grad
    set to None by zero_grad as in train.py) must give Algorithm 1's direction again, not one mixed
    with the last step's gradients."""
    torch.manual_seed(3)
    model = SharedEncoder().double()
    shared = list(model.shared.parameters())
    pcgrad = PCGrad(shared)
    for step in range(3):
        xs = [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)]
        grads = separate_gradients(model, xs)
        flat = torch.stack([torch.cat([g[id(p)].reshape(-1) for p in shared]) for g in grads])
        expected = torch.tensor(algorithm_1(flat.tolist(), random.Random(step)),
                                dtype=torch.float64)
        model.zero_grad(set_to_none=True)
        graded(PART, "PCGrad.backward", pcgrad.backward, model.losses(xs), random.Random(step))
        close(PART, torch.cat([p.grad.reshape(-1) for p in shared]), expected,
              f"step {step}: the shared .grad (Algorithm 1's direction)", atol=1e-12, rtol=0)
        if step == 0:
            buffer = pcgrad.grads.data_ptr()
    assert pcgrad.grads.data_ptr() == buffer, \
        "PCGrad allocated a new gradient buffer after the first step"


class SharedEncoder(nn.Module):
    """A shared layer and one head per task, as in MultiTaskModel."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 6)
        self.heads = nn.ModuleList([nn.Linear(6, 1) for _ in range(3)])

    def losses(self, xs):
        return [(self.heads[k](torch.tanh(self.shared(x))) ** 2).mean() * (k + 1)
                for k, x in enumerate(xs)]


def separate_gradients(model, xs):
    """Each task's gradient on every parameter, computed alone."""
    grads = []
    for loss in model.losses(xs):
        params = list(model.parameters())
        grad = torch.autograd.grad(loss, params, allow_unused=True)
        grads.append(dict(zip([id(p) for p in params], grad)))
    return grads


def test_heads_get_their_own_task_gradient_and_the_encoder_gets_pcgrad():
    torch.manual_seed(0)
    model = SharedEncoder().double()
    xs = [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)]
    grads = separate_gradients(model, xs)
    shared = list(model.shared.parameters())
    flat = torch.stack([torch.cat([g[id(p)].reshape(-1) for p in shared]) for g in grads])
    expected = torch.tensor(algorithm_1(flat.tolist(), random.Random(7)), dtype=torch.float64)

    conflicts = graded(PART, "PCGrad.backward", PCGrad(shared).backward, model.losses(xs),
                       random.Random(7))
    assert conflicts == int(((flat @ flat.T).triu(1) < 0).sum())
    close(PART, torch.cat([p.grad.reshape(-1) for p in shared]), expected,
          "the shared encoder's .grad (Algorithm 1's direction)", atol=1e-12, rtol=0)
    for k, head in enumerate(model.heads):
        for p in head.parameters():
            # its task's gradient, untouched
            assert torch.allclose(p.grad, grads[k][id(p)], atol=1e-14)


def test_any_optimizer_steps_along_the_pcgrad_direction():
    """With SGD (lr 0.1) the shared weights move by exactly -0.1 g^PC; Adam gets the same .grad."""
    torch.manual_seed(1)
    model = SharedEncoder().double()
    xs = [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)]
    shared = list(model.shared.parameters())
    before = [p.detach().clone() for p in shared]
    PCGrad(shared).backward(model.losses(xs), random.Random(0))
    direction = [p.grad.clone() for p in shared]
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    for p, b, d in zip(shared, before, direction):
        assert torch.allclose(p.detach(), b - 0.1 * d, atol=1e-14)


def test_no_shared_parameters_falls_back_to_the_summed_loss():
    model = SharedEncoder().double()
    xs = [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)]
    PCGrad([]).backward(model.losses(xs), random.Random(0))
    assert all(p.grad is not None for p in model.heads.parameters())


def test_a_parameter_no_task_reaches_keeps_no_gradient():
    """Like BERT's pooler under mean pooling: the summed loss leaves its .grad None, so must PCGrad
    (a zero .grad would still let AdamW's weight decay move it)."""
    model = SharedEncoder().double()
    unused = nn.Parameter(torch.ones(3, dtype=torch.float64))
    xs = [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)]
    PCGrad([*model.shared.parameters(), unused]).backward(model.losses(xs), random.Random(0))
    assert unused.grad is None and model.shared.weight.grad is not None


def test_sanity_check_the_projections():
    """The sanity check: the adjusted gradients and the update's weights on 4 fixed gradients with
    conflicts, against the solution's stored outputs (tests/fixtures/references/pcgrad.pt)."""
    g = conflicting(0)
    matches_reference(PART, "adjusted", projected(g, 0))
    matches_reference(PART, "weights", coefficients(g, 0).sum(0))
