"""The autograder's helpers: every failure names the part (minknn/assignment/parts.py, PARTS) and what
is off, never only a tensor dump.

    close("attention", actual, expected, "the output for an unpadded batch")
        -> part 2 attention: the output for an unpadded batch is off at 12 of its 96 elements,
           only at the padding positions (first at index (1, 0, 5): got 0.3, expected 0.1; ...)
    check("pooling", ok, "max pooling must ignore padding; got 0.0 at example 1, dim 3")
    graded("knn", "Datastore.vote", datastore.vote, scores, rows, "cosine", None)
        -> part 18 knn: Datastore.vote raised IndexError: ... (an error in the part's code)
        -> part 18 knn: Datastore.vote changed its input in place: scores at index (0, 2), ...
    matches_reference("attention", "padded", out)   the sanity check against the stored outputs
    describe(got, want, "the gradient of z")        how two tensors differ, in words, or None
    as_mix(mixed, logits, proxies) -> (0.7, 0.3, 0.0): a mix read back as 0.7 logits + 0.3 proxies
    differs("supcon", "the loss on the 'mixed' batch", "supcon_oracle's", ": got 0.2, expected 0.3")
        -> part 8 supcon: the loss on the 'mixed' batch differs from supcon_oracle's: got 0.2, ...

Two kinds of failure. A property check (check()) says what is wrong and how to fix it: "padded
keys must get weight 0 (add the mask to the scores, before the softmax)". A value check (close(),
matches_reference(), differs(): against an oracle, an expected value or a stored output) says what
it observes and names no cause: describe() says where and how the two differ (how many elements
and the first, and the pattern where one holds: a constant factor or offset, the sign, a
transpose, a shift by one position, the diagonal, a region such as the padding, one row or
column, a shape or dtype). Where it finds no pattern, and in differs(), the message reads "WHAT
differs from WHERE" (GENERIC), the phrase no other message uses: tests/mutate.py counts the
mutations caught with it as caught generically. A part's function that changes a tensor it was
given fails as that (graded(): InPlace), before any value read from the tensor afterwards could
suggest another cause.

Stored references: tests/fixtures/references/<part>.pt, a dict of named tensors the solution
computed on fixed inputs (as minBERT's sanity_check.py). After a deliberate change to what a part
computes, rewrite them by running the part's test command (minknn/assignment/parts.py) with
    MINKNN_WRITE_REFERENCES=1 python -m pytest -q tests/test_<file>.py
(a loss's: tests/losses/test_<loss>.py; the training part's: tests/test_training_step.py) and say
why in the commit.
"""
import inspect
import math
import os

import torch

from elsewhere import DeviceSlip
from minknn.assignment.parts import label

REFERENCES = os.path.join(os.path.dirname(__file__), "fixtures", "references")
GENERIC = " differs from "  # in a value check's message only (the property checks say more)

# How far a part's output may be from its stored reference. The references were computed on one
# CPU by the solution; the student's code runs on another CPU's kernels (MKL's and oneDNN's paths
# for it, the vector width, the thread count), which sum in another order, and in its own order of
# operations. In float32 both move an output by a few times 1e-7 of its size. FLOAT32, minBERT's
# sanity_check.py's tolerance, leaves room for that: under `pytest --kernels` one-thread,
# no-mkldnn and avx2 (tests/kernels.py) the largest difference any float32 reference saw was 1.4%
# of it (the layer's, tests/test_bert.py). The losses' references are float64, where another
# order moves a sum by about 1e-16 of it: FLOAT64 is a hundred times tighter and still far above
# that (the largest seen: 2e-8 of it).
FLOAT32 = dict(atol=1e-5, rtol=1e-3)
FLOAT64 = dict(atol=1e-8, rtol=1e-6)


