"""Data-parallel training (minknn/tools/distributed.py) on 2 gloo processes on the CPU. The rule: every
rank computes what one process computes on the whole batch. Each check below runs twice: in a
pool of 2 ranks, each rank encoding its slice of the global batch, and here, in this process
without a process group, on the whole batch (the reference); the tests compare the two.

- every loss train.py builds (the Objective: ce, the in-batch and proxy losses, mlcon on multi-hot
  labels), with a batch of 7 that 2 ranks split 4 + 3: the loss, the encoder's gradients after
  DDP's average (and once under DistributedDataParallel itself), the proxies' gradients;
- the MoCo memory: two steps of knnbert and moco with a queue, and of moco with a memory bank,
  then the memory (keys, labels, ids, pointer) and the weights; the sharded fill of a tiny BERT;
- PCGrad under DDP: 3 tasks with conflicting gradients, each task's g_k all-reduced before the
  surgery, the forwards and backwards under no_sync();
- gather itself: the order of the rows, a rank with no rows, the gradient of the local part
  (world x its share), a siamese pair's two halves; broadcast of a loss's proxies.
And how a rank that lost a peer learns, without a clock, that torchrun's SIGTERM came (stop_awaited;
sigterm_raises notes one that comes during a stop).
The pool is spawned once for the module (a spawn costs seconds of imports) and runs every check
in order; each rank sets 1 thread, and nothing waits forever (gloo's timeout, a join timeout).
"""
import contextlib
import os
import random
import select
import signal
import socket
import threading
import time
import traceback
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.testing import assert_close

from minknn import Terminated, sigterm_raises, stop_noted
import minknn
from minknn.bert import BertModel
from minknn.losses import Objective
from minknn.memory import MoCo
from minknn.model import Model, Output
from minknn.pcgrad import PCGrad
from minknn.tasks.data import load_split
from minknn.tasks.registry import get_task
from minknn.tokenizer import Tokenizer
import minknn.tools.distributed as distributed
from minknn.tools.distributed import (all_reduce_grads, all_reduce_mean, broadcast, gather,
                                      gather_output, is_main, rank, sizes, slice_of, world)

from helpers import DATA

WORLD, D, C = 2, 4, 3  # ranks, embedding width, classes
LOSSES = ("ce", "supcon", "triplet", "npairs", "contrastive", "mnrl", "softtriple", "proxynca",
          "proxyanchor", "mlcon")
MEMORIES = (("knnbert", "queue"), ("moco", "queue"), ("moco", "bank"))  # loss, --memory


class Encoder(nn.Module):
    """A linear "encoder" (6 -> D) and a linear head (D -> C), with the interface the losses and
    MoCo use: model(task, x=...) gives an Output; bert.config.hidden_size is the width."""

    def __init__(self):
        super().__init__()
        self.encoder, self.head = nn.Linear(6, D), nn.Linear(D, C)
        self.bert = SimpleNamespace(config=SimpleNamespace(hidden_size=D))

    def forward(self, task, x):
        z = self.encoder(x)
        return Output(logits=self.head(z), z=z)


def inputs(n, seed=0):
    return torch.randn(n, 6, generator=torch.Generator().manual_seed(seed))


def labels(n, multilabel=False):
    if multilabel:  # multi-hot rows, each with one or two classes
        y, even = F.one_hot(torch.arange(n) % C, C), torch.arange(0, n, 2)
        y[even, (even + 1) % C] = 1
        return y
    return torch.arange(n) % C


def grads(prefix, module):
    return {f"{prefix} {name}.grad": p.grad.clone() for name, p in module.named_parameters()
            if p.grad is not None}


def local(n):
    """This rank's rows of a batch of n, and every rank's slice sizes."""
    start, stop = slice_of(n, rank(), world())
    return slice(start, stop), sizes(n, world())


