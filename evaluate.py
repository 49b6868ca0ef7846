"""Evaluate a trained run: rebuild the model from its checkpoint alone and score a split.

    python evaluate.py --checkpoint runs/sst-ce-seed0                # dev accuracy and macro-F1
    python evaluate.py --checkpoint runs/sst-ce-seed0 --split test   # test-student: predictions only
    python evaluate.py --checkpoint runs/sst-proxyanchor-seed0 --proxy  # also proxy inference (minknn/proxy.py)
    python evaluate.py --checkpoint runs/sst-knnbert-seed0 --knn     # also kNN over the training set (minknn/knn.py)
    python evaluate.py --checkpoint runs/sst-knnbert-seed0 --knn --sweep   # phi and K tables (KNN-BERT Fig. 2)
    python evaluate.py --checkpoint runs/multitask-ce-seed0          # every task's metrics and the overall score

Writes the predictions to <run>/predictions-<split>.csv (id, predicted class index, class name);
with --proxy those of proxy inference to predictions-<split>-proxy.csv; with --knn those of the
mixed classifier to predictions-<split>-knn.csv and of kNN alone to predictions-<split>-knn-only.csv.
The kNN datastore is saved as <run>/datastore-<key>.pt and reused while the checkpoint, the key
and the training set are unchanged. A multi-task checkpoint (or one of a sentence-pair task) writes
one file per task, predictions-<split>-<task>.csv: id, predicted class index and name, or id and
predicted similarity.
"""
import argparse
import csv
import io
import json
import os
import time

from minknn import MinknnError, run
from minknn.checkpoint import atomic_save, load_checkpoint, rebuild
from minknn.data import get_task, load_split, training_examples
from minknn.engine import pick_device, predict
from minknn.knn import VOTES, Datastore, check_k, fingerprint, interpolate
from minknn.metrics import accuracy, macro_f1
from minknn.model import KNN_KEYS
from minknn.multitask import overall, predict_and_score
from minknn.proxy import check_has_proxies, proxy_logits

SWEEP_PHIS = [i / 10 for i in range(11)]
SWEEP_KS = [1, 4, 16, 64, 256, 1024]


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a run folder, or its checkpoint.pt")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    p.add_argument("--proxy", action="store_true", help="also score with proxy inference (proxy losses only)")
    p.add_argument("--proxy_alpha", type=float, default=0.5,
                   help="proxy inference: weight of the proxies' logits against the linear head's")
    p.add_argument("--knn", action="store_true", help="also classify by kNN over the training set, alone and mixed")
    p.add_argument("--k", type=int, default=64, help="kNN: neighbours per query")
    p.add_argument("--phi", type=float, default=0.25, help="kNN: s = (1 - phi) softmax(F(q)) + phi KNN(q)")
    p.add_argument("--vote", default="cosine", choices=list(VOTES), help="kNN: cosine (KNN-BERT) or distance (Liang et al.)")
    p.add_argument("--temperature", type=float, default=10.0, help="kNN, --vote distance: T in exp(-d / T)")
    p.add_argument("--knn_key", default=None, choices=KNN_KEYS,
                   help="kNN: the representation stored and searched (default: decoupled when the run has that head, else its --pooling)")
    p.add_argument("--sweep", action="store_true", help="kNN: score phi in 0, 0.1, ..., 1 and K in 1, 4, ..., 1024")
    p.add_argument("--datastore", default=None, help="kNN: datastore file (default: <run>/datastore-<key>.pt)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--data_dir", default=None, help="dataset root (default: $MINKNN_DATA, else ./data)")
    p.add_argument("--out", default=None, help="predictions CSV (default: <run>/predictions-<split>.csv)")
    args = p.parse_args(argv)
    for name in ("proxy_alpha", "phi"):
        if not 0 <= getattr(args, name) <= 1:
            p.error(f"--{name} must be in [0, 1], got {getattr(args, name)}")
    if args.k < 1:
        p.error(f"--k must be at least 1, got {args.k}")
    if args.temperature <= 0:
        p.error(f"--temperature must be positive, got {args.temperature}")
    if (args.sweep or args.knn_key or args.datastore) and not args.knn:
        p.error("--sweep, --knn_key and --datastore are kNN options; add --knn")
    return args


def write_csv(path, header, rows):
    def writer(rows, f):
        text = io.StringIO()
        w = csv.writer(text)
        w.writerow(header)
        w.writerows(rows)
        f.write(text.getvalue().encode())
    atomic_save(rows, path, writer)


def write_predictions(path, examples, pred, labels):
    write_csv(path, ["id", "prediction", "label"], [(e.id, int(p), labels[p]) for e, p in zip(examples, pred)])


