"""A second device on a machine without a GPU, so that a tensor a part makes without `device=`
fails here as it fails on a GPU.

On a GPU, `torch.arange(n)` inside a part makes a CPU tensor, and the first operation that meets
it with the part's inputs (on the GPU) raises "Expected all tensors to be on the same device".
On the CPU, where every part's command runs, both are on the CPU and nothing fails. So the tests
run each part once more with its inputs, and its module's parameters, on a device of their own:

    with second_device():                      # inside it, ELSEWHERE is a device like any other
        z = to_second(z)                       # or: to_second(module), moving its parameters
        loss = part(z, labels)                 # DeviceSlip here, naming the line at fault
    loss.device == ELSEWHERE; on_cpu(loss) is its value, the same number the CPU gives

A tensor on ELSEWHERE (an `Elsewhere`) holds its values on the CPU and computes there, so every
check of a value still runs; it reports torch.device("meta") as its device. Inside
second_device() every operation, autograd's backward included, goes through one
TorchDispatchMode (`_Mode`), which applies CUDA's rule before computing: an operation may not mix
tensors of the two devices, except that a CPU tensor of 0 dimensions (a number) may join one, as
on a GPU, and that an index may stay on the CPU (x[i] and x[i] = v move it, on a GPU too; a CPU
tensor indexed by one on the device may not). `torch.zeros(n, device=z.device)`,
`z.new_zeros(n)`, `torch.zeros_like(z)` and `.to(z.device)` all make tensors on ELSEWHERE (run on
the CPU, the result moved). One that breaks the rule raises DeviceSlip, which says which tensor
was made on the CPU (the line of minknn's code that made it, followed through the operations that
derived the tensor the slip met) and where it met the inputs. `.tolist()`, `.item()` and
`.cpu()` copy to the CPU, as on a GPU; `.numpy()` is a slip, as on a GPU.

torch.device("meta") because PyTorch knows it on every machine (its device guard, its kernels'
checks), yet nothing here ever allocates on it. What it cannot do: fused optimisers and CUDA's own
kernels refuse it, so a part's test builds a plain optimiser and leaves `--attention packed` out.
"""
import copy
import linecache
import os
import sys
import threading

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ELSEWHERE = torch.device("meta")
CODE = (os.path.join(ROOT, "minknn") + os.sep, os.path.join(ROOT, "train.py"))  # the parts' files
aten = torch.ops.aten
# operations whose index arguments may stay on the CPU, as CUDA allows (x[i], x[i] = v)
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default,
            aten._index_put_impl_.default}
# operations that move a tensor between devices: a CPU source is what they are for
MOVES = {aten.copy_.default, aten._to_copy.default, aten._copy_from.default,
         aten._copy_from_and_resize.default}


class DeviceSlip(AssertionError):
    """A tensor on the CPU met tensors on the part's device: on a GPU, the same error."""


_state = threading.local()  # made: WeakIdKeyDictionary of CPU tensors -> where minknn made them


def _made():
    return getattr(_state, "made", None)


