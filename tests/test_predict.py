"""predict (minknn/tools/predict.py) and the Python API under it (minknn/tools/inference.py load): the answers are
evaluate.py's, bit for bit, on the same texts (the head, proxy inference and kNN, on a run of each
kind), from texts given as arguments, in a file or on standard input; --explain's neighbours are the
datastore's nearest keys and its proxies' cosines the proxies'; --out writes them all."""
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import evaluate
import train
from minknn import MinknnError
from minknn.tools.cli import run
from minknn.tools.inference import load
from minknn.tools.predict import main as predict
from test_own_task import NEGATIVE, POSITIVE, reviews, write_csv, write_jsonl

DEV = ["a gripping story", "i hated the cast", "great and warm", "a tedious mess", "wonderful film",
       "a chore", "superb", "dull acting", "loved it", "awful"]
PREFIX = {"": "model", "proxy_": "proxy", "knn_": "knn-only", "mix_": "knn"}  # evaluate's -> predict's rules


def trained(tiny_bert_dir, tmp_path, *argv):
    out = tmp_path / "run"
    train.main(["--model", tiny_bert_dir, "--out", str(out), "--batch_size", "8", "--max_len", "32",
                "--device", "cpu", "--epochs", "2", "--lr", "3e-3", *argv])
    return str(out)


def evaluated(monkeypatch, argv):
    """evaluate.main(argv)'s probabilities by rule (model, proxy, knn, knn-only): what it scores and
    writes, caught on their way to its files."""
    caught = {}
    real = evaluate.write_rules

    def spy(args, task, examples, subset, rules, result):
        for _, prefix, probabilities, _ in rules:
            caught[PREFIX[prefix]] = probabilities.clone()
        return real(args, task, examples, subset, rules, result)
    with monkeypatch.context() as m:
        m.setattr(evaluate, "write_rules", spy)
        result = evaluate.main(argv)
    return caught, result


def answered(tmp_path, run_folder, *argv):
    out = tmp_path / "answers.jsonl"
    predict([run_folder, *argv, "--out", str(out)])
    return [json.loads(line) for line in open(out)]


@pytest.mark.parametrize("kind", ["classify", "multilabel", "similarity"])
def test_predict_gives_evaluates_probabilities_bit_for_bit(kind, tiny_bert_dir, tmp_path, monkeypatch):
    if kind == "classify":
        dev = write_csv(tmp_path / "dev.csv", ["text", "label"],
                        [(t, "positive" if i % 2 == 0 else "negative") for i, t in enumerate(DEV)])
        argv = ["--train_file", write_csv(tmp_path / "train.csv", ["text", "label"], reviews(3)),
                "--dev_file", dev, "--loss", "proxyanchor"]
        rules, columns = ["--proxy", "--knn", "--k", "4"], ["--text_column", "text"]
    elif kind == "multilabel":
        def tags(t):
            return ["cinema"] + (["acting"] if "act" in t or "cast" in t else []) + (["mood"] if "warm" in t else [])
        dev = write_jsonl(tmp_path / "dev.jsonl", [{"text": t, "label": tags(t)} for t in DEV])
        argv = ["--train_file", write_jsonl(tmp_path / "train.jsonl", [{"text": t, "label": tags(t) + [y]}
                                                                       for t, y in reviews(3)]),
                "--dev_file", dev, "--task_kind", "multilabel"]
        rules, columns = ["--knn", "--k", "4"], ["--text_column", "text"]
    else:
        def pairs(texts):
            return [(a, b, f"{(i * 0.7) % 5:.2f}") for i, (a, b) in enumerate(zip(texts, reversed(texts)))]
        dev = write_csv(tmp_path / "dev.tsv", ["a", "b", "score"], pairs(DEV), delimiter="\t")
        argv = ["--train_file", write_csv(tmp_path / "train.tsv", ["a", "b", "score"],
                                          pairs(POSITIVE + NEGATIVE) * 2, delimiter="\t"),
                "--dev_file", dev, "--text_column", "a,b", "--label_column", "score", "--task_kind", "similarity"]
        rules, columns = [], ["--text_column", "a,b"]
    run_folder = trained(tiny_bert_dir, tmp_path, *argv)
    expected, result = evaluated(monkeypatch, ["--checkpoint", run_folder, "--device", "cpu", *rules])
    answers = answered(tmp_path, run_folder, "--file", dev, *columns, "--device", "cpu", *rules)
    assert len(answers) == len(DEV) and set(expected) == {a for a in answers[0] if a in PREFIX.values()}, \
        f"predict answered by {sorted(answers[0])}, evaluate.py scored {sorted(expected)}"
    task = next(iter(torch.load(os.path.join(run_folder, "checkpoint.pt"), weights_only=True)["tasks"].values()))
    for rule, probabilities in expected.items():
        for i, a in enumerate(answers):
            theirs = probabilities[i].tolist()
            ours = a[rule]["answer"] if kind == "similarity" else [a[rule]["probabilities"][c] for c in task["labels"]]
            assert ours == theirs, (f"{kind} {rule}, text {i + 1} ({a['text']!r}): predict gives {ours}, "
                                    f"evaluate.py {theirs}: not the same computation")
    if kind != "similarity":  # the predictions files: the same classes
        name = next(n for n in result if isinstance(result[n], dict))
        rows = list(csv.DictReader(open(result[name]["predictions"])))
        said = [a["model"]["answer"] for a in answers]
        theirs = [r["prediction_name"] if kind == "classify" else r["prediction_name"].split() for r in rows]
        assert said == theirs, f"the head's answers {said} are not evaluate.py's predictions {theirs}"


