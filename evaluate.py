"""Evaluate a trained run: rebuild the model from its checkpoint alone and score a split.

    python evaluate.py --checkpoint runs/sst-ce-seed0                # dev accuracy and macro-F1
    python evaluate.py --checkpoint runs/sst-ce-seed0 --split test   # test-student: predictions only

Writes the predictions to <run>/predictions-<split>.csv (id, predicted class index, class name).
"""
import argparse
import csv
import io
import os

from minknn import MinknnError, run
from minknn.checkpoint import atomic_save, load_checkpoint, rebuild
from minknn.data import get_task, load_split
from minknn.engine import pick_device, predict
from minknn.metrics import accuracy, macro_f1


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a run folder, or its checkpoint.pt")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--data_dir", default=None, help="dataset root (default: $MINKNN_DATA, else ./data)")
    p.add_argument("--out", default=None, help="predictions CSV (default: <run>/predictions-<split>.csv)")
    return p.parse_args(argv)


def write_predictions(path, examples, pred, labels):
    def writer(rows, f):
        text = io.StringIO()
        w = csv.writer(text)
        w.writerow(["id", "prediction", "label"])
        w.writerows(rows)
        f.write(text.getvalue().encode())
    atomic_save([(e.id, int(p), labels[p]) for e, p in zip(examples, pred)], path, writer)


def main(argv=None):
    args = get_args(argv)
    ckpt = load_checkpoint(args.checkpoint)
    device = pick_device(args.device)
    task = get_task(ckpt["task"])
    if list(task.labels) != list(ckpt["labels"]):
        raise MinknnError(f"--checkpoint was trained on labels {ckpt['labels']}, but task {task.name} now has {task.labels}")
    model, _, tokenizer = rebuild(ckpt)
    model.to(device)
    examples = load_split(task, args.split, args.data_dir)

    logits, _ = predict(model, tokenizer, examples, args.batch_size, device, progress=args.split)
    pred = logits.argmax(-1).numpy()
    run = args.checkpoint if os.path.isdir(args.checkpoint) else os.path.dirname(args.checkpoint)
    out = args.out or os.path.join(run, f"predictions-{args.split}.csv")
    write_predictions(out, examples, pred, task.labels)

    result = {"task": task.name, "split": args.split, "n": len(examples), "predictions": out}
    if all(e.label is not None for e in examples):
        gold = [e.label for e in examples]
        result.update(acc=accuracy(pred, gold), macro_f1=macro_f1(pred, gold))
        print(f"{task.name} {args.split}: accuracy {result['acc']:.4f}, macro-F1 {result['macro_f1']:.4f} "
              f"on {len(examples)} examples; predictions in {out}")
    else:
        print(f"{task.name} {args.split}: {len(examples)} examples have no labels; predictions in {out}")
    return result


if __name__ == "__main__":
    run(main)
