"""The MoCo memory: the queue's pointer, labels and example ids, the momentum update, the key
encoder's isolation from gradients, the memory bank's update, the fill before the first step, and
a training step that leaves each query's own older key out of the loss. Part memory
(minknn/assignment/edition.py): its sanity check is test_sanity_check_the_memory; the tests after it
diagnose each piece on a stand-in model (a linear map), then on the tiny BERT."""
import copy
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import train
from minknn.assignment.parts import label
from minknn.losses import Objective
from minknn.memory import KeyEncoder, MemoryBank, MoCo, Queue
from minknn.model import Model
from minknn.tasks.data import load_split
from minknn.tasks.registry import get_task
from minknn.tokenizer import Tokenizer
from minknn.tools.engine import encode_batch

from elsewhere import check_on_second_device
from grading import as_formula, as_mix, check, close, graded, matches_reference

PART = "memory"
SST = get_task("sst")


def labels_of(examples):
    return torch.tensor([e.label for e in examples])


class StandIn(nn.Module):
    """A model with the interface MoCo uses (model(task, **batch).z, bert.config), whose
    representation is a linear map of the batch's x (B, 6): the memory's tests need no BERT."""

    def __init__(self, seed=0, dim=4):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.linear = nn.Linear(6, dim)
        with torch.no_grad():
            for p in self.linear.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.bert = SimpleNamespace(config=SimpleNamespace(hidden_size=dim))

    def forward(self, task, x):
        return SimpleNamespace(z=self.linear(x))


def trained(model, seed=1):
    """The model after an optimiser step, as it were: every parameter moved, so that the key
    encoder (a copy of the model before) and the model differ."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    return model


def flat(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def test_momentum_update_by_hand():
    """theta_k <- m theta_k + (1 - m) theta_q, in place, twice, with m = 0.9 and m = 0.6."""
    for m in (0.9, 0.6):
        model = StandIn()
        key_encoder = KeyEncoder(model, m=m)
        theta_k = flat(key_encoder.encoder)
        for step in (1, 2):
            trained(model, seed=step)
            theta_q = flat(model)
            graded(PART, "KeyEncoder.update", key_encoder.update, model)
            got = flat(key_encoder.encoder)
            moved = (flat(model) - theta_q).abs().max().item()
            if moved:
                a, b, off = as_mix(flat(model), theta_q, theta_k)
                check(PART, False, f"KeyEncoder.update with m = {m} changed the model's "
                      f"parameters theta_q (by up to {moved:.3g}), which it must only read"
                      + (f": they became {a:.3g} theta_q + {b:.3g} theta_k" if off < 1e-5
                         else "") + ("; the key encoder's stayed as they were"
                                     if torch.equal(got, theta_k) else ""))
            check(PART, not torch.equal(got, theta_k), f"KeyEncoder.update with m = {m} left the "
                  f"key encoder's parameters unchanged (expected m theta_k + (1 - m) theta_q, up "
                  f"to {(1 - m) * (theta_q - theta_k).abs().max().item():.3g} away); the update "
                  f"is written into the parameters themselves, in place (k.mul_(...).add_(...))")
            a, b, off = as_mix(got, theta_k, theta_q)
            said = as_formula((a, b), {"m": m, "1 - m": 1 - m, "1": 1.0, "0": 0.0},
                              ("theta_k", "theta_q")) if off <= 1e-5 else None
            check(PART, off < 1e-5 and abs(a - m) < 1e-5 and abs(b - (1 - m)) < 1e-5, f"after "
                  f"KeyEncoder.update with m = {m} the key encoder must be {m:g} theta_k + "
                  f"{1 - m:.2g} theta_q (m on its own parameters, 1 - m on the model's); it is "
                  f"{a:.3g} theta_k + {b:.3g} theta_q" + (f", off by {off:.3g}" if off > 1e-5
                                                         else "")
                  + (f": the update computes {said}, the formula m theta_k + (1 - m) theta_q"
                     if said else ""))
            theta_k = m * theta_k + (1 - m) * theta_q
            close(PART, got, theta_k, f"the key encoder's parameters after {step} momentum "
                  f"step(s) with m = {m} (theta_k <- m theta_k + (1 - m) theta_q)")
        close(PART, flat(model), theta_q, "the model's parameters after KeyEncoder.update (it "
              "must only read them)", atol=0, rtol=0)


def test_momentum_update_with_a_frozen_part_of_the_model():
    """With part of the model frozen (--option pretrain freezes BERT, a memory loss still trains
    its head), each key parameter still moves towards its own counterpart: the first layer frozen
    (requires_grad False), the second trained, both the same shape."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    model[0].requires_grad_(False)
    key_encoder = KeyEncoder(model, m=0.9)
    with torch.no_grad():
        for p in model[1].parameters():
            p.add_(torch.randn(p.shape, generator=g))
    before = [k.detach().clone() for k in key_encoder.encoder.parameters()]
    graded(PART, "KeyEncoder.update", key_encoder.update, model)
    names = [n for n, _ in model.named_parameters()]
    for name, k, k0, q in zip(names, key_encoder.encoder.parameters(), before,
                              model.parameters()):
        want = 0.9 * k0 + 0.1 * q.detach()
        if not torch.allclose(k, want, atol=1e-6):
            moved_to = [n for n, other in zip(names, model.parameters())
                        if other.shape == q.shape and torch.allclose(k, 0.9 * k0 + 0.1 *
                                                                     other.detach(), atol=1e-6)]
            check(PART, False, f"KeyEncoder.update with the model's first layer frozen "
                  f"(requires_grad False): the key encoder's {name} moved towards "
                  + (f"the model's {moved_to[0]}" if moved_to else "no parameter of the model")
                  + f", not its own counterpart {name}: every parameter pairs with its own, "
                  f"frozen or not (the key encoder is a copy of the whole model)")


