"""Evaluate a trained run: rebuild the model from its checkpoint alone and score a split.

    python evaluate.py --checkpoint runs/sst-ce-seed0                # dev accuracy and macro-F1
    python evaluate.py --checkpoint runs/sst-ce-seed0 --split test   # test-student: predictions only
    python evaluate.py --checkpoint runs/sst-proxyanchor-seed0 --proxy  # also proxy inference (minknn/proxy.py)

Writes the predictions to <run>/predictions-<split>.csv (id, predicted class index, class name),
and with --proxy those of proxy inference to <run>/predictions-<split>-proxy.csv.
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
from minknn.proxy import check_has_proxies, proxy_logits


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a run folder, or its checkpoint.pt")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    p.add_argument("--proxy", action="store_true", help="also score with proxy inference (proxy losses only)")
    p.add_argument("--proxy_alpha", type=float, default=0.5,
                   help="proxy inference: weight of the proxies' logits against the linear head's")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--data_dir", default=None, help="dataset root (default: $MINKNN_DATA, else ./data)")
    p.add_argument("--out", default=None, help="predictions CSV (default: <run>/predictions-<split>.csv)")
    args = p.parse_args(argv)
    if not 0 <= args.proxy_alpha <= 1:
        p.error(f"--proxy_alpha must be in [0, 1], got {args.proxy_alpha}")
    return args


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
    model, objective, tokenizer = rebuild(ckpt)
    if args.proxy:
        check_has_proxies(objective, ckpt["args"]["loss"])
    model.to(device)
    examples = load_split(task, args.split, args.data_dir)

    logits, embeddings = predict(model, tokenizer, examples, args.batch_size, device, progress=args.split)
    run = args.checkpoint if os.path.isdir(args.checkpoint) else os.path.dirname(args.checkpoint)
    out = args.out or os.path.join(run, f"predictions-{args.split}.csv")
    predictions = [("linear head", "", logits.argmax(-1).numpy(), out)]  # (name, result key prefix, classes, file)
    if args.proxy:
        mixed = proxy_logits(objective, logits, embeddings, args.proxy_alpha)
        predictions.append((f"proxy inference (alpha {args.proxy_alpha})", "proxy_", mixed.argmax(-1).numpy(),
                            "-proxy".join(os.path.splitext(out))))

    result = {"task": task.name, "split": args.split, "n": len(examples), "predictions": out}
    labelled = all(e.label is not None for e in examples)
    for name, prefix, pred, path in predictions:
        write_predictions(path, examples, pred, task.labels)
        if labelled:
            gold = [e.label for e in examples]
            result.update({prefix + "acc": accuracy(pred, gold), prefix + "macro_f1": macro_f1(pred, gold)})
            print(f"{task.name} {args.split}, {name}: accuracy {result[prefix + 'acc']:.4f}, "
                  f"macro-F1 {result[prefix + 'macro_f1']:.4f} on {len(examples)} examples; predictions in {path}")
        else:
            print(f"{task.name} {args.split}, {name}: {len(examples)} examples have no labels; predictions in {path}")
    return result


if __name__ == "__main__":
    run(main)
