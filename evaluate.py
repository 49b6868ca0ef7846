"""Evaluate a trained run: rebuild the model from its checkpoint alone and score a split.

    python evaluate.py --checkpoint RUN                # RUN: a folder train.py wrote; dev scores
    python evaluate.py --checkpoint RUN --split test   # a labelled test split (sst5, rte, ...)
    python evaluate.py --checkpoint RUN --proxy        # and proxy inference (a proxy loss's run)
    python evaluate.py --checkpoint RUN --knn          # and kNN over the training set
    python evaluate.py --checkpoint RUN --knn --sweep  # the phi and K tables (KNN-BERT's Fig. 2)
    python evaluate.py --checkpoint RUN --knn --index hnsw   # an approximate faiss index
    python evaluate.py --checkpoint RUN --split test --attack knn --phi 0.5  # a word-swap attack
A multi-label run's --knn is Su et al.'s vote; a multi-task run's scores are every task's and
the overall score.

Data: --data_dir, else $MINKNN_DATA, else the data root the run trained on (its checkpoint
records it), else ./data. The checkpoint also records a fingerprint of each task's training
examples: --knn builds its datastore only from examples with that fingerprint, so a datastore
never holds other examples than the run's. Every task's data is read and checked before any
encoding.

Every checkpoint takes one path: each task of the run is predicted by the model and, with
--proxy (tasks trained with a proxy loss) and --knn (classification and multi-label tasks), by
those rules too, side by side. Each rule's predictions go to <run>/predictions-<split>.csv (the
model), -proxy.csv, -knn.csv (the model mixed with kNN) and -knn-only.csv; in a run of several
tasks the file names carry the task's: predictions-<split>-<task>.csv. A file's columns are the
example's id, the prediction (classify and multilabel: prediction, prediction_name; similarity:
similarity) and, where the split has labels, the gold answer in the same form (gold, gold_name;
similarity: gold). The metrics go to <run>/predictions-<split>-metrics.json (beside --out's file
when given): the checkpoint, its epoch, the split, the data root, --max_eval, and per task its n,
every rule's scores (acc: the model's, proxy_acc: proxy inference's, knn_acc: kNN alone's,
mix_acc: the model mixed with kNN; likewise for each metric), proxy_alpha, the kNN settings (k,
phi, vote, temperature, key, the faiss index and its parameters) and timings. The kNN datastore
is saved as <run>/datastore-<key>.pt (datastore-<task>-<key>.pt) and reused while the checkpoint,
the key and the training set are unchanged. An approximate index (--index ivf or hnsw) is saved
in it once built; a datastore saved with another index (or other --nlist, --hnsw_m,
--ef_construction) gets the asked-for one built over its saved keys, or with --datastore is
refused. --nprobe and --ef_search only steer the search: changing them rebuilds nothing.
--attack RULE attacks one rule (model, proxy, knn at --phi, knn-only) with minknn/lab/attack.py, a
word-substitution attack in TextFooler's shape, on a fixed draw of --attack_n labelled examples of
--split (the same draw for every run), each cut to the words that fit the run's --max_len. Every
attacked example is a row of <run>/attack-<split>-<candidates>-<rule>.csv (--out to name it),
written as it ends, so a killed attack resumes where it stopped, and a rerun with another
--attack_n attacks only the drawn examples the file lacks (IMDB's draw of 300 holds its draw of
60); the summary (TextAttack's figures over the drawn examples, and the seconds this call took)
goes beside it, in its .json. The meaning encoder, and the candidates' embedding table, are
--attack_encoder's (default all-MiniLM-L6-v2 as pretrained), never the attacked model;
--attack_candidates wordnet takes WordNet's synonyms instead (Debian's wordnet-base).
A checkpoint or datastore whose contents no longer match the checksum saved with them (damaged on
disk), or a datastore whose keys or labels do not fit the model and the task, is refused in one
line.
"""
import csv
import dataclasses
import io
import json
import math
import os
import time

from minknn import MinknnError
from minknn.cli import run
from minknn.parts import require_written
from minknn.lab.attack import (Neighbours, Settings, Synonyms, cut_to_fit, read_wordnet, run_attack,
                           sentence_encoder)