def test_batch_keys_come_after_the_momentum_step():
    """The queue's batch keys are the key encoder's after its momentum step towards the model:
    MoCo's update after step t - 1 comes before the keys of step t."""
    model = StandIn()
    moco = MoCo(model, SimpleNamespace(name="sst"), "queue", 8, momentum=0.5)
    before = copy.deepcopy(moco.key_encoder.encoder)
    trained(model)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    after = copy.deepcopy(before)
    with torch.no_grad():
        for k, q in zip(after.parameters(), model.parameters()):
            k.copy_(0.5 * k + 0.5 * q)
        expected = F.normalize(after.linear(x), dim=1)
        stale = F.normalize(before.linear(x), dim=1)
        fresh = F.normalize(model.linear(x), dim=1)
    keys = graded(PART, "MoCo.batch_keys", moco.batch_keys, model, {"x": x}, torch.arange(3))
    a, b, _ = as_mix(flat(moco.key_encoder.encoder), flat(before), flat(model))
    check(PART, (a, b) != (1, 0), "batch_keys left the key encoder where it was: it makes the "
          "momentum step towards the model (self.key_encoder.update(model)), then computes the "
          "keys")
    close(PART, flat(moco.key_encoder.encoder), flat(after), "the key encoder after batch_keys "
          "(one momentum step towards the model, m = 0.5)")
    check(PART, not torch.allclose(keys, stale, atol=1e-5), "the batch keys were computed before "
          "the key encoder's momentum step: compute them after it, with the encoder that has "
          "followed the model's last step")
    check(PART, not torch.allclose(keys, fresh, atol=1e-5), "the batch keys are the model's own "
          "representations: they must be the key encoder's")
    check(PART, not keys.requires_grad, "the batch keys carry gradients: they must not")
    close(PART, keys, expected, "the batch keys (the key encoder's unit vectors after its momentum "
          "step)")


def enqueue(queue, keys, labels, ids):
    graded(PART, "Queue.enqueue", queue.enqueue, keys, labels, ids)