def loss_step(name, n, ddp=False):
    """One backward of loss `name` (the Objective train.py builds, lam 0.5) on the Encoder: each
    rank encodes its slice of a batch of n, the loss sees the gathered outputs and the whole
    batch's labels, and the model's gradients are averaged over the ranks as DDP does (ddp: by
    DistributedDataParallel itself). Returns the loss and every gradient, the proxies' too."""
    torch.manual_seed(0)
    model, objective = Encoder(), Objective(name, C, D, lam=0.5)
    x, y = inputs(n), labels(n, multilabel=name == "mlcon")
    net = DistributedDataParallel(model) if ddp and world() > 1 else model
    rows, slices = local(n)
    output = gather_output(net("t", x[rows]), slices)
    loss, _ = objective(output, y)
    loss.backward()
    if not ddp:
        all_reduce_grads(model.parameters())  # what DDP does
    return {"loss": loss.detach(), **grads("model", model), **grads("loss", objective)}


def memory_steps(loss, kind, n=7, size=10, steps=2):
    """Two training steps of a memory loss on the Encoder, as train.py takes them: each rank's
    slice of the batch through the key encoder and the model, the whole batch's labels and rows,
    DDP's average, the SGD step, the memory written. Returns the memory and the weights."""
    torch.manual_seed(0)
    model = Encoder()
    flags = {"m_most": 2, "m_least": 2} if loss == "knnbert" else {}
    objective = Objective(loss, C, D, lam=0.5, **flags)
    train_x, train_y = inputs(12, seed=1), labels(12)
    size = size if kind == "queue" else len(train_x)  # a bank: one entry per example
    moco = MoCo(model, SimpleNamespace(name="t"), kind, size, momentum=0.5)
    moco.memory.fill(torch.randn(size, D), train_y[:size], torch.arange(size))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    mine, slices = local(n)
    losses = []
    for step in range(steps):
        rows = (torch.arange(n) * 5 + step) % len(train_x)  # the batch's training-set rows
        x, y = train_x[rows], train_y[rows]
        keys = moco.batch_keys(model, {"x": x[mine]}, rows)
        output = gather_output(model("t", x[mine]), slices)
        total, _ = objective(output, y, keys, moco.memory, rows)
        optimizer.zero_grad()
        total.backward()
        all_reduce_grads(model.parameters())
        optimizer.step()
        moco.after_step(keys, y, rows, output.z)
        losses.append(total.detach())
    return {"loss of each step": torch.stack(losses),
            **{f"memory {k}": v.clone() for k, v in moco.memory.state_dict().items()},
            **{f"model {k}": v.clone() for k, v in model.state_dict().items()}}


def memory_fill(kind, bert_dir):
    """The memory of a tiny BERT filled from the SST fixture: under 2 ranks each encodes its
    share of the examples (11 for the queue, all for the bank)."""
    torch.manual_seed(0)
    model = Model(BertModel.from_pretrained(bert_dir), [get_task("sst")], "mean")
    tokenizer = Tokenizer.from_folder(bert_dir, 32)
    train = load_split(get_task("sst"), "train", DATA)
    size = 11 if kind == "queue" else len(train)
    moco = MoCo(model, get_task("sst"), kind, size)
    moco.fill(model, tokenizer, train, torch.tensor([e.label for e in train]), 4,
              torch.device("cpu"))
    return {f"memory {k}": v.clone() for k, v in moco.memory.state_dict().items()}


