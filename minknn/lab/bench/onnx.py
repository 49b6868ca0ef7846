"""What the exported classifier costs to run elsewhere. `onnx`: onnxruntime on the export's
onnx/classifier.onnx (python -m minknn.tools.export RUN OUT --onnx, minknn/tools/onnx_export.py)
against minknn's own prediction pass (engine.predict, the head rule, as evaluate.py and predict run
it), on the same texts, in one process, alternating. Both take the ids of the same tokenizer, in the
same batches (sorted by length, then cut), and give the head's probabilities; minknn skips the
padding inside its layers (minknn/packed.py), the traced graph cannot. Tokenising is in both
timings; the export itself is timed once, apart. The model is --model with a new head on z: what
is timed does not depend on what the head learned.
"""
import os
import tempfile
import time

import numpy as np
import torch

from minknn import MinknnError, backbones
from minknn.kinds import kind_of
from minknn.lab.bench.predict import texts_of
from minknn.lab.bench.shared import Table, device_name
from minknn.losses import build_losses
from minknn.model import Model
from minknn.tasks.data import Example
from minknn.tasks.registry import get_task
from minknn.tokenizer import Tokenizer
from minknn.tools.engine import batches_by_length, predict
from minknn.tools.onnx_export import check_onnx, onnx_inputs, write_onnx
from minknn.tools.weights import resolve_model_path


def ort_probabilities(session, tokenizer, texts, batch_size, inputs):
    """classifier.onnx's probabilities (N, C) in the texts' order: tokenised once, batches sorted
    by length (engine.predict's), padded to each batch's longest."""
    encodings = tokenizer.encode(texts)
    chunks, inverse = batches_by_length([len(ids) for ids, _ in encodings], batch_size)
    found = []
    for chunk in chunks:
        batch = tokenizer.pad([encodings[i] for i in chunk])
        found.append(session.run(None, {name: batch[name].numpy() for name in inputs})[0])
    return np.concatenate(found)[inverse.numpy()]


def bench_onnx(args, device, timer, out):
    try:
        check_onnx()
        import onnxruntime
    except ImportError as e:
        raise MinknnError(f"bench onnx needs onnxruntime ({e.name} is missing): pip install -e "
                          f"'.[test]'") from None
    if device.type != "cpu":
        raise MinknnError("bench onnx compares onnxruntime's CPU run with minknn's: --device cpu")
    task = get_task(args.task, args.data_dir)
    if task.kind != "classify" or task.pair:
        raise MinknnError(f"--task {task.name}: the texts here are a classification task's single "
                          f"sentences (sst, mr, ...)")
    folder = resolve_model_path(args.model)
    model = Model(backbones.from_pretrained(folder), [task], "mean").eval()
    losses = build_losses(model, {"loss": "ce", "sts_loss": "mse", "lam": None, "task": task.name,
                                  "tasks": [task.name], "decoupled": False})
    tokenizer = Tokenizer.from_folder(folder, max_len=args.max_len)
    texts = [t for t, _ in texts_of(task, args.data_dir, args.texts)]
    examples = [Example(text=t, id=str(i)) for i, t in enumerate(texts)]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_onnx(model, losses, args.max_len, tmp)
        export_seconds = time.perf_counter() - start
        model.bert.set_attention("fused")  # minknn's default again (the export sets explicit)
        session = onnxruntime.InferenceSession(os.path.join(tmp, "onnx", "classifier.onnx"),
                                               providers=["CPUExecutionProvider"])
        inputs = onnx_inputs(model.bert.config.model_type)

        def ours():
            with torch.inference_mode():
                logits = predict(model, tokenizer, task, examples, args.batch_size, device)[0]
            return kind_of(task).probabilities(logits).numpy()

        gap = np.abs(ours() - ort_probabilities(session, tokenizer, texts, args.batch_size,
                                                inputs)).max()
        lengths = [len(ids) for ids, _ in tokenizer.encode(texts)]
        out.append(f"`python -m minknn.lab.bench onnx`: {device_name(device)}, onnxruntime "
                   f"{onnxruntime.__version__} (its default threads); {args.model} with a new "
                   f"{task.name} head, --max_len {args.max_len}, batches of {args.batch_size}; "
                   f"the same {args.texts:,} {task.name} sentences ({np.mean(lengths):.0f} tokens "
                   f"on average), best of {args.rounds} alternating rounds; the export took "
                   f"{export_seconds:.0f} s, and the two agree within {gap:.1e}\n")
        print(out[-1])
        seconds = timer.best_of_rounds({
            "minknn": ours,
            "onnxruntime": lambda: ort_probabilities(session, tokenizer, texts, args.batch_size,
                                                     inputs)})
    rate = {k: args.texts / s for k, s in seconds.items()}
    table = Table(out, "the head's probabilities", "minknn (engine.predict)",
                  "onnxruntime (classifier.onnx)", "ratio")
    table.row(f"{args.texts:,} texts", f"{seconds['minknn']:.1f} s ({rate['minknn']:.0f} texts/s)",
              f"{seconds['onnxruntime']:.1f} s ({rate['onnxruntime']:.0f} texts/s)",
              f"{rate['onnxruntime'] / rate['minknn']:.2f}x minknn's throughput")
