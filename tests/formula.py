"""A part held to its formula, forward and backward, with a failure that says what is off.

    same_as_formula("layer", "the layer (BertLayer) in eval mode",
                    lambda h: layer(h, packing), lambda h: layer_formula(layer, h, packing),
                    {"h": h}, params=dict(layer.named_parameters()),
                    mistakes={"no gradient through h on its way into the attention":
                              lambda h: layer_formula(layer, h, packing, cut=...)})

runs the part and the formula (a literal transcription, in float64 where it can be) on the same
inputs, then backpropagates one fixed random cotangent through both, and compares:
  1. the inputs: a part that changes one of them in place fails, naming it and where;
  2. the output, then the gradient of every input and every parameter, in that order;
  3. at the first quantity off: a cause is named only when it is checked: when the part's output
     and every gradient equal those of one of `mistakes` (each a transcription of the formula
     under that mistake) while the formula's do not. Where several fit, all are named.
     Otherwise the failure says what is observed (describe()): which quantity, where, and how
     it is off, never why.

describe() reads the difference as a whole before falling back to its largest element: a shape,
values that are not finite, zeros, a constant factor or offset, a transposition, a difference
confined to named regions ("only at padding positions") or to some indices of an axis ("only at
example 1"). What it can say of no such pattern is a value check, worded with tests/grading.py's
GENERIC phrase (the mutation score counts it as such), with the largest difference: where, what
it got, what the formula gives.
"""
import math

import torch

from grading import GENERIC, check
from elsewhere import DeviceSlip
from minknn.assignment.parts import label

ATOL, RTOL = 1e-6, 1e-5
VALUE_ONLY = f"{GENERIC}the formula's"  # how describe() words a difference it reads no more in


def _f64(x):
    return x.detach().double().cpu()


def _close(a, b, atol=ATOL, rtol=RTOL):
    return a.shape == b.shape and torch.allclose(_f64(a), _f64(b), atol=atol, rtol=rtol,
                                                 equal_nan=False)


def _at(index, axes):
    if axes and len(axes) == len(index):
        return ", ".join(f"{a} {i}" for a, i in zip(axes, index))
    return f"index {tuple(index)}"