from minknn.bert import ATTENTION, ATTENTIONS
from minknn.checkpoint import load_checkpoint, rebuild
from minknn.files import atomic_save
from minknn.data import (Example, data_root, eval_subset, examples_fingerprint, labelled,
                         load_split, source_paths, split_recipe, training_examples)
from minknn.engine import PRECISIONS, pick_device, predict
from minknn.kinds import describe, kind_of, overall, score, task_metrics
from minknn.index import (INDEX_DEFAULTS, INDEX_FLAGS, INDEXES, built_with, describe_index,
                          index_settings)
from minknn.datastore import Datastore, fingerprint
from minknn.knn import KNN_DEFAULTS, SWEEP_KS, SWEEP_PHIS, VOTES, check_k, interpolate, settings
from minknn.model import KNN_KEYS
from minknn.cli import Parser
from minknn.proxy import PROXY_LOSSES, has_proxies, proxy_logits
from minknn.runs import make_folder
from minknn.files import write_json


ATTACK_RULES = ("model", "proxy", "knn", "knn-only")


def get_args(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="a run folder, or its checkpoint.pt")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test"], help="to score")
    p.add_argument("--max_eval", type=int, help="score a fixed subset of N examples per task "
                   "(default: all)")
    p.add_argument("--batch_size", type=int, default=64, help="examples per prediction batch")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu or cuda")
    p.add_argument("--precision", choices=PRECISIONS, help="bf16 autocast or plain fp32 "
                   "(default: bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--attention", default=ATTENTION, choices=ATTENTIONS,
                   help="attention() as written in minknn/bert.py, or PyTorch's fused kernel")
    p.add_argument("--data_dir", help="dataset root (default: $MINKNN_DATA, else the run's, "
                   "else ./data)")
    p.add_argument("--out", help="predictions CSV (default: <run>/predictions-<split>.csv)")
    g = p.add_argument_group("proxy inference")
    g.add_argument("--proxy", action="store_true", help="also score with proxy inference")
    g.add_argument("--proxy_alpha", type=float, default=0.5, help="the proxies' weight against "
                   "the linear head's")
    g = p.add_argument_group("kNN")
    g.add_argument("--knn", action="store_true", help="also classify by kNN, alone and mixed")
    g.add_argument("--k", type=int, help="neighbours per query (default: 64; multi-label 5)")
    g.add_argument("--phi", type=float, help="s = (1 - phi) P(q) + phi KNN(q) "
                   "(default: 0.25; multi-label 0.5)")
    g.add_argument("--vote", choices=list(VOTES), help="cosine (KNN-BERT), distance (Liang et "
                   "al.) or euclidean (Su et al.) (default: cosine; multi-label euclidean)")
    g.add_argument("--temperature", type=float, help="T of the distance and euclidean votes "
                   "(default: 10 and 1)")
    g.add_argument("--knn_key", choices=KNN_KEYS, help="the representation stored and searched "
                   "(default: the decoupled head's, else the run's --pooling)")
    g.add_argument("--sweep", action="store_true", help="phi 0, 0.1, .., 1 and K 1, 2, 4, .., 1024")
    g.add_argument("--datastore", help="datastore file (default: <run>/datastore-<key>.pt)")
    g.add_argument("--index", choices=INDEXES, help="faiss index: flat (exact), ivf or hnsw "
                   "(approximate; minknn/index.py) (default: flat)")
    ivf, hnsw = INDEX_DEFAULTS["ivf"], INDEX_DEFAULTS["hnsw"]
    g.add_argument("--nlist", type=int, help="ivf: k-means cells (default: "
                   f"{ivf['nlist_per_sqrt_n']} sqrt(N), at least 39 keys a cell)")
    g.add_argument("--nprobe", type=int, help="ivf: cells searched per query (default: "
                   f"{ivf['nprobe']})")
    g.add_argument("--hnsw_m", type=int, help=f"hnsw: links per key (default: {hnsw['hnsw_m']})")
    g.add_argument("--ef_construction", type=int, help="hnsw: candidates kept while building "
                   f"(default: {hnsw['ef_construction']})")
    g.add_argument("--ef_search", type=int, help="hnsw: candidates kept per query, raised to K "
                   f"(K + 1 on --split train) when smaller (default: {hnsw['ef_search']})")
    g = p.add_argument_group("attack (minknn/lab/attack.py)")
    g.add_argument("--attack", choices=ATTACK_RULES, help="attack this rule's predictions with "
                   "word substitutions: the model (its head), proxy inference, the model mixed "
                   "with kNN at --phi, or kNN alone")
    g.add_argument("--attack_n", type=int, help="examples attacked, a fixed draw (default: 300)")
    g.add_argument("--attack_queries", type=int, help="query budget per example (default: none)")
    g.add_argument("--attack_candidates", choices=["embedding", "wordnet"], help="each word's "
                   "substitutes: the nearest words of --attack_encoder's input embedding table, or "
                   "WordNet's synonyms ($WNSEARCHDIR, else /usr/share/wordnet: Debian's "
                   "wordnet-base) (default: embedding)")
    g.add_argument("--attack_encoder", help="the sentence encoder of the meaning constraint and "
                   "the candidates' embedding table: 'minilm' or a model folder (default: minilm)")
    args = p.parse_args(argv)
    args.knn = args.knn or args.attack in ("knn", "knn-only")
    args.proxy = args.proxy or args.attack == "proxy"
    for name in ("proxy_alpha", "phi"):
        if getattr(args, name) is not None and not 0 <= getattr(args, name) <= 1:
            p.error(f"--{name} must be in [0, 1], got {getattr(args, name)}")
    for name in ("k", "max_eval", "batch_size", "attack_n", "attack_queries",
                 *INDEX_FLAGS["ivf"], *INDEX_FLAGS["hnsw"]):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    t = args.temperature
    if t is not None and not (math.isfinite(t) and t > 0):
        p.error(f"--temperature must be a finite number > 0, got {t}")
    knn_only = [f"--{n}" for n in ("k", "phi", "vote", "temperature", "knn_key", "datastore",
                                   "sweep", "index", *INDEX_FLAGS["ivf"], *INDEX_FLAGS["hnsw"])
                if getattr(args, n) not in (None, False)]
    if knn_only and not args.knn:
        what = "is a kNN option" if len(knn_only) == 1 else "are kNN options"
        p.error(f"{', '.join(knn_only)} {what}; add --knn")
    index = args.index or "flat"
    for owner in ("ivf", "hnsw"):
        other = [f"--{n}" for n in INDEX_FLAGS[owner] if getattr(args, n) is not None]
        if other and index != owner:
            p.error(f"{', '.join(other)} {'sets' if len(other) == 1 else 'set'} --index {owner}, "
                    f"not --index {index}; add --index {owner}")
    attack_only = [f"--{n}" for n in ("attack_n", "attack_queries", "attack_encoder",
                                      "attack_candidates") if getattr(args, n) is not None]
    if attack_only and not args.attack:
        what = "is an attack option" if len(attack_only) == 1 else "are attack options"
        p.error(f"{', '.join(attack_only)} {what}; add --attack RULE")
    args.attack_n, args.attack_encoder = args.attack_n or 300, args.attack_encoder or "minilm"
    args.attack_candidates = args.attack_candidates or "embedding"
    if args.attack in ("knn", "knn-only") and args.split == "train":
        p.error("--attack knn on --split train: each example would find itself in the datastore; "
                "attack --split dev or test")
    if args.attack and (args.sweep or args.max_eval):
        p.error(f"--attack scores its own --attack_n examples; leave out "
                f"{'--sweep' if args.sweep else '--max_eval'}")
    if args.out is not None and (not args.out or os.path.isdir(args.out)):
        p.error(f"--out '{args.out}' names the predictions file (e.g. preds.csv), not a folder")
    return args