def test_queue_wraps_around_first_in_first_out():
    queue = Queue(5, 2)
    queue.fill(torch.ones(5, 2), torch.full((5,), 9), torch.arange(5))
    # labels 0 1 2 | 10 11 12 | 20 | 30 31 go to slots 0 1 2 | 3 4 0 | 1 | 2 3
    expected_labels = [[0, 1, 2, 9, 9], [12, 1, 2, 10, 11], [12, 20, 2, 10, 11],
                       [12, 20, 30, 31, 11]]
    ptr = 0
    for step, n in enumerate([3, 3, 1, 2]):  # 9 keys: the pointer passes the end once
        keys = torch.tensor([[10.0 * step + i, 1.0] for i in range(n)])
        labels = torch.tensor([10 * step + i for i in range(n)])
        enqueue(queue, keys, labels, 100 + labels)  # each key's example id travels with it
        where = f"a queue of 5 after enqueueing {n} keys at ptr {ptr}"
        ptr = (ptr + n) % 5
        check(PART, queue.ptr.item() == ptr, f"{where}: ptr is {queue.ptr.item()}, expected {ptr} "
              f"(ptr + B, modulo the size: it wraps round the end)")
        check(PART, queue.labels.tolist() == expected_labels[step],
              f"{where}: the labels by slot are {queue.labels.tolist()}, expected "
              f"{expected_labels[step]} (first in, first out, wrapping round the end)")
    check(PART, queue.ids.tolist() == [112, 120, 130, 131, 111],
          f"the example ids by slot are {queue.ids.tolist()}: each must travel with its key")
    unit = F.normalize(torch.stack([queue.labels.float(), torch.ones(5)], dim=1), dim=1)
    check_unit_keys(queue.keys, unit, "the queue's keys (each written with its label)")
    close(PART, queue.keys, unit, "the queue's keys (each written with its label, normalised)")


def check_unit_keys(got, expected, what, mistakes=None):
    """Each row of `got` a unit vector along the same row of `expected` (unit vectors); mistakes:
    {what a mistake stores: the keys it gives, recomputed}, named only when `got` equals them."""
    for mistake, wrong in (mistakes or {}).items():
        check(PART, not (got.shape == wrong.shape and torch.allclose(got, wrong, atol=1e-5)),
              f"{what} are {got.tolist()}: they equal the keys {mistake}; each key is stored as a "
              f"unit vector, F.normalize(keys, dim=1)")
    norms = got.norm(dim=1)
    check(PART, torch.allclose(norms, torch.ones_like(norms), atol=1e-5), f"{what} have norms "
          f"{[round(n, 4) for n in norms.tolist()]}, expected 1 each: each key is stored as a "
          f"unit vector, F.normalize(keys, dim=1) (per key, along its features)")
    cos = (F.normalize(got, dim=1) * expected).sum(1)
    check(PART, torch.allclose(cos, torch.ones_like(cos), atol=1e-5), f"{what} point elsewhere "
          f"than the keys enqueued (cosines {[round(c, 4) for c in cos.tolist()]} with them, "
          f"expected 1 each): slot i holds key i, scaled to length 1")


def test_a_batch_larger_than_the_queue_keeps_its_last_keys():
    queue = Queue(3, 2)
    enqueue(queue, torch.randn(7, 2), torch.arange(7), torch.arange(7))
    check(PART, queue.labels.tolist() == queue.ids.tolist() == [4, 5, 6],
          f"a batch of 7 into a queue of 3: labels by slot {queue.labels.tolist()}, expected the "
          f"batch's last three, [4, 5, 6]")
    check(PART, queue.ptr.item() == 0, f"a batch of 7 into a queue of 3: ptr is "
          f"{queue.ptr.item()}, expected 0 (three keys written: one full turn)")


def test_queue_normalises_each_key_vector_not_each_dimension():
    queue = Queue(3, 2)
    keys = torch.tensor([[3.0, 4.0], [0.0, 0.5], [10.0, 0.0]])
    enqueue(queue, keys, torch.arange(3), torch.arange(3))
    check_unit_keys(queue.keys, F.normalize(keys, dim=1), "the queue's keys", {
        "as given, not normalised": keys,
        "normalised per dimension across the batch (dim 0), not per key": F.normalize(keys, dim=0)})
    close(PART, queue.keys, torch.tensor([[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]]),
          "the queue's keys for [[3, 4], [0, 0.5], [10, 0]] (each key normalised, dim 1)")


