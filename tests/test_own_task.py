"""Your own files as a task (minknn/tasks/own_task.py): each format and kind read as its rows say, each bad
file refused in one line naming the file, the line and the column before any model is read, and a
run on such a task trained, evaluated, resumed, exported and put through the runner as a registered
task's is. The files are written here, in each test's folder; the words tokenise into the tiny
BERT's letters (tests/helpers.py)."""
import csv
import json
import os

import pytest
import torch

import evaluate
import minknn.tools.export
import train
from minknn import MinknnError
from minknn.lab import runner
from minknn.losses import LOSSES, loss_kind
from minknn.tasks.data import load_split, training_examples
from minknn.tasks.own_task import tasks_of
from minknn.tools import options
from minknn.tools.cli import run

POSITIVE = ["a gripping film", "wonderful acting", "i loved it", "great fun", "a moving story",
            "brilliant and warm", "superb cast", "a joy to watch"]
NEGATIVE = ["a dull film", "terrible acting", "i hated it", "boring mess", "a tedious story",
            "awful and cold", "weak cast", "a chore to watch"]


def write_csv(path, header, rows, delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def reviews(n=2):
    """(text, label) rows: each positive and negative text n times, interleaved."""
    return [row for _ in range(n) for pair in zip(POSITIVE, NEGATIVE)
            for row in ((pair[0], "positive"), (pair[1], "negative"))]


def tasks(*argv):
    """The run's Tasks as train.py reads the flags (checked: minknn/tools/checks.py), and its args."""
    args = options.get_args(["--model", "unread", *argv])
    return tasks_of(args), args


# ------------------------------------------------------------------------ each format and kind

@pytest.mark.parametrize("ext", ["csv", "tsv", "jsonl"])
def test_string_labels_become_the_sorted_class_names_in_each_format(tmp_path, ext):
    rows = [("an okay film", "neutral")] * 3 + reviews()
    path = (write_jsonl(tmp_path / f"r.{ext}", [{"text": t, "label": y} for t, y in rows]) if ext == "jsonl"
            else write_csv(tmp_path / f"r.{ext}", ["text", "label"], rows, "\t" if ext == "tsv" else ","))
    (task,), args = tasks("--train_file", path)
    assert task.name == "r" and args.task == "r" and args.tasks == ["r"], (task.name, args.task)
    assert task.labels == ["negative", "neutral", "positive"] and task.names == task.labels
    assert task.kind == "classify" and not task.pair
    train_split, dev = load_split(task, "train"), load_split(task, "dev")
    n = len(rows)
    assert (len(train_split), len(dev)) == (round(0.9 * n), n - round(0.9 * n)), \
        "no --dev_file: dev is a fixed 10% of train (data.load_split's rows [0.9 n, n))"
    by_id = {e.id: e for e in train_split + dev}
    line = 1 if ext == "jsonl" else 2  # the header is line 1 (JSON Lines: the first row is line 1)
    first = by_id[f"r.{ext}:{line}"]
    assert (first.text, first.label) == ("an okay film", 1), f"{first}: 'neutral' is class 1 of 3"
    with pytest.raises(MinknnError, match=r"no 'test' split \(the run was given no --test_file\)"):
        load_split(task, "test")


def test_integer_labels_are_classes_by_value_or_index_label_names(tmp_path):
    rows = [(t, stars) for t, stars in zip(POSITIVE + NEGATIVE, [5, 10, 5, 10, 2, 2, 10, 5] * 2)]
    path = write_csv(tmp_path / "stars.csv", ["text", "label"], rows)
    (task,), _ = tasks("--train_file", path)
    assert task.labels == ["2", "5", "10"] and task.names is None, \
        f"integers sort by value, not as text, and name nothing: {task.labels}, {task.names}"
    assert [e.label for e in load_split(task, "train") + load_split(task, "dev")
            if e.text == "wonderful acting"] == [2], "10 is the third class"

    coded = write_jsonl(tmp_path / "coded.jsonl", [{"text": t, "label": int(y == "positive")} for t, y in reviews()])
    (task,), _ = tasks("--train_file", coded, "--label_names", "bad,good")
    assert task.labels == ["bad", "good"] and task.names == ["bad", "good"]
    assert {e.label for e in load_split(task, "train") if e.text in POSITIVE} == {1}


def test_pairs_similarity_and_multilabel(tmp_path):
    pairs = [{"premise": a, "hypothesis": b, "score": s}
             for a, b, s in zip(POSITIVE, NEGATIVE + POSITIVE, [0.5, 4.5, 3.0, 1.25] * 4)]
    path = write_jsonl(tmp_path / "sim.jsonl", pairs * 2)
    (task,), _ = tasks("--train_file", path, "--text_column", "premise,hypothesis", "--label_column", "score",
                       "--task_kind", "similarity")
    e = training_examples(task)[0]
    assert task.pair and task.labels == [] and isinstance(e.label, float) and e.text_b is not None

    tags = [(t, "cinema|acting" if "acting" in t or "cast" in t else "cinema") for t, _ in reviews()]
    tags += [("a long read", "")]  # no class: a multi-label row may have none
    path = write_csv(tmp_path / "tags.csv", ["text", "tags"], tags)
    (task,), _ = tasks("--train_file", path, "--label_column", "tags", "--task_kind", "multilabel", "--label_sep", "|")
    assert task.kind == "multilabel" and task.labels == ["acting", "cinema"]
    labels = {e.text: e.label for e in load_split(task, "train") + load_split(task, "dev")}
    assert labels["terrible acting"] == (0, 1) and labels["a dull film"] == (1,) and labels["a long read"] == ()

    listed = write_jsonl(tmp_path / "tags.jsonl", [{"text": t, "label": y.split("|") if y else []} for t, y in tags])
    (task,), _ = tasks("--train_file", listed, "--task_kind", "multilabel")
    assert task.labels == ["acting", "cinema"] and {e.text: e.label for e in load_split(task, "train") +
                                                    load_split(task, "dev")}["weak cast"] == (0, 1)


def test_dev_and_test_files_and_an_unlabelled_test(tmp_path):
    train_path = write_csv(tmp_path / "train.csv", ["text", "label"], reviews())
    dev = write_csv(tmp_path / "dev.csv", ["text", "label"], reviews(1))
    test = write_csv(tmp_path / "test.csv", ["id", "text"], [(i, t) for i, t in enumerate(POSITIVE)])
    (task,), args = tasks("--train_file", train_path, "--dev_file", dev, "--test_file", test, "--task", "mine")
    assert task.name == "mine" and args.tasks == ["mine"]
    assert len(load_split(task, "train")) == 32 and len(load_split(task, "dev")) == 16
    assert [e.label for e in load_split(task, "test")] == [None] * 8, "a test file without labels: predictions only"
    assert args.train_file == os.path.abspath(train_path), "the run records absolute paths"
    blank = write_jsonl(tmp_path / "blank.jsonl", [{"text": t, "label": None} for t in POSITIVE])
    (task,), _ = tasks("--train_file", train_path, "--test_file", blank)
    assert [e.label for e in load_split(task, "test")] == [None] * 8, "a test file's empty label column: unlabelled"
    (task,), _ = tasks("--train_file", train_path, "--task", "критика")
    assert task.name == "критика", "a name in any script's letters"


# ------------------------------------------------------------------------ bad files, one line each

def bad(name, content, *flags, dev=None, ext="csv", says):
    return (name, content, flags, dev, ext, says)


TWO = "text,label\na great film,positive\na dull film,negative\n"
BAD_FILES = [
    bad("missing text column", "review,label\na great film,positive\n", says="t.csv:1: no column 'text'"),
    bad("missing label column", "text,stars\na great film,5\n", says="t.csv:1: no column 'label'"),
    bad("no header", "a great film,positive\na dull film,negative\n",
        says="t.csv:1: the first line (a great film, positive) names none of the columns text, label"),
    bad("header names a column twice", "text,label,text\na,positive,b\n",
        says="t.csv:1: the header names column 'text' twice (fields 1, 3)"),
    bad("an empty text", TWO + ",positive\n", says="t.csv:4: column 'text' is empty"),
    bad("an empty label", TWO + "an okay film,\n", says="t.csv:4: column 'label' is empty (no label)"),
    bad("a label dev never saw in train", TWO, dev="text,label\nan okay film,neutral\n",
        says="d.csv:2: column 'label' holds 'neutral', a class the training file never has"),
    bad("one class only", "text,label\na great film,positive\nfun,positive\n",
        says="t.csv: column 'label' holds one class only ('positive')"),
    bad("a float label for classification", TWO + "an okay film,0.5\n",
        says="t.csv:4: column 'label' holds 0.5, a number with a fraction"),
    bad("a similarity that is not a number", "text,label\na great film,4.5\na dull film,high\n", "--task_kind",
        "similarity", says="t.csv:3: column 'label' holds 'high', not a number"),
    bad("mixed label types", TWO + "an okay film,3\n",
        says="t.csv:4: column 'label' holds an integer (3), where line 2 holds a name ('positive')"),
    bad("mixed types between train and dev", "text,label\na,0\nb,1\n", dev="text,label\nc,positive\n",
        says="d.csv:2: column 'label' holds a name ('positive'), where the training file's labels are integers"),
    bad("no rows", "text,label\n", says="t.csv: no rows below the header"),
    bad("an empty file", "", says="t.csv: the file is empty"),
    bad("a row with too few fields", TWO + "just a text\n",
        says="t.csv:4: too few fields: 1 comma-separated fields, where the header has 2 (text, label)"),
    bad("a row with too many fields", TWO + "a long, winding film,positive\n",
        says="t.csv:4: too many fields: 3 comma-separated fields"),
    bad("undecodable bytes", TWO.encode() + b"caf\xe9 noir,positive\n", says="t.csv:4: not UTF-8"),
    bad("an unclosed quote", TWO + '"a great film,positive\n', says="t.csv:4: a field opens with a quote mark"),
    bad("a JSON Lines row without the text", '{"text": "a", "label": "x"}\n{"label": "y"}\n', ext="jsonl",
        says="t.jsonl:2: no 'text' in this row"),
    bad("a JSON Lines line that is not an object", '{"text": "a", "label": "x"}\n["b", "y"]\n', ext="jsonl",
        says="t.jsonl:2: a JSON list, not an object"),
    bad("a JSON Lines line that is not JSON", '{"text": "a", "label": "x"}\n{"text": "b", \n', ext="jsonl",
        says="t.jsonl:2: not a JSON object"),
    bad("a JSON list label without --task_kind multilabel", '{"text": "a", "label": ["x"]}\n', ext="jsonl",
        says="t.jsonl:1: column 'label' holds a list, not a class; a row of several classes is --task_kind multilabel"),
    bad("label_names with name labels", TWO, "--label_names", "bad,good",
        says="t.csv: --label_names names integer labels 0, 1, ..., and column 'label' holds names already"),
    bad("an integer beyond label_names", "text,label\na,0\nb,1\nc,2\n", "--label_names", "bad,good",
        says="t.csv:4: column 'label' holds 2, and --label_names has 2 names, for 0..1"),
    bad("an unknown extension", TWO, ext="txt", says="--train_file "),
    bad("a text that holds a line break", TWO + '"a long\nfilm",positive\n',
        says="t.csv:4: a field opens with a quote mark (\") that does not close on this line; a quoted field is "
             "\"..\", with \"\" for a quote mark inside; and a text may not hold a line break"),
    bad("a semicolon-separated file", "text;label\na;positive\n",
        says="t.csv:1: the header is one comma-separated field holding semicolons"),
    bad("a column named in another case", "Text,Label\na,positive\nb,negative\n",
        says="t.csv:1: no column 'text' (--text_column); the header has 'Text' (names are matched exactly)"),
    bad("a header after blank lines", "\n\nreview,label\na,positive\n",
        says="t.csv:3: no column 'text' (--text_column); the header has: review, label"),
    bad("a NaN label", '{"text": "a", "label": "x"}\n{"text": "b", "label": NaN}\n', ext="jsonl",
        says="t.jsonl:2: column 'label' holds nan, not a class"),
    bad("a lone surrogate", '{"text": "a", "label": "x"}\n{"text": "b \\ud83d", "label": "y"}\n', ext="jsonl",
        says="t.jsonl:2: column 'text' holds a lone surrogate"),
    bad("JSON nested too deep", '{"text": "a", "label": "x"}\n' + "[" * 100000 + "\n", ext="jsonl",
        says="t.jsonl:2: not a JSON object (nested too deep)"),
    bad("too few rows for a 10% dev split", "text,label\na,positive\nb,negative\nc,positive\n",
        says="t.csv: 3 rows, and a dev split of 10% of them would be empty; give --dev_file, or more rows"),
    # rows 0..9 shuffled by random.Random(0): row 6 is the one in dev (data.load_split)
    bad("a class the 90% cut leaves out of train", "text,label\n" + "a,x\n" * 6 + "b,y\n" + "c,x\n" * 3,
        says="t's train split (of "),
    bad("classes that differ only in case", TWO + "c,Positive\nd,negative\n",
        says="t.csv:4: column 'label' holds 'Positive', where line 2 holds 'positive': classes that differ only in "
             "case; write each class one way"),
    bad("a task named overall", TWO + "c,positive\nd,negative\ne,positive\n", "--task", "overall",
        says="task name 'overall': 'overall' is a name minknn keeps for itself"),
    bad("a tab-separated file named .csv", "text\tlabel\na\tpositive\n",
        says="t.csv:1: the header is one comma-separated field holding tabs: a tab-separated file is read as .tsv"),
]


def write_bad(tmp_path, content, ext, name="t"):
    path = tmp_path / f"{name}.{ext}"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


@pytest.mark.parametrize("case", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_a_bad_file_is_one_line_naming_file_line_and_column_before_the_model(case, tmp_path, capsys, monkeypatch):
    name, content, flags, dev, ext, says = case
    argv = ["--train_file", write_bad(tmp_path, content, ext), *flags, "--model", str(tmp_path / "no-model"),
            "--out", str(tmp_path / "run"), "--device", "cpu"]
    if dev is not None:
        argv += ["--dev_file", write_bad(tmp_path, dev, "csv", "d")]
    monkeypatch.setattr("minknn.backbones.from_pretrained",
                        lambda *a, **k: pytest.fail(f"{name}: the model was read before the file was refused"))
    with pytest.raises(SystemExit) as exit_:
        run(lambda: train.main(argv))
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning: ")]
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), \
        f"{name}: expected exit 2 and one line, got {exit_.value.code}: {err}"
    assert says in err[0], f"{name}: the line does not say {says!r}: {err[0]}"
    assert not os.path.exists(tmp_path / "run"), f"{name}: a refused run left its folder"


def test_a_file_given_twice_and_file_flags_without_a_train_file(tmp_path, capsys):
    path = write_bad(tmp_path, TWO, "csv")
    for argv, says in ((["--train_file", path, "--dev_file", path], "--dev_file " + path + " is --train_file's file"),
                       (["--dev_file", path], "--dev_file is a flag of your own files' task; give --train_file"),
                       (["--train_file", path, "--task", "sst"], "--task sst is a registered task"),
                       (["--train_file", path, "--label_sep", ";"], "--label_sep cuts a multi-label row's classes"),
                       (["--train_file", path, "--text_column", "a,b,c"], "--text_column 'a,b,c': give one column"),
                       (["--train_file", str(tmp_path)], f"--train_file {tmp_path}: a folder; give a file")):
        with pytest.raises(SystemExit) as exit_:
            run(lambda: options.get_args(argv))
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and says in err and "\n" not in err, f"{argv}: {err!r}"


def test_siamese_pairs_take_scores_in_the_scaled_cosines_range(tmp_path, capsys):
    """--pair_mode siamese scores a pair 2.5 (cos + 1), in [0, 5]: scores of 0 to 10 are refused, 0 to 5 taken."""
    rows = [(a, b, s) for a, b, s in zip(POSITIVE, NEGATIVE, [0, 2.5, 10, 7] * 2)]
    path = write_csv(tmp_path / "sim.csv", ["a", "b", "score"], rows)
    flags = ["--text_column", "a,b", "--label_column", "score", "--task_kind", "similarity", "--pair_mode", "siamese"]
    with pytest.raises(SystemExit):
        run(lambda: options.get_args(["--train_file", path, *flags]))
    err = "\n".join(line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning:"))
    assert err == (f"error: --pair_mode siamese scores a pair 2.5 (cos + 1), from 0 to 5, and {path}'s scores run "
                   f"from 0 to 10; use --pair_mode cross (or scale the scores to [0, 5])"), err
    five = write_csv(tmp_path / "five.csv", ["a", "b", "score"], [(a, b, s / 2) for a, b, s in rows])
    assert options.get_args(["--train_file", five, *flags]).pair_mode == "siamese"


# ------------------------------------------------------------------------ a run on your files

def run_on(tiny_bert_dir, out, *argv):
    return train.main(["--model", tiny_bert_dir, "--out", str(out), "--batch_size", "8", "--max_len", "32",
                       "--device", "cpu", "--epochs", "2", *argv])


def test_a_run_on_your_files_trains_evaluates_and_records_them(tiny_bert_dir, tmp_path, capsys):
    path = write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(3))
    test = write_csv(tmp_path / "heldout.csv", ["text", "label"], reviews(1))
    summary = run_on(tiny_bert_dir, tmp_path / "run", "--train_file", path, "--test_file", test,
                     "--loss", "proxyanchor", "--lr", "3e-3")
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("task reviews (classify), from your files") and "2 classes: negative, positive" in first
    saved = json.load(open(tmp_path / "run" / "run.json"))
    assert saved["args"]["train_file"] == path and "dev_file" not in saved["args"]
    assert saved["data"]["files"]["reviews"]["train"]["path"] == path
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ckpt["tasks"]["reviews"]["labels"] == ["negative", "positive"]
    assert summary["train_examples"] == {"reviews": 43} and summary["dev_examples"] == {"reviews": 5}

    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--split", "test", "--proxy", "--knn", "--k", "4"])
    assert result["reviews"]["n"] == 16 and {"acc", "proxy_acc", "knn_acc", "mix_acc"} <= set(result["reviews"])
    rows = list(csv.reader(open(result["reviews"]["predictions"])))
    assert rows[1][0] == "heldout.csv:2" and rows[1][4] in ("negative", "positive")

    # a changed file: evaluate.py refuses it, in one line naming it
    with open(test, "a") as f:
        f.write("one more,positive\n")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run(lambda: evaluate.main(["--checkpoint", str(tmp_path / "run"), "--split", "test"]))
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {test}: changed since the run read it") and "\n" not in err, err

    # the export: the encoder of a run of your files, as of any run
    minknn.tools.export.main([str(tmp_path / "run"), str(tmp_path / "exported")])
    assert os.path.exists(tmp_path / "exported" / "model.safetensors")


def test_resume_refuses_a_file_that_changed_before_anything_is_read(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    """Resumed in a folder with no data/ (your files need no data root), a run goes on; with its file changed,
    --resume refuses it before the model is read."""
    from test_runs import stop_at
    path = write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(3))
    monkeypatch.chdir(tmp_path)  # no data/ here
    for run_name in ("run", "again"):
        with monkeypatch.context() as m:
            stop_at(m, 2, KeyboardInterrupt)
            with pytest.raises(SystemExit):
                run(lambda: run_on(tiny_bert_dir, tmp_path / run_name, "--train_file", path, "--steps_per_epoch", "2"))
    summary = train.main(["--resume", str(tmp_path / "again"), "--device", "cpu"])
    assert summary["epochs"] == 2, "a run of your files resumes where no data/ folder is"
    with open(path, "a") as f:
        f.write("one more,positive\n")
    capsys.readouterr()
    monkeypatch.setattr("minknn.backbones.from_pretrained", lambda *a, **k: pytest.fail("the model was read"))
    with pytest.raises(SystemExit) as exit_:
        run(lambda: train.main(["--resume", str(tmp_path / "run"), "--device", "cpu"]))
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err, err
    assert err == (f"error: --resume {tmp_path / 'run'}: the run's train file {path} changed since it started; "
                   f"put the run's file back, or start a new run"), err


@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_trains_on_your_files_and_evaluate_reads_the_run(loss, tiny_bert_dir, tmp_path):
    """Each classification loss on a CSV of names, each multi-label loss on a JSON Lines file of lists: trained,
    then scored by evaluate.py (with kNN) from the checkpoint alone."""
    if loss_kind(loss) == "multilabel":
        path = write_jsonl(tmp_path / "tags.jsonl", [{"text": t, "label": ["cinema"] + ["acting"] * ("act" in t)}
                                                    for t, _ in reviews(3)])
        argv = ["--train_file", path, "--task_kind", "multilabel"]
    else:
        argv = ["--train_file", write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(3))]
    summary = run_on(tiny_bert_dir, tmp_path / "run", *argv, "--loss", loss, "--lr", "1e-3", "--epochs", "1")
    name = "tags" if loss_kind(loss) == "multilabel" else "reviews"
    assert summary["loss"] == loss and summary["best_epoch"] == 1, summary
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--knn", "--k", "4", "--device", "cpu"])[name]
    first = "micro_f1" if loss_kind(loss) == "multilabel" else "acc"
    assert result[first] == summary["dev"][name][first] and f"knn_{first}" in result