def write_csv(path, header, rows):
    def writer(rows, f):
        text = io.StringIO()
        w = csv.writer(text)
        w.writerow(header)
        w.writerows(rows)
        f.write(text.getvalue().encode())
    atomic_save(rows, path, writer)


def data_dir_of(args, ckpt):
    """The data root: --data_dir, else $MINKNN_DATA, else the root the run trained on (recorded
    in its checkpoint), else ./data (a checkpoint from before minknn recorded it)."""
    if args.data_dir or os.environ.get("MINKNN_DATA") or "data" not in ckpt:
        data_root(args.data_dir)  # a root that is not a folder stops here, before the model
        return args.data_dir
    root = ckpt["data"]["root"]
    if not os.path.isdir(root):
        raise MinknnError(f"--checkpoint {ckpt['file']}: the run read its data from {root}, "
                          f"which is not a folder here; give --data_dir (or MINKNN_DATA)")
    print(f"data: {root}, the run's (--data_dir for another)")
    return root


def run_training_set(args, ckpt, task):
    """The examples the run trained on (its --max_train or --per_class draw), for the kNN
    datastore: refused when their fingerprint is not the one the checkpoint recorded (another
    data root, or a file changed since the run read it)."""
    train = training_examples(task, args.data_dir, ckpt["args"]["max_train"], ckpt["args"]["seed"],
                              ckpt["args"].get("per_class"))
    recorded = ckpt.get("data", {}).get("train_fingerprint", {})
    if task.name in recorded and examples_fingerprint(train) != recorded[task.name]:
        root, here = ckpt["data"]["root"], os.path.abspath(data_root(args.data_dir))
        files = ", ".join(source_paths(task, split_recipe(task, "train")[0], args.data_dir))
        why = "changed since the run read it" if here == root else \
            f"the run read {root}: use --data_dir {root}"
        raise MinknnError(f"{files}: not the {task.name} training examples the run trained on "
                          f"({why}); --knn builds its datastore from the run's own")
    return train