def test_texts_from_arguments_a_file_a_column_or_standard_input(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    run_folder = trained(tiny_bert_dir, tmp_path, "--train_file",
                         write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(3)))
    by_args = predict([run_folder, "a gripping film", "a dull film", "--device", "cpu"])
    shown = capsys.readouterr().out
    assert [r["id"] for r in by_args] == ["1", "2"] and "1. a gripping film" in shown and "model:" in shown
    (tmp_path / "mine.txt").write_text("a gripping film\n\na dull film\n")
    by_lines = predict([run_folder, "--file", str(tmp_path / "mine.txt"), "--device", "cpu"])
    assert [r["id"] for r in by_lines] == ["mine.txt:1", "mine.txt:3"], "blank lines are no texts"
    by_column = predict([run_folder, "--file", str(tmp_path / "reviews.csv"), "--device", "cpu"])
    assert len(by_column) == 48 and by_column[0]["id"] == "reviews.csv:2"
    monkeypatch.setattr(sys, "stdin", io.StringIO("a gripping film\r\na dull film\n"))
    by_stdin = predict([run_folder, "--device", "cpu"])
    for name, answers in (("a .txt file", by_lines), ("standard input", by_stdin)):
        assert [a["model"] for a in answers] == [a["model"] for a in by_args], f"{name} answers otherwise"
    assert [r["text"] for r in by_column] == [t for t, _ in reviews(3)], "the column's texts, in the file's order"

    capsys.readouterr()
    for argv, says in (([run_folder, "--file", str(tmp_path / "reviews.csv"), "--text_column", "review"],
                        "reviews.csv:1: no column 'review'"),
                       ([run_folder, "a", "--file", str(tmp_path / "mine.txt")], "give texts as arguments or --file"),
                       ([run_folder, "a", "--explain", "2", "--task", "x"], "this run has the tasks reviews"),
                       ([run_folder, "a", "--proxy"], "--proxy: this checkpoint was trained with --loss ce"),
                       ([run_folder, "a", "--k", "4"], "--k is a kNN option; add --knn or --explain"),
                       ([run_folder, "a", "--out", str(tmp_path / "a.txt")], "write a .csv or a .jsonl file"),
                       (["a gripping film"], "RUN a gripping film: not found; the first argument is the run"),
                       ([], "give the run first (RUN: a folder train.py wrote, or its checkpoint.pt)")):
        with pytest.raises(SystemExit) as exit_:
            run(lambda: predict(argv + ["--device", "cpu"]))
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(err) == 1 and says in err[0], f"{argv}: {err}"