def _numbers(values, limit=6):
    values = sorted(set(values))
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def describe(got, want, what, axes=None, regions=None, atol=ATOL, rtol=RTOL):
    """None when got equals want (the formula's value); else one line saying how `what` is off:
    an observation, never a cause. axes names the dimensions ("example", "key", ...); regions
    maps a name ("the padding positions") to a boolean mask (broadcast to want's shape) of where
    it lies."""
    if not isinstance(got, torch.Tensor):
        return f"{what} is a {type(got).__name__}, not a tensor of shape {tuple(want.shape)}"
    if got.shape != want.shape:
        out = f"{what} has shape {tuple(got.shape)}; the formula's has shape {tuple(want.shape)}"
        if got.dim() >= 2 and got.transpose(-2, -1).shape == want.shape and _close(
                got.transpose(-2, -1), want, atol, rtol):
            out += ", and its values are the formula's with the last two dimensions swapped"
        return out
    a, b = _f64(got), _f64(want)
    if torch.allclose(a, b, atol=atol, rtol=rtol):
        return None
    bad = ~torch.isclose(a, b, atol=atol, rtol=rtol)
    n, total = int(bad.sum()), bad.numel()
    first = tuple(int(i) for i in bad.nonzero()[0])
    if not torch.isfinite(a).all() and torch.isfinite(b).all():
        wrong = ~torch.isfinite(a)
        at = tuple(int(i) for i in wrong.nonzero()[0])
        return (f"{what} is not finite at {int(wrong.sum())} of its {total} elements (first "
                f"{a[at].item()} at {_at(at, axes)}); the formula's is finite everywhere")
    if (a == 0).all():
        return (f"{what} is 0 everywhere; the formula's is not (up to {b.abs().max().item():.3g}"
                f" in size)")
    if b.abs().max() > 0 and b.numel() > 1:
        scale = (a * b).sum() / (b * b).sum()
        if abs(scale - 1) > 1e-3 and torch.allclose(a, scale * b, atol=atol, rtol=rtol):
            return (f"{what} is {scale.item():.6g} times the formula's, everywhere (its shape "
                    f"is right, its size is not)")
        shift = (a - b).mean()
        if torch.allclose(a, b + shift, atol=atol, rtol=rtol):
            return f"{what} is the formula's plus {shift.item():.6g}, everywhere"
    if a.dim() >= 2 and a.shape[-1] == a.shape[-2] and torch.allclose(
            a, b.transpose(-2, -1), atol=atol, rtol=rtol):
        return f"{what} is the formula's with its last two dimensions swapped (transposed)"
    where = ""
    for region, mask in (regions or {}).items():
        mask = mask.expand(bad.shape) if mask.shape != bad.shape else mask
        if (bad & ~mask).sum() == 0:
            where = f", only {region}"
            break
        if (bad & mask).sum() == 0:
            where = f", only outside {region}"
            break
    if not where and axes and len(axes) == a.dim():
        for d, axis in enumerate(axes):
            rows = sorted({int(i) for i in bad.nonzero()[:, d]})
            if len(rows) < a.shape[d] and a.shape[d] > 1:
                where = f", only at {axis} {_numbers(rows)} (of 0 to {a.shape[d] - 1})"
                break
    gap = (a - b).abs().nan_to_num(math.inf)
    worst = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    detail = (f" at {n} of its {total} elements{where}, by up to {gap.max().item():.3g} (at "
              f"{_at(worst, axes)} got {a[worst].item():.6g}, expected {b[worst].item():.6g})")
    if (a[bad] == 0).all():
        return (f"{what} is 0 at {n} of its {total} elements where the formula's is not"
                f"{where} (first at {_at(first, axes)}, where the formula gives "
                f"{b[first].item():.6g})")
    if where:  # a difference confined somewhere is an observation, not only a value
        return f"{what} is off{detail}"
    return f"{what}{VALUE_ONLY}{detail}"


def _call(part, what, fn, inputs):
    try:
        return fn(**inputs)
    except (NotImplementedError, DeviceSlip):
        raise
    except Exception as e:
        raise AssertionError(f"{label(part)}: {what} raised {type(e).__name__}: {e}") from e


def run(fn, inputs, params, cotangent, part=None, what=""):
    """(output, {name: gradient}) of fn on fresh leaf copies of the inputs, backpropagating
    `cotangent` (a function of the output's shape); None for no gradient."""
    leaves = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in
              inputs.items()}
    out = _call(part, what, fn, leaves) if part else fn(**leaves)
    wrt = {**{k: v for k, v in leaves.items() if v.requires_grad}, **params}
    if not (isinstance(out, torch.Tensor) and out.requires_grad):
        return out, dict.fromkeys(wrt)
    backward = lambda: torch.autograd.grad(out, list(wrt.values()), cotangent(out),  # noqa: E731
                                           allow_unused=True)
    grads = _call(part, f"the backward of {what}", lambda: backward(), {}) if part else backward()
    return out, dict(zip(wrt, grads))


def fixed_cotangent(seed=0):
    def make(out):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(out.shape, generator=g, dtype=torch.float64).to(out)
    return make


def unchanged(part, what, fn, inputs):
    """The part does not write into its inputs: each one, after a call without gradients, is as
    it was."""
    copies = {k: v.detach().clone() for k, v in inputs.items()}
    with torch.no_grad():
        _call(part, what, fn, copies)
    for name, before in inputs.items():
        after, before = copies[name], before.detach()
        same = (after == before) | (after.isnan() & before.isnan()) if after.is_floating_point() \
            else after == before
        if not same.all():
            bad = (~same).nonzero()[0]
            i = tuple(int(x) for x in bad)
            check(part, False, f"{what} changed its input {name} in place (at index {i}, from "
                  f"{before[i].item():.6g} to {after[i].item():.6g}): it must leave its inputs "
                  f"as they were and compute a new tensor")