def test_memory_bank_update_is_wu_et_al_momentum():
    """v_i <- (m v_i + (1 - m) f_i) / ||.||, f_i the unit query, with m = 0.5 (theirs) and 0.8
    (at m = 0.5 a swapped m and 1 - m would not show)."""
    for m in (0.5, 0.8):
        bank = MemoryBank(4, 2)
        bank.fill(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]), torch.arange(4),
                  torch.arange(4))
        before = bank.keys.clone()
        graded(PART, "MemoryBank.update", bank.update, torch.tensor([1, 3]),
               torch.tensor([[2.0, 0.0], [0.0, -3.0]]), m)
        # each moved entry read back as a v_i + b q_i: unit (normalised after the mix), and
        # along m v_i + (1 - m) f_i, f_i = q_i / ||q_i|| (||q_i|| = 2 and 3), so b / a =
        # (1 - m) / (m ||q_i||)
        shares = []
        for row, q in ((1, torch.tensor([2.0, 0.0])), (3, torch.tensor([0.0, -3.0]))):
            v = bank.keys[row]
            check(PART, abs(v.norm().item() - 1) < 1e-5, f"MemoryBank.update with m = {m}: "
                  f"entry {row} has norm {v.norm().item():.4g}, expected 1: v_i <- (m v_i + "
                  f"(1 - m) f_i) / ||.||, normalised after the mix")
            a, b, _ = as_mix(v, before[row], q)
            shares.append(b * q.norm().item() / (a + b * q.norm().item()))
        check(PART, abs(shares[0] - shares[1]) < 1e-5, f"MemoryBank.update with m = {m}: the "
              f"queries [2, 0] and [0, -3] got shares {shares[0]:.3g} and {shares[1]:.3g} of "
              f"their entries, expected {1 - m:.3g} each; a query's norm does not count, the mix "
              f"takes the unit query f_i = q_i / ||q_i||")
        said = as_formula((1 - shares[0], shares[0]), {"m": m, "1 - m": 1 - m, "1": 1.0,
                                                       "0": 0.0}, ("v_i", "f_i"))
        unchanged = bool(torch.equal(bank.keys, before))
        check(PART, abs(shares[0] - (1 - m)) < 1e-5, f"MemoryBank.update with m = {m}: each "
              f"entry moved along {1 - shares[0]:.3g} v_i + {shares[0]:.3g} f_i; m = {m} is the "
              f"old entry's share: m v_i + (1 - m) f_i"
              + (": the bank is unchanged, the update written nowhere (bank.keys[rows] = ... "
                 "writes into the bank; bank.keys[rows][...] = ... into a copy)" if unchanged
                 else f": the update computes {said}" if said else ""))
        expected = before.clone()
        expected[1] = F.normalize(m * before[1] + (1 - m) * torch.tensor([1.0, 0.0]), dim=0)
        expected[3] = F.normalize(m * before[3] + (1 - m) * torch.tensor([0.0, -1.0]), dim=0)
        close(PART, bank.keys, expected, f"the bank after moving entries 1 and 3 towards the "
              f"queries [2, 0] and [0, -3] with m = {m} (m is the old entry's share)")
        check(PART, bank.labels.tolist() == [0, 1, 2, 3], "MemoryBank.update changed the labels")


