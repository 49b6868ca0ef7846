"""Data-parallel training (torchrun, DistributedDataParallel): the process group and the
collectives the losses, the MoCo memory and PCGrad need.

    torchrun --nproc_per_node N train.py ...    N ranks: NCCL on CUDA (rank r on GPU LOCAL_RANK),
                                                gloo on the CPU
    python train.py ...                         one process: every function here is the identity

The rule: every rank computes the same loss as one process on the whole global batch.
--batch_size is the global batch B. Rank r encodes only its slice of it, rows
slice_of(B, r, N) = [start, stop): contiguous, the first B % N ranks one example more, so that the
slices concatenated in rank order are the batch in its original order. The model's outputs are
then gathered from all ranks (gather_output), with gradients for the local part, and every rank
builds the batch's targets and training-set rows itself. So every loss (ce, bce, mse and every
metric loss: supcon, triplet, npairs, contrastive, mnrl, softtriple, proxynca, proxyanchor,
mlcon, knnbert, moco, decoupled and the pair losses) sees the global batch, exactly what one
process sees, and needs no change: its in-batch negatives are those of all ranks.

Why the gradients come out right. Every rank computes the same loss L of the gathered outputs.
all_gather's backward sums, over the ranks, the gradient of L with respect to each rank's slice,
so rank r's parameter gradient is N dL/dtheta through its own slice; DDP averages over the ranks,
(1/N) sum_r N dL/dtheta|slice r = dL/dtheta, one process's gradient. A loss's own parameters
(proxies) are not gathered and not in DDP: each rank computes the identical loss of identical
proxies, so their gradient is already one process's, on every rank, with no communication.
tests/test_distributed.py checks this for each loss, and that gathering WITHOUT gradient (only the
local slice's share) or not at all (a local-batch loss) gives another gradient.

The MoCo memory (minknn/memory.py) gathers its keys without gradient (gather_keys, MoCo's
concat_all_gather), so that every rank enqueues the same keys and holds the same queue; PCGrad
(minknn/pcgrad.py) averages each task's gradient (all_reduce_mean) before its projection.

How a run under torchrun ends when a rank fails or is killed: torchrun SIGTERMs the others, and a
collective that lost the rank fails on the others (lost_peer). Rank 0 says how the run stopped
(summary.json, one line: minknn/tools/run.py). If rank 0 itself is gone, a rank left says it in its
place, once: the one that takes over run.lock (files.rank_0_gone), once torchrun's SIGTERM has
come (stop_awaited). The lock, not torchrun's store, is what tells that rank 0 is gone: the store
(a TCPStore that torchrun's agent hosts, not rank 0) outlives rank 0 and holds only keys, and a
key rank 0 never set says "not yet" as well as "never"; telling them apart would take a clock (a
heartbeat, a timeout). The OS lets go of a lock when the process holding it ends, kill -9
included, so a free run.lock is a fact, not a guess.
"""
import contextlib
import os
import select
import signal
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from minknn import stop_noted
from minknn.model import Output


def _grouped():
    return dist.is_available() and dist.is_initialized()


def launched():
    """Whether torchrun started this process (it sets RANK), as nanoGPT detects it."""
    return int(os.environ.get("RANK", -1)) != -1


def setup(device_name):
    """Joins the process group torchrun made: returns (rank, world, device). device_name: the
    run's device, 'cpu' or 'cuda' (a torch.device too); on CUDA each rank takes its node's GPU
    LOCAL_RANK, whatever index was given."""
    if torch.device(device_name).type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # the other ranks wait at a barrier while rank 0 evaluates: NCCL's default 10 minutes may
    # be too short for a large dev set
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=timedelta(minutes=30))
    return dist.get_rank(), dist.get_world_size(), device


def teardown():
    if _grouped():
        dist.destroy_process_group()


@contextlib.contextmanager
def processes(device):
    """The block as one process of the run: None outside torchrun; under it, the process joins the
    group (setup) and the block gets its device, with stdout quiet but on rank 0, which alone
    prints (the other ranks' errors still reach stderr); the group is left after it. device: the
    run's (engine.pick_device)."""
    if not launched():
        yield None
        return
    _, _, device = setup(device)
    try:
        with open(os.devnull, "w") as quiet, \
                contextlib.redirect_stdout(sys.stdout if is_main() else quiet):
            yield device
    finally:
        teardown()


def rank():
    return dist.get_rank() if _grouped() else 0


def world():
    return dist.get_world_size() if _grouped() else 1


def is_main():
    """Rank 0: the only one that evaluates, prints and writes the run's files."""
    return rank() == 0


def lost_peer(error):
    """Whether an error is a collective's that lost another rank (it failed or was killed): gloo's
    "Connection closed by peer" or "reset by peer", or torch's DistError. Any other RuntimeError
    is a bug of this rank's, to show with its traceback."""
    return _grouped() and (isinstance(error, dist.DistError) or "by peer" in str(error))


