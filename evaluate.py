"""Evaluate a trained run: rebuild the model from its checkpoint alone and score a split.

    python evaluate.py --checkpoint RUN                # RUN: a folder train.py wrote; dev scores
    python evaluate.py --checkpoint RUN --split test   # a labelled test split (sst5, rte, ...)
    python evaluate.py --checkpoint RUN --proxy        # and proxy inference (a proxy loss's run)
    python evaluate.py --checkpoint RUN --knn          # and kNN over the training set
    python evaluate.py --checkpoint RUN --knn --sweep  # the phi and K tables (KNN-BERT's Fig. 2)
    python evaluate.py --checkpoint RUN --knn --index hnsw   # an approximate faiss index

Each task of the run is predicted by the model and, with --proxy and --knn, by those rules too,
side by side (minknn/tools/inference.py); a multi-label run's --knn is Su et al.'s vote. Each rule's
predictions go to a CSV beside the run, the scores to predictions-<split>-metrics.json, each name
with the flags that change what is scored (predictions-dev-knn-k16-metrics.json: NAMED); --knn's
datastore of the run's own training examples is saved beside it and reused (minknn/datastore.py).
The run is loaded and every task's data read and checked before any encoding
(minknn/tools/inference.py load_run, read_task_data). The files and the data root: docs/runs.md; kNN
and its flags: docs/knn.md. The word-substitution attack: minknn/lab/attack.py.
"""
import os

from minknn.datastore import knn_settings, run_datastore
from minknn.index import INDEX_FLAGS
from minknn.kinds import describe, kind_of, overall, task_metrics
from minknn.knn import SWEEP_PHIS
from minknn.proxy import has_proxies
from minknn.tasks.data import data_root, labelled
from minknn.tools.cli import Parser, run
from minknn.tools.files import write_csv, write_json
from minknn.tools.inference import KnnSweep, load_run, read_task_data, rule_answers, scores_of
from minknn.tools.options import add_flags, add_rule_flags, add_run_flags, check_rule_flags

def make_parser(description=__doc__.split("\n")[0], rules=True):
    """The flags of a run's checkpoint, its data and the inference rules' settings (the attack's
    too); rules: with the choice of rules, --proxy, --knn and --sweep (evaluate.py's). The
    settings and the flags predict shares are minknn/tools/options.py's (add_run_flags,
    add_rule_flags)."""
    p = Parser(description=description)
    p.add_argument("--checkpoint", required=True, help="a run folder, or its checkpoint.pt")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test"], help="to score")
    if rules:
        add_flags(p, "max_eval", max_eval={"help": "score a fixed subset of N examples per task "
                                                   "(default: all)"})
    add_run_flags(p)
    p.add_argument("--out", help="predictions CSV (default: <run>/predictions-<split>.csv, "
                   "-max_eval<N> added with --max_eval; the other files beside it)")
    add_rule_flags(p, rules, sweep=rules)
    return p


DEFAULTS = vars(make_parser().parse_args(["--checkpoint", "RUN"]))  # each flag's default


