"""What only a GPU can check: the CUDA path computes what the CPU path computes. Every test is
skipped, saying why, where PyTorch sees no CUDA device (the CPU suite's summary lists the skips);
on a GPU machine (../shared/GPU.md, .gpu/checklist.sh runs it first) it takes the tiny random
BERT and the fixture data, about half a minute (25 s here with the CPU standing in for the GPU).

- a forward and backward on CUDA in fp32 equal the CPU's (hidden states at real tokens, every
  parameter's gradient), padded and unpadded, with each --attention kernel;
- attention over the packed tokens (packed.packed_kernel's choice) runs where it should and equals
  the padded call: flash varlen in bf16 evaluation, nested tensors in fp32 and bf16 training;
- a bf16-autocast training step on CUDA is finite and its loss near the fp32 step's;
- a knnbert run built as train.py builds it keeps its queue and key encoder on the GPU, and its
  steps (loss, gradients, queue) equal the CPU's;
- a kNN datastore of keys encoded on CUDA finds the CPU's neighbours and votes the CPU's classes;
- PCGrad's surgery on CUDA equals the CPU's on the same gradients;
- a checkpoint trained on CUDA is evaluated by a process that sees no GPU, with CUDA's classes;
- torchrun with one NCCL process trains a knnbert run to its summary.

fp32 comparisons run with TF32 off (no_tf32 below: set for each test, restored after), so CUDA's
fp32 matmuls round as the CPU's do, and the tolerances are float rounding's: 1e-5 absolute and
1e-4 relative for activations and losses, gradients to 1e-5 of the largest gradient entry of any
weight plus 1e-4 relative (on the CPU, fp32 against fp64 missed these by under 1% of them).
Dropout is off where two runs are compared: the model in eval mode, or the tiny BERT copied
without dropout (test_ddp.py's bert_dir), so the two sides draw no random masks.
"""
import copy
import csv
import glob
import json
import os
import random
import subprocess
import sys

import pytest
import torch

import evaluate
import train
from helpers import DATA
from minknn import bert, packed
from minknn.bert import BertConfig, BertModel
from minknn.datastore import Datastore
from minknn.knn import VOTES, settings
from minknn.model import Model
from minknn.pcgrad import PCGrad
from minknn.tasks.data import load_split
from minknn.tasks.registry import TASKS
from minknn.tokenizer import Tokenizer
from minknn.tools import options
from minknn.tools.checkpoint import load_checkpoint, rebuild
from minknn.tools.engine import predict
from minknn.tools.step import batch
from minknn.tools.trainer import build, fill_memory
from test_ddp import bert_dir, torchrun  # noqa: F401 (bert_dir: a fixture, the tiny BERT without dropout)
from test_pcgrad import algorithm_1, conflicting

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: these tests run on a GPU machine (see ../shared/GPU.md / "
           ".gpu/checklist.sh)")