def stop_awaited(seconds=60):
    """Waits for torchrun's SIGTERM (or a Ctrl-C): a rank other than 0 whose collective lost a
    peer, before it asks files.rank_0_gone. torchrun sends it once it has seen a process end, and a
    process has let go of its files (run.lock) before its end can be seen; the collective's error
    comes as soon as the lost process closes its sockets, which may be before its other files.
    So the signal, not the error, says that a lost rank 0 has let go of run.lock. A SIGTERM that
    came as the error was on its way up (minknn.stop_noted) ends the wait before it begins.
    seconds: the longest wait, for a launcher that sends none. The signal may reach any of the
    process's threads (gloo's, torch's); wherever it lands, Python's handler writes its number to
    the wakeup fd, which the wait watches, and runs in this thread as the wait returns."""
    if threading.current_thread() is not threading.main_thread():
        return
    watched, woken = os.pipe()
    os.set_blocking(woken, False)
    before = signal.set_wakeup_fd(woken, warn_on_full_buffer=False)
    try:
        if not stop_noted():  # (a handler due from before the fd runs as this line begins)
            select.select([watched], [], [], seconds)
    except KeyboardInterrupt:  # a Ctrl-C, or a SIGTERM outside sigterm_raises: a stop too
        pass
    finally:
        signal.set_wakeup_fd(before)
        os.close(watched)
        os.close(woken)


def sizes(n, world):
    """The slice sizes of a batch of n over `world` ranks: the first n % world one larger."""
    return [n // world + (r < n % world) for r in range(world)]


def slice_of(n, rank, world):
    """Rank `rank`'s rows [start, stop) of a batch of n."""
    start = sum(sizes(n, world)[:rank])
    return start, start + sizes(n, world)[rank]


class AllGather(torch.autograd.Function):
    """all_gather with a gradient. Forward: every rank's x (same shape on all), stacked
    (world, ...). Backward: each rank's loss depends on every rank's x, so the gradient of x is
    the sum over the ranks of the gradient of its part of the stack (one all_reduce).
    torch.distributed.nn.functional.all_gather does the same, but torch 2.13 warns that it is
    deprecated, for a private module; this is all it does, on two calls every backend has."""

    @staticmethod
    def forward(ctx, x):
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, x.contiguous())
        return torch.stack(pieces)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()  # all_reduce writes in place: not into autograd's tensor
        dist.all_reduce(grad)  # sum over the ranks
        return grad[dist.get_rank()]


def gather(x, sizes):
    """All ranks' x (sizes[r] rows on rank r) concatenated along dim 0 in rank order, with the
    gradient flowing back to this rank's x. Without a process group, x itself."""
    if not _grouped():
        return x
    assert len(x) == sizes[rank()], f"rank {rank()} holds {len(x)} rows, not {sizes[rank()]}"
    # all_gather needs one shape on every rank: pad to the largest slice, cut after
    padded = torch.cat([x, x.new_zeros(max(sizes) - len(x), *x.shape[1:])])
    pieces = AllGather.apply(padded)  # (world, max(sizes), ...)
    return torch.cat([piece[:n] for piece, n in zip(pieces, sizes)])


@torch.no_grad()
def gather_keys(x, sizes):
    """gather() without gradient: MoCo's concat_all_gather, for keys, labels and rows. Never for
    what a loss is computed from: the other ranks would get no gradient through it."""
    return gather(x, sizes)


def gather_output(output, sizes, pair=False):
    """The model's Output for the whole batch: logits, z and retrieval gathered with
    gradients. `hidden` (B, T, H) is left None: each rank pads to its own longest text, and only
    a kNN datastore reads it, built at evaluation on rank 0. pair: a siamese pair batch, whose
    vectors are its B first texts then its B second ones; each half is gathered on its own."""
    def vectors(x):
        if x is None:
            return None
        if not pair:
            return gather(x, sizes)
        b = sizes[rank()]
        return torch.cat([gather(x[:b], sizes), gather(x[b:], sizes)])
    return Output(logits=gather(output.logits, sizes), z=vectors(output.z),
                  retrieval=vectors(output.retrieval))


@torch.no_grad()
def broadcast(module):
    """Rank 0's parameters and buffers, copied into every rank's `module`: for what DDP does not
    hold, a loss's proxies, which must start equal on every rank (DDP does this for the model)."""
    if _grouped():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t, 0)


def broadcast_object(obj):
    """Rank 0's obj (anything picklable) on every rank: the run folder's name, how an epoch
    ended. The other ranks wait here for rank 0."""
    if not _grouped():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, 0)
    return box[0]


def all_reduce_mean(tensor):
    """The tensor averaged over the ranks, in place (PCGrad's task gradients); returns it."""
    if _grouped():
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
    return tensor


def all_reduce_grads(params):
    """Averages the .grad of `params` over the ranks in one all-reduce: what DDP does, for the
    parameters it was told not to sync (PCGrad's step runs under ddp_model.no_sync()). A
    parameter without .grad is skipped; it must be the same on every rank."""
    grads = [p.grad for p in params if p.grad is not None]
    if not _grouped() or not grads:
        return
    flat = all_reduce_mean(torch.cat([g.reshape(-1) for g in grads]))
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