def test_explain_shows_the_neighbours_kNN_votes_with_and_the_proxies_cosines(tiny_bert_dir, tmp_path, capsys):
    run_folder = trained(tiny_bert_dir, tmp_path, "--loss", "proxyanchor", "--train_file",
                         write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(3)))
    texts = ["a gripping story", "awful acting"]
    answers = predict([run_folder, *texts, "--explain", "3", "--device", "cpu"])
    shown = capsys.readouterr().out
    assert "the 3 nearest training examples (cosine similarity, label, text):" in shown
    assert "the class proxies' cosines:" in shown

    api = load(run_folder, device="cpu")
    z = F.normalize(torch.from_numpy(api.encode(texts)), dim=-1)
    train_set = {e.id: e for e in api.training_set(api.task())}
    ids = list(train_set)
    keys = F.normalize(torch.from_numpy(api.encode([train_set[i].text for i in ids])), dim=-1)
    cosines = z @ keys.T  # every training example's cosine, computed here
    for i, a in enumerate(answers):
        got = [(n["id"], n["score"]) for n in a["neighbours"]]
        best = cosines[i].topk(3).values.tolist()
        assert [s for _, s in got] == pytest.approx(best, abs=1e-5), \
            f"text {i + 1}: the neighbours' similarities {got} are not the 3 largest cosines {best}"
        for n in a["neighbours"]:
            assert n["text"] == train_set[n["id"]].text and n["label"] == ["negative", "positive"][
                train_set[n["id"]].label], f"neighbour {n['id']}: its text or label is not the training row's"
            assert cosines[i, ids.index(n["id"])].item() == pytest.approx(n["score"], abs=1e-5)
        proxies = api.losses[api.task().name].metric.proxies
        expected = (z[i] @ F.normalize(proxies, dim=-1).T).tolist()
        assert list(a["proxies"].values()) == pytest.approx(expected, abs=1e-5), "the proxies' cosines"


def test_out_writes_csv_and_json_lines_and_pairs_go_two_by_two(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    pairs = [(a, b, "entail" if i % 2 else "contra") for i, (a, b) in enumerate(zip(POSITIVE, NEGATIVE))] * 3
    run_folder = trained(tiny_bert_dir, tmp_path, "--train_file",
                         write_csv(tmp_path / "pairs.csv", ["a", "b", "label"], pairs), "--text_column", "a,b")
    out = tmp_path / "answers.csv"
    recs = predict([run_folder, "a gripping film", "a dull film", "great fun", "weak cast", "--knn", "--k", "4",
                    "--explain", "2", "--out", str(out), "--device", "cpu"])
    assert capsys.readouterr().out.strip().endswith(f"2 answers (model, knn, knn-only, the 2 nearest training "
                                                    f"examples) in {out}")
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0]) == ["id", "text", "text_b", "model", "model_probability", "knn", "knn_probability",
                             "knn-only", "knn-only_probability", "neighbours"]
    assert [(r["text"], r["text_b"]) for r in rows] == [("a gripping film", "a dull film"), ("great fun", "weak cast")]
    assert [r["model"] for r in rows] == [r["model"]["answer"] for r in recs]
    assert float(rows[0]["model_probability"]) == pytest.approx(max(recs[0]["model"]["probabilities"].values()),
                                                                abs=1e-6)
    (tmp_path / "pairs.txt").write_text("a gripping film\ta dull film\n\ngreat fun\tweak cast\n")
    by_lines = predict([run_folder, "--file", str(tmp_path / "pairs.txt"), "--device", "cpu"])
    assert [(r["id"], r["text"], r["text_b"]) for r in by_lines] == [
        ("pairs.txt:1", "a gripping film", "a dull film"), ("pairs.txt:3", "great fun", "weak cast")]
    assert [r["model"] for r in by_lines] == [r["model"] for r in recs], "a pair line answers as two arguments do"
    with pytest.raises(MinknnError, match="a pair task takes its texts two by two"):
        predict([run_folder, "a", "b", "c", "--device", "cpu"])
    monkeypatch.setattr(sys, "stdin", io.StringIO("a gripping film\ta dull film\njust one\n"))
    with pytest.raises(MinknnError, match="stdin:2: a pair task takes a line 'first text<TAB>second text'"):
        predict([run_folder, "--device", "cpu"])
    monkeypatch.setattr(sys, "stdin", io.StringIO("\na gripping film\t \n"))
    with pytest.raises(MinknnError, match="stdin:2: a pair task takes a line .*, both not empty"):
        predict([run_folder, "--device", "cpu"])