class Tasks(nn.Module):
    """A shared linear encoder and one linear head per task (3 tasks); task 1's head starts as
    task 0's."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(6, D)
        self.heads = nn.ModuleList(nn.Linear(D, 1) for _ in range(3))
        self.heads[1].load_state_dict(self.heads[0].state_dict())

    def forward(self, task, x):
        z = self.encoder(x)
        return Output(logits=self.heads[task](z).squeeze(-1), z=z)


def pcgrad_step(n=7):
    """One PCGrad step under DDP: the forwards and PCGrad's backwards under no_sync(), so that DDP
    averages nothing itself (train.py goes round DDP's hooks altogether, on its module: the same
    gradients), each task's g_k all-reduced before the surgery, then the heads' averaged.
    Tasks 0 and 1 have the same inputs and opposite targets: their gradients conflict. Returns
    the gradients and the number of conflicting pairs."""
    torch.manual_seed(0)
    model = Tasks()
    net = DistributedDataParallel(model) if world() > 1 else model
    pcgrad = PCGrad(model.encoder.parameters(), all_reduce_mean, model.heads.parameters())
    mine, slices = local(n)
    with net.no_sync() if world() > 1 else contextlib.nullcontext():
        losses = []
        targets = 3 * torch.randn(2, n, generator=torch.Generator().manual_seed(0))
        for k, (x, t) in enumerate([(inputs(n), targets[0]), (inputs(n), -targets[0]),
                                    (inputs(n, seed=1), targets[1])]):
            output = gather_output(net(k, x[mine]), slices)
            losses.append(F.mse_loss(output.logits, t))
        conflicts = pcgrad.backward(losses, random.Random(0))
    return {"conflicts": torch.tensor(conflicts), **grads("model", model)}


def gather_rows(n):
    """gather() of rows 0..n-1 (each rank its own) and the gradient its local part gets from
    sum(w * gathered), w the same on every rank."""
    mine, slices = local(n)
    x = torch.arange(n * 2.0).view(n, 2)[mine].requires_grad_()
    gathered = gather(x, slices)
    (torch.arange(1.0, 2 * n + 1).view(n, 2) * gathered).sum().backward()
    return {"gathered": gathered.detach(), "grad": x.grad}


def gather_pair(n=5):
    """gather_output of a siamese pair batch: each rank's vectors are its first texts then its
    second ones (2 b, D); gathered, the whole batch's first texts then its second ones."""
    u, v = inputs(n, seed=3)[:, :D], inputs(n, seed=4)[:, :D]
    mine, slices = local(n)
    embeddings = torch.cat([u[mine], v[mine]])
    output = gather_output(Output(logits=u[mine, 0], z=embeddings), slices, pair=True)
    return {"embeddings": output.z, "logits": output.logits}


def proxies_broadcast():
    """A proxy loss built under another seed on each rank, then broadcast from rank 0."""
    torch.manual_seed(rank())
    objective = Objective("proxyanchor", C, D)
    broadcast(objective)
    return {"proxies": objective.metric.proxies.detach()}


def checks(bert_dir):
    """Every check: name -> (function, its arguments). Both ranks run them in this order."""
    return {
        **{f"loss {name}": (loss_step, (name, 7)) for name in LOSSES},
        "loss supcon, a batch of 8": (loss_step, ("supcon", 8)),
        "loss proxyanchor under DistributedDataParallel": (loss_step, ("proxyanchor", 7, True)),
        **{f"memory {loss} {kind}": (memory_steps, (loss, kind)) for loss, kind in MEMORIES},
        "fill queue": (memory_fill, ("queue", bert_dir)),
        "fill bank": (memory_fill, ("bank", bert_dir)),
        "pcgrad": (pcgrad_step, ()),
        "gather 3": (gather_rows, (3,)),
        "gather 1": (gather_rows, (1,)),
        "gather pair": (gather_pair, ()),
        "broadcast": (proxies_broadcast, ()),
    }