def close(part, actual, expected, what, **tolerances):
    """assert_close, failing with a message naming the part and the quantity and, on its first
    line, how the two differ (describe(): where, how many elements, the pattern where one holds);
    torch's own report follows it."""
    try:
        torch.testing.assert_close(actual, expected, **tolerances)
    except AssertionError as e:
        off = None
        if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
            atol, rtol = DEFAULT_TOLERANCES.get(expected.dtype, (1e-5, 1.3e-6))
            off = describe(actual, expected, what, atol=tolerances.get("atol", atol),
                           rtol=tolerances.get("rtol", rtol), reference="the expected value",
                           dtype=tolerances.get("check_dtype", True))
        raise AssertionError(f"{label(part)}: {off or what + GENERIC + 'the expected value'}\n"
                             f"{e}") from None


# torch.testing.assert_close's tolerances by dtype, where a call gives none (its documentation)
DEFAULT_TOLERANCES = {torch.float16: (1e-5, 1e-3), torch.bfloat16: (1e-5, 1.6e-2),
                      torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7)}


# ---- the describer: how two tensors differ, in words (every value check's message) ----

ATOL, RTOL = 1e-6, 1e-5


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


def simple_factor(ratio):
    """'2 times', '1/3 of', 'minus' for a ratio that is a whole number up to 64, its inverse or
    -1 (within 1e-6); None for any other."""
    for n in range(2, 65):
        for c, say in ((n, f"{n} times"), (1 / n, f"1/{n} of"), (-n, f"-{n} times"),
                       (-1 / n, f"-1/{n} of")):
            if abs(ratio - c) < 1e-6 * max(1.0, abs(c)):
                return say
    return "minus" if abs(ratio + 1) < 1e-6 else None


def _shifted(a, b, atol, rtol, axes):
    """' shifted by one position along AXIS (...)' when a is b moved one place along an axis (on
    the positions both cover), else ''."""
    for d in range(a.dim()):
        n = a.shape[d]
        if n < 3:
            continue
        for step, said in ((1, "i - 1"), (-1, "i + 1")):
            got = a.narrow(d, 1, n - 1) if step == 1 else a.narrow(d, 0, n - 1)
            want = b.narrow(d, 0, n - 1) if step == 1 else b.narrow(d, 1, n - 1)
            if torch.allclose(got, want, atol=atol, rtol=rtol) and not torch.allclose(
                    got, a.narrow(d, 0, n - 1) if step == 1 else a.narrow(d, 1, n - 1),
                    atol=atol, rtol=rtol):
                axis = axes[d] if axes and len(axes) == a.dim() else f"dimension {d}"
                return f" shifted by one position along {axis} (its element i is the expected {said})"
    return ""