def get_args(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    check_rule_flags(p, args, args.knn, ["max_eval"])
    return args


# An evaluation's files are named by the flags that change what it scores (docs/runs.md), so that
# evaluations with other flags never overwrite each other's: each rule's file by its own flags,
# the metrics by them all. --batch_size, --device, --precision and --attention change a prediction
# by float rounding at most: not named.
NAMED = {"proxy": ("proxy_alpha",), "knn": ("knn_key", "vote", "temperature", "k", "phi", "index",
                                            *INDEX_FLAGS["ivf"], *INDEX_FLAGS["hnsw"])}
CHOICES = ("knn_key", "vote", "index")  # named by their value alone: cls, distance, hnsw


def named(args, rule, leave_out=()):
    """The rule's part of a file name: the rule, then each of its flags given other than at its
    default, a choice as its value, a number as the flag and the value ('knn-distance-k16')."""
    parts = [rule]
    for flag in NAMED["knn" if rule.startswith("knn") else rule]:
        value = getattr(args, flag, None)
        if flag not in leave_out and value is not None and value != DEFAULTS.get(flag):
            parts.append(str(value) if flag in CHOICES else f"{flag}{value}")
    return "-".join(parts)


def predictions_base(args, ckpt):
    """The predictions files' path less its .csv: --out's, else <run>/predictions-<split>, and
    -max_eval<N> with --max_eval (the examples scored)."""
    if args.out:
        return os.path.splitext(args.out)[0]
    subset = f"-max_eval{args.max_eval}" if getattr(args, "max_eval", None) else ""
    return os.path.join(os.path.dirname(ckpt["file"]), f"predictions-{args.split}{subset}")


def metrics_path(args, ckpt):
    """The metrics file: the predictions' base, each rule asked for with its flags, -sweep."""
    rules = [named(args, rule) for rule in ("proxy", "knn") if getattr(args, rule)]
    sweep = ["sweep"] if args.sweep else []
    return "-".join([predictions_base(args, ckpt), *rules, *sweep, "metrics.json"])


def evaluate_task(args, ckpt, model, losses, tokenizer, task, device, examples, subset, train):
    """One task's predictions by every rule asked for, their files and, on labels, scores.
    train: the training set for --knn, None for no kNN."""
    several, knn, key = len(model.tasks) > 1, train is not None, model.knn_key(args.knn_key)
    base = predictions_base(args, ckpt) + (f"-{task.name}" if several else "")
    if knn:  # the datastore first: its errors come before the slow encoding of the split
        datastore, build_seconds, index_seconds = run_datastore(args, ckpt, model, tokenizer, task,
                                                                train, key, device, several)
    # minknn/tools/inference.py: one pass gives the outputs and the pooled z, or with --knn the
    # queries in the datastore's representation (the key's); a second gives z for --proxy where they
    # differ
    proxy = args.proxy and has_proxies(losses[task.name])
    wanted = ["model"] + ["proxy"] * proxy + ["knn-only", "knn"] * knn
    # the queries are training examples: leave each one's own entry out of its neighbours
    exclude = datastore.rows_of([e.id for e in examples]) if knn and args.split == "train" else None
    found, queries, _, seconds = rule_answers(
        model, tokenizer, task, examples, args, device, losses[task.name], wanted,
        datastore if knn else None, exclude, progress=f"{task.name} {args.split}")
    probabilities = found["model"]
    rules = [("model", "", probabilities, f"{base}.csv")]  # (name, prefix, probabilities, file)
    result = {"n": len(examples), "predictions": f"{base}.csv"}
    if proxy:
        rules.append((f"proxy inference (alpha {args.proxy_alpha})", "proxy_", found["proxy"],
                      f"{base}-{named(args, 'proxy')}.csv"))
        result["proxy_alpha"] = args.proxy_alpha
    if knn:
        s = knn_settings(args, task)
        result["knn"] = {**s._asdict(), "key": key, "index": datastore.settings}
        how = f"K {s.k}, --vote {s.vote}{f', T {s.temperature}' if s.vote != 'cosine' else ''}"
        rules += [(f"kNN alone ({how}, key {key})", "knn_", found["knn-only"],
                   f"{base}-{named(args, 'knn-only', leave_out=['phi'])}.csv"),
                  (f"model + kNN (phi {s.phi})", "mix_", found["knn"],
                   f"{base}-{named(args, 'knn')}.csv")]
        result["timing"] = {"encode_ms_per_query": 1000 * seconds["encode"] / len(examples),
                            "knn_ms_per_query": 1000 * seconds["knn"] / len(examples),
                            "datastore_build_seconds": build_seconds,
                            "index_build_seconds": index_seconds,
                            "datastore_size": len(datastore)}
    elif args.knn:
        print(f"{task.name}: no kNN for a {task.kind} task"
              f"{' of siamese pairs' if model.siamese(task) else ''}")
    gold = write_rules(args, task, examples, subset, rules, result)
    if knn:
        t = result["timing"]
        share = 100 * t["knn_ms_per_query"] / t["encode_ms_per_query"]
        print(f"time: encoder {t['encode_ms_per_query']:.2f} ms/query, kNN search and vote "
              f"{t['knn_ms_per_query']:.3f} ms/query (+{share:.1f}%) over {len(datastore)} keys")
    if args.sweep and knn:
        result["sweep"] = sweep(task, KnnSweep(datastore, queries, s, exclude=exclude),
                                probabilities, gold, s)
        path = f"{base}-{named(args, 'knn')}-sweep.json"
        write_json(path, result["sweep"])
        print(f"\nsweep tables in {path}")
    return result


def write_rules(args, task, examples, subset, rules, result):
    """Each rule's predictions file and, where the split has labels, its scores (into result,
    each metric's name after the rule's prefix) and line. Returns the gold answers, or None."""
    kind = kind_of(task)
    gold = kind.gold(task, examples) if labelled(examples) else None
    for name, prefix, probs, path in rules:
        pred = kind.decide(probs)
        write_csv(path, *kind.rows(task, examples, pred))
        if gold is None:
            print(f"{task.name} {args.split}, {name}: {len(examples)} examples have no labels; "
                  f"predictions in {path}")
            continue
        scores = scores_of(task, probs, gold)
        result.update({prefix + metric: value for metric, value in scores.items()})
        print(f"{task.name} {args.split}, {name}: {describe(scores)} on {len(examples)} "
              f"examples{subset}; predictions in {path}")
    return gold


def sweep(task, knn, probabilities, gold, s):
    """The task's scores over phi (at K) and over K (at phi), printed as two tables; knn: a
    KnnSweep of the queries (one search at the largest K); s: the run's kNN settings."""
    k = min(s.k, knn.most)
    tables = {"phi": [{"phi": pp, "k": k, **scores_of(task, knn.mixed(probabilities, k, pp), gold)}
                      for pp in SWEEP_PHIS],
              "k": [{"phi": s.phi, "k": kk, **scores_of(task, knn.mixed(probabilities, kk, s.phi),
                                                       gold)} for kk in knn.ks()]}
    metrics = task_metrics(task)
    for name, fixed in (("phi", f"K = {k}"), ("k", f"phi = {s.phi}")):
        print(f"\n{'phi' if name == 'phi' else 'K':>5}  {'  '.join(f'{m:>8}' for m in metrics)}"
              f"   ({task.name}, {fixed}, --vote {s.vote})")
        for r in tables[name]:
            print(f"{r[name]:>5}  {'  '.join(f'{r[m]:8.4f}' for m in metrics)}")
    return tables


def main(argv=None):
    args = get_args(argv)
    # minknn/tools/inference.py: the parts it runs written (a student edition), the checkpoint's run
    # rebuilt, the rules asked for checked against it
    ckpt, model, losses, tokenizer, tasks, knn_tasks, device = load_run(
        args, args.proxy, args.knn, lambda ckpt: predictions_base(args, ckpt))
    # every task's data first: a bad file or another training set stops before any encoding
    data = {t.name: read_task_data(args, ckpt, t, t in knn_tasks, args.max_eval) for t in tasks}
    result = {"checkpoint": ckpt["file"], "epoch": ckpt["epoch"], "split": args.split,
              "data_root": os.path.abspath(data_root(args.data_dir)), "max_eval": args.max_eval}
    for task in tasks:
        result[task.name] = evaluate_task(args, ckpt, model, losses, tokenizer, task, device,
                                          *data[task.name])
    if len(tasks) > 1 and all(task_metrics(t)[0] in result[t.name] for t in tasks):
        result["overall"] = overall(tasks, {t.name: result[t.name] for t in tasks})
        print(f"overall score: {result['overall']:.4f} (the mean of the tasks' first scores, "
              f"each in [0, 1])")
    path = metrics_path(args, ckpt)
    write_json(path, result)
    print(f"metrics in {path}")
    return result


if __name__ == "__main__":
    run(main)