def where_in_code():
    """'minknn/losses/supcon.py:37: `self_mask = torch.eye(...)`': the innermost frame of the
    parts' code on the stack now, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(CODE[0]) or path == CODE[1]:
            line = linecache.getline(path, frame.f_lineno).strip()
            return f"{os.path.relpath(path, ROOT)}:{frame.f_lineno}: `{line}`"
        frame = frame.f_back
    return None


class Elsewhere(torch.Tensor):
    """A CPU tensor that says it is on ELSEWHERE; see the module docstring."""

    @staticmethod
    def __new__(cls, inner):
        assert type(inner) is torch.Tensor and inner.device.type == "cpu", inner.device
        t = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, layout=inner.layout, device=ELSEWHERE,
            requires_grad=inner.requires_grad)
        t.inner = inner
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"Elsewhere({self.inner!r})"

    def tolist(self):  # a GPU tensor's .tolist() copies it to the host, as here
        return self.inner.tolist()

    def numpy(self, *args, **kwargs):  # a GPU tensor's does not
        raise DeviceSlip(f"numpy() of a tensor on the inputs' device (at {where_in_code()}): on "
                         f"a GPU this raises 'can't convert cuda:0 device type tensor to numpy'; "
                         f"call .cpu() first")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _compute(func, args, kwargs or {})


def _is_it(device):
    return device is not None and torch.device(device) == ELSEWHERE


def _compute(func, args, kwargs):
    """One operation: CUDA's rule checked, then computed on the CPU, its tensors moved to
    ELSEWHERE where it made them there (device=ELSEWHERE, or an input on ELSEWHERE)."""
    flat, _ = tree_flatten((args, kwargs))
    if any(type(t) is torch.Tensor and t.device == ELSEWHERE for t in flat):  # no values in it
        raise RuntimeError(f"tests/elsewhere.py: a tensor on {ELSEWHERE} without values reached "
                           f"{func}: it was made out of _Mode's sight (add its maker to _Data)")
    there = any(isinstance(t, Elsewhere) for t in flat) or _is_it(kwargs.get("device"))
    if _is_it(kwargs.get("device")):  # torch.zeros(n, device=z.device), .to(z.device)
        kwargs = {**kwargs, "device": torch.device("cpu")}
    elif func in MOVES and kwargs.get("device") is not None:  # .cpu(), .to("cpu")
        there = False
    if any(isinstance(t, Elsewhere) for t in flat):
        _check_devices(func, args, kwargs)
    wrappers = {}

    def unwrap(x):
        if isinstance(x, Elsewhere):
            wrappers[id(x.inner)] = x
            return x.inner
        return x
    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if there:
        def wrap(x):  # an in-place operation returns its input: the same wrapper
            if type(x) is not torch.Tensor:
                return x
            return wrappers[id(x)] if id(x) in wrappers else Elsewhere(x)
        return tree_map(wrap, out)
    made = _made()
    if made is not None:  # a CPU tensor made from CPU tensors: where minknn made the first
        source = next((made[t] for t in flat if type(t) is torch.Tensor and t in made), None)
        for t in tree_flatten(out)[0]:
            if type(t) is torch.Tensor and t.dim() > 0:
                made[t] = source or where_in_code() or "outside minknn's code"
    return out


def _check_devices(func, args, kwargs):
    """CUDA's rule on the tensors of one operation (the module docstring)."""
    if func in MOVES:
        return
    flat, _ = tree_flatten((args, kwargs))
    if func in INDEXING:  # the indexed tensor (and the values put) must be on the device
        flat, _ = tree_flatten((args[:1], args[2:], kwargs))
    for t in flat:
        if type(t) is torch.Tensor and t.dim() > 0:
            raise DeviceSlip(slip_message(t, func))


def slip_message(t, func):
    made = (_made() or {}).get(t)
    used = where_in_code()
    dtype = str(t.dtype).removeprefix('torch.')
    what = f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} tensor of shape {tuple(t.shape)}"
    return (f"{what} made on the CPU"
            + (f" (at {made})" if made else "") + f" met tensors on the inputs' device in "
            f"{func.overloadpacket.__name__}" + (f" (at {used})" if used and used != made else "")
            + ": on a GPU this raises 'Expected all tensors to be on the same device'; make it "
            "on its inputs' device (device=x.device for an input x, x.new_zeros, "
            "torch.zeros_like, .to(x.device))")


class _Data(TorchFunctionMode):
    """torch.tensor(data, device=z.device) and its kin copy Python data to the device below the
    dispatcher, out of _Mode's sight (a meta tensor without values would come out): they are run
    on the CPU here, their result moved."""
    FUNCTIONS = (torch.tensor, torch.as_tensor, torch.Tensor.new_tensor, torch.asarray)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func in self.FUNCTIONS and device is not None and torch.device(device) == ELSEWHERE:
            return Elsewhere(func(*args, **{**kwargs, "device": "cpu"}))
        if func is torch.Tensor.new_tensor and isinstance(args[0], Elsewhere) and device is None:
            return Elsewhere(func(args[0].inner, *args[1:], **kwargs))
        return func(*args, **kwargs)