def describe(got, want, what, axes=None, regions=None, atol=ATOL, rtol=RTOL,
             reference="the formula's", dtype=False):
    """None when got equals want (the reference's value: the formula's, the expected, the stored
    one); else one line saying how `what` is off: an observation, never a cause. In this order:
    its type, shape (a transposed one said so) or, with dtype=True, dtype; values not finite
    where the reference's are; then how many elements differ and the first, and the pattern of
    the difference where one holds: 0 everywhere, a constant factor (the sign, -1), a constant
    offset, a transpose, a shift by one position along an axis; confined to the diagonal or off
    it, to a region (regions: a name -> a boolean mask of where it lies: "at the padding
    positions") or its outside, or to some indices of one axis (axes names the dimensions:
    "only at example 1"); there, 0, of the opposite sign or a constant factor of the reference's.
    A difference in no such pattern is worded as a value check (GENERIC), with its count, its
    first element and its largest."""
    def value_only():
        return f"{GENERIC}{reference}"
    if not isinstance(got, torch.Tensor):
        return f"{what} is a {type(got).__name__}, not a tensor of shape {tuple(want.shape)}"
    if got.shape != want.shape:
        out = f"{what} has shape {tuple(got.shape)}; {reference} has shape {tuple(want.shape)}"
        if got.dim() >= 2 and got.transpose(-2, -1).shape == want.shape and _close(
                got.transpose(-2, -1), want, atol, rtol):
            out += ", and its values are those with the last two dimensions swapped"
        return out
    if dtype and got.dtype != want.dtype:
        right = " (its values are right)" if _close(got, want, atol, rtol) else ""
        return f"{what} has dtype {got.dtype}; {reference} has {want.dtype}{right}"
    a, b = _f64(got), _f64(want)
    if torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True):
        return None
    bad = ~torch.isclose(a, b, atol=atol, rtol=rtol, equal_nan=True)
    n, total = int(bad.sum()), bad.numel()
    first = tuple(int(i) for i in bad.nonzero()[0])
    if total == 1:
        x, y = a.flatten()[0].item(), b.flatten()[0].item()
        factor = simple_factor(x / y) if y and math.isfinite(x) else None
        if factor:
            return f"{what} is {factor} {reference}: got {x:.6g}, expected {y:.6g}"
        return f"{what}{value_only()}: got {x:.6g}, expected {y:.6g}"
    if not torch.isfinite(a).all() and torch.isfinite(b).all():
        wrong = ~torch.isfinite(a)
        at = tuple(int(i) for i in wrong.nonzero()[0])
        return (f"{what} is not finite at {int(wrong.sum())} of its {total} elements (first "
                f"{a[at].item()} at {_at(at, axes)}); {reference} is finite everywhere")
    if (a == 0).all():
        return f"{what} is 0 everywhere; {reference} is not (up to {b.abs().max().item():.3g})"
    first_said = (f"first at {_at(first, axes)}: got {a[first].item():.6g}, expected "
                  f"{b[first].item():.6g}")
    if b.abs().max() > 0:
        scale = ((a * b).sum() / (b * b).sum()).item()
        if abs(scale - 1) > 1e-3 and torch.allclose(a, scale * b, atol=atol, rtol=rtol):
            said = ("with its sign flipped (minus it)" if abs(scale + 1) < 1e-3
                    else f"times {scale:.6g}")
            return (f"{what} is {reference} {said}, at every element ({n} of {total} differ; "
                    f"{first_said})")
        shift = (a - b).mean()
        if torch.allclose(a, b + shift, atol=atol, rtol=rtol):
            return (f"{what} is {reference} plus {shift.item():.6g}, at every element ({n} of "
                    f"{total} differ; {first_said})")
    if a.dim() >= 2 and a.shape[-1] == a.shape[-2] and torch.allclose(
            a, b.transpose(-2, -1), atol=atol, rtol=rtol):
        return f"{what} is {reference} with its last two dimensions swapped (transposed)"
    shifted = _shifted(a, b, atol, rtol, axes)
    if shifted:
        return f"{what} is {reference}{shifted} ({n} of its {total} elements differ; {first_said})"
    where = ""
    masks = dict(regions or {})
    if a.dim() >= 2 and a.shape[-1] == a.shape[-2] > 1:
        masks["on the diagonal"] = torch.eye(a.shape[-1], dtype=torch.bool)
    for region, mask in masks.items():
        mask = mask.expand(bad.shape) if mask.shape != bad.shape else mask
        if (bad & ~mask).sum() == 0:
            where = f", only {region}"
            break
        if (bad & mask).sum() == 0:
            where = ", only off the diagonal" if region == "on the diagonal" else \
                f", only outside {region}"
            break
    if not where and axes and len(axes) == a.dim():
        live = (a != 0) | (b != 0)  # an index where both are 0 throughout tells nothing apart
        for d, axis in enumerate(axes):
            rows = sorted({int(i) for i in bad.nonzero()[:, d]})
            active = int(live.transpose(0, d).reshape(a.shape[d], -1).any(1).sum())
            if len(rows) < active and a.shape[d] > 1:
                where = f", only at {axis} {_numbers(rows)} (of 0 to {a.shape[d] - 1})"
                break
    gap = (a - b).abs().nan_to_num(math.inf)
    worst = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    there = ""
    if (a[bad] == 0).all():
        there = f"; there it is 0 and {reference} is not"
    elif torch.allclose(a[bad], -b[bad], atol=atol, rtol=rtol):
        there = f"; there it has the opposite sign of {reference}"
    elif (b[bad] != 0).all():
        r = a[bad] / b[bad]
        if torch.allclose(r, r[0].expand_as(r), atol=1e-6, rtol=1e-6):
            there = f"; there it is {r[0].item():.6g} times {reference}"
    detail = (f" at {n} of its {total} elements{where} ({first_said}; the largest by "
              f"{gap.max().item():.3g}, at {_at(worst, axes)}){there}")
    if where or there:  # a difference confined somewhere, or of one kind, is an observation
        return f"{what} is off{detail}"
    return f"{what}{value_only()}{detail}"