def knn_datastore(args, ckpt, ckpt_file, model, tokenizer, task, key, device):
    """The training set's datastore: loaded from disk when still valid, else built and saved."""
    train = training_examples(task, args.data_dir, ckpt["args"].get("max_train"), ckpt["args"]["seed"])
    if not args.sweep:  # the sweep caps K at the datastore's size
        check_k(args.k, len(train), excluding_self=args.split == "train")
    stamp = fingerprint(ckpt_file, key, train)
    path = args.datastore or os.path.join(os.path.dirname(ckpt_file), f"datastore-{key}.pt")
    if os.path.exists(path):
        datastore = Datastore.load(path, stamp)
        if datastore is not None:
            print(f"datastore: {len(datastore)} keys ({key}) loaded from {path}")
            return datastore, None
        if args.datastore:
            raise MinknnError(f"--datastore {path} was built by a different checkpoint, key or training set; "
                              f"leave out --datastore to build one for this checkpoint")
        print(f"datastore: {path} is from an older checkpoint, key or training set; rebuilding it")
    start = time.time()
    _, keys = predict(model, tokenizer, train, args.batch_size, device, progress="datastore", key=key)
    datastore = Datastore(keys, [e.label for e in train], [e.id for e in train], len(task.labels))
    datastore.save(path, stamp)
    seconds = time.time() - start
    print(f"datastore: {len(datastore)} keys ({key}) built in {seconds:.1f} s, saved to {path}")
    return datastore, seconds


def knn_classify(datastore, queries, logits, exclude, args):
    """kNN alone (N, C), its mix with the linear head (N, C), and the seconds the search and vote took."""
    start = time.time()
    scores, rows = datastore.search(queries, args.k, args.vote, exclude)
    knn_probs = datastore.vote(scores, rows, args.vote, args.temperature)
    return knn_probs, interpolate(logits, knn_probs, args.phi), time.time() - start


def sweep(datastore, logits, queries, gold, exclude, args):
    """Accuracy and macro-F1 over phi (at --k) and over K (at --phi), from one search at the largest K."""
    most = len(datastore) - (exclude is not None)
    ks = sorted({min(k, most) for k in SWEEP_KS})
    scores, rows = datastore.search(queries, ks[-1], args.vote, exclude)

    def score(k, phi):
        knn_probs = datastore.vote(scores[:, :k], rows[:, :k], args.vote, args.temperature)
        pred = interpolate(logits, knn_probs, phi).argmax(1).numpy()
        return {"acc": accuracy(pred, gold), "macro_f1": macro_f1(pred, gold)}
    k = min(args.k, most)
    tables = {"phi": [{"phi": phi, "k": k, **score(k, phi)} for phi in SWEEP_PHIS],
              "k": [{"phi": args.phi, "k": kk, **score(kk, args.phi)} for kk in ks]}
    for name, fixed in (("phi", f"K = {k}"), ("k", f"phi = {args.phi}")):
        print(f"\n{'phi' if name == 'phi' else 'K':>5}  accuracy  macro-F1   ({fixed}, --vote {args.vote})")
        for r in tables[name]:
            print(f"{r[name]:>5}  {r['acc']:.4f}    {r['macro_f1']:.4f}")
    return tables


def evaluate_multitask(args, ckpt, ckpt_file, device):
    """Every task of a multi-task checkpoint: its metrics, the overall score and its predictions file."""
    if args.proxy or args.knn:
        raise MinknnError("--proxy and --knn are for single-task classification checkpoints; this one is multi-task")
    model, _, tokenizer = rebuild(ckpt)
    model.to(device)
    tasks = model.tasks
    splits = {t.name: load_split(t, args.split, args.data_dir) for t in tasks}
    results = predict_and_score(model, tokenizer, tasks, splits, args.batch_size, device, args.split)
    out = args.out or os.path.join(os.path.dirname(ckpt_file), f"predictions-{args.split}.csv")
    result = {"task": ckpt["task"], "split": args.split, "predictions": {}}
    for task in tasks:
        pred, scores = results[task.name]
        path = f"-{task.name}".join(os.path.splitext(out))
        if task.kind == "similarity":
            write_csv(path, ["id", "similarity"], [(e.id, f"{p:.4f}") for e, p in zip(splits[task.name], pred)])
        else:
            write_predictions(path, splits[task.name], pred, task.labels)
        result["predictions"][task.name] = path
        n = len(splits[task.name])
        if scores is None:
            print(f"{task.name} {args.split}: {n} examples have no labels; predictions in {path}")
            continue
        result[task.name] = scores
        metric = f"Pearson {scores['pearson']:.4f}" if "pearson" in scores else \
            f"accuracy {scores['acc']:.4f}, macro-F1 {scores['macro_f1']:.4f}"
        print(f"{task.name} {args.split}: {metric} on {n} examples; predictions in {path}")
    if all(results[t.name][1] is not None for t in tasks):
        result["overall"] = overall({t.name: results[t.name][1] for t in tasks})
        print(f"overall score: {result['overall']:.4f} (mean of the accuracies and (Pearson + 1) / 2)")
    return result