class _Mode(TorchDispatchMode):
    """Every operation inside second_device(): factories that name ELSEWHERE included, and the
    ones autograd's backward makes (at::zeros(grad.options()))."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _compute(func, args, kwargs or {})


class second_device:
    """The context inside which ELSEWHERE works (the module docstring)."""

    def __enter__(self):
        self.previous = _made()
        _state.made = WeakIdKeyDictionary()
        self.modes = (_Data(), _Mode())
        for mode in self.modes:
            mode.__enter__()
        return ELSEWHERE

    def __exit__(self, *exc):
        for mode in reversed(self.modes):
            mode.__exit__(*exc)
        _state.made = self.previous
        return False


def to_second(x):
    """A tensor (its copy), or a module (moved in place: every parameter and buffer), on
    ELSEWHERE; a parameter stays a parameter, requires_grad as it was."""
    if isinstance(x, torch.nn.Module):
        for module in x.modules():
            for name, p in module._parameters.items():
                if p is not None and not isinstance(p, Elsewhere):
                    module._parameters[name] = torch.nn.Parameter(
                        Elsewhere(p.detach().clone()), requires_grad=p.requires_grad)
            for name, b in module._buffers.items():
                if b is not None and not isinstance(b, Elsewhere):
                    module._buffers[name] = Elsewhere(b.detach().clone())
        return x
    if isinstance(x, Elsewhere):
        return x
    return Elsewhere(x.detach().clone()).requires_grad_(x.requires_grad)


def on_cpu(x):
    """The CPU tensor (a copy) behind a tensor on ELSEWHERE; other values as they are."""
    if isinstance(x, Elsewhere):
        return x.inner.detach().clone()
    return x


def check_on_second_device(part, what, fn, inputs, module=None, backward=True):
    """The part runs on a device other than the CPU: fn(module, **inputs) with every input and
    every parameter of `module` (a copy) on ELSEWHERE makes no tensor on the CPU that meets them
    (DeviceSlip, named), and gives the CPU's output; with backward, the CPU's gradients too (of
    the floating inputs, and of the module's parameters)."""
    from grading import check  # here, so that elsewhere.py alone needs no test helpers

    def one(move):
        m = copy.deepcopy(module) if module is not None else None
        xs = {k: v.detach().clone() for k, v in inputs.items()}
        if move:
            m = to_second(m) if m is not None else None
            xs = {k: to_second(v) for k, v in xs.items()}
        xs = {k: v.requires_grad_(backward and v.is_floating_point()) for k, v in xs.items()}
        with torch.random.fork_rng():
            torch.manual_seed(0)
            out = fn(m, **xs)
            grads = {}
            if backward and isinstance(out, torch.Tensor) and out.requires_grad:
                g = torch.Generator().manual_seed(0)
                cot = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
                out.backward(to_second(cot) if move else cot)
                grads = {f"the gradient of {k}": x.grad for k, x in xs.items() if x.requires_grad}
                if m is not None:
                    grads.update((f"the gradient of the parameter {n}", p.grad)
                                 for n, p in m.named_parameters())
        return out, grads

    where = f"{what}, run with its inputs on a GPU-like device"
    try:
        want, want_grads = one(False)
        with second_device():
            got, got_grads = one(True)
    except DeviceSlip as e:
        check(part, False, f"{where}: {e}")
    except (NotImplementedError, AssertionError):  # a stub, or a check that names its part
        raise
    except Exception as e:
        check(part, False, f"{what} raised {type(e).__name__}: {e}")
    for name, w, g in [("the output", want, got)] + [(n, w, got_grads.get(n))
                                                    for n, w in want_grads.items()]:
        if not isinstance(w, torch.Tensor):
            continue
        check(part, isinstance(g, Elsewhere), f"{where}: {name} is " + (
            f"on {g.device}" if isinstance(g, torch.Tensor) else repr(g))
              + ", not on the inputs' device")
        gap = (on_cpu(g).double() - w.detach().double()).abs().max().item() if w.numel() else 0
        check(part, gap <= 1e-6 * (1 + w.detach().double().abs().max().item()),
              f"{where}: {name} is {gap:.3g} away from the one the CPU computes")