def test_after_step_enqueues_the_keys_or_moves_the_bank():
    """The queue takes the batch's keys, not its queries; the bank's entries of the batch's rows
    move towards the queries."""
    model, g = StandIn(), torch.Generator().manual_seed(3)
    keys = F.normalize(torch.randn(3, 4, generator=g), dim=1)
    queries = torch.randn(3, 4, generator=g, requires_grad=True)
    labels, rows = torch.tensor([2, 0, 1]), torch.tensor([5, 1, 4])
    moco = MoCo(model, SimpleNamespace(name="sst"), "queue", 8)
    graded(PART, "MoCo.after_step", moco.after_step, keys, labels, rows, queries)
    slots = moco.memory.keys[:3]
    check(PART, not torch.allclose(slots, F.normalize(queries.detach(), dim=1), atol=1e-5),
          "after_step put the batch's queries in the queue: it enqueues batch_keys, the key "
          "encoder's keys; the queries never enter the queue")
    close(PART, moco.memory.keys[:3], keys, "the queue's first slots after the first step (the "
          "batch's keys; the queries never enter the queue)")
    check(PART, moco.memory.labels[:3].tolist() == [2, 0, 1] and moco.memory.ids[:3].tolist()
          == [5, 1, 4], f"after the first step the queue's first 3 slots hold labels "
          f"{moco.memory.labels[:3].tolist()} and rows {moco.memory.ids[:3].tolist()}, expected "
          f"the batch's, [2, 0, 1] and [5, 1, 4], enqueued with its keys")
    moco = MoCo(model, SimpleNamespace(name="sst"), "bank", 6)
    moco.memory.fill(F.normalize(torch.randn(6, 4, generator=g), dim=1), torch.arange(6),
                     torch.arange(6))
    before = moco.memory.keys.clone()
    graded(PART, "MoCo.after_step", moco.after_step, before[rows], labels, rows, queries)
    check(PART, not torch.allclose(moco.memory.keys[rows], before[rows]), "after_step over a "
          "bank left the batch's entries where they were; they move towards the batch's queries "
          "(memory.update(rows, queries))")
    norms = moco.memory.keys[rows].norm(dim=1)
    check(PART, torch.allclose(norms, torch.ones_like(norms), atol=1e-5), f"after_step over a "
          f"bank: the moved entries (rows {rows.tolist()}) have norms "
          f"{[round(n, 4) for n in norms.tolist()]}, expected 1 each: each entry is normalised on "
          f"its own, along its features, after the mix (v_i <- (m v_i + (1 - m) f_i) / ||.||)")
    expected = before.clone()
    expected[rows] = F.normalize(0.5 * before[rows] + 0.5 * F.normalize(queries.detach(), dim=1),
                                 dim=1)
    close(PART, moco.memory.keys, expected, "the bank after a step (the batch's entries moved "
          "towards its queries, m = 0.5)")


def test_sanity_check_the_memory():
    """The sanity check: the momentum update, the queue, the bank and the batch keys on fixed
    inputs, against the solution's stored outputs (tests/fixtures/references/memory.pt)."""
    g = torch.Generator().manual_seed(0)
    model = StandIn()
    key_encoder = KeyEncoder(model, m=0.9)
    trained(model)
    for _ in range(2):
        graded(PART, "KeyEncoder.update", key_encoder.update, model)
    matches_reference(PART, "key encoder after two steps with m 0.9", flat(key_encoder.encoder))
    queue = Queue(5, 3)
    for step, n in enumerate((3, 4, 2)):  # 9 keys: the pointer passes the end once
        labels = 10 * step + torch.arange(n)
        graded(PART, "Queue.enqueue", queue.enqueue, torch.randn(n, 3, generator=g), labels,
               100 + labels)
    for name in ("keys", "labels", "ids", "ptr"):
        matches_reference(PART, f"queue {name}", getattr(queue, name))
    bank = MemoryBank(6, 3)
    bank.fill(torch.randn(6, 3, generator=g), torch.arange(6), torch.arange(6))
    graded(PART, "MemoryBank.update", bank.update, torch.tensor([4, 1]),
           torch.randn(2, 3, generator=g), 0.7)
    matches_reference(PART, "bank keys after an update with m 0.7", bank.keys)
    model = StandIn()
    moco = MoCo(model, SimpleNamespace(name="sst"), "queue", 8, momentum=0.6)
    trained(model)
    x = torch.randn(3, 6, generator=g)
    keys = graded(PART, "MoCo.batch_keys", moco.batch_keys, model, {"x": x}, torch.arange(3))
    matches_reference(PART, "batch keys with m 0.6", keys)


def test_memory_runs_on_the_inputs_device():
    """Every piece of the memory with the model, the memory and the batch on a second device
    (tests/elsewhere.py): a tensor made without device= fails as on a GPU. Two steps of a queue
    of 5 (the second wraps round its end) and of a bank of 6, through MoCo as train.py calls it."""
    def steps(model, x, labels, rows):
        out = []
        for kind, size in (("queue", 5), ("bank", 6)):
            moco = MoCo(model, SimpleNamespace(name="sst"), kind, size, momentum=0.6)
            moco.memory.fill(F.normalize(x[:size, :4]), labels[:size], torch.arange(size))
            for step in (0, 1):
                b = slice(3 * step, 3 * step + 3)
                keys = moco.batch_keys(model, {"x": x[b]}, rows[b])
                moco.after_step(keys, labels[b], rows[b], model("sst", x[b]).z)
            out += [moco.memory.keys.flatten(), moco.memory.labels, moco.memory.ids]
            if kind == "queue":
                out += [moco.memory.ptr[None], flat(moco.key_encoder.encoder)]
        return torch.cat([t.to(x.dtype) for t in out])
    g = torch.Generator().manual_seed(3)
    check_on_second_device(PART, "MoCo's queue and memory bank, two steps each", steps,
                           {"x": torch.randn(6, 6, generator=g), "labels": torch.arange(6) % 2,
                            "rows": torch.tensor([4, 0, 2, 1, 5, 3])}, StandIn(), backward=False)