def test_the_python_api(tiny_bert_dir, tmp_path):
    run_folder = trained(tiny_bert_dir, tmp_path, "--loss", "proxyanchor", "--train_file",
                         write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(3)))
    api = load(run_folder, device="cpu", k=4)
    texts = ["a gripping film", "a dull film", "great fun"]
    assert api.labels == ["negative", "positive"], "predict_proba's columns"
    for rule in ("model", "proxy", "knn", "knn-only"):
        p = api.predict_proba(texts, rule)
        assert p.shape == (3, 2) and abs(p.sum(1) - 1).max() < 1e-9, f"{rule}: {p}"
        assert api.predict(texts, rule) == [["negative", "positive"][i] for i in p.argmax(1)]
    assert api.encode(texts).shape == (3, 32)
    near = api.neighbours(texts, k=2)
    assert len(near) == 3 and all(len(n) == 2 and {"id", "text", "label", "score"} <= set(n[0]) for n in near)
    with pytest.raises(MinknnError, match="give a list of texts, not one string"):
        api.predict("a gripping film")
    with pytest.raises(MinknnError, match="unknown setting 'kk'"):
        load(run_folder, kk=3)
    with pytest.raises(MinknnError, match="--phi must be in"):
        load(run_folder, phi=2)
    with pytest.raises(MinknnError, match="unknown rule 'knnn'"):
        api.predict(texts, "knnn")
    with pytest.raises(MinknnError, match="batch_size='64': give a whole number"):
        load(run_folder, batch_size="64")
    with pytest.raises(MinknnError, match="k=0: the number of neighbours, 1 or more"):
        api.neighbours(texts, k=0)
    with pytest.raises(MinknnError, match="no texts to answer"):
        api.predict([])


def test_a_bad_file_of_texts_stops_before_the_run_is_read(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    run_folder = trained(tiny_bert_dir, tmp_path, "--train_file",
                         write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(3)))
    (tmp_path / "bad.csv").write_text("text\na gripping film\n\"unclosed\n")
    monkeypatch.setattr("minknn.tools.predict.load", lambda *a, **k: pytest.fail("the run was read before the file"))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run(lambda: predict([run_folder, "--file", str(tmp_path / "bad.csv")]))
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path / 'bad.csv'}:3: a field opens with a quote mark") and "\n" not in err


def test_a_run_copied_without_its_files_still_predicts_by_its_head(tiny_bert_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    run_folder = trained(tiny_bert_dir, tmp_path, "--train_file",
                         write_csv(data / "reviews.csv", ["text", "label"], reviews(3)))
    shutil.rmtree(data)
    assert predict([run_folder, "a gripping film", "--device", "cpu"])[0]["model"]["answer"] in ("negative",
                                                                                                  "positive")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run(lambda: predict([run_folder, "a gripping film", "--knn", "--device", "cpu"]))
    err = capsys.readouterr().err.strip()
    assert err == f"error: {data / 'reviews.csv'}: not found; the run read its train examples from it", err


@pytest.mark.parametrize("page", ["README.md", "docs/predict.md"])
def test_the_pages_python_api_block_runs_as_written(page, tiny_bert_dir, tmp_path, monkeypatch):
    """The page's ```python block, run as a user pastes it, in a folder where runs/reviews is a run of
    their file: five lines at most, each a call that works."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, page), encoding="utf-8").read()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) <= 5, f"{page}: the Python API takes {len(block.splitlines())} lines"
    monkeypatch.chdir(tmp_path)
    # 72 training examples: kNN's default K (64) fits in its datastore, and the block runs verbatim
    train.main(["--train_file", write_csv(tmp_path / "reviews.csv", ["text", "label"], reviews(5)), "--model",
                tiny_bert_dir, "--out", "runs/reviews", "--max_len", "32", "--epochs", "1", "--device", "cpu"])
    namespace = {}
    exec(compile(block, page, "exec"), namespace)
    assert namespace["run"].predict(["a gripping film"])[0] in ("negative", "positive")


def test_importing_the_api_loads_nothing_slow():
    """`from minknn.tools.inference import load` imports torch and minknn's files, not torch._dynamo (2 s on this
    project's CPU: torch.nn.attention.varlen's, which minknn/packed.py imports on its first CUDA use only), nor a
    model or data (load does that)."""
    code = "import sys; import minknn.tools.inference; print(sorted(m for m in ('torch._dynamo', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-500:])
