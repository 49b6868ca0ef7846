"""Throughput of the hand-written BERT: training and inference examples/s, and model FLOPs utilisation.

    python bench.py                   # default weights, batch 32, lengths 64 and 128, CPU or CUDA
    python bench.py --device cpu --steps 5

For each sequence length it times
    train      a full step of the classifier: forward, cross-entropy, backward, AdamW update
    inference  a forward pass under torch.inference_mode()
on random token ids (no padding, so every position is real work). On CUDA both run under bf16
autocast, as train.py does; the CPU runs fp32.

MFU (model FLOPs utilisation, as nanoGPT reports it) = achieved FLOP/s / peak FLOP/s, with
    FLOPs per token, forward  = 2 N + 4 L T H     N: weights in matmuls (embeddings excluded)
    training                  = 3 x forward       (the backward pass costs twice the forward)
and the peak measured here: the best of a few large square matmuls in the same dtype.
If Hugging Face transformers is importable, the same steps run on its BertModel with the same
weights and inputs, and the ratio ours / reference (throughput) is printed (it is not a
dependency). The two models alternate over a few rounds and each keeps its best round: on a
shared 2-core machine one round's timing can move by 10-20%.
"""
import argparse
import time

import torch
import torch.nn as nn

from minknn import run
from minknn.bert import BertModel, resolve_model_path
from minknn.engine import autocast, pick_device
from minknn.model import Model
from minknn.tasks import TASKS


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats=1, warmup=1):
    """Seconds per call of fn(), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - start) / repeats


def peak_matmul_flops(device, dtype, repeats=5):
    n = 8192 if device.type == "cuda" else 2048  # large enough to reach the peak on either
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first one warms up
        sync(device)
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - t) / 4)
    return 2 * n ** 3 / best


def flops_per_token(config, T):
    H, L, I = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    N = L * (4 * H * H + 2 * H * I)  # Q, K, V, O projections and the two feed-forward matmuls per layer
    return 2 * N + 4 * L * T * H      # + Q K^T and (attention) V


class Reference(nn.Module):
    """Hugging Face's BertModel behind the same call signature as ours."""
    def __init__(self, path):
        super().__init__()
        import transformers
        self.hf = transformers.BertModel.from_pretrained(path, add_pooling_layer=False)
        self.config = self.hf.config

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return self.hf(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state


def time_steps(model, batch, labels, device, steps, train):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():
        if train:
            with autocast(device):
                loss = nn.functional.cross_entropy(model("sst", **batch).logits.float(), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        else:
            with torch.inference_mode(), autocast(device):
                model("sst", **batch)

    model.train(train)
    return timed(step, device, steps, warmup=2)


def main():
    p = argparse.ArgumentParser(description="throughput and MFU of the hand-written BERT")
    p.add_argument("--model", default="minilm")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--lengths", default="64,128")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds per model, alternating; the best counts")
    p.add_argument("--no_reference", action="store_true", help="skip the Hugging Face comparison")
    args = p.parse_args()
    device = pick_device(args.device)
    path = resolve_model_path(args.model)
    torch.manual_seed(0)

    sst = [TASKS["sst"]]  # a 5-class head, as on SST
    models = {"minknn": Model(BertModel.from_pretrained(path), sst, "mean")}
    if not args.no_reference:
        try:
            torch.manual_seed(0)
            models["reference"] = Model(Reference(path), sst, "mean")
            models["reference"].heads.load_state_dict(models["minknn"].heads.state_dict())
        except ImportError:
            print("transformers is not importable: no reference comparison")
    for m in models.values():
        m.to(device)

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = peak_matmul_flops(device, dtype)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; {dtype}; measured peak matmul {peak / 1e12:.3f} TFLOP/s; "
          f"batch {args.batch_size}; best of {args.rounds} rounds of {args.steps} timed steps, each after 2 warm-up steps")
    config = models["minknn"].bert.config
    print(f"{'length':>6} {'mode':>9} {'model':>9} {'examples/s':>10} {'MFU':>6} {'ratio':>6}")
    for T in [int(x) for x in args.lengths.split(",")]:
        g = torch.Generator().manual_seed(T)
        batch = {"input_ids": torch.randint(1000, config.vocab_size, (args.batch_size, T), generator=g).to(device),
                 "attention_mask": torch.ones(args.batch_size, T, dtype=torch.long, device=device),
                 "token_type_ids": torch.zeros(args.batch_size, T, dtype=torch.long, device=device)}
        labels = torch.randint(0, 5, (args.batch_size,), generator=g).to(device)
        for train in (True, False):
            flops = args.batch_size * T * flops_per_token(config, T) * (3 if train else 1)
            seconds = {label: float("inf") for label in models}
            for _ in range(args.rounds):  # alternate the models and keep each one's best round,
                for label, model in models.items():  # so that a noisy moment does not decide the ratio
                    seconds[label] = min(seconds[label], time_steps(model, batch, labels, device, args.steps, train))
            for label in models:
                ratio = f"{seconds['reference'] / seconds['minknn']:.2f}" if label == "reference" else ""
                print(f"{T:>6} {'train' if train else 'inference':>9} {label:>9} {args.batch_size / seconds[label]:>10.1f} "
                      f"{flops / seconds[label] / peak:>6.2f} {ratio:>6}", flush=True)


if __name__ == "__main__":
    run(main)
