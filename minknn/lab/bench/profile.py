"""`profile`: where a step of train.py goes. train.py's own train_step (shared.py's built and step)
on --steps real batches, three times over the same batches: once on shapes met for the first
time (on a GPU each new shape may load or plan kernels), once again (shapes already seen), and
once under torch.profiler, which counts the kernels launched, the synchronisations (a read of a
GPU value back to the CPU: a .item(), a .tolist(), a copy to the host) and each operator's time.
A step whose kernels take a small share of its wall time is bound by the CPU launching them, and
a faster kernel cannot help it (RESULTS.md, "How does minknn run on a GPU?").
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minknn.lab.bench.shared import Table, built, device_name, fixed_batches, precision_of, step
from minknn.tasks.data import load_split
from minknn.tasks.registry import get_task
from minknn.tools.step import batch

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def bench_profile(args, device, timer, out):
    task = get_task(args.task, args.data_dir)
    train = {task.name: load_split(task, "train", args.data_dir)}
    rows = fixed_batches(train, [task], args.batch_size, args.steps, args.seed)
    trainer = built(args, ["--task", task.name, "--batch_size", str(args.batch_size),
                           "--max_len", str(args.max_len), "--attention", args.attention],
                    train, device)
    steps = [batch(trainer, r) for r in rows]

    def run():
        for b in steps:
            step(trainer, b)
    fresh = timer.seconds(run, warmup=0) / len(steps)  # the first pass: every shape new
    seen = timer.seconds(run, warmup=0) / len(steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
        timer.sync()
    events = prof.key_averages()
    per_step = {what: sum(e.count for e in events if e.key in names) / len(steps)
                for what, names in (("launches", LAUNCHES), ("syncs", SYNCS))}
    cpu_ops = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
    kernels = sum(getattr(e, "self_device_time_total", 0) for e in events
                  if str(getattr(e, "device_type", "")).endswith("CUDA"))
    out.append(f"`python -m minknn.lab.bench profile`: {device_name(device)}, "
               f"{precision_of(device)}; train.py's train_step on {len(steps)} batches of "
               f"{args.batch_size} {task.name} training examples (--seed {args.seed}, --max_len "
               f"{args.max_len}, --attention {args.attention}), the same batches three times: "
               f"new shapes, seen shapes, profiled\n")
    print(out[-1])
    table = Table(out, "what", "per step")
    table.row("wall time, shapes met for the first time", f"{1000 * fresh:.1f} ms")
    table.row("wall time, shapes seen before", f"{1000 * seen:.1f} ms")
    table.row("PyTorch operators' own CPU time (profiled)", f"{cpu_ops / 1000 / len(steps):.1f} ms")
    if device.type == "cuda":
        table.row("GPU kernels' time (profiled)", f"{kernels / 1000 / len(steps):.2f} ms")
        table.row("kernel launches", f"{per_step['launches']:.0f}")
        table.row("synchronisations (the CPU waits for the GPU)", f"{per_step['syncs']:.1f}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))