def read_task_data(args, ckpt, task, knn):
    """(examples to score, a note on the --max_eval subset, the training set for --knn or None;
    knn: whether --knn applies to this task), read and checked before any encoding."""
    examples = load_split(task, args.split, args.data_dir)
    if args.attack and not labelled(examples):
        raise MinknnError(f"--attack needs the gold classes, and the {task.name} {args.split} "
                          f"split has no labels; use --split dev (or test where it has labels)")
    n, flag = (args.attack_n, "--attack_n") if args.attack else (args.max_eval, "--max_eval")
    subset = f" (a {flag} subset of {len(examples)})" if n and n < len(examples) else ""
    examples = eval_subset(examples, n)
    if not knn:
        return examples, subset, None
    if args.sweep and not labelled(examples):
        raise MinknnError(f"--sweep scores each phi and K, but the {task.name} {args.split} split "
                          f"has no labels")
    train = run_training_set(args, ckpt, task)
    if not args.sweep:  # the sweep caps K at the datastore's size
        check_k(knn_settings(args, task)[0], len(train), excluding_self=args.split == "train")
    knn_index(args, len(train))  # --nlist beyond the training set stops here
    return examples, subset, train


def knn_settings(args, task):
    """K, phi, the vote and its temperature for this task: the flags, else its kind's defaults."""
    return settings(task.kind, args.k, args.phi, args.vote, args.temperature)


def knn_index(args, n):
    """The faiss index's settings over n training examples: the flags, else the defaults."""
    return index_settings(args.index or "flat", n, **{name: getattr(args, name) for flags in
                                                      INDEX_FLAGS.values() for name in flags})


def knn_datastore(args, ckpt, path, model, tokenizer, task, train, key, device):
    """The training set's datastore and its index for this vote: loaded from disk when still
    valid, else built and saved. Returns (datastore, seconds encoding its keys or None, seconds
    building its index or None)."""
    stamp, wanted = fingerprint(ckpt["file"], key, train), knn_index(args, len(train))
    datastore, seconds, stale = None, None, False
    if os.path.exists(path):
        # keys of the model's width, one a training example, labels of the task's classes
        datastore = Datastore.load(path, stamp, len(train), model.bert.config.hidden_size,
                                   len(task.labels))
        if datastore is None and args.datastore:
            raise MinknnError(f"--datastore {path} was built by a different checkpoint, key or "
                              f"training set; leave out --datastore to build one for this "
                              f"checkpoint")
        if datastore is None:
            print(f"datastore: {path} is from an older checkpoint, key or training set; "
                  f"rebuilding it")
        elif built_with(datastore.settings) != built_with(wanted):
            saved, asked = describe_index(datastore.settings), describe_index(wanted)
            if args.datastore:
                raise MinknnError(f"--datastore {path} holds index {saved}, but the flags ask for "
                                  f"{asked}; give its flags, or leave out --datastore")
            print(f"datastore: {path} holds index {saved}, not {asked}; building that over its "
                  f"keys")
            stale = True
        else:
            print(f"datastore: {len(datastore)} keys ({key}), index {describe_index(wanted)}, "
                  f"loaded from {path}")
    if datastore is None:
        start = time.time()
        _, keys = predict(model, tokenizer, task, train, args.batch_size, device,
                          progress="datastore", key=key, precision=args.precision)
        labels = kind_of(task).targets(task, train, "cpu")  # class indices, or multi-hot rows
        datastore = Datastore(keys, labels, [e.id for e in train], len(task.labels), wanted)
        datastore.save(path, stamp)
        seconds = time.time() - start
        print(f"datastore: {len(datastore)} keys ({key}) built in {seconds:.1f} s, saved to {path}")
    datastore.use_index(wanted)  # nprobe and ef_search: the flags', whatever was saved
    vote = knn_settings(args, task)[2]
    index_seconds = None
    if not datastore.has_index(vote):  # a flat index is never saved: the keys are all it holds
        start = time.time()
        datastore.index(vote)
        index_seconds = time.time() - start
        stale = stale or wanted["index"] != "flat"
    if stale:  # the next evaluate loads this index instead of building it
        datastore.save(path, stamp)
        print(f"datastore: index {describe_index(wanted)} built in {index_seconds:.1f} s, saved "
              f"to {path}")
    return datastore, seconds, index_seconds