def main(argv=None):
    args = get_args(argv)
    ckpt = load_checkpoint(args.checkpoint)
    ckpt_file = os.path.join(args.checkpoint, "checkpoint.pt") if os.path.isdir(args.checkpoint) else args.checkpoint
    device = pick_device(args.device)
    if "tasks" in ckpt:
        return evaluate_multitask(args, ckpt, ckpt_file, device)
    task = get_task(ckpt["task"])
    if list(task.labels) != list(ckpt["labels"]):
        raise MinknnError(f"--checkpoint was trained on labels {ckpt['labels']}, but task {task.name} now has {task.labels}")
    model, objective, tokenizer = rebuild(ckpt)
    if args.proxy:
        check_has_proxies(objective, ckpt["args"]["loss"])
    key = args.knn_key or ("decoupled" if model.retrieval is not None else ckpt["args"]["pooling"])
    if args.knn and key == "decoupled" and model.retrieval is None:
        raise MinknnError("--knn_key decoupled: this checkpoint has no retrieval head (train it with --decoupled)")
    model.to(device)
    examples = load_split(task, args.split, args.data_dir)
    labelled = all(e.label is not None for e in examples)
    if args.sweep and not labelled:
        raise MinknnError(f"--sweep scores each phi and K, but the {args.split} split has no labels")

    if args.knn:  # the datastore first: its errors come before the slow encoding of the split
        datastore, build_seconds = knn_datastore(args, ckpt, ckpt_file, model, tokenizer, task, key, device)

    # one pass gives the logits and, with --knn, the queries in the datastore's representation
    start = time.time()
    logits, reps = predict(model, tokenizer, examples, args.batch_size, device, progress=args.split,
                           key=key if args.knn else None)
    encode_seconds = time.time() - start
    run_dir = os.path.dirname(ckpt_file)
    out = args.out or os.path.join(run_dir, f"predictions-{args.split}.csv")
    predictions = [("linear head", "", logits.argmax(-1).numpy(), out)]  # (name, result key prefix, classes, file)
    if args.proxy:  # proxies compare the pooled z; a --knn_key other than the run's pooling needs its own pass
        z = reps if not args.knn or key == ckpt["args"]["pooling"] else \
            predict(model, tokenizer, examples, args.batch_size, device, progress=f"{args.split} (z)")[1]
        mixed = proxy_logits(objective, logits, z, args.proxy_alpha)
        predictions.append((f"proxy inference (alpha {args.proxy_alpha})", "proxy_", mixed.argmax(-1).numpy(),
                            "-proxy".join(os.path.splitext(out))))

    result = {"task": task.name, "split": args.split, "n": len(examples), "predictions": out}
    if args.knn:
        queries = reps
        # the queries are training examples: leave each one's own entry out of its neighbours
        exclude = datastore.rows_of([e.id for e in examples]) if args.split == "train" else None
        knn_probs, mixed, knn_seconds = knn_classify(datastore, queries, logits, exclude, args)
        how = f"K {args.k}, --vote {args.vote}" + (f", T {args.temperature}" if args.vote == "distance" else "")
        predictions += [(f"kNN alone ({how}, key {key})", "knn_", knn_probs.argmax(1).numpy(), "-knn-only".join(os.path.splitext(out))),
                        (f"linear + kNN (phi {args.phi})", "mix_", mixed.argmax(1).numpy(), "-knn".join(os.path.splitext(out)))]
        result["timing"] = {"encode_ms_per_query": 1000 * encode_seconds / len(examples),
                            "knn_ms_per_query": 1000 * knn_seconds / len(examples),
                            "datastore_build_seconds": build_seconds, "datastore_size": len(datastore)}

    for name, prefix, pred, path in predictions:
        write_predictions(path, examples, pred, task.labels)
        if labelled:
            gold = [e.label for e in examples]
            result.update({prefix + "acc": accuracy(pred, gold), prefix + "macro_f1": macro_f1(pred, gold)})
            print(f"{task.name} {args.split}, {name}: accuracy {result[prefix + 'acc']:.4f}, "
                  f"macro-F1 {result[prefix + 'macro_f1']:.4f} on {len(examples)} examples; predictions in {path}")
        else:
            print(f"{task.name} {args.split}, {name}: {len(examples)} examples have no labels; predictions in {path}")
    if args.knn:
        t = result["timing"]
        print(f"time: encoder {t['encode_ms_per_query']:.2f} ms/query, kNN search and vote {t['knn_ms_per_query']:.3f} "
              f"ms/query (+{100 * t['knn_ms_per_query'] / t['encode_ms_per_query']:.1f}%) over {len(datastore)} keys on {device}")
    if args.sweep:
        result["sweep"] = sweep(datastore, logits, queries, [e.label for e in examples], exclude, args)
        path = os.path.join(run_dir, f"knn-sweep-{args.split}-{args.vote}-{key}.json")
        atomic_save(result["sweep"], path, lambda obj, f: f.write(json.dumps(obj, indent=1).encode()))
        print(f"\nsweep tables in {path}")
    return result


if __name__ == "__main__":
    run(main)