GPU, CPU = torch.device("cuda"), torch.device("cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN_TIMEOUT = 90  # seconds (the run takes about 15): a hung NCCL collective fails the test


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 matmuls (and cuDNN's) in true fp32, as on the CPU, for the test; then as they were."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def assert_near(got, want, what, rtol=1e-4, atol=1e-5):
    """got (CUDA's) against want (the CPU's), on the CPU: |got - want| <= atol + rtol |want|
    everywhere, else the worst entry is named, with both values and the miss."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, \
        f"{what}: shape {tuple(got.shape)} on CUDA, {tuple(want.shape)} on the CPU"
    if not torch.isfinite(got).all():
        where = tuple(int(i) for i in (~torch.isfinite(got)).nonzero()[0])
        assert False, f"{what}: not finite on CUDA at {where} ({got[where].item()})"
    over = (got - want).abs() - (atol + rtol * want.abs())
    if (over > 0).any():
        where = tuple(int(i) for i in torch.unravel_index(over.argmax(), got.shape))
        g, w = got[where].item(), want[where].item()
        at = f" at {where}" if where else ""
        assert False, (f"{what}:{at} CUDA gives {g:.8g}, the CPU {w:.8g}, off by {abs(g - w):.3g} "
                       f"(allowed {atol:.1g} + {rtol:.1g} x |cpu|); {int((over > 0).sum())} of "
                       f"{got.numel()} entries off")


def assert_same_weights(a, b, what):
    """Two models' (or modules') parameters and buffers equal to the bit, before they are compared:
    the two sides start from the same point."""
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x.cpu(), y.cpu()), f"{what}: {name} differs before the test starts"


# ---------------------------------------------------------------------------------------------
# 1. the encoder: forward and backward in fp32

def a_batch(vocab_size, lengths, T=16, seed=0):
    """(input_ids, attention_mask, token_type_ids) (B, T): row b has lengths[b] real tokens, the
    rest padding; each row's second half is segment 1, as a pair's."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    types = (torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids * mask, mask, types


@pytest.mark.parametrize("kernel", list(bert.ATTENTIONS))
@pytest.mark.parametrize("lengths", [(16, 9, 3, 1, 12), (16,) * 5], ids=["padded", "unpadded"])
def test_cuda_forward_and_backward_equal_the_cpus(tiny_bert_dir, kernel, lengths):
    """The tiny BERT (eval mode: no dropout) on one batch, on the CPU and on CUDA in fp32: the
    hidden states at the real tokens, the pooled output and every parameter's gradient of a loss
    that weighs each output entry by a fixed random number (so every weight gets a gradient)."""
    cpu = BertModel.from_pretrained(tiny_bert_dir).set_attention(kernel).eval()
    gpu = copy.deepcopy(cpu).to(GPU)
    inputs = a_batch(cpu.config.vocab_size, lengths)
    real = inputs[1].bool()
    g = torch.Generator().manual_seed(1)
    weigh = torch.randn(len(lengths), 16, cpu.config.hidden_size, generator=g) * real[..., None]
    weigh_pooled = torch.randn(len(lengths), cpu.config.hidden_size, generator=g)
    outputs = {}
    for side, model, device in (("cpu", cpu, CPU), ("cuda", gpu, GPU)):
        h, pooled = model(*(x.to(device) for x in inputs), pooled=True)
        ((h * weigh.to(device)).sum() + (pooled * weigh_pooled.to(device)).sum()).backward()
        outputs[side] = h, pooled
    case = f"--attention {kernel}, {'padded' if not real.all() else 'unpadded'} batch"
    (h_cpu, pooled_cpu), (h_gpu, pooled_gpu) = outputs["cpu"], outputs["cuda"]
    assert h_gpu.device.type == GPU.type, f"{case}: the hidden states came back on {h_gpu.device}"
    assert_near(h_gpu.cpu()[real], h_cpu[real], f"{case}: the hidden states at real tokens (N, H)")
    assert_near(pooled_gpu, pooled_cpu, f"{case}: the pooled output (B, H)")
    # the absolute tolerance a share of the largest gradient entry of any weight: the attention
    # key's bias has gradient 0 in exact arithmetic (softmax ignores a shift of a query's scores),
    # so its fp32 gradient is rounding noise, different on each device
    scale = max(p.grad.abs().max().item() for p in cpu.parameters() if p.grad is not None)
    for (name, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        assert (p.grad is None) == (q.grad is None), \
            f"{case}: {name} has a gradient on {'the CPU' if q.grad is None else 'CUDA'} only"
        if p.grad is not None:
            assert_near(q.grad, p.grad, f"{case}: the gradient of {name}", atol=1e-5 * scale)


# ---------------------------------------------------------------------------------------------
# attention over the packed tokens (packed.packed_kernel chooses; packed.packed_attention runs it)

def packed_model(dropout=0.0):
    """A small random BERT whose head size (16) flash attention takes (a multiple of 8)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=dropout)
    return BertModel(config).to(GPU)


def ragged_batch(lengths=(37, 5, 20, 1, 12)):
    """a_batch's ids and mask for packed_model, on the GPU: rows of very different lengths."""
    ids, mask, _ = a_batch(200, lengths, T=max(lengths), seed=1)
    return ids.to(GPU), mask.to(GPU)


@pytest.fixture
def kernels_run(monkeypatch):
    """The packed kernels that ran (packed.packed_attention's `how`, one a layer; bert.py calls it
    by the name it imported)."""
    ran = []
    written = packed.packed_attention
    monkeypatch.setattr(bert, "packed_attention", lambda how, *a: ran.append(how) or written(how, *a))
    return ran


def test_evaluation_in_bf16_runs_flash_varlen_and_matches_the_padded_call(kernels_run):
    """Evaluation (no dropout) under bf16 autocast: --attention packed runs flash attention over the
    packed tokens (torch.nn.attention.varlen where this torch has it, else nested tensors). Its
    error against the fp32 padded call must be no larger than the bf16 padded call's (twice it,
    plus 0.01: both round in bf16, differently)."""
    model = packed_model().eval()
    ids, mask = ragged_batch()
    real = mask.bool()
    with torch.inference_mode():
        want = model.set_attention("fused")(ids, mask)[real].float()
        got = {}
        for how in ("fused", "packed"):
            with torch.autocast(GPU.type, dtype=torch.bfloat16):
                got[how] = model.set_attention(how)(ids, mask)[real].float()
    expected = "varlen" if packed.varlen_kernel() is not None and GPU.type == "cuda" else "nested"
    assert kernels_run == [expected] * 2, (f"evaluation in bf16 ran the packed kernels {kernels_run}; "
                                           f"expected {expected!r} in each of 2 layers")
    err = {how: (g - want).abs().max().item() for how, g in got.items()}
    assert torch.isfinite(got["packed"]).all(), "non-finite hidden states from the packed kernel"
    assert err["packed"] <= 2 * err["fused"] + 1e-2, (
        f"{expected} attention in bf16 is {err['packed']:.3g} from the fp32 padded call at most, the "
        f"bf16 padded call {err['fused']:.3g}")


def test_training_in_fp32_runs_nested_tensors_equal_to_the_padded_call(kernels_run):
    """Training in fp32 (flash attention takes fp16 and bf16 only): nested jagged tensors, whose
    hidden states and every gradient must be the padded call's."""
    model = packed_model().train()
    ids, mask = ragged_batch()
    real = mask.bool()
    probe = torch.randn(64, generator=torch.Generator().manual_seed(2)).to(GPU)
    out = {}
    for how in ("fused", "packed"):
        model.set_attention(how).zero_grad()
        h = model(ids, mask)
        ((h * mask[..., None]).sum(1) @ probe).sum().backward()
        out[how] = h[real].detach().cpu(), {n: p.grad.cpu() for n, p in model.named_parameters()
                                            if p.grad is not None}
    assert kernels_run == ["nested"] * 2, f"fp32 training ran the packed kernels {kernels_run}"
    torch.testing.assert_close(out["packed"][0], out["fused"][0], atol=1e-5, rtol=1e-4,
                               msg=lambda m: f"nested attention: hidden states against the padded call: {m}")
    for name, g in out["fused"][1].items():
        torch.testing.assert_close(out["packed"][1][name], g, atol=1e-5, rtol=1e-3,
                                   msg=lambda m: f"nested attention: gradient of {name} against the padded "
                                   f"call: {m}")


def test_training_in_bf16_with_attention_dropout_runs_nested_tensors(kernels_run):
    """The training path of a real run: bf16 autocast and attention dropout (0.5 here, to see it).
    Finite loss and gradients, dropout active (two steps' outputs differ), each real token's
    output near the padded call's in expectation is not checked here (dropout draws differ)."""
    model = packed_model(dropout=0.5).train().set_attention("packed")
    ids, mask = ragged_batch()
    real = mask.bool()
    outs = []
    for _ in range(2):
        model.zero_grad()
        with torch.autocast(GPU.type, dtype=torch.bfloat16):
            h = model(ids, mask)
        loss = h[real].float().pow(2).mean()
        loss.backward()
        assert torch.isfinite(loss), f"loss {loss.item()}"
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, f"non-finite gradients in {bad}"
        outs.append(h[real].float())
    assert kernels_run == ["nested"] * 4, f"bf16 training with dropout ran the packed kernels {kernels_run}"
    assert not torch.equal(outs[0], outs[1]), "attention dropout 0.5: two training steps gave the same output"


# ---------------------------------------------------------------------------------------------
# runs built as train.py builds them (minknn/tools/trainer.py), stepped by train.py's own train_step

def built(bert_dir, device, *flags):
    """A run of sst on the fixture data built by minknn/tools/trainer.py's build, its memory filled as
    train.py's begin() fills it, the model in training mode (dropout: none in bert_dir)."""
    args = options.get_args(["--task", "sst", "--model", bert_dir, "--data_dir", DATA,
                             "--device", str(device), "--batch_size", "8", "--max_len", "32",
                             "--lr", "1e-3", *flags])
    trainer, _ = build(args, train.make_optimizer)
    if trainer.moco:
        fill_memory(trainer)
    trainer.model.train()
    return trainer


def step(trainer):
    """One train.py step on the next batch of the run's stream: (the rows, the loss, its terms)."""
    rows = {name: next(stream) for name, stream in trainer.streams.items()}
    losses, terms, _ = train.train_step(trainer, batch(trainer, rows))
    return rows["sst"], losses["sst"], terms["sst"]


def flat_grads(params):
    return torch.cat([p.grad.reshape(-1).cpu() for p in params if p.grad is not None])


# ---------------------------------------------------------------------------------------------
# 2. bf16 autocast

@pytest.mark.parametrize("kernel", list(bert.ATTENTIONS))
def test_a_bf16_step_on_cuda_is_finite_and_near_the_fp32_step(bert_dir, kernel):
    """One ce step on CUDA under --precision bf16 (engine.autocast, as train_step runs it) and one
    under fp32, from the same weights on the same batch: the encoder ran under bf16 autocast, the
    loss and every gradient are finite fp32, the loss within 0.01 + 1% of the fp32 step's, and the
    gradient's direction within cosine 0.999 of fp32's. (On the CPU's bf16, the tiny model's loss
    moved by 6e-4 at most and the cosine stayed above 0.9999.)"""
    runs = {p: built(bert_dir, GPU, "--precision", p, "--attention", kernel)
            for p in ("fp32", "bf16")}
    assert_same_weights(runs["fp32"].model, runs["bf16"].model, "the fp32 and bf16 runs")
    dtypes = []  # the autocast dtype while the bf16 run's encoder runs
    hook = runs["bf16"].model.bert.register_forward_hook(lambda *_: dtypes.append(
        torch.get_autocast_dtype(GPU.type) if torch.is_autocast_enabled(GPU.type)
        else torch.float32))
    try:
        (rows32, loss32, _), (rows16, loss16, _) = step(runs["fp32"]), step(runs["bf16"])
    finally:
        hook.remove()
    assert rows32 == rows16, f"the two runs drew other rows: {rows32} and {rows16}"
    assert dtypes == [torch.bfloat16], \
        f"--attention {kernel}: the bf16 run's encoder ran under {dtypes}, not bf16 autocast"
    assert loss16.dtype == torch.float32 and torch.isfinite(loss16), \
        f"--attention {kernel}: the bf16 step's loss is {loss16!r}"
    assert loss16.item() != loss32.item(), \
        f"--attention {kernel}: the bf16 loss is the fp32 loss to the bit: bf16 never ran"
    assert abs(loss16.item() - loss32.item()) <= 0.01 + 0.01 * abs(loss32.item()), \
        f"--attention {kernel}: the bf16 step's loss {loss16.item():.5f} is " \
        f"{abs(loss16.item() - loss32.item()):.4f} from the fp32 step's {loss32.item():.5f} " \
        f"(allowed 0.01 + 1%)"
    names = {id(p): n for n, p in runs["bf16"].model.named_parameters()}
    for p in runs["bf16"].params:
        assert p.dtype == torch.float32, f"bf16 step: the weight {names.get(id(p))} is {p.dtype}"
        assert p.grad is None or (p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()), \
            f"bf16 step: the gradient of {names.get(id(p))} is {p.grad.dtype} or not finite"
    g16, g32 = flat_grads(runs["bf16"].params), flat_grads(runs["fp32"].params)
    cosine = torch.nn.functional.cosine_similarity(g16.double(), g32.double(), dim=0).item()
    assert cosine >= 0.999, f"--attention {kernel}: the bf16 step's gradient (clipped) is at " \
                            f"cosine {cosine:.5f} to the fp32 step's (allowed >= 0.999)"


# ---------------------------------------------------------------------------------------------
# 3. the memory on the GPU, and knnbert's steps

def off_the_gpu(trainer):
    """The memory's buffers, the key encoder's parameters and buffers, and the model's and
    losses' parameters that are not on CUDA: [(name, device)]."""
    found = [(f"memory.{n}", t) for n, t in trainer.moco.memory.named_buffers()]
    if trainer.moco.key_encoder:
        encoder = trainer.moco.key_encoder.encoder
        found += [(f"key_encoder.{n}", t) for n, t in
                  [*encoder.named_parameters(), *encoder.named_buffers()]]
    found += [(n, t) for n, t in [*trainer.model.named_parameters(),
                                  *trainer.losses.named_parameters()]]
    return [(n, str(t.device)) for n, t in found if t.device.type != GPU.type]


@pytest.mark.parametrize("memory", ["queue", "bank"])
def test_a_knnbert_run_keeps_its_memory_on_the_gpu_and_steps_as_on_the_cpu(bert_dir, memory):
    """A knnbert run (fp32) built on CUDA: the memory's buffers and the key encoder on the GPU,
    after the fill and after two steps. The same run on the CPU: the same rows, and at each of
    two steps the loss and its terms to 1e-4 relative (the second after AdamW's first step);
    after the first step the (clipped) gradients, the memory's keys, labels and rows, and the key
    encoder's weights. (Not the weights after AdamW's step: a gradient that is rounding noise, as
    the attention key's bias has, still moves its weight by a share of lr, differently on each
    device; the next step's loss does not feel it.)"""
    flags = ("--loss", "knnbert", "--memory", memory, "--precision", "fp32")
    gpu, cpu = built(bert_dir, GPU, *flags), built(bert_dir, CPU, *flags)
    assert off_the_gpu(gpu) == [], f"--memory {memory}: after the fill, not on CUDA: " \
                                   f"{off_the_gpu(gpu)[:5]}"
    assert_same_weights(cpu.model, gpu.model, "the CPU and CUDA runs' models")
    assert_near(gpu.moco.memory.keys, cpu.moco.memory.keys, f"--memory {memory}: the filled keys")
    for n in (1, 2):
        (rows_gpu, loss_gpu, terms_gpu), (rows_cpu, loss_cpu, terms_cpu) = step(gpu), step(cpu)
        assert rows_gpu == rows_cpu, f"step {n}: CUDA's run drew rows {rows_gpu}, the CPU's " \
                                     f"{rows_cpu}"
        assert_near(loss_gpu, loss_cpu, f"--memory {memory}, step {n}: the loss", atol=1e-6)
        for term in terms_cpu:
            assert_near(terms_gpu[term], terms_cpu[term], f"--memory {memory}, step {n}: the "
                        f"{term} term", atol=1e-6)
        if n == 1:
            g_cpu = flat_grads(cpu.params)
            assert_near(flat_grads(gpu.params), g_cpu, f"--memory {memory}, step 1: the clipped "
                        f"gradients, flattened", atol=1e-5 * g_cpu.abs().max().item())
            for name, t in cpu.moco.memory.named_buffers():
                assert_near(getattr(gpu.moco.memory, name), t,
                            f"--memory {memory}, after step 1: the memory's {name}")
            if memory == "queue":
                for (name, p), q in zip(cpu.moco.key_encoder.encoder.named_parameters(),
                                        gpu.moco.key_encoder.encoder.parameters()):
                    assert_near(q, p, f"after step 1: the key encoder's {name}")
    assert off_the_gpu(gpu) == [], f"--memory {memory}: after two steps, not on CUDA: " \
                                   f"{off_the_gpu(gpu)[:5]}"


# ---------------------------------------------------------------------------------------------
# 4. the kNN datastore

def test_a_datastore_of_cuda_keys_votes_as_the_cpus(tiny_bert_dir):
    """sst's training set encoded on CUDA and on the CPU (fp32, mean pooling) into two
    datastores, searched with the dev set's queries of each side, K = 5, each vote: predict()
    hands faiss CPU tensors, the keys agree to float rounding, each query finds the CPU's K
    neighbours (unless the CPU's K-th and K+1-th are a near tie, within 1e-4), and the vote picks
    the CPU's class (unless the CPU's two best classes are within 1e-9)."""
    task, K = TASKS["sst"], 5
    train_set, dev = load_split(task, "train", DATA), load_split(task, "dev", DATA)
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, 32)
    torch.manual_seed(0)
    cpu = Model(BertModel.from_pretrained(tiny_bert_dir), [task], "mean").eval()
    gpu = copy.deepcopy(cpu).to(GPU)
    labels = torch.tensor([e.label for e in train_set])
    stores, queries = {}, {}
    for side, model, device in (("cpu", cpu, CPU), ("cuda", gpu, GPU)):
        _, keys = predict(model, tokenizer, task, train_set, 8, device, key="mean",
                          precision="fp32")
        _, queries[side] = predict(model, tokenizer, task, dev, 8, device, key="mean",
                                   precision="fp32")
        assert keys.device.type == queries[side].device.type == "cpu", \
            f"predict on {device} returned keys on {keys.device}: faiss reads CPU arrays only"
        stores[side] = Datastore(keys, labels, [e.id for e in train_set], len(task.labels))
    assert_near(torch.from_numpy(stores["cuda"].keys), torch.from_numpy(stores["cpu"].keys),
                "the datastore's keys (training set, mean pooling)")
    assert_near(queries["cuda"], queries["cpu"], "the dev queries")
    for vote in VOTES:
        temperature = settings("classify", vote=vote).temperature
        scores, rows = stores["cpu"].search(queries["cpu"], K + 1, vote)  # K+1: the gap after K
        scores_gpu, rows_gpu = stores["cuda"].search(queries["cuda"], K, vote)
        votes = stores["cpu"].vote(scores[:, :K], rows[:, :K], vote, temperature)
        votes_gpu = stores["cuda"].vote(scores_gpu, rows_gpu, vote, temperature)
        compared = 0  # the queries without a near tie at the K-th neighbour
        for q in range(len(dev)):
            tie = abs(scores[q, K - 1] - scores[q, K]).item() <= 1e-4 * max(1, abs(scores[q, K]))
            compared += not tie
            if set(rows[q, :K].tolist()) != set(rows_gpu[q].tolist()):
                assert tie, (f"--vote {vote}, dev query {q}: CUDA's keys give neighbours "
                             f"{rows_gpu[q].tolist()}, the CPU's {rows[q, :K].tolist()} (scores "
                             f"{scores[q].tolist()}: no near tie at the K-th)")
                continue
            top2 = votes[q].topk(2).values
            assert votes_gpu[q].argmax() == votes[q].argmax() or top2[0] - top2[1] <= 1e-9, \
                (f"--vote {vote}, dev query {q}: the same neighbours vote class "
                 f"{int(votes_gpu[q].argmax())} on CUDA's keys, {int(votes[q].argmax())} on the "
                 f"CPU's (votes {votes_gpu[q].tolist()} and {votes[q].tolist()})")
        # the fixture's duplicate texts tie exactly (3 of sst's 15 dev queries, on the CPU)
        assert compared >= len(dev) // 2, f"--vote {vote}: {len(dev) - compared} of {len(dev)} " \
                                          f"queries have a near tie at the K-th: the test is void"


# ---------------------------------------------------------------------------------------------
# 5. PCGrad

def test_pcgrad_on_cuda_equals_the_cpus():
    """Three tasks whose gradients on the shared weights are given (test_pcgrad.py's
    `conflicting`: task 0 conflicts with tasks 1 and 2), spread over three fp32 tensors of 2,096
    weights, each task with a head of its own: PCGrad.backward on CUDA keeps its gradient buffer
    on the GPU, counts the CPU's conflicts (some), and sets the shared .grad to the CPU's (1e-5
    relative and of the largest entry; fp32 missed fp64 on the CPU by 3e-7 of it) and to
    Algorithm 1 written out (test_pcgrad.py's oracle, 1e-4); each head keeps its own task's
    gradient."""
    shapes = [(32, 64), (32,), (16,)]  # a weight matrix, its bias, another vector: 2,096 weights
    P = sum(torch.Size(s).numel() for s in shapes)
    g = conflicting(3, K=3, P=P).float()  # (3, P)
    expected = torch.tensor(algorithm_1(g.double().tolist(), random.Random(7)))
    # the weights drawn once, on the CPU, then copied: CUDA's generator draws other numbers
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=generator) for s in shapes]
    results = {}
    for side, device in (("cpu", CPU), ("cuda", GPU)):
        shared = [t.to(device, copy=True).requires_grad_() for t in start]
        heads = [torch.ones((), device=device, requires_grad=True) for _ in range(3)]
        gk = g.to(device)
        losses = []
        for k in range(3):  # loss_k = head_k (g_k . theta): its gradient on theta is g_k
            theta = torch.cat([p.reshape(-1) for p in shared])
            losses.append(heads[k] * (gk[k] @ theta))
        pcgrad = PCGrad(shared)
        conflicts = pcgrad.backward(losses, random.Random(7))
        assert pcgrad.grads.device.type == device.type, \
            f"PCGrad on {device}: its gradient buffer is on {pcgrad.grads.device}"
        theta = torch.cat([p.detach().reshape(-1) for p in shared]).cpu()
        results[side] = (conflicts, torch.cat([p.grad.reshape(-1) for p in shared]).cpu(),
                         [h.grad.cpu() for h in heads], theta)
    (c_cpu, grad_cpu, _, theta), (c_gpu, grad_gpu, heads_gpu, _) = \
        results["cpu"], results["cuda"]
    assert c_cpu > 0, "the gradients were meant to conflict: the surgery had nothing to do"
    assert c_gpu == c_cpu, f"PCGrad counted {c_gpu} conflicting pairs on CUDA, {c_cpu} on the CPU"
    scale = grad_cpu.abs().max().item()
    assert_near(grad_gpu, grad_cpu, "the shared .grad after PCGrad (sum_i g_i^PC)",
                rtol=1e-5, atol=1e-5 * scale)
    assert_near(grad_gpu, expected, "the shared .grad against Algorithm 1 written out",
                atol=1e-4 * scale)
    for k in range(3):
        own = (g[k].double() @ theta.double()).float()  # d loss_k / d head_k = g_k . theta
        assert_near(heads_gpu[k], own, f"head {k}'s gradient (its own task's alone)",
                    atol=1e-4 * abs(own.item()))