def datastore_path(args, ckpt, task, key, several):
    """--datastore, else <run>/datastore-<key>.pt (datastore-<task>-<key>.pt in a multi-task run)."""
    name = f"datastore-{task.name + '-' if several else ''}{key}.pt"
    return args.datastore or os.path.join(os.path.dirname(ckpt["file"]), name)


def sweep(task, datastore, probabilities, queries, gold, exclude, args):
    """The task's scores over phi (at K) and over K (at phi), from one search at the largest K."""
    k, phi, vote, temperature = knn_settings(args, task)
    most = len(datastore) - (exclude is not None)
    ks = sorted({min(kk, most) for kk in SWEEP_KS})
    scores, rows = datastore.search(queries, ks[-1], vote, exclude)
    kind = kind_of(task)

    def at(kk, pp):
        knn = datastore.vote(scores[:, :kk], rows[:, :kk], vote, temperature)
        return score(task, kind.decide(interpolate(probabilities, knn, pp)), gold)
    k = min(k, most)
    tables = {"phi": [{"phi": pp, "k": k, **at(k, pp)} for pp in SWEEP_PHIS],
              "k": [{"phi": phi, "k": kk, **at(kk, phi)} for kk in ks]}
    for name, fixed in (("phi", f"K = {k}"), ("k", f"phi = {phi}")):
        metrics = task_metrics(task)
        print(f"\n{'phi' if name == 'phi' else 'K':>5}  {'  '.join(f'{m:>8}' for m in metrics)}"
              f"   ({task.name}, {fixed}, --vote {vote})")
        for r in tables[name]:
            print(f"{r[name]:>5}  {'  '.join(f'{r[m]:8.4f}' for m in metrics)}")
    return tables


def predictions_base(args, ckpt):
    """The predictions files' path less its .csv: --out's, else <run>/predictions-<split>."""
    run_dir = os.path.dirname(ckpt["file"])
    return os.path.splitext(args.out or os.path.join(run_dir, f"predictions-{args.split}.csv"))[0]


