"""The autograder's helpers: every failure names the part (minknn/assignment/parts.py, PARTS) and what
is off, never only a tensor dump.

    close("attention", actual, expected, "the output for an unpadded batch")
        -> part 2 attention: the output for an unpadded batch differs from the expected value
           (Mismatched elements: 3 / 96, greatest absolute difference 0.12 at index (0, 1, 4) ...)
    check("pooling", ok, "max pooling must ignore padding; got 0.0 at example 1, dim 3")
    graded("knn", "Datastore.vote", datastore.vote, scores, rows, "cosine", None)
        -> part 18 knn: Datastore.vote raised IndexError: ... (an error in the part's code)
    matches_reference("attention", "padded", out)   the sanity check against the stored outputs
    as_mix(mixed, logits, proxies) -> (0.7, 0.3, 0.0): a mix read back as 0.7 logits + 0.3 proxies
    differs("supcon", "the loss on the 'mixed' batch", "supcon_oracle's", ": got 0.2, expected 0.3")
        -> part 8 supcon: the loss on the 'mixed' batch differs from supcon_oracle's: got 0.2, ...

Two kinds of failure. A property check (check()) says what is wrong and how to fix it: "padded
keys must get weight 0 (add the mask to the scores, before the softmax)". A value check (close(),
matches_reference(), differs(): against an oracle, an expected value or a stored output) says only
that a number is off; each part's tests run their property checks first. Every value check's
message, and no other, reads "WHAT differs from WHERE" (GENERIC): tests/mutate.py counts the
mutations caught with it as caught generically.

Stored references: tests/fixtures/references/<part>.pt, a dict of named tensors the solution
computed on fixed inputs (as minBERT's sanity_check.py). After a deliberate change to what a part
computes, rewrite them by running the part's test command (minknn/assignment/parts.py) with
    MINKNN_WRITE_REFERENCES=1 python -m pytest -q tests/test_<file>.py
(a loss's: tests/losses/test_<loss>.py; the training part's: tests/test_training_step.py) and say
why in the commit.
"""
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
    """assert_close with a message naming the part and the quantity, and on its first line the
    largest difference, where and by how much; torch's own report follows it."""
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{label(part)}: {what}{GENERIC}"
                               f"the expected value{largest_difference(actual, expected)}\n{m}",
                               **tolerances)


def largest_difference(actual, expected):
    """': at index (0, 1) got 0.5, expected 0.4' for the element furthest from its expected
    value; '' when the two cannot be compared element by element."""
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
            and actual.shape == expected.shape and actual.numel()):
        return ""
    a, b = actual.detach().double().cpu(), expected.detach().double().cpu()
    gap = (a - b).abs().nan_to_num(float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    return f": at index {index} got {a[index].item():.6g}, expected {b[index].item():.6g}"


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


def graded(part, what, fn, *args, **kwargs):
    """fn(*args, **kwargs), the part's code: an exception in it fails naming the part, rather than
    as a bare traceback. The student edition's stub (NotImplementedError) names its part already
    and goes through."""
    try:
        return fn(*args, **kwargs)
    except (NotImplementedError, DeviceSlip):  # the stub names its part; a slip says it whole
        raise
    except Exception as e:
        raise AssertionError(f"{label(part)}: {what} raised {type(e).__name__}: {e}") from e


def first_difference(actual, expected, atol=1e-5, rtol=1e-4):
    """(index, actual value, expected value) of the first element out of tolerance, or None."""
    bad = ~torch.isclose(actual.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=True)
    if not bad.any():
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    return index, actual[index].item(), expected[index].item()


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
    diff = first_difference(actual, expected, atol, rtol)
    if diff is not None:
        index, got, want = diff
        differs(part, f"sanity check '{name}'", "the stored reference output",
                f" ({os.path.relpath(path)}): at index {index} got {got:.6g}, expected {want:.6g}")
