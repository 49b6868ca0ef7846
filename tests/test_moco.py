"""The MoCo memory: the queue's pointer, labels and example ids, the momentum update, the key
encoder's isolation from gradients, the memory bank's update, the fill before the first step, and
a training step that leaves each query's own older key out of the loss."""
import copy

import pytest
import torch
import torch.nn.functional as F

import train
from minknn.data import load_split
from minknn.engine import encode_batch
from minknn.losses import Objective
from minknn.model import Model
from minknn.moco import KeyEncoder, MemoryBank, MoCo, Queue
from minknn.tasks import get_task
from minknn.tokenizer import Tokenizer

SST = get_task("sst")


def labels_of(examples):
    return torch.tensor([e.label for e in examples])


def test_queue_wraps_around_first_in_first_out():
    queue = Queue(5, 2)
    queue.fill(torch.ones(5, 2), torch.full((5,), 9), torch.arange(5))
    for step, n in enumerate([3, 3, 1, 2]):  # 3 + 3 + 1 + 2 = 9 keys: the pointer passes the end once
        keys = torch.tensor([[10.0 * step + i, 1.0] for i in range(n)])
        labels = torch.tensor([10 * step + i for i in range(n)])
        queue.enqueue(keys, labels, 100 + labels)  # each key's example id travels with it
    # labels 0 1 2 | 10 11 12 | 20 | 30 31 go to slots 0 1 2 | 3 4 0 | 1 | 2 3
    assert queue.labels.tolist() == [12, 20, 30, 31, 11]
    assert queue.ids.tolist() == [112, 120, 130, 131, 111]
    assert queue.ptr.item() == 4
    assert torch.allclose(queue.keys, F.normalize(queue.labels[:, None] * torch.tensor([[1.0, 0.0]]) + torch.tensor([[0.0, 1.0]]), dim=1))


def test_a_batch_larger_than_the_queue_keeps_its_last_keys():
    queue = Queue(3, 2)
    queue.enqueue(torch.randn(7, 2), torch.arange(7), torch.arange(7))
    assert queue.labels.tolist() == queue.ids.tolist() == [4, 5, 6] and queue.ptr.item() == 0  # three keys written: one full turn


def test_queue_normalises_each_key_vector_not_each_dimension():
    queue = Queue(3, 2)
    keys = torch.tensor([[3.0, 4.0], [0.0, 0.5], [10.0, 0.0]])
    queue.enqueue(keys, torch.arange(3), torch.arange(3))
    assert torch.allclose(queue.keys, torch.tensor([[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]]))


def test_memory_bank_update_is_wu_et_al_momentum():
    bank = MemoryBank(4, 2)
    bank.fill(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]), torch.arange(4), torch.arange(4))
    before = bank.keys.clone()
    bank.update(torch.tensor([1, 3]), torch.tensor([[2.0, 0.0], [0.0, -3.0]]), m=0.5)
    expected = before.clone()
    expected[1] = F.normalize(0.5 * before[1] + 0.5 * torch.tensor([1.0, 0.0]), dim=0)
    expected[3] = F.normalize(0.5 * before[3] + 0.5 * torch.tensor([0.0, -1.0]), dim=0)
    assert torch.allclose(bank.keys, expected) and bank.labels.tolist() == [0, 1, 2, 3]


@pytest.fixture
def model(tiny_bert):
    torch.manual_seed(0)
    return Model(copy.deepcopy(tiny_bert), [SST], "mean")