def evaluate_task(args, ckpt, model, losses, tokenizer, task, device, examples, subset, train):
    """One task's predictions by every rule asked for, their files and, on labels, scores.
    train: the training set for --knn, None for no kNN."""
    kind, run_dir, several = kind_of(task), os.path.dirname(ckpt["file"]), len(model.tasks) > 1
    base = predictions_base(args, ckpt) + (f"-{task.name}" if several else "")
    knn = train is not None
    key = args.knn_key or ("decoupled" if model.retrieval is not None else ckpt["args"]["pooling"])
    if knn:  # the datastore first: its errors come before the slow encoding of the split
        path = datastore_path(args, ckpt, task, key, several)
        datastore, build_seconds, index_seconds = knn_datastore(args, ckpt, path, model,
                                                                tokenizer, task, train, key,
                                                                device)

    # one pass gives the outputs and, with --knn, the queries in the datastore's representation
    start = time.time()
    outputs, reps = predict(model, tokenizer, task, examples, args.batch_size, device,
                            progress=f"{task.name} {args.split}", key=key if knn else None,
                            precision=args.precision)
    encode_seconds = time.time() - start
    probabilities = kind.probabilities(outputs)
    rules = [("model", "", probabilities, f"{base}.csv")]  # (name, prefix, probabilities, file)
    result = {"n": len(examples), "predictions": f"{base}.csv"}
    if args.proxy and has_proxies(losses[task.name]):
        # proxies compare the pooled z: a --knn_key other than the run's pooling needs its own pass
        z = reps if not knn or key == ckpt["args"]["pooling"] else \
            predict(model, tokenizer, task, examples, args.batch_size, device, "z",
                    precision=args.precision)[1]
        mixed = proxy_logits(losses[task.name], outputs, z, args.proxy_alpha)
        rules.append((f"proxy inference (alpha {args.proxy_alpha})", "proxy_",
                      kind.probabilities(mixed), f"{base}-proxy.csv"))
        result["proxy_alpha"] = args.proxy_alpha
    if knn:
        k, phi, vote, temperature = knn_settings(args, task)
        result["knn"] = {"k": k, "phi": phi, "vote": vote, "temperature": temperature, "key": key,
                         "index": datastore.settings}
        # the queries are training examples: leave each one's own entry out of its neighbours
        exclude = datastore.rows_of([e.id for e in examples]) if args.split == "train" else None
        start = time.time()
        scores, rows = datastore.search(reps, k, vote, exclude)
        knn_probs = datastore.vote(scores, rows, vote, temperature)
        knn_seconds = time.time() - start
        how = f"K {k}, --vote {vote}{f', T {temperature}' if vote != 'cosine' else ''}, key {key}"
        rules += [(f"kNN alone ({how})", "knn_", knn_probs, f"{base}-knn-only.csv"),
                  (f"model + kNN (phi {phi})", "mix_", interpolate(probabilities, knn_probs, phi),
                   f"{base}-knn.csv")]
        result["timing"] = {"encode_ms_per_query": 1000 * encode_seconds / len(examples),
                            "knn_ms_per_query": 1000 * knn_seconds / len(examples),
                            "datastore_build_seconds": build_seconds,
                            "index_build_seconds": index_seconds,
                            "datastore_size": len(datastore)}
    elif args.knn:
        print(f"{task.name}: no kNN for a {task.kind} task"
              f"{' of siamese pairs' if model.siamese(task) else ''}")

    gold = kind.gold(task, examples) if labelled(examples) else None
    for name, prefix, probs, path in rules:
        pred = kind.decide(probs)
        write_csv(path, *kind.rows(task, examples, pred))
        if gold is None:
            print(f"{task.name} {args.split}, {name}: {len(examples)} examples have no labels; "
                  f"predictions in {path}")
            continue
        scores = score(task, pred, gold)
        result.update({prefix + metric: value for metric, value in scores.items()})
        print(f"{task.name} {args.split}, {name}: {describe(scores)} on {len(examples)} "
              f"examples{subset}; predictions in {path}")
    if knn:
        t = result["timing"]
        share = 100 * t["knn_ms_per_query"] / t["encode_ms_per_query"]
        print(f"time: encoder {t['encode_ms_per_query']:.2f} ms/query, kNN search and vote "
              f"{t['knn_ms_per_query']:.3f} ms/query (+{share:.1f}%) over {len(datastore)} keys")
    if args.sweep and knn:
        result["sweep"] = sweep(task, datastore, probabilities, reps, gold, exclude, args)
        vote, prefix = knn_settings(args, task)[2], f"{task.name}-" if several else ""
        path = os.path.join(run_dir, f"knn-sweep-{args.split}-{vote}-{prefix}{key}.json")
        write_json(path, result["sweep"])
        print(f"\nsweep tables in {path}")
    return result


def rule_classifier(args, model, losses, tokenizer, task, device, datastore, key):
    """The attacked classifier, a black box: texts -> (N, C) probabilities of --attack's rule,
    the same computation evaluate_task scores (the head, proxy_logits, the kNN vote)."""
    kind, rule = kind_of(task), args.attack
    k, phi, vote, temperature = knn_settings(args, task)

    def classify(texts):
        examples = [Example(text=t) for t in texts]
        outputs, reps = predict(model, tokenizer, task, examples, args.batch_size, device,
                                key=key if datastore is not None else None,
                                precision=args.precision)
        probabilities = kind.probabilities(outputs)
        if rule == "model":
            return probabilities
        if rule == "proxy":  # reps: the pooled z (no kNN key asked for)
            return kind.probabilities(proxy_logits(losses[task.name], outputs, reps,
                                                  args.proxy_alpha))
        knn = datastore.vote(*datastore.search(reps, k, vote), vote, temperature)
        return knn if rule == "knn-only" else interpolate(probabilities, knn, phi)
    return classify