@pytest.fixture
def model(tiny_bert):
    torch.manual_seed(0)
    return Model(copy.deepcopy(tiny_bert), [SST], "mean")


def test_momentum_update_of_the_bert_model(model):
    """The same update on the tiny BERT model: every parameter, embeddings to head."""
    key_encoder = KeyEncoder(model, m=0.9)
    theta_k = flat(key_encoder.encoder)
    trained(model)
    graded(PART, "KeyEncoder.update", key_encoder.update, model)
    close(PART, flat(key_encoder.encoder), 0.9 * theta_k + 0.1 * flat(model),
          "the BERT key encoder's parameters after a momentum step with m = 0.9")


def test_key_encoder_gets_no_gradient_and_moves_only_by_momentum(model, tiny_bert_dir, data_dir):
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    train = load_split(get_task("sst"), "train", data_dir)
    moco = MoCo(model, SST, "queue", 16, momentum=0.5)
    moco.fill(model, tokenizer, train, labels_of(train), 8, torch.device("cpu"))
    objective = Objective("knnbert", 5, 32, m_most=2, m_least=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = train[:8]
    inputs, labels = encode_batch(tokenizer, batch), labels_of(batch)
    rows = torch.arange(8)
    keys = graded(PART, "MoCo.batch_keys", moco.batch_keys, model, inputs, rows)
    before = [p.clone() for p in moco.key_encoder.encoder.parameters()]
    loss, _ = objective(model("sst", **inputs), labels, keys, moco.memory, rows)
    loss.backward()
    optimizer.step()
    check(PART, not keys.requires_grad, "the batch keys carry gradients: they must not")
    encoder = moco.key_encoder.encoder
    assert all(not p.requires_grad and p.grad is None for p in encoder.parameters())
    assert any(p.grad is not None for p in model.parameters())
    for k, k0 in zip(encoder.parameters(), before):  # the optimiser step left it alone
        assert torch.equal(k, k0)
    graded(PART, "MoCo.after_step", moco.after_step, keys, labels, rows + 100, None)
    check(PART, moco.memory.ptr.item() == 8, f"a queue of 16 after its first batch of 8: ptr is "
          f"{moco.memory.ptr.item()}, expected 8")
    check(PART, torch.equal(moco.memory.labels[:8], labels)
          and torch.equal(moco.memory.ids[:8], rows + 100),
          "after the first step the queue's first 8 slots must hold the batch's labels and rows")


def test_fill_stores_the_key_encoders_unit_keys_with_true_labels(model, tiny_bert_dir, data_dir):
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    train = load_split(get_task("sst"), "train", data_dir)
    moco = MoCo(model, SST, "queue", 10)
    moco.fill(model, tokenizer, train, labels_of(train), 4, torch.device("cpu"))
    # the keys training makes
    expected = moco.key_encoder("sst", encode_batch(tokenizer, train[:10]))
    assert torch.allclose(moco.memory.keys, expected, atol=1e-5)
    assert moco.memory.labels.tolist() == [e.label for e in train[:10]]
    assert moco.memory.ids.tolist() == list(range(10))  # slot i: training example i
    assert torch.allclose(moco.memory.keys.norm(dim=1), torch.ones(10))
    assert moco.memory.ptr.item() == 0 and model.training


def test_bank_gives_each_example_its_own_entry(model, tiny_bert_dir, data_dir):
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    train = load_split(get_task("sst"), "train", data_dir)
    moco = MoCo(model, SST, "bank", len(train))
    moco.fill(model, tokenizer, train, labels_of(train), 8, torch.device("cpu"))
    rows = torch.tensor([3, 0, 7])
    assert moco.key_encoder is None and moco.memory.ids.tolist() == list(range(len(train)))
    assert torch.equal(moco.batch_keys(model, None, rows), moco.memory.keys[rows])
    queries = torch.randn(3, 32)
    expected = F.normalize(0.5 * moco.memory.keys[rows] + 0.5 * F.normalize(queries, dim=1), dim=1)
    graded(PART, "MoCo.after_step", moco.after_step, None, None, rows, queries)
    close(PART, moco.memory.keys[rows], expected,
          "the bank entries of a step's rows (moved towards its queries, m = 0.5)")


@pytest.mark.parametrize("loss_name", ["moco", "knnbert"])
@pytest.mark.parametrize("kind", ["queue", "bank"])
def test_train_step_leaves_each_querys_own_keys_out(model, tiny_bert_dir, data_dir, loss_name,
                                                    kind):
    """The whole training set in memory: every query's own older key (queue) or entry (bank) is
    there. train_step must hand the loss the batch's rows, and the loss must drop those keys;
    after the step, the batch joins the memory."""
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    train_set = load_split(get_task("sst"), "train", data_dir)
    moco = MoCo(model, SST, kind, len(train_set), momentum=0.5)
    moco.fill(model, tokenizer, train_set, labels_of(train_set), 8, torch.device("cpu"))
    flags = {"m_most": 2, "m_least": 2} if loss_name == "knnbert" else {}
    objective = Objective(loss_name, 5, 32, lam=1.0, **flags)
    losses = torch.nn.ModuleDict({"sst": objective})
    rows = torch.tensor([5, 0, 9, 3])
    batch = [train_set[i] for i in rows]
    inputs, labels = encode_batch(tokenizer, batch), labels_of(batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the step changes nothing we compare
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    memory_before = moco.memory.keys.clone()
    ptr_before = moco.memory.ptr.item() if kind == "queue" else None
    torch.manual_seed(1)
    trainer = SimpleNamespace(model=model, losses=losses, optimizer=optimizer, scheduler=scheduler,
                              params=list(model.parameters()), moco=moco, ddp=None, pcgrad=None,
                              rng=random.Random(0), args=SimpleNamespace(precision=None))
    task_losses, _, _ = train.train_step(trainer, {"sst": (inputs, labels, rows)})
    # the same step again by hand, with the same dropout, then the formula over every other
    # example's key
    torch.manual_seed(1)
    keys = moco.key_encoder("sst", inputs) if kind == "queue" else memory_before[rows]
    h = model("sst", **inputs).z.detach().double()
    others = [[j for j in range(len(train_set)) if j != row] for row in rows.tolist()]
    q = F.normalize(h, dim=1)
    expected = []
    for i, row in enumerate(rows.tolist()):
        s = q[i] @ memory_before[others[i]].double().T / objective.metric.temperature
        if loss_name == "moco":
            positive = q[i] @ keys[i].double() / objective.metric.temperature
            expected.append(torch.nn.functional.softplus(s.logsumexp(0) - positive))
        else:  # knnbert with at most 2 + 2 positives: all of another example's same-class keys
            same = labels_of(train_set)[others[i]] == labels[i]
            if not same.any():
                continue
            pos = s[same].sort(descending=True).values
            pos = pos if len(pos) <= 4 else torch.cat([pos[:2], pos[-2:]])
            expected.append(torch.nn.functional.softplus(s[~same].logsumexp(0) - pos).mean())
    loss_part = label("moco-loss" if loss_name == "moco" else "knnbert")
    close(PART, task_losses["sst"].double(), torch.stack(expected).mean(), f"the {loss_name} loss "
          f"of a training step over a {kind} (each query's own key left out; when the memory's "
          f"other tests pass, look at {loss_part})", rtol=1e-4, atol=1e-5)
    if kind == "queue":  # its keys take the 4 oldest slots (the same key may land on its own)
        took = (moco.memory.ptr.item() - ptr_before) % len(train_set)
        what = f"the queue's pointer moved {took} slots"
    else:
        took = (moco.memory.keys != memory_before).any(dim=1).sum().item()
        what = f"{took} of the bank's entries changed"
    check(PART, took == len(rows), f"over a training step {what}, not the batch's {len(rows)}: "
          "after the optimiser step, train.py's train_step hands the batch to "
          "trainer.moco.after_step (when after_step's own tests pass, look at that call)")
