"""Every inference rule on one trained cell of a grid (minknn/lab/runner.py), from one prediction pass
per split: the linear head, proxy inference at each alpha, kNN mixed and alone at each (K, phi),
and the probe (a logistic regression, minknn/probe.py, fit on the training set's z).
Each method's result line holds, for every value of its inference grid, the scores on the
selection split and on the test split (minknn/lab/report.py chooses on the first), plus what the
plots draw: the learning curve, the kNN sweep over phi x K, and for the first seed a 2-D map.
"""
import itertools
import os
import time

import torch

from minknn import MinknnError
from minknn import backbones
from minknn.checkpoint import load_checkpoint, rebuild
from minknn.data import eval_subset, examples_fingerprint
from minknn.engine import pick_device, predict
from minknn.kinds import kind_of, score
from minknn.datastore import Datastore
from minknn.inference import KnnSweep, probe_probabilities, rule_probabilities, scores_of
from minknn.knn import SWEEP_KS, SWEEP_PHIS, settings
from minknn.model import Model
from minknn.files import read_jsonl

MAP_POINTS = 300                                   # test examples in the 2-D map of a cell


def line_head(cell, method, ctx):
    return {"task": cell.task, "size": cell.size, "seed": cell.seed, "method": method.name,
            "label": method.label, "rule": method.rule, "cell": cell.name,
            "train_params": dict(cell.params), "select": ctx.select}


def score_cell(cell, methods, ctx, folder):
    """Every rule the methods ask for, on the selection and test examples, for each value of its
    inference grid: one prediction pass per split (and one over the training set for kNN)."""
    start = time.time()
    ckpt = load_checkpoint(os.path.join(folder, "checkpoint.pt"))
    device, precision = pick_device(ckpt["args"]["device"]), ckpt["args"]["precision"]
    model, losses, tokenizer = rebuild(ckpt)
    model.to(device)
    task, loss = model.tasks[cell.task], losses[cell.task]
    kind, batch = kind_of(task), 2 * ckpt["args"]["batch_size"]
    train_set = ctx.train_examples(cell)
    if examples_fingerprint(train_set) != ckpt["data"]["train_fingerprint"][cell.task]:
        raise MinknnError(f"{folder}: its run trained on other {cell.task} examples than the "
                          f"grid's draw (size {cell.size}, seed {cell.seed}); a --methods grid "
                          f"may not set the runner's own flags")
    selection, test, test_name = ctx.splits(cell.task, len(train_set))
    examples = {"select": selection, "test": test}
    outputs, z = {}, {}
    for split, ex in examples.items():
        outputs[split], z[split] = predict(model, tokenizer, task, ex, batch, device,
                                           precision=precision)
    gold = {split: kind.gold(task, ex) for split, ex in examples.items()}

    def scores(probabilities):  # {"select": {...}, "test": {...}}
        return {s: score(task, kind.decide(probabilities[s]), gold[s]) for s in examples}
    base = {s: kind.probabilities(outputs[s]) for s in examples}
    vectors = {}  # key -> the training set's vectors: one prediction pass each, shared by rules

    def training_vectors(key):
        if key not in vectors:
            vectors[key] = predict(model, tokenizer, task, train_set, batch, device, key=key,
                                   precision=precision)[1]
        return vectors[key]
    if any(m.rule.startswith("knn") for m in methods):
        key = model.knn_key()
        k_most = max([*SWEEP_KS, *(k for m in methods for k in m.rule_grid.get("k", []))])
        knn = knn_tables(task, model, tokenizer, train_set, training_vectors(key), examples, key,
                         z, base, batch, device, precision, k_most)
    records = read_jsonl(os.path.join(folder, "metrics.jsonl"))
    common = {"test_split": test_name, "n_train": len(train_set), "n_select": len(selection),
              "n_test": len(test), "best_epoch": ckpt["epoch"],
              "curve": [{"epoch": r["epoch"], "train_loss": r["train_loss"][cell.task],
                         "dev": r["dev"][cell.task]} for r in records],
              "seconds": {"train": round(sum(r["epoch_seconds"] for r in records), 1),
                          "evaluate": round(time.time() - start, 1)}}
    lines = []
    for method in methods:
        line = line_head(cell, method, ctx)
        if method.rule == "linear":
            grid = [{"params": {}, **scores(base)}]
        elif method.rule == "probe":  # the head refit: scikit-learn's LogisticRegression()
            if z["test"] is None:
                raise MinknnError(f"{task.name}: the probe rule fits a vector per example, and a "
                                  f"siamese pair has two; use --pair_mode cross")
            grid = [{"params": {}, **scores(probe_probabilities(
                task, train_set, training_vectors(model.pooling), z))}]
        elif method.rule == "proxy":  # p(c|x) = softmax((1 - alpha) F(z) + alpha s cos(z, P_c))
            grid = [{"params": {"alpha": alpha}, **scores({
                s: rule_probabilities("proxy", task, outputs[s], z[s], loss, alpha)
                for s in examples})} for alpha in method.rule_grid.get("alpha", [0.5])]
        else:  # s = (1 - phi) P(q) + phi KNN(q); knn-only: phi = 1
            default_k, default_phi = settings(task.kind)[:2]
            phis = method.rule_grid.get("phi", [default_phi]) if method.rule == "knn" else [1.0]
            grid = [{"params": {"k": min(k, len(train_set)), "phi": phi}, **knn["at"](k, phi)}
                    for k, phi in itertools.product(method.rule_grid.get("k", [default_k]), phis)]
            line["sweep"] = knn["sweep"]
        lines.append({**line, "grid": grid, **common})
    if cell.seed == ctx.seeds[0] and z["test"] is not None:  # a 2-D map, before and after
        lines[0]["map"] = representation_map(ctx, task, ckpt, tokenizer, test, z["test"], device,
                                             precision)
    return lines


