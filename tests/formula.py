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

describe() (tests/grading.py, the one describer every value check uses) reads the difference as a
whole before falling back to its elements: a shape or dtype, values that are not finite, zeros, a
constant factor (the sign) or offset, a transposition, a shift by one position, a difference
confined to the diagonal, to named regions ("only at padding positions") or to some indices of an
axis ("only at example 1"). What it can say of no such pattern is a value check, worded with
tests/grading.py's GENERIC phrase (the mutation score counts it as such), with how many elements
differ, the first and the largest.
"""
import torch

from grading import GENERIC, _close, check, describe
from elsewhere import DeviceSlip
from minknn.assignment.parts import label

ATOL, RTOL = 1e-6, 1e-5
VALUE_ONLY = f"{GENERIC}the formula's"  # how describe() words a difference it reads no more in


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