def test_momentum_update_matches_the_formula(model):
    key_encoder = KeyEncoder(model, m=0.9)
    theta_k = [p.clone() for p in key_encoder.encoder.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    key_encoder.update(model)
    for k, k0, q in zip(key_encoder.encoder.parameters(), theta_k, model.parameters()):
        assert torch.allclose(k, 0.9 * k0 + 0.1 * q)


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
    keys = moco.batch_keys(model, inputs, rows)
    before = [p.clone() for p in moco.key_encoder.encoder.parameters()]
    loss, _ = objective(model("sst", **inputs), labels, keys, moco.memory, rows)
    loss.backward()
    optimizer.step()
    assert not keys.requires_grad
    assert all(not p.requires_grad and p.grad is None for p in moco.key_encoder.encoder.parameters())
    assert any(p.grad is not None for p in model.parameters())
    for k, k0 in zip(moco.key_encoder.encoder.parameters(), before):  # the optimiser step left it alone
        assert torch.equal(k, k0)
    moco.after_step(keys, labels, rows + 100, None)
    assert moco.memory.ptr.item() == 8 and torch.equal(moco.memory.labels[:8], labels)
    assert torch.equal(moco.memory.ids[:8], rows + 100)


def test_fill_stores_the_key_encoders_unit_keys_with_true_labels(model, tiny_bert_dir, data_dir):
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    train = load_split(get_task("sst"), "train", data_dir)
    moco = MoCo(model, SST, "queue", 10)
    moco.fill(model, tokenizer, train, labels_of(train), 4, torch.device("cpu"))
    expected = moco.key_encoder("sst", encode_batch(tokenizer, train[:10]))  # the keys training makes
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
    moco.after_step(None, None, rows, queries)
    assert torch.allclose(moco.memory.keys[rows], expected)


@pytest.mark.parametrize("loss_name", ["moco", "knnbert"])
@pytest.mark.parametrize("kind", ["queue", "bank"])
def test_train_step_leaves_each_querys_own_keys_out(model, tiny_bert_dir, data_dir, loss_name, kind):
    """The whole training set in memory: every query's own older key (queue) or entry (bank) is
    there. train_step must hand the loss the batch's rows, and the loss must drop those keys."""
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    train_set = load_split(get_task("sst"), "train", data_dir)
    moco = MoCo(model, SST, kind, len(train_set), momentum=0.5)
    moco.fill(model, tokenizer, train_set, labels_of(train_set), 8, torch.device("cpu"))
    objective = Objective(loss_name, 5, 32, lam=1.0, **({"m_most": 2, "m_least": 2} if loss_name == "knnbert" else {}))
    losses = torch.nn.ModuleDict({"sst": objective})
    rows = torch.tensor([5, 0, 9, 3])
    batch = [train_set[i] for i in rows]
    inputs, labels = encode_batch(tokenizer, batch), labels_of(batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the step changes nothing we compare
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    memory_before = moco.memory.keys.clone()
    torch.manual_seed(1)
    task_losses, _, _ = train.train_step(model, losses, optimizer, scheduler, list(model.parameters()),
                                         {"sst": (inputs, labels, rows)}, moco)
    # the same step again by hand, with the same dropout, then the formula over every other example's key
    torch.manual_seed(1)
    keys = moco.key_encoder("sst", inputs) if kind == "queue" else memory_before[rows]
    h = model("sst", **inputs).embeddings.detach().double()
    others = [[j for j in range(len(train_set)) if j != row] for row in rows.tolist()]
    q = F.normalize(h, dim=1)
    expected = []
    for i, row in enumerate(rows.tolist()):
        s = q[i] @ memory_before[others[i]].double().T / objective.metric.tau
        if loss_name == "moco":
            positive = q[i] @ keys[i].double() / objective.metric.tau
            expected.append(torch.nn.functional.softplus(s.logsumexp(0) - positive))
        else:  # knnbert with at most 2 + 2 positives: all of another example's same-class keys
            same = labels_of(train_set)[others[i]] == labels[i]
            if not same.any():
                continue
            pos = s[same].sort(descending=True).values
            pos = pos if len(pos) <= 4 else torch.cat([pos[:2], pos[-2:]])
            expected.append(torch.nn.functional.softplus(s[~same].logsumexp(0) - pos).mean())
    torch.testing.assert_close(task_losses["sst"].double(), torch.stack(expected).mean(), rtol=1e-4, atol=1e-5,
                               msg=f"{loss_name} over a {kind}: a query's own key is still in its loss")