# ---------------------------------------------------------------------------------------------
# 6. a checkpoint trained on CUDA, evaluated where there is no GPU

def predictions(path):
    """The prediction column of an evaluate.py predictions CSV, as ints."""
    return [int(row["prediction"]) for row in csv.DictReader(open(path))]


def test_a_checkpoint_trained_on_cuda_predicts_the_same_classes_on_a_cpu_only_machine(
        tiny_bert_dir, tmp_path):
    """train.py --device cuda (bf16 by default) for one epoch of knnbert; then evaluate.py --knn
    on CUDA in this process, and as a script in a process that sees no GPU (CUDA_VISIBLE_DEVICES
    empty) on the CPU, both in fp32: the CPU-only process loads the checkpoint (its weights and
    memory saved from the GPU) and predicts CUDA's classes on every dev example (unless the CPU's
    two best logits are within 1e-4), and its datastore's keys are CUDA's to 1e-5."""
    run = tmp_path / "run"
    summary = train.main(["--task", "sst", "--model", tiny_bert_dir, "--data_dir", DATA,
                          "--out", str(run), "--batch_size", "8", "--max_len", "32",
                          "--device", GPU.type, "--epochs", "1", "--loss", "knnbert"])
    assert summary["device"].startswith(GPU.type), f"train.py --device cuda ran on " \
                                                 f"{summary['device']}"
    ckpt = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["args"]["precision"] == "bf16", \
        f"a CUDA run's default precision is bf16, the checkpoint says {ckpt['args']['precision']}"
    common = ["--checkpoint", str(run), "--data_dir", DATA, "--precision", "fp32", "--knn",
              "--k", "8"]
    evaluate.main([*common, "--device", GPU.type, "--out", str(tmp_path / "cuda.csv"),
                   "--datastore", str(tmp_path / "datastore-cuda.pt")])
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "evaluate.py", *common, "--device", "cpu",
                           "--out", str(tmp_path / "cpu.csv"),
                           "--datastore", str(tmp_path / "datastore-cpu.pt")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, f"evaluate.py --device cpu without a visible GPU exited " \
                                 f"{done.returncode}:\n{done.stderr[-3000:]}"
    # the CPU's logits, for the margins of any disagreement
    model, _, tokenizer = rebuild(load_checkpoint(str(run)))
    dev = load_split(TASKS["sst"], "dev", DATA)
    logits, _ = predict(model, tokenizer, TASKS["sst"], dev, 64, CPU, precision="fp32")
    top2 = logits.topk(2, dim=1).values
    on_gpu, on_cpu = predictions(tmp_path / "cuda.csv"), predictions(tmp_path / "cpu.csv")
    assert len(on_gpu) == len(on_cpu) == len(dev), \
        f"{len(on_gpu)} predictions on CUDA, {len(on_cpu)} on the CPU, {len(dev)} dev examples"
    for i, (a, b) in enumerate(zip(on_gpu, on_cpu)):
        margin = (top2[i, 0] - top2[i, 1]).item()
        assert a == b or margin <= 1e-4, \
            f"dev example {i} ({dev[i].id}): class {a} on CUDA, {b} on the CPU-only process " \
            f"(the CPU's two best logits {margin:.3g} apart)"
    keys = {side: torch.load(tmp_path / f"datastore-{side}.pt", weights_only=True)["keys"]
            for side in ("cuda", "cpu")}
    assert_near(keys["cuda"], keys["cpu"], "the datastore's keys (evaluate.py --knn)")
    assert glob.glob(str(tmp_path / "cpu-knn*.csv")), \
        f"the CPU-only evaluate.py --knn wrote no kNN predictions: {os.listdir(tmp_path)}"


