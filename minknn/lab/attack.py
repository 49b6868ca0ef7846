"""A word-substitution attack in TextFooler's shape (Jin et al. 2020), offline, on any inference
rule of a trained run: KNN-BERT's robustness test (Li et al., sec. 4.6, Table 4).

    python -m minknn.lab.attack --checkpoint RUN --split test --attack knn --phi 0.5
    python -m minknn.lab.attack --checkpoint RUN --attack model --attack_candidates wordnet

The attack itself (its steps, its constraints and where each value comes from) is
minknn/lab/wordswap.py; this file plugs a run into it.

main(): the attack on a fixed draw of --attack_n labelled examples of --split (the same draw for
every run), each cut to the words that fit the run's --max_len. Every attacked example is a row of
<run>/attack-<split>-<candidates>-<rule>.csv (--out to name it), written as it ends, so a killed
attack resumes where it stopped, and a rerun with another --attack_n attacks only the drawn
examples the file lacks (IMDB's draw of 300 holds its draw of 60); the summary (TextAttack's
figures over the drawn examples, and the seconds this call took) goes beside it, in its .json,
with the settings a rerun must share to resume (the checkpoint by its sha256, so a run folder
moved or copied keeps its attacks). A figure that is a mean of nothing (the success rate when no
example was classified correctly) is null there and printed as n/a, with the reason.
--attack_candidates wordnet takes WordNet's synonyms (Debian's wordnet-base).
"""
import csv
import dataclasses
import io
import json
import os
import time

import torch

import evaluate  # the flags, read as evaluate.py reads them, and its files' path
from minknn import MinknnError, backbones, progress_bar
from minknn.datastore import knn_settings, run_datastore
from minknn.kinds import kind_of
from minknn.lab.wordswap import (Neighbours, Settings, Synonyms, attack, cut_to_fit, not_available,
                                 read_wordnet, summary)
from minknn.model import pool
from minknn.tasks.data import Example, labelled
from minknn.tokenizer import Tokenizer
from minknn.tools.cli import run
from minknn.tools.files import atomic_save, file_sha256, read_json, write_json
from minknn.tools.inference import RULES, load_run, read_task_data, rule_answers
from minknn.tools.options import check_rule_flags
from minknn.tools.weights import resolve_model_path


# what main() plugs into the attack (minknn/lab/wordswap.py): the meaning encoder, the
# candidates, a resumable run

def sentence_encoder(path="minilm", device="cpu", batch_size=64):
    """(encode, neighbours' inputs) of a pretrained model folder ('minilm': all-MiniLM-L6-v2, a
    sentence-similarity model): encode(texts) -> (N, H) mean-pooled last hidden states, frozen;
    and its input embedding table with its vocabulary and case, for Neighbours."""
    bert = backbones.from_pretrained(path).to(device).eval()
    # a window of 15 words is far shorter than 128 tokens
    tokenizer = Tokenizer.from_folder(resolve_model_path(path), min(128, bert.config.max_tokens))

    @torch.inference_mode()
    def encode(texts):
        vectors = []
        for i in range(0, len(texts), batch_size):
            batch = {k: v.to(device) for k, v in tokenizer(texts[i:i + batch_size]).items()}
            vectors.append(pool(bert(**batch), batch["attention_mask"], "mean").float().cpu())
        return torch.cat(vectors)
    table = bert.embeddings.word_embeddings.weight.detach().cpu()
    return encode, (table, tokenizer.vocab, tokenizer.lowercase)
STATUSES = ("succeeded", "failed", "skipped")
COLUMNS = ["id", "status", "label", "original_prediction", "perturbed_prediction", "words",
           "swapped", "queries", "swaps", "original", "perturbed"]


def read_done(path):
    """The rows of an attack CSV that a killed run left, as dicts. A last row the kill cut short
    (no newline at its end) is dropped and the file rewritten without it."""
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        text = f.read()
    rows = list(csv.reader(io.StringIO(text)))
    if rows and rows[0] != COLUMNS:
        raise MinknnError(f"{path}: not an attack CSV of this minknn (its header is not "
                          f"{','.join(COLUMNS)}); give --out another file")
    good = [r for r in rows[1:] if len(r) == len(COLUMNS) and r[1] in STATUSES]
    if rows and not text.endswith("\n"):
        good = good[:len(rows) - 2]  # the last row is cut short, even if it parses
    if len(good) < len(rows) - 1 or not rows:
        write_rows(path, good, mode="w")
    return [dict(zip(COLUMNS, r)) for r in good]


