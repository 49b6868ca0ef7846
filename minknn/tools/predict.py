"""Ask a trained run about your texts, and see why it answered: python -m minknn.tools.predict RUN.

    python -m minknn.tools.predict runs/sst-ce "a gripping film" "a dull one"   # the head's class
    python -m minknn.tools.predict runs/sst-knnbert --knn --explain 3 "a gripping film"  # kNN's,
    and why python -m minknn.tools.predict runs/sst-proxyanchor --proxy --file mine.csv --out
    answers.jsonl cat mine.txt | python -m minknn.tools.predict runs/sst-ce                   # a
    text a line on stdin

The texts: the arguments; or --file, a text a line (.txt), or a column of a .csv, .tsv or .jsonl
file (--text_column, read as train.py reads your files: minknn/tasks/own_task.py); or, with neither,
standard input, a text a line. A pair task takes pairs: its arguments two by two, two columns
(--text_column a,b), or a line 'first text<TAB>second text'.

The answers, each text's: the class and its probability by the run's head (model); with --proxy
by proxy inference (proxy, at --proxy_alpha); with --knn by the head mixed with kNN's vote (knn,
at --phi) and by the vote alone (knn-only), over the run's datastore: evaluate.py's rules, settings
and datastore (minknn/tools/inference.py, whose Python API this command is written over; the same
texts get evaluate.py's very probabilities). A multi-label run answers its classes above 0.5, a
similarity run its score. --explain N shows why: each text's N nearest training examples, their
labels and similarities (the datastore's neighbours, the ones kNN votes with), and, in a proxy
loss's run, each class proxy's cosine.

--out FILE.csv or FILE.jsonl writes every answer (JSON Lines: every class's probability, the
neighbours' texts) and prints one line. The texts are encoded in batches sorted by length, under
inference mode, as evaluate.py encodes a split (`python -m minknn.lab.bench predict` times both
on the same texts).
"""
import os
import sys

from minknn import MinknnError
from minknn.kinds import kind_of
from minknn.tasks.lines import BOM, read_lines, split_lines
from minknn.tasks.own_files import FORMATS, file_texts
from minknn.tasks.own_task import text_columns
from minknn.tools.cli import Parser, run
from minknn.tools.files import make_folder, write_csv, write_jsonl
from minknn.tools.inference import load
from minknn.tools.options import add_rule_flags, add_run_flags, check_rule_flags, rule_settings

RULE_NAMES = {"model": "model", "proxy": "proxy", "knn": "model + kNN", "knn-only": "kNN alone"}


class PredictParser(Parser):
    """argparse, but for RUN and TEXT missing: the texts are not required (--file and standard
    input give them), the run is."""

    def error(self, message):
        if message.startswith("the following arguments are required"):
            message = ("give the run first (RUN: a folder train.py wrote, or its checkpoint.pt), "
                       "then the texts, or --file, or texts on standard input")
        super().error(message)


def get_args(argv=None):
    p = PredictParser(prog="python -m minknn.tools.predict", description=__doc__.split("\n")[0])
    p.add_argument("run", metavar="RUN", help="a run folder train.py wrote, or its checkpoint.pt")
    p.add_argument("texts", metavar="TEXT", nargs="*", help="texts to answer (a pair task: two "
                   "by two) (default: --file, else a text a line on standard input)")
    p.add_argument("--file", help="the texts: a .txt file, a text a line (a pair: a tab between), "
                   "or a .csv, .tsv or .jsonl file's --text_column; '-' for standard input")
    p.add_argument("--text_column", default="text", help="--file's column of texts, or two "
                   "comma-separated for a pair task")
    p.add_argument("--task", help="which task of a multi-task run answers")
    p.add_argument("--explain", type=int, default=0, metavar="N", help="also show each text's N "
                   "nearest training examples (kNN's neighbours) and each class proxy's cosine")
    p.add_argument("--out", help="write the answers to this .csv or .jsonl file instead of the "
                   "screen")
    add_run_flags(p)
    add_rule_flags(p, rules=True)
    args = p.parse_intermixed_args(argv)  # texts before and after the flags
    if not os.path.exists(args.run):
        p.error(f"RUN {args.run}: not found; the first argument is the run (a folder train.py "
                f"wrote, or its checkpoint.pt), the texts come after it")
    if args.explain < 0:
        p.error(f"--explain must be at least 1 (or 0: none), got {args.explain}")
    check_rule_flags(p, args, args.knn or args.explain > 0, add_knn="add --knn or --explain")
    if args.texts and args.file:
        p.error("give texts as arguments or --file, not both")
    if args.out and os.path.splitext(args.out)[1].lower() not in (".csv", ".jsonl"):
        p.error(f"--out {args.out}: write a .csv or a .jsonl file")
    return args