# ---------------------------------------------------------------------------------------------
# 7. torchrun, NCCL

# train.py, saying which backend its process group took (distributed.setup wrapped)
BACKEND_SAYING_TRAIN = '''import torch.distributed as dist
import minknn.tools.distributed as distributed
import train
from minknn.tools.cli import run

setup = distributed.setup


def said(device):
    joined = setup(device)
    print(f"process group: {dist.get_backend()} on {joined[2]}", flush=True)
    return joined


distributed.setup = said
run(train.main)
'''


def test_torchrun_with_one_nccl_process_trains_a_knnbert_run(bert_dir, tmp_path):
    """`torchrun --standalone --nproc_per_node 1 train.py --device cuda` of knnbert (its keys
    gathered through NCCL's all_gather even with one rank): the process group is NCCL's on
    cuda:0, the run ends with status 0 and writes its summary.json, on cuda:0, one epoch."""
    script, run = tmp_path / "train_saying.py", tmp_path / "run"
    script.write_text(BACKEND_SAYING_TRAIN)
    done = torchrun(["--task", "sst", "--loss", "knnbert", "--model", bert_dir, "--data_dir", DATA,
                     "--out", run, "--device", GPU.type, "--batch_size", "8", "--max_len", "32",
                     "--epochs", "1", "--max_eval", "8"], tmp_path, script=script,
                    timeout=TORCHRUN_TIMEOUT, processes=1)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, f"torchrun exit {done.returncode}; its stderr ends:\n{err[-3000:]}"
    assert "process group: nccl on cuda:0" in out, \
        f"the process group is not NCCL's on cuda:0; the run printed:\n{out[-2000:]}"
    assert (run / "summary.json").exists(), f"no summary.json in {run}: {os.listdir(run)}"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["device"], summary["epochs"]) == ("cuda:0", 1), \
        f"summary.json: device {summary['device']}, epochs {summary['epochs']} (want cuda:0, 1)"