def worker(r, port, bert_dir, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=r, world_size=WORLD, timeout=timedelta(seconds=60))
    results = {}
    try:
        for name, (f, args) in checks(bert_dir).items():
            try:
                results[name] = f(*args)
            except Exception:  # both ranks run the same code: both stop here, and go on together
                results[name] = f"rank {r}: {traceback.format_exc()}"
        torch.save(results, os.path.join(out, f"rank{r}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tiny_bert_dir, tmp_path_factory):
    """What each of 2 ranks computed, one dict of results per check."""
    out = str(tmp_path_factory.mktemp("ranks"))
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    processes = [context.Process(target=worker, args=(r, port, tiny_bert_dir, out))
                 for r in range(WORLD)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=300)
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()
    if any(p.exitcode != 0 for p in processes):
        pytest.fail(f"the 2-rank pool failed: exit codes {[p.exitcode for p in processes]} "
                    "(-9: killed after 300 s; its output is above)")
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(WORLD)]


def results_of(ranks, name):
    """Each rank's results of one check; a check that raised fails with its traceback."""
    for results in ranks:
        if isinstance(results[name], str):
            pytest.fail(f"check '{name}' raised on {results[name]}")
    return [results[name] for results in ranks]


def same_as_one_process(ranks, name, expected, what):
    for r, results in enumerate(results_of(ranks, name)):
        for key, value in expected.items():
            assert_close(results[key], value, msg=lambda m: (
                f"{name}: rank {r}'s {key} differs from one process's on the whole batch "
                f"({what})\n{m}"))


@pytest.mark.parametrize("name", LOSSES)
def test_each_loss_sees_the_global_batch(ranks, name):
    same_as_one_process(ranks, f"loss {name}", loss_step(name, 7),
                        "the loss must see every rank's outputs, gathered with their gradients")


def test_an_even_split_and_distributed_data_parallel_itself(ranks):
    same_as_one_process(ranks, "loss supcon, a batch of 8", loss_step("supcon", 8),
                        "the loss must see every rank's outputs, gathered with their gradients")
    same_as_one_process(ranks, "loss proxyanchor under DistributedDataParallel",
                        loss_step("proxyanchor", 7),
                        "DDP's own average of the gradients must give one process's")


@pytest.mark.parametrize("loss, kind", MEMORIES)
def test_every_rank_holds_one_process_memory(ranks, loss, kind):
    same_as_one_process(ranks, f"memory {loss} {kind}", memory_steps(loss, kind),
                        "the keys of every rank must be gathered before the loss and the "
                        "enqueue, with the whole batch's labels and rows")


@pytest.mark.parametrize("kind", ["queue", "bank"])
def test_the_sharded_fill_is_one_process_fill(ranks, kind, tiny_bert_dir):
    expected = memory_fill(kind, tiny_bert_dir)
    for r, results in enumerate(results_of(ranks, f"fill {kind}")):
        for key, value in expected.items():
            # padding differs between the shards' batches: float32 noise in the keys
            assert_close(results[key], value, atol=1e-5, rtol=1e-4,
                         msg=lambda m: f"the {kind}'s fill: rank {r}'s {key} differs from one "
                                       f"process's (each rank's share gathered in order)\n{m}")


def test_pcgrad_projects_the_global_gradients(ranks):
    expected = pcgrad_step()
    assert expected["conflicts"] > 0, "the tasks' gradients must conflict for this test to say much"
    same_as_one_process(ranks, "pcgrad", expected,
                        "each task's gradient must be all-reduced BEFORE the projection")


def test_gather_keeps_the_rows_in_order_and_sums_the_gradients(ranks):
    for n in (3, 1):  # 2 + 1 rows, and 1 + 0: a rank with no rows
        w = torch.arange(1.0, 2 * n + 1).view(n, 2)
        for r, got in enumerate(results_of(ranks, f"gather {n}")):
            assert_close(got["gathered"], torch.arange(n * 2.0).view(n, 2), msg=lambda m: (
                f"gather of {n} rows: rank {r} got another batch than rows 0..{n - 1} in "
                f"order\n{m}"))
            start, stop = slice_of(n, r, WORLD)
            # every rank's loss reaches every slice: its gradient is summed over the 2 ranks
            assert_close(got["grad"], WORLD * w[start:stop], msg=lambda m: (
                f"gather of {n} rows: rank {r}'s gradient must be {WORLD} x its share of "
                f"sum(w * gathered), the sum over the ranks\n{m}"))


def test_a_pair_batch_is_gathered_half_by_half(ranks):
    same_as_one_process(ranks, "gather pair", gather_pair(),
                        "a siamese batch's first texts then its second ones, each half gathered")


def test_broadcast_gives_every_rank_rank_0s_proxies(ranks):
    rank0, rank1 = results_of(ranks, "broadcast")
    torch.manual_seed(0)
    assert_close(rank0["proxies"], Objective("proxyanchor", C, D).metric.proxies.detach())
    assert_close(rank1["proxies"], rank0["proxies"], msg=lambda m: (
        f"broadcast: rank 1's proxies must be rank 0's, whatever seed built them\n{m}"))


def test_slices_cover_the_batch_in_order():
    for n in range(0, 10):
        for world_ in (1, 2, 3, 4):
            bounds = [slice_of(n, r, world_) for r in range(world_)]
            assert [b - a for a, b in bounds] == sizes(n, world_)
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(bounds[r][1] == bounds[r + 1][0] for r in range(world_ - 1))
            assert max(sizes(n, world_)) - min(sizes(n, world_)) <= 1
            assert sizes(n, world_) == sorted(sizes(n, world_), reverse=True), \
                "the first n % world ranks take one example more"


def test_without_a_process_group_everything_is_the_identity():
    x = torch.randn(3, 2, requires_grad=True)
    assert (rank(), world(), is_main()) == (0, 1, True)
    assert gather(x, [3]) is x and gather_output(Output(x, x), [3]).z is x
    assert torch.equal(all_reduce_mean(x.detach().clone()), x.detach())


def test_a_sigterm_during_a_stop_is_noted_not_raised(monkeypatch):
    """In sigterm_raises SIGTERM raises Terminated, except while a stop is on its way up (a lost
    peer's error, a KeyboardInterrupt, being handled): then it raises nothing and is noted. Raised,
    it would replace that stop (torchrun's SIGTERM, just as rank 1's collective lost rank 0)."""
    monkeypatch.setattr(minknn, "_NOTED", [])
    monkeypatch.setattr(distributed, "lost_peer", lambda e: "by peer" in str(e))  # no group here
    with sigterm_raises():
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        assert not stop_noted(), "a SIGTERM that raised Terminated was noted too"
        for stop in (RuntimeError("Connection closed by peer"), KeyboardInterrupt()):
            try:
                try:
                    raise stop
                except BaseException:
                    signal.raise_signal(signal.SIGTERM)  # must raise nothing
            except Terminated:
                pytest.fail(f"SIGTERM while {stop!r} was handled raised Terminated")
        assert minknn._NOTED == [signal.SIGTERM] * 2, f"noted: {minknn._NOTED}"
        try:
            raise RuntimeError("a bug")
        except RuntimeError:
            with pytest.raises(Terminated):  # not a stop: SIGTERM stops the run
                signal.raise_signal(signal.SIGTERM)
    with sigterm_raises():
        assert not stop_noted(), "the SIGTERMs noted in one run's block were still noted in the next one's"


def test_a_rank_that_lost_a_peer_waits_for_torchruns_sigterm(monkeypatch):
    """stop_awaited, in the handler of a lost peer's error under sigterm_raises: with no SIGTERM
    it waits `seconds`; a SIGTERM sent as it begins to wait ends the wait, though it lands on
    another thread (here: this thread blocks it; under torchrun, gloo's and torch's threads may
    take it); and one noted already ends it before it begins."""
    monkeypatch.setattr(minknn, "_NOTED", [])
    monkeypatch.setattr(distributed, "lost_peer", lambda e: "by peer" in str(e))  # no group here
    wait = select.select

    def wait_as_sigterm_comes(*args):
        threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()
        return wait(*args)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with sigterm_raises():
        try:
            raise RuntimeError("Connection closed by peer")
        except RuntimeError:
            start = time.monotonic()
            distributed.stop_awaited(seconds=0.5)
            waited = time.monotonic() - start
            assert waited >= 0.5, f"stop_awaited returned after {waited:.2f} s, with no SIGTERM"
            assert not stop_noted()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                with monkeypatch.context() as patch:
                    patch.setattr(select, "select", wait_as_sigterm_comes)
                    start = time.monotonic()
                    distributed.stop_awaited(seconds=60)
                    waited = time.monotonic() - start
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
            assert stop_noted() and waited < 30, f"SIGTERM sent: noted {minknn._NOTED}, " \
                                                 f"stop_awaited returned after {waited:.1f} s"
            start = time.monotonic()
            distributed.stop_awaited(seconds=60)
            assert time.monotonic() - start < 30, "stop_awaited waited though SIGTERM had come"