def test_a_registered_tasks_run_records_no_file_flags(tiny_bert_dir, data_dir, tmp_path):
    """A run of the registry keeps run.json and checkpoint.pt's arguments as before the file flags."""
    train.main(["--task", "sst", "--model", tiny_bert_dir, "--data_dir", data_dir, "--out", str(tmp_path / "run"),
                "--epochs", "1", "--steps_per_epoch", "1", "--max_len", "32", "--device", "cpu"])
    saved = json.load(open(tmp_path / "run" / "run.json"))
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    for where, args in (("run.json", saved["args"]), ("checkpoint.pt", ckpt["args"])):
        extra = set(args) & set(options.FILE_FLAGS)
        assert not extra, f"{where} records the file flags {extra} for a registered task"
    assert "files" not in saved["data"] and "own" not in ckpt["tasks"]["sst"]
    assert "resume" in ckpt["args"] and "resume" not in saved["args"], "checkpoint.pt keeps --resume, run.json not"


def test_the_runner_grids_your_files_beside_a_registered_task_held_out(tiny_bert_dir, data_dir, tmp_path):
    path = write_csv(tmp_path / "train.csv", ["text", "label"], reviews(3))
    test = write_csv(tmp_path / "test.csv", ["text", "label"], reviews(1))
    argv = ["--train_file", path, "--test_file", test, "--tasks", "mr,mine", "--chosen_on", "mr",
            "--methods", "ce,proxyanchor+proxy", "--sizes", "8pc", "--seeds", "0", "--out", str(tmp_path / "g"),
            "--data_dir", data_dir, "--model", tiny_bert_dir, "--epochs", "1", "--max_len", "32",
            "--batch_size", "8", "--device", "cpu"]
    runner.main(argv)
    lines = [json.loads(line) for line in open(tmp_path / "g" / "results.jsonl")]
    mine = [ln for ln in lines if ln["task"] == "mine"]
    assert {ln["method"] for ln in mine} == {"ce", "proxyanchor+proxy"}
    assert all(ln["test_split"] == "test" and ln["n_test"] == 16 and ln["n_train"] == 16 for ln in mine)
    table = open(tmp_path / "g" / "table.md").read()
    assert "held out" in table.lower() and "mine" in table
    # the same grid on a changed file is another grid: refused in one line
    with open(path, "a") as f:
        f.write("one more,positive\n")
    with pytest.raises(MinknnError, match="holds a grid run with --files"):
        runner.main(argv)


