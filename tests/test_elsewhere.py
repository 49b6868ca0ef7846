"""The second device the parts' tests run on (tests/elsewhere.py): it computes what the CPU
computes, forward and backward, and fails where CUDA fails (a CPU tensor of 1 dimension or more
meeting the device's tensors), naming the line that made the CPU tensor; it lets through what CUDA
lets through (a CPU number, a CPU index, an explicit copy)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from elsewhere import ELSEWHERE, DeviceSlip, Elsewhere, on_cpu, second_device, to_second


def test_it_computes_what_the_cpu_computes_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 3, generator=g), torch.randn(3, 2, generator=g)
    want = F.softmax(x @ w, -1)[torch.tensor([0, 2])].sum(0)
    with second_device():
        xs, ws = to_second(x).requires_grad_(), to_second(w).requires_grad_()
        got = F.softmax(xs @ ws, -1)[torch.tensor([0, 2], device=xs.device)].sum(0)
        got.sum().backward()
    assert got.device == ELSEWHERE and isinstance(xs.grad, Elsewhere)
    torch.testing.assert_close(on_cpu(got), want)
    x.requires_grad_()
    F.softmax(x @ w, -1)[torch.tensor([0, 2])].sum(0).sum().backward()
    torch.testing.assert_close(on_cpu(xs.grad), x.grad)


def test_a_tensor_made_without_device_fails_naming_its_line():
    with second_device():
        z = to_second(torch.ones(3))
        with pytest.raises(DeviceSlip, match=r"made on the CPU \(at .*test_elsewhere.py|met "
                                             r"tensors on the inputs' device in add"):
            z + torch.arange(3)  # a CPU tensor of 1 dimension: CUDA refuses it


def test_factories_on_the_inputs_device_pass():
    with second_device():
        z = to_second(torch.ones(2, 3))
        made = [torch.zeros(3, device=z.device), z.new_zeros(3), torch.zeros_like(z[0]),
                torch.arange(3).to(z.device), torch.eye(3, dtype=torch.bool, device=z.device)]
        for t in made:
            assert t.device == ELSEWHERE
            z + t if t.dtype != torch.bool else z.masked_fill(t[:2], 0.0)


def test_what_cuda_allows_passes():
    """A CPU number (a 0-dimensional tensor), a CPU index (x[i], x[i] = v), an explicit copy
    (copy_, .cpu()), .item() and .tolist()."""
    with second_device():
        z = to_second(torch.arange(6.0))
        z * torch.tensor(2.0)
        z[torch.tensor([1, 3])]
        z[torch.tensor([0])] = to_second(torch.tensor([9.0]))
        z.copy_(torch.zeros(6))
        assert z.cpu().device.type == "cpu" and z.sum().item() == 0 and z.tolist() == [0.0] * 6


def test_what_cuda_refuses_fails():
    """A CPU tensor indexed by one on the device; a CPU index_select; a CPU mask; .numpy()."""
    with second_device():
        z = to_second(torch.arange(6.0))
        i = to_second(torch.tensor([1, 2]))
        for f in (lambda: torch.arange(6.0)[i], lambda: z.index_select(0, torch.tensor([1])),
                  lambda: z.masked_fill(torch.ones(6, dtype=torch.bool), 0.0), lambda: z.numpy()):
            with pytest.raises(DeviceSlip):
                f()


def test_a_module_moves_with_its_parameters_and_trains():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    want = layer(torch.ones(1, 3))
    moved = to_second(copy.deepcopy(layer))
    with second_device():
        out = moved(to_second(torch.ones(1, 3)))
        out.sum().backward()
        torch.optim.AdamW(moved.parameters(), lr=0.1, foreach=False).step()
    assert isinstance(moved.weight, torch.nn.Parameter) and moved.weight.device == ELSEWHERE
    torch.testing.assert_close(on_cpu(out), want.detach())