def write_rows(path, rows, mode="a"):
    """Appends rows (lists of COLUMNS' values) to path, header first when it is new; each row is
    on disk (flushed and fsynced) before the next example starts."""
    new = mode == "w" or not os.path.exists(path)
    text = io.StringIO()
    w = csv.writer(text)
    if new:
        w.writerow(COLUMNS)
    w.writerows(rows)
    if mode == "w":
        atomic_save(text.getvalue(), path, lambda s, f: f.write(s.encode()))
        return
    with open(path, "a", newline="", encoding="utf-8") as f:
        f.write(text.getvalue())
        f.flush()
        os.fsync(f.fileno())


def run_attack(examples, labels, classify, neighbours, encode, settings, path, names,
               antonyms=None):
    """Attacks each example (ids and texts; labels: their class indices) and appends its row to
    the CSV at path; examples already in it (a killed run's, or another draw's) are not attacked
    again, and its rows of other examples are kept. names: the classes' names. Returns summary()
    of the examples' rows; with antonyms (read_wordnet()[1]), also the share of the successful
    attacks that swapped a word for an antonym, in %."""
    done = read_done(path)
    ids = {row["id"] for row in done}
    todo = [(e, y) for e, y in zip(examples, labels) if e.id not in ids]
    bar = progress_bar(todo, desc="attack", initial=len(examples) - len(todo), total=len(examples))
    for example, label in bar:
        r = attack(example.text, label, classify, neighbours, encode, settings)
        swaps = "; ".join(f"{i}:{old}>{new}" for i, (old, new) in r["swaps"].items())
        row = [example.id, r["status"], names[label], names[r["original_prediction"]],
               names[r["perturbed_prediction"]], r["words"], len(r["swaps"]), r["queries"],
               swaps, r["original"], r["perturbed"]]
        write_rows(path, [row])
        done.append(dict(zip(COLUMNS, map(str, row))))
        bar.set_postfix(succeeded=sum(d["status"] == "succeeded" for d in done))
    asked = {e.id for e in examples}
    done = [d for d in done if d["id"] in asked]
    result = summary([{"status": d["status"], "words": int(d["words"]),
                       "queries": int(d["queries"]), "swaps": range(int(d["swapped"]))}
                      for d in done])
    if antonyms is not None:
        won = [[pair.split(":", 1)[1].lower().split(">") for pair in d["swaps"].split("; ")]
               for d in done if d["status"] == "succeeded"]
        hit = [any(tuple(pair) in antonyms for pair in swaps) for swaps in won]
        result["antonym_attacks"] = 100 * sum(hit) / len(hit) if hit else None
    return result


# ---------------------------------------------------------------------------------------------
# python -m minknn.lab.attack: the attack on one inference rule of a trained run

def get_args(argv=None):
    p = evaluate.make_parser(__doc__.split("\n")[0], rules=False)
    g = p.add_argument_group("attack")
    g.add_argument("--attack", required=True, choices=RULES, help="attack this rule's "
                   "predictions with word substitutions: the model (its head), proxy inference, "
                   "the model mixed with kNN at --phi, or kNN alone")
    g.add_argument("--attack_n", type=int, default=300, help="examples attacked, a fixed draw")
    g.add_argument("--attack_queries", type=int, help="query budget per example (default: none)")
    g.add_argument("--attack_candidates", default="embedding", choices=["embedding", "wordnet"],
                   help="each word's substitutes: the nearest words of --attack_encoder's input "
                   "embedding table, or WordNet's synonyms ($WNSEARCHDIR, else "
                   "/usr/share/wordnet: Debian's wordnet-base)")
    g.add_argument("--attack_encoder", default="minilm", help="the sentence encoder of the "
                   "meaning constraint and the candidates' embedding table: 'minilm' or a model "
                   "folder")
    args = p.parse_args(argv)
    args.knn, args.proxy = args.attack in ("knn", "knn-only"), args.attack == "proxy"
    check_rule_flags(p, args, args.knn, ["attack_n", "attack_queries"],
                              "attack --attack knn or knn-only")
    if args.knn and args.split == "train":
        p.error("--attack knn on --split train: each example would find itself in the datastore; "
                "attack --split dev or test")
    return args