def diagnose(part, actual, expected, what, mistakes, atol=1e-5, rtol=1e-4):
    """A value check that names a cause only where it checked it: passes when `actual` equals
    `expected`; else names the first of `mistakes` ({what the student did: the value that mistake
    gives}, each recomputed by the test) whose value `actual` equals; else fails as close() does,
    saying what differs, where and by how much (GENERIC), and guessing no cause.
        diagnose("supcon", got, want, "the loss on two equal examples and one opposite",
                 {"the scores are multiplied by tau, not divided": oracle(1 / tau)})
        -> part 8 supcon: the loss on ...: got 4.2, expected 0.0013: the scores are multiplied..."""
    def tensor(x):
        return x.detach().double().cpu() if torch.is_tensor(x) else torch.tensor(float(x),
                                                                                  dtype=torch.float64)
    a, b = tensor(actual), tensor(expected)
    if a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=rtol):
        return
    values = f": got {a.item():.6g}, expected {b.item():.6g}" if a.numel() == 1 == b.numel() else ""
    for mistake, value in mistakes.items():
        wrong = tensor(value)
        if a.shape == wrong.shape and torch.allclose(a, wrong, atol=atol, rtol=rtol):
            check(part, False, f"{what}{values}: {mistake}")
    close(part, a, b, what, atol=atol, rtol=rtol)


def check(part, ok, message):
    """assert ok, with the part's label before the message."""
    if not ok:
        raise AssertionError(f"{label(part)}: {message}")


def differs(part, what, reference, detail=""):
    """Fail with a value check's message: `what` differs from `reference` (an oracle's value, the
    expected one), then the detail (the two values)."""
    raise AssertionError(f"{label(part)}: {what}{GENERIC}{reference}{detail}")


def as_mix(mixed, first, second):
    """(a, b, off): `mixed` read back as a * first + b * second by least squares, off the largest
    difference left. A mix's weights by name ("it is 0.3 P + 0.7 KNN"), not only that it differs."""
    basis = torch.stack([first.flatten(), second.flatten()], 1).double()
    target = mixed.detach().flatten().double()[:, None]
    weights = torch.linalg.lstsq(basis, target).solution
    off = (basis @ weights - target).abs().max().item()
    a, b = (round(w.item(), 6) + 0.0 for w in weights)  # + 0.0: no -0 in a message
    return a, b, off


def named(value, symbols, tol=1e-6):
    """The one name in symbols ({"phi": 0.3, "1 - phi": 0.7, "1": 1.0, "0": 0.0}) whose value
    `value` equals, or None (none, or two: the test picks values at which they differ). A
    weight read back (as_mix) said in the formula's symbols: "phi P + (1 - phi) KNN"."""
    names = [n for n, v in symbols.items() if abs(value - v) <= tol]
    return names[0] if len(names) == 1 else None


def as_formula(weights, symbols, terms):
    """'phi P + (1 - phi) KNN': weights read back (as_mix) said in the formula's symbols, each
    weight named by named(); None where one has no single name."""
    names = [named(w, symbols) for w in weights]
    if None in names:
        return None
    return " + ".join(f"({n}) {t}" if " " in n else f"{n} {t}" for n, t in zip(names, terms))


class InPlace(AssertionError):
    """A part's function wrote into a tensor it was given: every value read from that tensor
    afterwards (the test's own readings of the result among them) is the part's, not the input's."""


def kept(named):
    """[(name, tensor, a copy)] of the tensors among a call's arguments (named: [(name, value)]),
    at the top and one level into a list, tuple or dict, for changed_in_place after the call."""
    found = []
    for name, value in named:
        if isinstance(value, dict):
            found += [(f"{name}['{k}']", v) for k, v in value.items() if torch.is_tensor(v)]
        elif isinstance(value, (list, tuple)):
            found += [(f"{name}[{i}]", v) for i, v in enumerate(value) if torch.is_tensor(v)]
        elif torch.is_tensor(value):
            found.append((name, value))
    return [(name, t, t.detach().clone()) for name, t in found]