def same_as_formula(part, what, part_fn, formula, inputs, params=None, mistakes=None,
                    axes=None, regions=None, grad_axes=None, atol=ATOL, rtol=RTOL, seed=0,
                    rng_seed=None):
    """The module docstring. inputs: {name: tensor}; the floating ones get gradients. params:
    {name: parameter} the part and the formula share. mistakes: {what the student did: a
    function of the inputs (as the formula) computing it}. axes, regions: of the output
    (describe()); grad_axes: {input name: its axes}. rng_seed: each call starts from it (the same
    dropout masks for part and formula)."""
    params = params or {}
    cot = fixed_cotangent(seed)

    def seeded(fn):
        if rng_seed is None:
            return fn

        def call(**kw):
            torch.manual_seed(rng_seed)
            return fn(**kw)
        return call
    with torch.random.fork_rng():
        unchanged(part, what, seeded(part_fn), inputs)
        got, got_grads = run(seeded(part_fn), inputs, params, cot, part, what)
        want, want_grads = run(seeded(formula), inputs, params, cot)
        quantities = [(f"{what}: the output", got, want, axes, regions)]
        for name in want_grads:
            quantities.append((f"{what}: the gradient of {name}", got_grads.get(name),
                               want_grads[name], (grad_axes or {}).get(name), None))
        for quantity, g, w, ax, reg in quantities:
            if g is None and (w is None or not w.abs().max()):
                continue  # no gradient, and none due
            if g is None:
                off = (f"{quantity} is None: no gradient reaches it (nothing connects it to the "
                       f"output in autograd's graph); the formula's is up to "
                       f"{w.abs().max().item():.3g} in size")
            else:
                off = describe(g, torch.zeros_like(g) if w is None else w, quantity, ax, reg,
                               atol, rtol)
            if off is None:
                continue
            named = [m for m, fn in (mistakes or {}).items()
                     if _matches(seeded(fn), inputs, params, cot, got, got_grads, atol, rtol)]
            if named:  # what is off, then the cause checked: no value check's phrase
                check(part, False, f"{off.replace(VALUE_ONLY, ' is off')}; the output and every "
                      f"gradient are those of the formula with {' or with '.join(named)}")
            check(part, False, off)


def readings_that_fit(part, what, part_fn, formula, readings, inputs, params=None,
                      rng_seed=None, atol=ATOL, rtol=RTOL, seed=0):
    """The readings ({what the part then computes: a function of the inputs, as the formula})
    whose output and gradients the part's equal, where the formula's they do not: [] when the
    part is the formula, or no reading fits. A part's earlier tests call it first, so that a
    mistake one reading is checked to be is named before a test of one property sees it."""
    params, cot = params or {}, fixed_cotangent(seed)

    def seeded(fn):
        def call(**kw):
            if rng_seed is not None:
                torch.manual_seed(rng_seed)
            return fn(**kw)
        return call
    with torch.random.fork_rng():
        try:
            got, got_grads = run(seeded(part_fn), inputs, params, cot)
        except Exception:
            return []  # the tests that follow say what raised
        if _matches(seeded(formula), inputs, params, cot, got, got_grads, atol, rtol):
            return []
        return [m for m, fn in readings.items()
                if _matches(seeded(fn), inputs, params, cot, got, got_grads, atol, rtol)]


def _matches(fn, inputs, params, cot, got, got_grads, atol, rtol):
    """Whether the part's output and gradients are those of fn."""
    try:
        out, grads = run(fn, inputs, params, cot)
    except Exception:
        return False
    if not _close(got, out, atol, rtol):
        return False
    for name, g in grads.items():
        mine = got_grads.get(name)
        g = torch.zeros_like(mine) if g is None and mine is not None else g
        mine = torch.zeros_like(g) if mine is None and g is not None else mine
        if g is not None and not _close(mine, g, atol, rtol):
            return False
    return True