def rule_classifier(args, model, losses, tokenizer, task, device, datastore):
    """The attacked classifier, a black box: texts -> (N, C) probabilities of --attack's rule
    (minknn/tools/inference.py rule_answers, as evaluate.py scores it)."""
    def classify(texts):
        examples = [Example(text=t) for t in texts]
        return rule_answers(model, tokenizer, task, examples, args, device, losses[task.name],
                            [args.attack], datastore)[0][args.attack]
    return classify


def attack_settings(args, ckpt, task, key, knn):
    """(the attack's CSV, its .json report, the settings it runs with): a killed attack resumes
    only with the settings it started with, but --attack_n may change (the examples done, by
    id, are kept)."""
    rule, s = args.attack, knn_settings(args, task)
    name = {"model": "model", "proxy": f"proxy-alpha{args.proxy_alpha}",
            "knn": f"knn-phi{s.phi}-k{s.k}", "knn-only": f"knn-only-k{s.k}"}[rule]
    path = args.out or os.path.join(os.path.dirname(ckpt["file"]),
                                    f"attack-{args.split}-{args.attack_candidates}-{name}.csv")
    report = os.path.splitext(path)[0] + ".json"
    # the checkpoint by its bytes' sha256, which survives a move or a copy of the run; its path
    # is kept for the reader, not compared
    asked = {"checkpoint": os.path.abspath(ckpt["file"]),
             "checkpoint_sha256": file_sha256(ckpt["file"]), "split": args.split, "rule": rule,
             "attack_n": args.attack_n, "encoder": args.attack_encoder,
             "candidates": args.attack_candidates,
             "attack": dataclasses.asdict(Settings(queries=args.attack_queries)),
             **({"k": s.k, "vote": s.vote, "temperature": s.temperature, "key": key,
                 **({"phi": s.phi} if rule == "knn" else {})} if knn else {}),
             **({"proxy_alpha": args.proxy_alpha} if rule == "proxy" else {})}
    if os.path.exists(path):
        check_same_attack(path, report, asked)
    return path, report, asked, name