def changed_in_place(copies):
    """'z at index (0, 3), from 0.5 to 0 (12 of its 48 elements changed)' for the first of kept()'s
    tensors the call changed, or None."""
    for name, tensor, before in copies:
        after = tensor.detach()
        if after.shape != before.shape or after.dtype != before.dtype:
            return (f"{name}, from shape {tuple(before.shape)} {before.dtype} to "
                    f"{tuple(after.shape)} {after.dtype}")
        same = after == before
        if after.is_floating_point() or after.is_complex():
            same |= after.isnan() & before.isnan()
        if not same.all():
            i = tuple(int(x) for x in (~same).nonzero()[0])
            return (f"{name} at index {i}, from {before[i].item():.6g} to {after[i].item():.6g} "
                    f"({int((~same).sum())} of its {same.numel()} elements changed)")
    return None


def argument_names(fn, n):
    """The names of fn's first n arguments (z, labels, ...), from its signature (a module's:
    its forward's)."""
    try:
        names = list(inspect.signature(fn.forward if isinstance(fn, torch.nn.Module)
                                       else fn).parameters)
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"argument {i + 1}" for i in range(n)]


def fail_if_changed(copies, prefix, what):
    """Fails (InPlace) where a call changed one of kept()'s tensors: 'PREFIX: WHAT changed its
    input in place: ...' (prefix: the part's label, or a loss outside the parts' name)."""
    changed = changed_in_place(copies)
    if changed:
        raise InPlace(f"{prefix}: {what} changed its input in place: {changed}; it must leave its "
                      f"inputs as they were and compute new tensors (the values read after it are "
                      f"not the input's)")


def graded(part, what, fn, *args, **kwargs):
    """fn(*args, **kwargs), the part's code: an exception in it fails naming the part, rather than
    as a bare traceback; so does a call that changed a tensor it was given (InPlace), before any
    value computed from it is read. The student edition's stub (NotImplementedError) names its
    part already and goes through."""
    copies = kept([*zip(argument_names(fn, len(args)), args), *kwargs.items()])
    try:
        result = fn(*args, **kwargs)
    except (NotImplementedError, DeviceSlip):  # the stub names its part; a slip says it whole
        raise
    except Exception as e:
        raise AssertionError(f"{label(part)}: {what} raised {type(e).__name__}: {e}") from e
    fail_if_changed(copies, label(part), what)
    return result


def matches_reference(part, name, actual, atol=FLOAT32["atol"], rtol=FLOAT32["rtol"]):
    """The sanity check: `actual` equals the stored reference output `name` of this part, within
    FLOAT32 (a float64 output: FLOAT64, or tolerances of its own)."""
    path = os.path.join(REFERENCES, f"{part}.pt")
    actual = actual.detach().cpu()
    if os.environ.get("MINKNN_WRITE_REFERENCES") == "1":
        stored = torch.load(path) if os.path.exists(path) else {}
        stored[name] = actual.clone()
        os.makedirs(REFERENCES, exist_ok=True)
        torch.save(stored, path + ".tmp")
        os.replace(path + ".tmp", path)
        return
    check(part, os.path.exists(path), f"no stored reference outputs: {os.path.relpath(path)} is "
          f"missing (tests/grading.py says how to write them)")
    stored = torch.load(path)
    check(part, name in stored, f"no stored reference '{name}' in {path}; write it with "
          f"MINKNN_WRITE_REFERENCES=1 (tests/grading.py)")
    expected = stored[name]
    check(part, actual.shape == expected.shape, f"sanity check '{name}': shape "
          f"{tuple(actual.shape)}, the reference output's is {tuple(expected.shape)}")
    off = describe(actual, expected, f"sanity check '{name}'", atol=atol, rtol=rtol,
                   reference=f"the stored reference output ({os.path.relpath(path)})")
    check(part, off is None, off)