def knn_tables(task, model, tokenizer, train_set, keys, examples, key, z, base, batch, device,
               precision, k_most):
    """The kNN scores at any (K <= k_most, phi) from one search per split at the largest K, over
    a datastore of the training set's keys: {"at": function (k, phi) -> {"select":, "test":},
    "sweep": the phi x K table}."""
    kind = kind_of(task)
    datastore = Datastore(keys, kind.targets(task, train_set, "cpu"), [e.id for e in train_set],
                          len(task.labels))
    queries = z if key == model.pooling else {
        s: predict(model, tokenizer, task, ex, batch, device, key=key, precision=precision)[1]
        for s, ex in examples.items()}
    sweeps = {s: KnnSweep(datastore, queries[s], settings(task.kind), k_most) for s in examples}
    gold = {s: kind.gold(task, ex) for s, ex in examples.items()}

    def at(k, phi):
        return {s: scores_of(task, sweeps[s].mixed(base[s], k, phi), gold[s]) for s in examples}
    sweep = [{"k": k, "phi": phi, **at(k, phi)} for k in sweeps["test"].ks() for phi in SWEEP_PHIS]
    return {"at": at, "sweep": sweep}


def representation_map(ctx, task, ckpt, tokenizer, test, z_after, device, precision):
    """PCA to 2-D (the top two principal directions, from an SVD of the centred vectors) of up to
    MAP_POINTS test representations, from the base model and from the trained one."""
    rows = eval_subset(list(range(len(test))), MAP_POINTS)
    sample = [test[i] for i in rows]

    def before():
        bert = backbones.from_pretrained(ckpt["args"]["model"])  # 'minilm' or a folder
        base = Model(bert, [task], ckpt["args"]["pooling"], ckpt["args"]["pair_mode"]).to(device)
        return predict(base, tokenizer, task, sample, 64, device, precision=precision)[1]
    z_before = ctx.cached(("before", task.name, len(test)), before)
    gold = kind_of(task).gold(task, sample)
    labels = [int(g) if gold.ndim == 1 else int(g.argmax()) for g in gold]
    return {"labels": labels, "label_names": list(task.labels),
            "before": pca_2d(z_before), "after": pca_2d(z_after[rows])}


def pca_2d(x):
    x = x.double() - x.double().mean(0)
    _, _, v = torch.linalg.svd(x, full_matrices=False)
    return [[round(a, 4), round(b, 4)] for a, b in (x @ v[:2].T).tolist()]