def attack_task(args, ckpt, model, losses, tokenizer, task, device, examples, train):
    """--attack: minknn/lab/attack.py's attack on --attack's rule, over the drawn examples."""
    run_dir, rule = os.path.dirname(ckpt["file"]), args.attack
    k, phi, vote, temperature = knn_settings(args, task)
    key = args.knn_key or ("decoupled" if model.retrieval is not None else ckpt["args"]["pooling"])
    name = {"model": "model", "proxy": f"proxy-alpha{args.proxy_alpha}",
            "knn": f"knn-phi{phi}-k{k}", "knn-only": f"knn-only-k{k}"}[rule]
    path = args.out or os.path.join(run_dir, f"attack-{args.split}-{args.attack_candidates}-"
                                             f"{name}.csv")
    report = os.path.splitext(path)[0] + ".json"
    settings = Settings(queries=args.attack_queries)
    asked = {"checkpoint": os.path.abspath(ckpt["file"]), "split": args.split, "rule": rule,
             "attack_n": args.attack_n, "encoder": args.attack_encoder,
             "candidates": args.attack_candidates,
             "attack": dataclasses.asdict(settings),
             **({"k": k, "vote": vote, "temperature": temperature, "key": key,
                 **({"phi": phi} if rule == "knn" else {})} if train is not None else {}),
             **({"proxy_alpha": args.proxy_alpha} if rule == "proxy" else {})}
    # WordNet's data: the synonyms of --attack_candidates wordnet, and, where it is installed,
    # how many successful attacks swapped a word for one of its antonyms
    wordnet = os.environ.get("WNSEARCHDIR", "/usr/share/wordnet")
    found = os.path.exists(os.path.join(wordnet, "data.adj"))
    if args.attack_candidates == "wordnet" and not found:
        raise MinknnError(f"--attack_candidates wordnet: no WordNet data in {wordnet} (install "
                          f"Debian's wordnet-base, or set WNSEARCHDIR to a folder with data.adj)")
    if os.path.exists(path):  # a killed attack resumes only with the settings it started with,
        saved = None           # but --attack_n may change: the examples done (by id) are kept
        if os.path.exists(report):
            with open(report) as f:
                saved = json.load(f).get("settings")
        if saved is None or {**saved, "attack_n": args.attack_n} != asked:
            raise MinknnError(f"--attack: {path} holds an attack with other settings "
                              f"({report} says {saved}); give --out another file")
    write_json(report, {"settings": asked, "summary": None})
    datastore = None
    if train is not None:
        datastore = knn_datastore(args, ckpt, datastore_path(args, ckpt, task, key, False), model,
                                  tokenizer, task, train, key, device)[0]
    synonyms, antonyms = read_wordnet(wordnet) if found else (None, None)
    encode, (table, vocab, lowercase) = sentence_encoder(args.attack_encoder, device)
    neighbours = Synonyms(synonyms, settings.candidates) if args.attack_candidates == "wordnet" \
        else Neighbours(table, vocab, lowercase, settings.candidates, settings.min_cos)

    def fits(text):  # all its tokens inside the run's --max_len
        return len(tokenizer.encode([text])[0][0]) < tokenizer.max_len
    examples = [dataclasses.replace(e, text=cut_to_fit(e.text, fits), id=e.id or str(i))
                for i, e in enumerate(examples)]
    labels = kind_of(task).gold(task, examples).tolist()
    classify = rule_classifier(args, model, losses, tokenizer, task, device, datastore, key)
    start = time.time()
    summary = run_attack(examples, labels, classify, neighbours, encode, settings, path,
                         task.labels, antonyms)
    summary["seconds"] = round(time.time() - start, 1)
    write_json(report, {"settings": asked, "summary": summary, "csv": path})
    print(f"{task.name} {args.split}, attack on {rule} ({name}), {summary['n']} examples:")
    for label, field, unit in ATTACK_REPORT:
        if field not in summary:
            continue
        print(f"  {label:<32} {summary[field]:.2f}{unit}" if isinstance(summary[field], float)
              else f"  {label:<32} {summary[field]}")
    print(f"every example in {path}; the summary in {report}")
    return summary