def test_your_class_names_start_the_proxies_and_your_task_joins_a_multitask_run(tiny_bert_dir, data_dir, tmp_path,
                                                                               capsys):
    path = write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(3))
    run_on(tiny_bert_dir, tmp_path / "named", "--train_file", path, "--loss", "proxyanchor", "--proxy_init", "names",
           "--epochs", "1")
    assert "proxies at the class names reviews: 'negative', 'positive'" in capsys.readouterr().out
    coded = write_csv(tmp_path / "coded.csv", ["text", "label"], [(t, int(y == "positive")) for t, y in reviews(3)])
    with pytest.raises(SystemExit):
        run(lambda: options.get_args(["--train_file", coded, "--loss", "proxyanchor", "--proxy_init", "names"]))
    assert "coded has no readable class names (its labels 0, 1 are codes" in capsys.readouterr().err
    (task,), _ = tasks("--train_file", coded, "--label_names", "negative,positive", "--loss", "ancsetfit")
    assert task.names == ["negative", "positive"], "--label_names are the names AncSetFit's statements read"

    summary = run_on(tiny_bert_dir, tmp_path / "multi", "--task", "multitask", "--tasks", "sst,reviews",
                     "--train_file", path, "--data_dir", data_dir, "--epochs", "1")
    assert set(summary["dev"]) == {"sst", "reviews", "overall"}
    result = evaluate.main(["--checkpoint", str(tmp_path / "multi")])
    assert {"sst", "reviews", "overall"} <= set(result)
    with pytest.raises(SystemExit):
        run(lambda: options.get_args(["--task", "multitask", "--tasks", "sst,mrpc", "--train_file", path]))
    assert "add a name for your files' task (e.g. --tasks sst,mrpc,mine)" in capsys.readouterr().err