def check_same_attack(path, report, asked):
    """An existing CSV at the attack's path is resumed only when it is an attack's output (its
    header), its settings file is beside it, and that holds these settings (asked), --attack_n
    aside; else one line on which of the three is wrong."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f), None)
    if header != COLUMNS:
        raise MinknnError(f"--attack: {path} is not an attack's output (its first line is not "
                          f"the header {','.join(COLUMNS)}); give --out another file")
    if not os.path.exists(report):
        raise MinknnError(f"--attack: {path} is an attack's output, but its settings file "
                          f"{report} is missing, so it cannot be told which run and rule its "
                          f"rows attacked; put that file back, or give --out another file (or "
                          f"delete {path} to attack again)")
    saved = read_json(report)
    saved = saved.get("settings") if isinstance(saved, dict) else None
    if not isinstance(saved, dict):
        raise MinknnError(f"--attack: {report} holds no \"settings\" object (was it edited?); "
                          f"put the attack's own back, or give --out another file")
    # an attack saved before the checkpoint's sha256 was: its checkpoint by path, as then
    same_place = "checkpoint_sha256" not in saved and saved.get("checkpoint") == asked["checkpoint"]
    ignored = {"checkpoint", "attack_n"} | ({"checkpoint_sha256"} if same_place else set())
    differ = [f"{k} {json.dumps(saved.get(k))}, not {json.dumps(asked.get(k))}"
              for k in sorted(set(saved) | set(asked))
              if k not in ignored and saved.get(k) != asked.get(k)]
    if differ:
        raise MinknnError(f"--attack: {path} holds an attack with other settings ({report}: "
                          f"{'; '.join(differ)}); give --out another file")


def main(argv=None):
    args = get_args(argv)
    ckpt, model, losses, tokenizer, tasks, knn_tasks, device = load_run(  # as evaluate.py does
        args, args.proxy, args.knn, lambda ckpt: evaluate.predictions_base(args, ckpt))
    task = tasks[0]
    if len(tasks) > 1 or task.kind != "classify" or task.pair:
        what = f"{len(tasks)} tasks" if len(tasks) > 1 else \
            f"a {'pair' if task.pair else task.kind} task"
        raise MinknnError(f"--attack swaps words of single texts of a one-task classification "
                          f"run; this run has {what}")
    examples, _, train = read_task_data(args, ckpt, task, task in knn_tasks, args.attack_n,
                                        "--attack_n")
    if not labelled(examples):
        raise MinknnError(f"--attack needs the gold classes, and the {task.name} {args.split} "
                          f"split has no labels; use --split dev (or test where it has labels)")
    key = model.knn_key(args.knn_key)
    path, report, asked, name = attack_settings(args, ckpt, task, key, train is not None)
    # WordNet's data: the synonyms of --attack_candidates wordnet, and, where it is installed,
    # how many successful attacks swapped a word for one of its antonyms
    wordnet = os.environ.get("WNSEARCHDIR", "/usr/share/wordnet")
    found = os.path.exists(os.path.join(wordnet, "data.adj"))
    if args.attack_candidates == "wordnet" and not found:
        raise MinknnError(f"--attack_candidates wordnet: no WordNet data in {wordnet} (install "
                          f"Debian's wordnet-base, or set WNSEARCHDIR to a folder with data.adj)")
    write_json(report, {"settings": asked, "summary": None})
    datastore = None if train is None else \
        run_datastore(args, ckpt, model, tokenizer, task, train, key, device)[0]
    synonyms, antonyms = read_wordnet(wordnet) if found else (None, None)
    settings = Settings(queries=args.attack_queries)
    encode, (table, vocab, lowercase) = sentence_encoder(args.attack_encoder, device)
    neighbours = Synonyms(synonyms, settings.candidates) if args.attack_candidates == "wordnet" \
        else Neighbours(table, vocab, lowercase, settings.candidates, settings.min_cos)

    def fits(text):  # all its tokens inside the run's --max_len
        return len(tokenizer.encode([text])[0][0]) < tokenizer.max_len
    examples = [dataclasses.replace(e, text=cut_to_fit(e.text, fits), id=e.id or str(i))
                for i, e in enumerate(examples)]
    labels = kind_of(task).gold(task, examples).tolist()
    classify = rule_classifier(args, model, losses, tokenizer, task, device, datastore)
    start = time.time()
    summary = run_attack(examples, labels, classify, neighbours, encode, settings, path,
                         task.labels, antonyms)
    summary["seconds"] = round(time.time() - start, 1)
    write_json(report, {"settings": asked, "summary": summary, "csv": path})
    print(f"{task.name} {args.split}, attack on {args.attack} ({name}), {summary['n']} examples:")
    for label, field, unit in REPORT:
        if field not in summary:
            continue
        value = summary[field]
        if value is None:  # a mean of nothing: say why, not nan%
            print(f"  {label:<32} n/a ({not_available(summary, field)})")
        else:
            print(f"  {label:<32} {value:.2f}{unit}" if isinstance(value, float)
                  else f"  {label:<32} {value}")
    print(f"every example in {path}; the summary in {report}")
    return summary


REPORT = [("successful attacks", "succeeded", ""), ("failed attacks", "failed", ""),
          ("skipped attacks (already wrong)", "skipped", ""),
          ("original accuracy", "original_accuracy", "%"),
          ("accuracy under attack", "accuracy_under_attack", "%"),
          ("attack success rate", "attack_success_rate", "%"),
          ("average perturbed word share", "perturbed_word_share", "%"),
          ("average words per input", "words_per_input", ""),
          ("average queries", "queries", ""),
          ("successful, with a WordNet antonym", "antonym_attacks", "%")]


if __name__ == "__main__":
    run(main)