def read_texts(args):
    """(where they came from, [(id, what was read)]): the arguments' texts, a table's columns (a
    tuple a row) or a file's or standard input's lines, read and checked before the run is
    loaded (a bad file stops first)."""
    if args.texts:
        return "arguments", [(str(i + 1), t) for i, t in enumerate(args.texts)]
    path = args.file
    if path and os.path.splitext(path)[1].lower() in FORMATS:
        columns = text_columns(args.text_column)
        if not 1 <= len(columns) <= 2:
            raise MinknnError(f"--text_column {args.text_column}: one column, or two for pairs")
        name = os.path.basename(path)
        return "columns", [(f"{name}:{n}", tuple(t)) for n, t in file_texts(path, columns)]
    if path in (None, "-"):
        if path is None and sys.stdin.isatty():
            raise MinknnError("no texts: give them as arguments, with --file, or on standard "
                              "input (a text a line)")
        name, lines = "stdin", stdin_lines()
    else:
        name, lines = os.path.basename(path), read_lines(path)
    found = [(f"{name}:{n}", line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not found:
        raise MinknnError(f"{path or 'standard input'}: no texts in it")
    return "lines", found


def as_texts(source, given, pair):
    """The texts the run's task takes, from read_texts': each a string, or a pair of them."""
    if source == "arguments" and pair:
        if len(given) % 2:
            raise MinknnError(f"a pair task takes its texts two by two (A1 B1 A2 B2 ...); "
                              f"{len(given)} were given")
        return [(str(i // 2 + 1), (given[i][1], given[i + 1][1]))
                for i in range(0, len(given), 2)]
    if source == "columns":
        if len(given[0][1]) != (2 if pair else 1):
            raise MinknnError(f"--text_column: the run's task takes "
                              f"{'pairs: give two columns, a,b' if pair else 'one text a row'}")
        return [(id, texts if pair else texts[0]) for id, texts in given]
    if source == "lines" and pair:
        for id, line in given:
            parts = line.split("\t")
            if len(parts) != 2 or not all(p.strip() for p in parts):
                raise MinknnError(f"{id}: a pair task takes a line 'first text<TAB>second text', "
                                  f"both not empty; this one has {len(parts)} tab-separated "
                                  f"parts")
        return [(id, tuple(line.split("\t"))) for id, line in given]
    return given


def stdin_lines():
    """Standard input's lines, each UTF-8 (one that is not is one line naming it), a byte-order
    mark and \\r\\n line ends taken."""
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    lines = []
    for n, line in enumerate(split_lines(raw.removeprefix(BOM)), start=1):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise MinknnError(f"standard input:{n}: not UTF-8 ({e.reason})") from None
    return lines


def records(task, ids, texts, answers, explain):
    """One dict a text: its id and text(s), each rule's answer and probabilities, and with
    explain its neighbours and the proxies' cosines."""
    kind, out = kind_of(task), []
    decided = {rule: [kind.answer(task, d) for d in kind.decide(probs)]  # each rule's, at once
               for rule, probs in answers.items() if rule in RULE_NAMES}
    rows = {rule: answers[rule].tolist() for rule in decided}
    proxies = answers["proxies"].tolist() if "proxies" in answers else None
    for i, (id, text) in enumerate(zip(ids, texts)):
        a, b = text if task.pair else (text, None)
        r = {"id": id, "text": a, **({"text_b": b} if task.pair else {})}
        for rule in decided:
            r[rule] = {"answer": decided[rule][i]} if task.kind == "similarity" else {
                "answer": decided[rule][i], "probabilities": dict(zip(task.labels, rows[rule][i]))}
        if explain:
            r["neighbours"] = answers["neighbours"][i]
            if proxies is not None:
                r["proxies"] = dict(zip(task.labels, proxies[i]))
        out.append(r)
    return out


def shown(task, answer):
    """A rule's answer and its probability, as the screen shows it."""
    if task.kind == "similarity":
        return f"{answer['answer']:.3f}"
    p = answer["probabilities"]
    if task.kind == "classify":
        return f"{answer['answer']}  {p[answer['answer']]:.3f}"
    if answer["answer"]:
        return ", ".join(f"{c} {p[c]:.3f}" for c in answer["answer"])
    top = max(p, key=p.get)
    return f"(no class above 0.5; the likeliest: {top} {p[top]:.3f})"


def settings_note(trained, task, rule):
    """What a rule's line adds: proxy inference's alpha, the mix's phi, the vote's K."""
    args = trained.args
    if rule == "proxy":
        return f"alpha {args.proxy_alpha}"
    s = trained.knn_settings(task)
    return f"phi {s.phi}" if rule == "knn" else f"K {s.k}, --vote {s.vote}"


def print_answers(trained, task, recs):
    """The answers on the screen, a block a text (docs/predict.md shows one)."""
    for r in recs:
        print(f"{r['id']}. {r['text']}" + (f"  |  {r['text_b']}" if task.pair else ""))
        for rule in RULE_NAMES:
            if rule in r:
                note = "" if rule == "model" else f"   ({settings_note(trained, task, rule)})"
                print(f"   {RULE_NAMES[rule] + ':':<13}{shown(task, r[rule])}{note}")
        if "neighbours" in r:
            what = ("cosine similarity" if trained.knn_settings(task).vote == "cosine"
                    else "squared distance")
            print(f"   the {len(r['neighbours'])} nearest training examples ({what}, label, text):")
            for n in r["neighbours"]:
                label = label_text(n["label"], ", ")
                pair = f"  |  {n['text_b']}" if n["text_b"] is not None else ""
                print(f"     {n['score']:7.3f}  {label}  {n['text']}{pair}  [{n['id']}]")
        if "proxies" in r:
            cosines = sorted(r["proxies"].items(), key=lambda kv: -kv[1])
            print("   the class proxies' cosines: " + ", ".join(f"{c} {v:.3f}" for c, v in cosines))


def label_text(label, sep):
    """A neighbour's label as text: a class's name, or a multi-label row's names joined."""
    return label if isinstance(label, str) else sep.join(label)


def write_out(path, task, recs):
    """--out: JSON Lines as the records are; CSV a row a text, each rule's answer and its
    probability (a multi-label run's classes and theirs joined by ';'), the neighbours' ids,
    labels and scores, the proxies' cosines."""
    if path.lower().endswith(".jsonl"):
        return write_jsonl(path, recs)
    rules = [rule for rule in RULE_NAMES if rule in recs[0]]
    header = ["id", "text"] + ["text_b"] * task.pair
    for rule in rules:
        header += [rule] + ([f"{rule}_probability"] if task.kind != "similarity" else [])
    header += ["neighbours"] * ("neighbours" in recs[0]) + ["proxies"] * ("proxies" in recs[0])
    rows = []
    for r in recs:
        row = [r["id"], r["text"]] + ([r["text_b"]] if task.pair else [])
        for rule in rules:
            answer = r[rule]["answer"]
            if task.kind == "similarity":
                row.append(f"{answer:.6f}")
                continue
            chosen = [answer] if task.kind == "classify" else answer
            row += [";".join(chosen), ";".join(f"{r[rule]['probabilities'][c]:.6f}"
                                               for c in chosen)]
        if "neighbours" in r:
            row.append("; ".join(f"{n['id']} {label_text(n['label'], '|')} {n['score']:.4f}"
                                 for n in r["neighbours"]))
        if "proxies" in r:
            row.append("; ".join(f"{c} {v:.4f}" for c, v in r["proxies"].items()))
        rows.append(row)
    write_csv(path, header, rows)


def main(argv=None):
    args = get_args(argv)
    source, given = read_texts(args)  # the texts first: a bad file stops before the run is read
    trained = load(args.run, **{k: getattr(args, k) for k in vars(rule_settings())})
    task = trained.task(args.task)
    if args.explain and task.kind not in ("classify", "multilabel") or \
            args.explain and trained.model.siamese(task):
        raise MinknnError(f"--explain shows kNN's neighbours, and {task.name} has no kNN (a "
                          f"similarity task, or pairs under --pair_mode siamese)")
    given = as_texts(source, given, task.pair)
    if args.out:
        make_folder(os.path.dirname(os.path.abspath(args.out)), "--out's folder")
    rules = ["model"] + ["proxy"] * args.proxy + ["knn", "knn-only"] * args.knn
    ids, texts = [i for i, _ in given], [t for _, t in given]
    answers = trained.answers(texts, rules, task.name, args.explain,
                              progress="predict" if args.file or not args.texts else None)
    recs = records(task, ids, texts, answers, args.explain)
    if args.out:
        write_out(args.out, task, recs)
        print(f"{len(recs)} answers ({', '.join(rules)}"
              f"{f', the {args.explain} nearest training examples' if args.explain else ''}) "
              f"in {args.out}")
    else:
        print_answers(trained, task, recs)
    return recs


if __name__ == "__main__":
    run(main)