ATTACK_REPORT = [("successful attacks", "succeeded", ""), ("failed attacks", "failed", ""),
                 ("skipped attacks (already wrong)", "skipped", ""),
                 ("original accuracy", "original_accuracy", "%"),
                 ("accuracy under attack", "accuracy_under_attack", "%"),
                 ("attack success rate", "attack_success_rate", "%"),
                 ("average perturbed word share", "perturbed_word_share", "%"),
                 ("average words per input", "words_per_input", ""),
                 ("average queries", "queries", ""),
                 ("successful, with a WordNet antonym", "antonym_attacks", "%")]


def main(argv=None):
    args = get_args(argv)
    # a student edition's parts this runs (minknn/assignment.py), checked before any slow work
    require_written(["embeddings", "layer", "pooling"] + ["attention"] * (args.attention ==
                    "explicit") + ["proxy-inference"] * args.proxy + ["knn"] * args.knn)
    device = pick_device(args.device)
    ckpt = load_checkpoint(args.checkpoint)  # ckpt["file"]: the checkpoint file's path
    # the predictions' folder must take files before anything is encoded
    make_folder(os.path.dirname(predictions_base(args, ckpt)) or ".",
                "--out's folder" if args.out else "the run folder")
    args.data_dir = data_dir_of(args, ckpt)
    model, losses, tokenizer = rebuild(ckpt)
    model.bert.set_attention(args.attention)
    model.to(device)
    tasks = list(model.tasks.values())
    if args.proxy and not any(has_proxies(losses[t.name]) for t in tasks):
        loss = ckpt["args"]["loss"]
        raise MinknnError(f"--proxy: this checkpoint was trained with --loss {loss}, which has no "
                          f"proxies; proxy inference needs one of: {', '.join(PROXY_LOSSES)}")
    if args.knn and args.knn_key == "decoupled" and model.retrieval is None:
        raise MinknnError("--knn_key decoupled: this checkpoint has no retrieval head (train it "
                          "with --decoupled)")
    knn_tasks = [t for t in tasks if args.knn and t.kind in KNN_DEFAULTS and not model.siamese(t)]
    if args.knn and not knn_tasks:
        raise MinknnError("--knn votes with the training set's labels: it needs a classification "
                          "or multi-label task with one vector per example (not a similarity task, "
                          "not --pair_mode siamese)")
    if args.temperature is not None and any(knn_settings(args, t)[2] == "cosine"
                                            for t in knn_tasks):
        raise MinknnError("--temperature sets the distance and euclidean votes' T; the cosine vote "
                          "has none (add --vote distance or euclidean)")
    # every task's data first: a bad file or another training set stops before any encoding
    if args.attack:
        attackable = [t for t in tasks if t.kind == "classify" and not t.pair]
        if len(tasks) > 1 or not attackable:
            what = f"{len(tasks)} tasks" if len(tasks) > 1 else \
                f"a {'pair' if tasks[0].pair else tasks[0].kind} task"
            raise MinknnError(f"--attack swaps words of single texts of a one-task classification "
                              f"run; this run has {what}")
    data = {t.name: read_task_data(args, ckpt, t, t in knn_tasks) for t in tasks}
    if args.attack:
        return attack_task(args, ckpt, model, losses, tokenizer, tasks[0], device,
                           data[tasks[0].name][0], data[tasks[0].name][2])
    result = {"checkpoint": ckpt["file"], "epoch": ckpt["epoch"], "split": args.split,
              "data_root": os.path.abspath(data_root(args.data_dir)), "max_eval": args.max_eval}
    for task in tasks:
        result[task.name] = evaluate_task(args, ckpt, model, losses, tokenizer, task, device,
                                          *data[task.name])
    if len(tasks) > 1 and all(task_metrics(t)[0] in result[t.name] for t in tasks):
        result["overall"] = overall(tasks, {t.name: result[t.name] for t in tasks})
        print(f"overall score: {result['overall']:.4f} (the mean of the tasks' first scores, "
              f"each in [0, 1])")
    path = predictions_base(args, ckpt) + "-metrics.json"
    write_json(path, result)
    print(f"metrics in {path}")
    return result


if __name__ == "__main__":
    run(main)
