"""train.py and evaluate.py end to end, on the tiny fixture datasets and the tiny random BERT (part 5's
make_optimizer and train_step, on a model small enough to follow: test_training_step.py)."""
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import evaluate
import minknn.datastore
import minknn.tools.inference
import train
from minknn import MinknnError
from minknn.bert import BertModel
from minknn.datastore import Datastore
from minknn.losses import LOSSES, MEMORY_LOSSES, METRIC_LOSSES, loss_kind
from minknn.losses import PROXY_LOSSES
from minknn.pcgrad import PCGrad
from minknn.tasks.data import examples_fingerprint, training_examples
from minknn.tasks.registry import TASKS
from minknn.tools import options
from minknn.tools.files import CHECKSUM, sealed
from test_training_step import factor  # the schedule, part 5's

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(script, *args):
    """Runs a script as a user would; returns its exit status and its stderr, less the warnings
    that the fixtures are smaller than the official files (test_data.py tests those)."""
    p = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return p.returncode, "\n".join(line for line in p.stderr.strip().splitlines() if not line.startswith("warning: "))


def run_train(tiny_bert_dir, data_dir, out, *extra):
    return train.main(["--task", "sst", "--model", tiny_bert_dir, "--data_dir", data_dir, "--out", str(out),
                       "--batch_size", "8", "--max_len", "32", "--device", "cpu", *extra])


def test_train_then_evaluate(tiny_bert_dir, data_dir, tmp_path):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "8", "--lr", "3e-3")
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["epoch"] for r in records] == list(range(1, 9))
    assert records[-1]["train_loss"]["sst"] < 0.75 * records[0]["train_loss"]["sst"]  # it learns (chance: ln 5 = 1.61)
    assert summary["dev"]["sst"]["acc"] == max(r["dev"]["sst"]["acc"] for r in records) > 0.5
    assert summary["dev"]["overall"] == summary["dev"]["sst"]["acc"]  # one task: its accuracy picks the epoch
    assert json.load(open(tmp_path / "run" / "summary.json")) == summary

    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--device", "cpu"])["sst"]
    assert (result["acc"], result["macro_f1"]) == (summary["dev"]["sst"]["acc"], summary["dev"]["sst"]["macro_f1"])
    rows = list(csv.reader(open(result["predictions"])))
    assert rows[0] == ["id", "prediction", "prediction_name", "gold", "gold_name"] and len(rows) == 16

    test = evaluate.main(["--checkpoint", str(tmp_path / "run" / "checkpoint.pt"), "--split", "test",
                          "--data_dir", data_dir])["sst"]
    rows = list(csv.reader(open(test["predictions"])))
    assert "acc" not in test and len(rows) == 8 and rows[0] == ["id", "prediction", "prediction_name"]  # no labels


def test_attention_flag_picks_the_attention_that_trains(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """--attention explicit trains and evaluates with bert.attention(), the function a student
    writes; --attention fused never calls it."""
    import minknn.bert
    calls = []
    written = minknn.bert.attention

    def counted(q, k, v, mask, dropout_p=0.0):
        calls.append(dropout_p)
        return written(q, k, v, mask, dropout_p)

    monkeypatch.setattr(minknn.bert, "attention", counted)
    run_train(tiny_bert_dir, data_dir, tmp_path / "fused", "--epochs", "1", "--steps_per_epoch", "1",
              "--attention", "fused")
    assert calls == [], "--attention fused must not call attention()"
    run_train(tiny_bert_dir, data_dir, tmp_path / "explicit", "--epochs", "1", "--steps_per_epoch", "1",
              "--attention", "explicit")
    assert 0.1 in calls, "--attention explicit must train with attention(), its dropout on"
    assert 0.0 in calls, "--attention explicit must also score dev with attention(), no dropout"
    calls.clear()
    evaluate.main(["--checkpoint", str(tmp_path / "fused"), "--data_dir", data_dir, "--device", "cpu",
                   "--attention", "explicit"])
    assert calls and set(calls) == {0.0}, "evaluate.py --attention explicit must call attention()"


def test_few_shot_pretrain_run_leaves_bert_untouched(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """BERT is exactly the base model's after training (last.pt, kept here), which is why the checkpoint can leave
    it out and name the base model instead; evaluate.py, --knn included, rebuilds it from that folder (given
    relative to another folder than evaluate's) and gets the run's dev scores."""
    real = os.remove
    monkeypatch.setattr(os, "remove", lambda path: None if str(path).endswith("last.pt") else real(path))
    monkeypatch.chdir(os.path.dirname(tiny_bert_dir))
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--option", "pretrain",
                        "--max_train", "10", "--pooling", "cls", "--seed", "3",
                        "--model", os.path.basename(tiny_bert_dir))
    monkeypatch.chdir(tmp_path)
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    from minknn.bert import BertModel
    original = BertModel.from_pretrained(tiny_bert_dir).state_dict()
    for k, v in original.items():
        assert torch.equal(last["model"]["bert." + k], v), k
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert not [k for k in ckpt["model"] if k.startswith("bert.")] and list(ckpt["model"]) == ["heads.sst.weight",
                                                                                               "heads.sst.bias"]
    assert ckpt["base_model"]["folder"] == os.path.abspath(tiny_bert_dir)
    assert ckpt["args"]["max_train"] == 10 and ckpt["args"]["lr"] == 1e-3 and summary["seed"] == 3
    argv = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn", "--k", "4"]
    first, again = evaluate.main(argv)["sst"], evaluate.main(argv)["sst"]
    assert (first["acc"], first["macro_f1"]) == (summary["dev"]["sst"]["acc"], summary["dev"]["sst"]["macro_f1"])
    assert 0 <= first["knn_acc"] <= 1 and again == {**first, "timing": again["timing"]}
    assert again["timing"]["datastore_build_seconds"] is None, "the datastore of an unchanged checkpoint was rebuilt"


def test_bad_flags_give_one_line_errors(tiny_bert_dir, data_dir, tmp_path):
    code, err = cli("train.py", "--loss", "proxyanchr", "--model", tiny_bert_dir, "--data_dir", data_dir)
    assert code == 2 and err == (
        f"error: unknown --loss 'proxyanchr'; choose one of: {', '.join(LOSSES)}")
    code, err = cli("train.py", "--task", "sst", "--model", str(tmp_path / "no-model"), "--data_dir", data_dir)
    assert code == 2 and err.startswith("error: --model") and "\n" not in err
    code, err = cli("evaluate.py", "--checkpoint", str(tmp_path))
    assert code == 2 and err.startswith("error: --checkpoint") and "not found" in err


@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_trains_end_to_end(tiny_bert_dir, data_dir, tmp_path, loss):
    """Each classification loss on SST, each multi-label loss on GoEmotions (the fixtures)."""
    task = "goemotions" if loss_kind(loss) == "multilabel" else "sst"
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--task", task, "--epochs", "2", "--lr", "1e-3",
                        "--loss", loss)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert all(torch.isfinite(torch.tensor(r["train_loss"][task])) for r in records) and summary["loss"] == loss
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ckpt["args"]["loss"] == loss and ckpt["args"]["proxy_lr"] == 0.1
    if loss in PROXY_LOSSES:
        names = [n for n, _ in METRIC_LOSSES[loss](5, 8).named_parameters()]  # proxies, centres
        assert list(ckpt["loss"]) == [f"sst.metric.{n}" for n in names]
    assert ("memory" in ckpt) == (loss in MEMORY_LOSSES)


def test_setfit_trains_the_encoder_on_pairs_and_saves_the_logistic_head(tiny_bert_dir, data_dir, tmp_path):
    """--loss setfit: an epoch is a pass over R x 2 x N pairs (3 x 2 x 15 = 90, 12 batches of 8), the encoder
    trains, and the best checkpoint's head is the logistic regression (C = 1) on that encoder's z of the training
    examples, fit after the epoch (SetFit's LogisticRegression), not a head that trained."""
    from minknn.tools.checkpoint import load_checkpoint, rebuild
    from minknn.tools.engine import predict
    from minknn.probe import fit_logistic
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--loss", "setfit", "--epochs", "2", "--lr",
                        "1e-3", "--per_class", "3", "--setfit_iterations", "3", "--seed", "2")
    assert summary["train_examples"] == {"sst": 15}, summary
    assert summary["steps_per_epoch"] == 12, (f"--loss setfit: {summary['steps_per_epoch']} steps an epoch; a pass "
                                              f"over R x 2 x N = 90 pairs in batches of 8 pairs is 12")
    assert summary["lam"] == {"sst": 1.0}
    ckpt = load_checkpoint(str(tmp_path / "run"))
    model, _, tokenizer = rebuild(ckpt)
    base = BertModel.from_pretrained(tiny_bert_dir).state_dict()
    assert any(not torch.equal(model.bert.state_dict()[k], v) for k, v in base.items()), "the encoder did not train"
    task = model.tasks["sst"]
    train_set = training_examples(task, data_dir, None, 2, 3)
    assert examples_fingerprint(train_set) == ckpt["data"]["train_fingerprint"]["sst"]
    _, z = predict(model, tokenizer, task, train_set, 16, torch.device("cpu"))
    W, b = fit_logistic(z, torch.tensor([e.label for e in train_set]), len(task.labels))
    torch.testing.assert_close(model.heads["sst"].weight, W, msg="--loss setfit: the checkpoint's head weight is not "
                               "the logistic regression on the trained encoder's z (train.py end_epoch, fit_head)")
    torch.testing.assert_close(model.heads["sst"].bias, b, msg="--loss setfit: the head's bias")
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--device", "cpu"])["sst"]
    assert result["acc"] == summary["dev"]["sst"]["acc"], "evaluate.py scores the saved head as the run did"


def test_ancsetfit_encodes_each_classs_statement_in_its_anchors_place(tiny_bert_dir, data_dir, tmp_path,
                                                                      monkeypatch):
    """--loss ancsetfit: an epoch is a pass over R x N triplets (2 x 15 = 30, 4 batches of 8); each batch's first
    third is the statements of its texts' classes (sst: AncSetFit's "The movie is terrible" ... "great"), the
    second the training texts, the third texts of other classes; the encoder trains, and the head is fit after."""
    import minknn.tools.step
    from minknn.tasks.data import class_statements
    seen, real = [], minknn.tools.step.encode_batch

    def encode(tokenizer, examples, siamese=False):
        seen.append([(e.text, e.label) for e in examples])
        return real(tokenizer, examples, siamese)
    monkeypatch.setattr(minknn.tools.step, "encode_batch", encode)
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--loss", "ancsetfit", "--epochs", "1", "--lr",
                        "1e-3", "--per_class", "3", "--anc_iterations", "2", "--seed", "2")
    assert summary["steps_per_epoch"] == 4, (f"--loss ancsetfit: {summary['steps_per_epoch']} steps an epoch; a "
                                             f"pass over R x N = 30 triplets in batches of 8 is 4")
    statements = class_statements(TASKS["sst"])
    train_texts = {e.text for e in training_examples(TASKS["sst"], data_dir, None, 2, 3)}
    batches = [b for b in seen if len(b) % 3 == 0 and any(text in statements for text, _ in b)]
    assert len(batches) == 4, f"{len(batches)} training batches held the statements, not 4"
    for b in batches:
        B = len(b) // 3
        anchors, texts, negatives = b[:B], b[B:2 * B], b[2 * B:]
        assert [a for a in anchors] == [(statements[y], y) for _, y in texts], (
            f"a batch's anchors must be the statements of its texts' classes, in order: {anchors} for the texts' "
            f"classes {[y for _, y in texts]}")
        assert all(text in train_texts for text, _ in texts + negatives), "texts and negatives: training texts"
        assert all(n != y for (_, y), (_, n) in zip(texts, negatives)), "a negative of its text's own class"
    assert summary["lam"] == {"sst": 1.0}


def test_setfit_below_lam_1_trains_its_head_from_the_probe_and_does_not_refit_it(tiny_bert_dir, data_dir, tmp_path):
    """--loss setfit --lam 0.5 --head_init probe (SetFit's body with the recipe's LP-FT start): the head starts as
    the probe (at lr 1e-12 nothing moves, so the saved head is the base encoder's probe) and trains by cross-entropy
    beside the pair loss (at lr 1e-3 the saved head is that trained head, not the logistic regression refit on the
    trained encoder's z)."""
    from minknn.tools.checkpoint import load_checkpoint, rebuild
    from minknn.tools.engine import predict
    from minknn.probe import fit_logistic

    def head_and_probe(lr):
        out = tmp_path / f"run-lr{lr}"
        summary = run_train(tiny_bert_dir, data_dir, out, "--loss", "setfit", "--lam", "0.5", "--head_init", "probe",
                            "--epochs", "1", "--lr", lr, "--per_class", "3", "--setfit_iterations", "3", "--seed", "2")
        assert summary["lam"] == {"sst": 0.5}, summary["lam"]
        model, _, tokenizer = rebuild(load_checkpoint(str(out)))
        task = model.tasks["sst"]
        train_set = training_examples(task, data_dir, None, 2, 3)
        _, z = predict(model, tokenizer, task, train_set, 16, torch.device("cpu"))
        W, _ = fit_logistic(z, torch.tensor([e.label for e in train_set]), len(task.labels))
        return (model.heads["sst"].weight - W).abs().max().item()
    gap = head_and_probe("1e-12")
    assert gap < 1e-5, (f"--loss setfit --lam 0.5 --head_init probe --lr 1e-12: the saved head is {gap:.1e} from the "
                        f"base encoder's probe; it must start as the probe (and at lr 1e-12 stay there)")
    gap = head_and_probe("1e-3")
    assert gap > 1e-3, (f"--loss setfit --lam 0.5: the saved head is the logistic regression refit on the trained "
                        f"z (largest difference {gap:.1e}); with a cross-entropy term the head trains and stays")


def test_proxies_learn_at_their_own_rate(tiny_bert_dir, data_dir, tmp_path):
    def proxies(*flags):
        out = tmp_path / "-".join(["run", *flags])
        run_train(tiny_bert_dir, data_dir, out, "--epochs", "1", "--loss", "proxyanchor", *flags)
        return torch.load(out / "checkpoint.pt", weights_only=True)["loss"]["sst.metric.proxies"]
    frozen, trained = proxies("--proxy_lr", "0"), proxies()   # the same seed: the same random start
    assert not torch.equal(frozen, trained)
    assert torch.equal(frozen, proxies("--proxy_lr", "0", "--lr", "1e-3"))   # the encoder's lr does not move them


def test_proxy_inference_from_a_checkpoint(tiny_bert_dir, data_dir, tmp_path):
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "3", "--lr", "3e-3", "--loss", "proxyanchor")
    common = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--proxy"]
    plain = evaluate.main(common + ["--proxy_alpha", "0"])["sst"]
    assert (plain["proxy_acc"], plain["proxy_macro_f1"]) == (plain["acc"], plain["macro_f1"])
    mixed = evaluate.main(common)["sst"]
    assert mixed["acc"] == plain["acc"] and 0 <= mixed["proxy_acc"] <= 1
    rows = list(csv.reader(open(tmp_path / "run" / "predictions-dev-proxy.csv")))
    assert rows[0] == ["id", "prediction", "prediction_name", "gold", "gold_name"] and len(rows) == 16


def test_proxy_errors_are_one_line(tiny_bert_dir, data_dir, tmp_path):
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--max_train", "10")
    assert cli("evaluate.py", "--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--proxy") == (2,
        "error: --proxy: this checkpoint was trained with --loss ce, which has no proxies; "
        f"proxy inference needs one of: {', '.join(PROXY_LOSSES)}")
    for bad in (["--loss", "supcon", "--lam", "1.5"], ["--loss", "ce", "--lam", "0.5"]):
        with pytest.raises(SystemExit):
            options.get_args(bad)
    with pytest.raises(SystemExit):
        evaluate.get_args(["--checkpoint", "x", "--proxy_alpha", "-0.1"])


def test_lam_one_scores_epochs_by_the_nearest_proxy(tiny_bert_dir, data_dir, tmp_path):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "2", "--lr", "3e-3",
                        "--loss", "proxynca", "--lam", "1")
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--proxy",
                            "--proxy_alpha", "1"])["sst"]
    assert (summary["dev"]["sst"]["acc"], summary["dev"]["sst"]["macro_f1"]) == (result["proxy_acc"], result["proxy_macro_f1"])
    assert result["acc"] != result["proxy_acc"]  # the untrained head scores differently: the test can fail


@pytest.mark.parametrize("memory", ["queue", "bank"])
def test_knnbert_trains_and_its_memory_is_saved(tiny_bert_dir, data_dir, tmp_path, memory):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--lr", "1e-3", "--loss", "knnbert",
                        "--memory", memory, "--m_most", "3", "--m_least", "2")
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    train_labels = sorted(int(row[3]) for row in list(csv.reader(open(os.path.join(data_dir, "minbert", "ids-sst-train.csv")), delimiter="\t"))[1:])
    assert ckpt["args"]["queue_size"] == len(train_labels) == 40 and summary["memory_fill_seconds"] >= 0
    assert (ckpt["args"]["m_most"], ckpt["args"]["m_least"], ckpt["args"]["memory"]) == (3, 2, memory)
    assert ckpt["memory"]["keys"].shape == (40, 32)
    assert torch.allclose(ckpt["memory"]["keys"].norm(dim=1), torch.ones(40))
    # one epoch writes every training example's key once (queue) or keeps one entry each (bank):
    # either way the memory holds each label as often as the training set does
    assert sorted(ckpt["memory"]["labels"].tolist()) == train_labels
    if memory == "queue":
        assert ckpt["memory"]["ptr"].item() == 0  # 40 keys into 40 slots: one full turn


@pytest.mark.parametrize("memory", ["queue", "bank"])
def test_a_memory_run_says_what_it_is_before_the_fill_shows_its_progress(tiny_bert_dir, data_dir, tmp_path,
                                                                          monkeypatch, memory):
    """The run's first line (what it is) comes before the progress bar of the memory's fill, then
    the memory's line: stdout and stderr into one stream, as a terminal shows them."""
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--steps_per_epoch", "1",
              "--loss", "knnbert", "--memory", memory)
    shown = screen.getvalue()
    order = [shown.find(s) for s in ("train/dev examples:", f"filling the {memory}", f"memory: a {memory}")]
    assert -1 not in order and order == sorted(order), (
        f"the run's first line, the fill's progress bar and the memory's line must come in this order: "
        f"{shown[:600]!r}")


def test_a_warning_during_an_epoch_starts_its_own_line_not_the_bars(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """knnbert's warning (every class of the 40-key queue has at most --m_most + --m_least keys) comes on the
    first step, while the epoch's progress bar is on screen: it must clear the bar's line first (tqdm.write), not
    be printed onto it. stdout and stderr into one stream, as a terminal shows them."""
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--steps_per_epoch", "2",
              "--loss", "knnbert")
    shown = screen.getvalue()
    at = shown.find("warning: knnbert:")
    assert at >= 0, f"the premise: knnbert warns on this run: {shown[:600]!r}"
    line_start = max(shown.rfind("\n", 0, at), shown.rfind("\r", 0, at)) + 1
    assert shown[line_start:at].strip() == "", (
        f"the warning was printed onto the progress bar's line {shown[line_start:at]!r}; print it with tqdm.write "
        f"(minknn.warn) so that the bar's line is cleared first")


def test_train_then_evaluate_knn(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "4", "--lr", "3e-3", "--loss", "knnbert")
    common = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn", "--k", "8"]
    first = evaluate.main(common + ["--phi", "0"])["sst"]
    assert (first["mix_acc"], first["mix_macro_f1"]) == (first["acc"], first["macro_f1"])  # phi 0: the linear head
    assert first["timing"]["datastore_size"] == 40 and first["timing"]["datastore_build_seconds"] is not None
    assert os.path.exists(tmp_path / "run" / "datastore-mean.pt")
    again = evaluate.main(common + ["--phi", "1", "--vote", "distance"])["sst"]
    assert again["timing"]["datastore_build_seconds"] is None  # reused: same checkpoint, key, training set
    assert (again["mix_acc"], again["mix_macro_f1"]) == (again["knn_acc"], again["knn_macro_f1"])  # phi 1: kNN alone
    assert os.path.exists(tmp_path / "run" / "predictions-dev-knn-k8-phi0.0.csv")  # the first's, kept
    rows = list(csv.reader(open(tmp_path / "run" / "predictions-dev-knn-distance-k8-phi1.0.csv")))
    assert rows[0] == ["id", "prediction", "prediction_name", "gold", "gold_name"] and len(rows) == 16

    # on the training set each query's own entry is left out (test_knn.py checks the search itself)
    searches = []
    search = Datastore.search
    monkeypatch.setattr(Datastore, "search", lambda self, q, k, vote, exclude=None: (
        searches.append((self.ids, exclude)), search(self, q, k, vote, exclude))[1])
    evaluate.main(common + ["--split", "train"])
    evaluate.main(common)
    (_, exclude_train), (_, exclude_dev) = searches
    assert exclude_train.tolist() == list(range(40)) and exclude_dev is None
    monkeypatch.undo()

    swept = evaluate.main(common + ["--sweep"])["sst"]["sweep"]
    assert [r["phi"] for r in swept["phi"]] == sorted([i / 10 for i in range(11)] + [0.25])
    assert [r["k"] for r in swept["k"]] == [1, 2, 4, 8, 16, 32, 40]  # capped at the 40 keys
    assert swept["phi"][0]["acc"] == first["acc"]
    at_8 = evaluate.main(common + ["--phi", "0.5"])["sst"]
    assert next(r for r in swept["phi"] if r["phi"] == 0.5)["acc"] == at_8["mix_acc"]
    assert os.path.exists(tmp_path / "run" / "predictions-dev-knn-k8-sweep.json")

    # another key: the mean-pooled datastore, given by name, is refused for [CLS] keys
    code, err = cli("evaluate.py", *common, "--knn_key", "cls",
                    "--datastore", str(tmp_path / "run" / "datastore-mean.pt"))
    assert code == 2 and "was built by a different checkpoint, key" in err, (
        f"--knn_key cls with the mean keys' --datastore: exit {code}, {err!r}; the datastore's "
        "fingerprint (minknn/datastore.py) covers the key")

    # the checkpoint changes: the default datastore is rebuilt, an explicit one is refused
    run_train(tiny_bert_dir, data_dir, tmp_path / "run2", "--epochs", "1", "--seed", "5")
    code, err = cli("evaluate.py", "--checkpoint", str(tmp_path / "run2"), "--data_dir", data_dir, "--knn", "--k", "8",
                    "--datastore", str(tmp_path / "run" / "datastore-mean.pt"))
    assert code == 2 and "was built by a different checkpoint" in err and "\n" not in err
    import shutil
    shutil.copy(tmp_path / "run2" / "checkpoint.pt", tmp_path / "run" / "checkpoint.pt")
    assert evaluate.main(common)["sst"]["timing"]["datastore_build_seconds"] is not None


def test_evaluate_saves_each_faiss_index_in_its_own_file_over_the_saved_keys(tiny_bert_dir, data_dir, tmp_path,
                                                                              monkeypatch, capsys):
    """--index hnsw: the index built once and saved in its own file, datastore-mean-hnsw.pt, beside the flat
    datastore-mean.pt (which it leaves as it was), loaded by the next evaluate (another --ef_search only changes
    the search); its keys are the flat file's, not encoded again. An explicit --datastore holding another index
    is refused; an older minknn's datastore-mean.pt holding an approximate index is moved to that index's file."""
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1")
    common = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn", "--k", "8"]
    path, hnsw_path, ivf_path = (tmp_path / "run" / f"datastore-mean{kind}.pt" for kind in ("", "-hnsw", "-ivf"))

    def refused(extra, message):
        """evaluate.py with these flags stops with one line, before encoding anything."""
        with monkeypatch.context() as m:
            for module in (minknn.tools.inference, minknn.datastore):  # evaluate.py's pass, the datastore's
                m.setattr(module, "predict", lambda *a, **k: pytest.fail("refused after a prediction pass"))
            with pytest.raises(MinknnError, match=message) as e:
                evaluate.main(common + extra)
        assert "\n" not in str(e.value)
    refused(["--index", "ivf", "--nlist", "41"], r"^--nlist 41: the datastore holds 40 training examples and k-means "
                                                 r"needs one a cell at least; use --nlist 40 or less \(default: 1\)$")
    flat = evaluate.main(common)["sst"]
    assert flat["knn"]["index"] == {"index": "flat"} and flat["timing"]["datastore_build_seconds"] is not None
    assert torch.load(path, weights_only=True)["faiss"] == {}  # a flat index is the keys: not saved
    flat_bytes = path.read_bytes()

    passes = []
    predict = minknn.tools.inference.predict
    for module in (minknn.tools.inference, minknn.datastore):  # the split's pass, the datastore's
        monkeypatch.setattr(module, "predict", lambda *a, **k: (passes.append(k["progress"]), predict(*a, **k))[1])
    capsys.readouterr()
    hnsw = evaluate.main(common + ["--index", "hnsw", "--ef_search", "16"])["sst"]
    assert hnsw["knn"]["index"] == {"index": "hnsw", "hnsw_m": 32, "ef_construction": 64, "ef_search": 16}
    assert hnsw["timing"]["datastore_build_seconds"] is None and hnsw["timing"]["index_build_seconds"] is not None
    assert path.read_bytes() == flat_bytes, "building the hnsw index replaced the flat datastore"
    assert f"40 keys (mean) loaded from {path}; index hnsw (hnsw_m 32, ef_construction 64) goes to {hnsw_path}" \
        in capsys.readouterr().out
    saved = torch.load(hnsw_path, weights_only=True)
    assert saved["index"] == {"index": "hnsw", "hnsw_m": 32, "ef_construction": 64} and set(saved["faiss"]) == {"cosine"}
    again = evaluate.main(common + ["--index", "hnsw", "--ef_search", "64"])["sst"]
    assert (again["timing"]["datastore_build_seconds"], again["timing"]["index_build_seconds"]) == (None, None)
    assert again["knn"]["index"]["ef_search"] == 64 and again["knn_acc"] == hnsw["knn_acc"]
    evaluate.main(common + ["--index", "hnsw", "--vote", "distance"])  # the l2 index joins the cosine one
    assert set(torch.load(hnsw_path, weights_only=True)["faiss"]) == {"cosine", "l2"}
    assert (evaluate.main(common)["sst"]["timing"]["datastore_build_seconds"],) == (None,)  # the flat file, as it was
    assert passes == ["sst dev"] * 4, passes  # the training set was encoded once, by the first flat evaluate

    refused(["--index", "ivf", "--datastore", str(hnsw_path)],
            r"datastore-mean-hnsw.pt holds index hnsw \(hnsw_m 32, ef_construction 64\), but the flags ask for ivf "
            r"\(nlist 1, max_train_per_cell 64\); give its flags, or leave out --datastore$")
    ivf = evaluate.main(common + ["--index", "ivf"])["sst"]
    assert ivf["timing"]["datastore_build_seconds"] is None and torch.load(ivf_path, weights_only=True)["index"] == \
        {"index": "ivf", "nlist": 1, "max_train_per_cell": 64}
    assert (ivf["knn_acc"], ivf["mix_acc"]) == (flat["knn_acc"], flat["mix_acc"])  # one cell of 40 keys: exact
    assert set(torch.load(hnsw_path, weights_only=True)["faiss"]) == {"cosine", "l2"}, "ivf replaced the hnsw file"

    # an older minknn kept every index in datastore-mean.pt: its hnsw index moves to its own file, not lost
    shutil.move(hnsw_path, path)
    capsys.readouterr()
    evaluate.main(common)
    assert f"{path} held index hnsw; moved to {hnsw_path}" in capsys.readouterr().out
    assert torch.load(path, weights_only=True)["index"] == {"index": "flat"}
    assert set(torch.load(hnsw_path, weights_only=True)["faiss"]) == {"cosine", "l2"}
    assert evaluate.main(common + ["--index", "hnsw"])["sst"]["timing"]["index_build_seconds"] is None
    assert passes == ["sst dev"] * 7, passes  # the split only, each time


def test_decoupled_trains_and_knn_uses_its_head(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "2", "--lr", "3e-3", "--decoupled")
    assert summary["decoupled"] and summary["lam"] == {"sst": 0.5}
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert {"retrieval.0.weight", "retrieval.2.weight"} <= set(ckpt["model"])
    common = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn", "--k", "8", "--vote", "distance"]
    result = evaluate.main(common)["sst"]
    assert 0 <= result["knn_acc"] <= 1 and os.path.exists(tmp_path / "run" / "datastore-decoupled.pt")
    # with the datastore saved, the split is encoded once: the logits and the queries r in one pass
    passes = []
    predict = minknn.tools.inference.predict
    for module in (minknn.tools.inference, minknn.datastore):  # the split's pass, the datastore's
        monkeypatch.setattr(module, "predict", lambda *a, **k: (passes.append(k.get("key")), predict(*a, **k))[1])
    assert evaluate.main(common)["sst"]["knn_acc"] == result["knn_acc"] and passes == ["decoupled"]
    monkeypatch.undo()
    evaluate.main(common + ["--knn_key", "mean"])
    r = torch.load(tmp_path / "run" / "datastore-decoupled.pt", weights_only=True)["keys"]
    z = torch.load(tmp_path / "run" / "datastore-mean.pt", weights_only=True)["keys"]
    assert r.shape == z.shape and not torch.allclose(r, z)


def test_knn_and_memory_errors_are_one_line(tiny_bert_dir, data_dir, tmp_path):
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1")
    common = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn"]
    for extra, message in [
        (["--k", "41"], "error: --k 41: the datastore holds 40 training examples; use --k 40 or less"),
        (["--knn_key", "decoupled"], "error: --knn_key decoupled: this checkpoint has no retrieval head (train it with --decoupled)"),
    ]:
        assert cli("evaluate.py", *common, *extra) == (2, message)
    code, err = cli("evaluate.py", "--checkpoint", str(tmp_path / "run"), "--sweep")
    assert code == 2 and err.endswith("error: --sweep is a kNN option; add --knn")
    model = ["--model", tiny_bert_dir, "--data_dir", data_dir, "--out", str(tmp_path / "bad")]
    code, err = cli("train.py", *model, "--loss", "knnbert", "--queue_size", "41", "--max_len", "32")
    assert (code, err) == (2, "error: --queue_size 41: the queue is filled from the 40 training examples, so it must be between 1 and 40")


def recording_steps(monkeypatch, stop_at=None):
    """train.train_step, recorded: a list of (the lr the step takes, the scheduler), one per call; with stop_at,
    Ctrl-C at that call (before its step)."""
    seen, real = [], train.train_step

    def step(trainer, batches):
        if len(seen) + 1 == stop_at:
            raise KeyboardInterrupt
        seen.append((trainer.optimizer.param_groups[0]["lr"], trainer.scheduler))
        return real(trainer, batches)
    monkeypatch.setattr(train, "train_step", step)
    return seen


def test_steps_trains_n_optimiser_steps_whatever_the_data(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """--steps 12 --epochs 3 on 10 examples (a pass: 2 batches of 8): 12 optimiser steps in all, 4 an epoch (the
    streams start new passes), the dev set scored 3 times; the schedule (3 warm-up steps) spans the 12, its last
    step at lr / 9 and 0 after it (Zhang et al. 2021: train for a number of steps, not of epochs)."""
    seen = recording_steps(monkeypatch)
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--steps", "12", "--epochs", "3", "--max_train",
                        "10", "--warmup", "0.25", "--lr", "1e-3")
    assert len(seen) == 12, f"--steps 12: the optimiser took {len(seen)} steps (minknn/tools/trainer.py build(): steps)"
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["epoch"] for r in records] == [1, 2, 3] and summary["steps_per_epoch"] == 4, \
        f"--steps 12 --epochs 3: {len(records)} dev scorings, {summary['steps_per_epoch']} steps each, not 3 of 4"
    lrs, scheduler = [lr for lr, _ in seen], seen[-1][1]
    torch.testing.assert_close(lrs, [1e-3 * factor(s, 12, 0.25) for s in range(12)], rtol=1e-12, atol=0,
                               msg=lambda m: f"--steps 12: each step's lr, warm-up then decay over the 12 steps "
                                             f"(make_optimizer's total_steps must be --steps): {m}")
    assert scheduler.last_epoch == 12 and scheduler.get_last_lr()[0] == 0, \
        f"--steps 12: after the last step the schedule stands at step {scheduler.last_epoch}, lr " \
        f"{scheduler.get_last_lr()[0]}, not 12 and 0"
    assert json.load(open(tmp_path / "run" / "run.json"))["args"]["steps"] == 12, "run.json must keep --steps"


def test_a_steps_run_with_a_probe_head_resumes_to_the_run_left_alone(tiny_bert_dir, data_dir, tmp_path,
                                                                     monkeypatch):
    """--steps and --head_init probe are the run's (run.json): Ctrl-C in epoch 2 of 3, then --resume, ends with the
    records of the run left alone, after the 6 steps left of the 9 (3 an epoch, where a pass over the 10 examples
    is 2); the resumed run does not fit the probe again
    (last.pt holds the heads as trained; a refit would overwrite nothing, but is the fit's time, and wrong if it
    came after the restore)."""
    import minknn.tools.trainer
    fits, fit_head = [], minknn.tools.trainer.fit_head
    monkeypatch.setattr(minknn.tools.trainer, "fit_head", lambda *a, **k: fits.append(a[2].name) or fit_head(*a, **k))
    flags = ("--steps", "9", "--epochs", "3", "--max_train", "10", "--head_init", "probe", "--lr", "1e-3")
    run_train(tiny_bert_dir, data_dir, tmp_path / "alone", *flags)
    assert fits == ["sst"], f"--head_init probe: fit_head ran for {fits}, not once for sst"
    original = train.train_step
    recording_steps(monkeypatch, stop_at=5)  # epoch 2's second step
    with pytest.raises(SystemExit):
        run_train(tiny_bert_dir, data_dir, tmp_path / "stopped", *flags)
    fits.clear()
    monkeypatch.setattr(train, "train_step", original)
    seen = recording_steps(monkeypatch)
    train.main(["--resume", str(tmp_path / "stopped")])
    assert fits == [], f"--resume refit the probe ({fits}): last.pt holds the heads (minknn/tools/trainer.py build)"
    assert len(seen) == 6 and seen[-1][1].last_epoch == 9, \
        f"--resume after epoch 1 of a --steps 9 run: {len(seen)} steps, the schedule at {seen[-1][1].last_epoch}"
    alone, resumed = ([{k: r[k] for k in ("epoch", "train_loss", "dev")}
                       for r in map(json.loads, open(tmp_path / run / "metrics.jsonl"))] for run in ("alone", "stopped"))
    assert resumed == alone, f"stopped and resumed: {resumed}; left alone: {alone}"


@pytest.mark.parametrize("task, flags", [("sst", ["--option", "pretrain"]), ("cfimdb", ["--head_init", "probe"]),
                                         ("goemotions", ["--head_init", "probe"])],
                         ids=["5 classes, pretrain's default", "2 classes", "multi-label"])
def test_the_probe_head_is_the_logistic_regression_before_the_first_step(tiny_bert_dir, data_dir, tmp_path,
                                                                         monkeypatch, task, flags):
    """--head_init probe (LP-FT): at the first step the model's outputs on its training examples are
    fit_logistic's on the same z (the encoder as loaded, no dropout): softmax's logits for a class task, one sigmoid
    per label for a multi-label one (after Model.start_heads' priors, which it replaces)."""
    from minknn.tools.engine import predict
    from minknn.kinds import kind_of
    from minknn.probe import fit_logistic
    first = []
    real = train.train_step

    def step(trainer, batches):
        if not first:
            t = trainer.tasks[0]
            first.append((t, *predict(trainer.model, trainer.tokenizer, t, trainer.train[t.name], 16,
                                      trainer.device), kind_of(t).targets(t, trainer.train[t.name], "cpu")))
            trainer.model.train()
        return real(trainer, batches)
    monkeypatch.setattr(train, "train_step", step)
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--task", task, "--epochs", "1", "--steps_per_epoch", "1",
              "--max_train", "16", *flags)
    t, outputs, z, y = first[0]
    W, b = fit_logistic(z, y, len(t.labels), multilabel=t.kind == "multilabel")
    torch.testing.assert_close(outputs, z @ W.T + b, msg=lambda m: f"{task} {' '.join(flags)}: the head's outputs "
                               f"at the first step are not fit_logistic's on the loaded encoder's z "
                               f"(minknn/tools/trainer.py fit_probes): {m}")


def run_multitask(tiny_bert_dir, data_dir, out, *extra):
    return train.main(["--task", "multitask", "--tasks", "sst,quora,sts", "--model", tiny_bert_dir, "--data_dir", data_dir,
                       "--out", str(out), "--batch_size", "8", "--max_len", "32", "--device", "cpu", *extra])


@pytest.mark.parametrize("pcgrad", [False, True])
def test_multitask_trains_then_evaluates(tiny_bert_dir, data_dir, tmp_path, monkeypatch, pcgrad):
    calls = []
    backward = PCGrad.backward
    monkeypatch.setattr(PCGrad, "backward", lambda *a: calls.append(1) or backward(*a))
    summary = run_multitask(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "6", "--lr", "3e-3",
                            *(["--pcgrad"] if pcgrad else []))
    assert len(calls) == (6 * 5 if pcgrad else 0)  # 40 SST examples / batch 8 = 5 steps per epoch
    assert summary["steps_per_epoch"] == 5 and summary["train_examples"] == {"sst": 40, "quora": 24, "sts": 24}
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["epoch"] for r in records] == list(range(1, 7))
    assert all(0 <= r["conflicting_pairs"] <= 1 for r in records) if pcgrad else "conflicting_pairs" not in records[0]
    for name in ("sst", "quora", "sts"):  # each task learns
        assert records[-1]["train_loss"][name] < 0.8 * records[0]["train_loss"][name], name
    best = records[summary["best_epoch"] - 1]["dev"]
    assert summary["dev"]["overall"] == best["overall"] == max(r["dev"]["overall"] for r in records)
    assert best["overall"] == pytest.approx((best["sst"]["acc"] + best["quora"]["acc"] + (best["sts"]["pearson"] + 1) / 2) / 3)

    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--device", "cpu"])
    for name in ("sst", "quora", "sts"):
        assert {k: result[name][k] for k in summary["dev"][name]} == summary["dev"][name], name
    assert result["overall"] == summary["dev"]["overall"]
    files = {name: list(csv.reader(open(result[name]["predictions"]))) for name in ("sst", "quora", "sts")}
    assert files["sst"][0] == ["id", "prediction", "prediction_name", "gold", "gold_name"] and len(files["sst"]) == 16
    assert files["quora"][0] == ["id", "prediction", "prediction_name", "gold", "gold_name"] and len(files["quora"]) == 13
    assert files["sts"][0] == ["id", "similarity", "gold"] and len(files["sts"]) == 13 and 0 < len(files["sts"][1][1]) <= 7
    assert os.path.basename(result["sts"]["predictions"]) == "predictions-dev-sts.csv"

    test = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--split", "test"])
    assert "overall" not in test and len(list(csv.reader(open(test["sts"]["predictions"])))) == 7


def test_a_pair_task_trains_alone_siamese_with_a_pair_loss(tiny_bert_dir, data_dir, tmp_path):
    summary = train.main(["--task", "mrpc", "--pair_mode", "siamese", "--pair_loss", "contrastive", "--epochs", "1",
                          "--model", tiny_bert_dir, "--data_dir", data_dir, "--out", str(tmp_path / "run"),
                          "--batch_size", "8", "--max_len", "32", "--max_train", "12"])
    assert summary["tasks"] == ["mrpc"] and set(summary["dev"]) == {"mrpc", "overall"}
    assert summary["train_examples"] == {"mrpc": 12} and summary["steps_per_epoch"] == 2  # --max_train caps the task
    assert list(summary["dev"]["mrpc"]) == ["acc", "f1", "macro_f1"]  # GLUE's MRPC scores
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ckpt["tasks"] == {"mrpc": {"kind": "classify", "labels": ["not paraphrase", "paraphrase"], "pair": True}}
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir])
    assert {k: result["mrpc"][k] for k in summary["dev"]["mrpc"]} == summary["dev"]["mrpc"]


def test_a_pair_task_with_knnbert_then_knn(tiny_bert_dir, data_dir, tmp_path):
    """KNN-BERT's own setting: RTE (a GLUE pair task) with its loss, then its kNN classifier."""
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--task", "rte", "--loss", "knnbert", "--epochs", "2",
                        "--lr", "1e-3", "--m_most", "3", "--m_least", "2")
    assert summary["train_examples"] == {"rte": 36} and summary["dev_examples"] == {"rte": 4}  # dev: 10% of GLUE's train
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ckpt["memory"]["keys"].shape == (36, 32) and ckpt["tasks"]["rte"]["pair"]
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn", "--k", "8",
                            "--split", "test"])["rte"]
    assert result["n"] == 8 and result["timing"]["datastore_size"] == 36  # test: GLUE's dev file, labelled
    for rule in ("", "knn_", "mix_"):
        assert 0 <= result[rule + "acc"] <= 1, rule
    rows = list(csv.reader(open(tmp_path / "run" / "predictions-test-knn-k8.csv")))
    assert rows[0] == ["id", "prediction", "prediction_name", "gold", "gold_name"] and len(rows) == 9
    assert rows[1][2] in ("entailment", "not_entailment") and rows[1][4] in ("entailment", "not_entailment")


def test_multilabel_trains_then_votes_with_its_neighbours(tiny_bert_dir, data_dir, tmp_path):
    summary = run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--task", "goemotions", "--loss", "mlcon",
                        "--epochs", "3", "--lr", "3e-3")
    assert summary["lam"] == {"goemotions": 0.1} and list(summary["dev"]["goemotions"]) == ["micro_f1", "macro_f1", "hamming"]
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert records[-1]["train_loss"]["goemotions"] < records[0]["train_loss"]["goemotions"]
    common = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn"]
    result = evaluate.main(common)["goemotions"]
    assert result["micro_f1"] == summary["dev"]["goemotions"]["micro_f1"]
    assert {"knn_micro_f1", "mix_micro_f1", "knn_hamming", "mix_hamming"} <= set(result)
    rows = list(csv.reader(open(tmp_path / "run" / "predictions-dev-knn-only.csv")))
    assert rows[0] == ["id", "prediction", "prediction_name", "gold", "gold_name"] and len(rows) == 11
    alone = evaluate.main(common + ["--phi", "1"])["goemotions"]  # lam = 1: the vote alone, thresholded at 0.5
    assert (alone["mix_micro_f1"], alone["mix_hamming"]) == (alone["knn_micro_f1"], alone["knn_hamming"])
    swept = evaluate.main(common + ["--sweep"])["goemotions"]["sweep"]
    assert [r["k"] for r in swept["k"]] == [1, 2, 4, 8, 16, 32, 40] and swept["phi"][0]["micro_f1"] == result["micro_f1"]
    at_half = next(r for r in swept["phi"] if r["phi"] == 0.5)
    assert at_half["micro_f1"] == result["mix_micro_f1"]  # the defaults: K 5, lam 0.5
    assert os.path.exists(tmp_path / "run" / "predictions-dev-knn-sweep.json")


def test_one_loop_trains_a_three_kind_mix(tiny_bert_dir, data_dir, tmp_path):
    """A classification, a pair and a multi-label task in one run, with --max_eval and a metric loss
    that reaches the classification tasks only."""
    summary = train.main(["--task", "multitask", "--tasks", "sst,rte,goemotions", "--loss", "supcon",
                          "--model", tiny_bert_dir, "--data_dir", data_dir, "--out", str(tmp_path / "run"),
                          "--batch_size", "8", "--max_len", "32", "--epochs", "2", "--max_eval", "6"])
    assert summary["steps_per_epoch"] == 5 and summary["dev_examples"] == {"sst": 6, "rte": 4, "goemotions": 6}
    assert summary["lam"] == {"sst": 0.1, "rte": 0.1, "goemotions": 0.0}  # goemotions: BCE alone
    assert set(summary["dev"]) == {"sst", "rte", "goemotions", "overall"}
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--max_eval", "6", "--knn",
                            "--k", "4"])
    assert result["overall"] == summary["dev"]["overall"] and result["goemotions"]["n"] == 6
    assert {"knn_acc", "knn_micro_f1"} <= set(result["sst"]) | set(result["goemotions"])
    assert os.path.exists(tmp_path / "run" / "datastore-rte-mean.pt")


BF16_RUNS = {  # every loss, the other metric terms, and the multi-task path with and without PCGrad
    **{loss: ["--task", "goemotions" if loss_kind(loss) == "multilabel" else "sst", "--loss", loss] for loss in LOSSES},
    "decoupled": ["--decoupled"],
    "pair_loss mnrl": ["--task", "mrpc", "--pair_mode", "siamese", "--pair_loss", "mnrl"],
    "pair_loss contrastive": ["--task", "mrpc", "--pair_mode", "siamese", "--pair_loss", "contrastive"],
    "multitask": ["--task", "multitask", "--tasks", "sst,quora,sts"],
    "multitask pcgrad": ["--task", "multitask", "--tasks", "sst,quora,sts", "--pcgrad"],
}


@pytest.mark.parametrize("run", BF16_RUNS)
def test_a_bf16_training_step_on_the_cpu(tiny_bert_dir, data_dir, tmp_path, monkeypatch, run):
    """--precision bf16 runs the CUDA path's dtypes on the CPU, so a dtype mistake shows without a GPU.
    Each step: the forward under bf16 autocast, then a finite fp32 loss, finite fp32 gradients, fp32
    weights (proxies included)."""
    steps, train_step = [], train.train_step

    def checked_step(trainer, batches):
        model, losses, params = trainer.model, trainer.losses, trainer.params
        dtypes = []  # the autocast dtype while the encoder runs
        hook = model.bert.register_forward_hook(lambda *_: dtypes.append(
            torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32))
        try:
            task_losses, parts, conflicts = train_step(trainer, batches)
        finally:
            hook.remove()
        assert dtypes and set(dtypes) == {torch.bfloat16}, f"{run}: the encoder ran in {dtypes}, not under bf16 autocast"
        for name, loss in task_losses.items():
            assert loss.dtype == torch.float32 and torch.isfinite(loss), f"{run}: the {name} loss is {loss}"
        names = {id(p): n for n, p in [*model.named_parameters(), *losses.named_parameters()]}
        for p in params:
            assert p.dtype == torch.float32, f"{run}: {names[id(p)]} became {p.dtype}"
            assert p.grad is None or (p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()), \
                f"{run}: the gradient of {names[id(p)]} is {p.grad.dtype}, or not finite"
        assert sum(p.grad is not None for p in params) > len(params) // 2, f"{run}: most weights got no gradient"
        steps.append(task_losses)
        return task_losses, parts, conflicts

    monkeypatch.setattr(train, "train_step", checked_step)
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", *BF16_RUNS[run], "--precision", "bf16", "--epochs", "1",
              "--steps_per_epoch", "2", "--max_eval", "4", "--lr", "1e-3")
    assert len(steps) == 2
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["args"]["precision"] == "bf16"


def test_evaluate_predicts_in_its_precision(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--max_train", "10", "--loss", "proxyanchor")
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["args"]["precision"] == "fp32"  # the CPU's
    seen, predict = [], minknn.tools.inference.predict
    for module in (minknn.tools.inference, minknn.datastore):  # the split's passes, the datastore's
        monkeypatch.setattr(module, "predict", lambda *a, **k: seen.append(k.get("precision")) or predict(*a, **k))
    evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--precision", "bf16", "--proxy",
                   "--knn", "--k", "4", "--knn_key", "cls"])
    assert seen == ["bf16"] * 3, seen  # the datastore, the split, and the split's z for the proxies (key cls)


def test_the_memory_is_filled_in_the_runs_precision(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """The queue's first keys come from the same --precision as the keys written during training."""
    import minknn.memory
    seen, predict = [], minknn.memory.predict
    monkeypatch.setattr(minknn.memory, "predict", lambda *a, **k: seen.append(k.get("precision")) or predict(*a, **k))
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--steps_per_epoch", "1", "--loss", "knnbert",
              "--precision", "bf16")
    assert seen == ["bf16"], f"the memory fill ran in {seen}, the run in bf16"


def test_help_explains_every_flag_once(capsys):
    for script in (options, evaluate):
        with pytest.raises(SystemExit):
            script.get_args(["--help"])
        text = capsys.readouterr().out
        assert text.splitlines()[2].strip(), f"{script.__name__} --help has no description"
        assert "(default: None)" not in text and "default: default" not in text
        parser_actions = [a for a in script_parser(script)._actions if a.option_strings != ["-h", "--help"]]
        for action in parser_actions:
            assert action.help, f"{script.__name__} {action.option_strings[0]} has no help text"
            assert action.help.count("default") <= 1, action.option_strings[0]


def script_parser(script):
    """The script's ArgumentParser, caught as get_args builds it."""
    import argparse
    built = []
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = lambda self, argv=None: built.append(self) or original(self, argv)
    try:
        script.get_args(["--checkpoint", "x"] if script is evaluate else ["--max_train", "1"])
    except SystemExit:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original
    return built[0]


def test_run_errors_are_one_line(tiny_bert_dir, data_dir, tmp_path):
    """As a user sees them, from a subprocess (test_options.py checks every flag combination)."""
    model = ["--model", tiny_bert_dir, "--data_dir", data_dir]
    assert cli("train.py", *model, "--task", "multitask", "--tasks", "sst,sts,sst") == (
        2, "error: --tasks sst,sts,sst names a task twice")
    assert cli("train.py", *model, "--pooling", "sum")[1].startswith("error: argument --pooling: invalid choice")
    code, err = cli("train.py", *model, "--task", "sts", "--pair_mode", "siamese", "--option", "pretrain", "--max_len", "32")
    assert code == 2 and err == "error: nothing to train: --option pretrain freezes BERT, and a siamese similarity task has no head"
    train.main(["--task", "sts", "--epochs", "1", "--steps_per_epoch", "1", "--out", str(tmp_path / "run"), "--max_len", "32",
                *model])
    assert cli("evaluate.py", "--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn") == (
        2, "error: --knn votes with the training set's labels: it needs a classification or multi-label task with "
           "one vector per example (not a similarity task, not --pair_mode siamese)")


# ------------------------------------------------------------------ evaluate.py knows what the run trained on

def without_data_record(run):
    """Makes run's checkpoint one written before checkpoints recorded their data (and so before their checksum)."""
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    del ckpt["data"], ckpt["contents_sha256"]
    torch.save(ckpt, run / "checkpoint.pt")


def test_a_checkpoint_records_its_data_and_evaluate_reads_that_root(tiny_bert_dir, data_dir, tmp_path, monkeypatch,
                                                                    capsys):
    """--data_dir, else the run's own root (over $MINKNN_DATA: the README tells users to export it, and a run scored
    on another root would score other examples), else $MINKNN_DATA, else ./data; a root other than the run's is
    said in one line."""
    monkeypatch.delenv("MINKNN_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./data here
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--max_train", "16")
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    drawn = training_examples(TASKS["sst"], data_dir, 16, 0)
    own = os.path.abspath(data_dir)
    assert ckpt["data"] == {"root": own, "train_fingerprint": {"sst": examples_fingerprint(drawn)}}
    knn = ["--checkpoint", str(tmp_path / "run"), "--knn", "--k", "4"]

    def data_lines(argv):
        result = evaluate.main(argv)
        return result["data_root"], [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("data:")]

    capsys.readouterr()
    assert data_lines(knn) == (own, [f"data: {own}, the run's (--data_dir for another)"])  # no flag, no MINKNN_DATA
    assert sorted(os.listdir(tmp_path)) == ["run"], "evaluate.py left a data folder behind"
    shutil.copytree(data_dir, tmp_path / "copy")  # the same examples elsewhere: --knn accepts them
    copy = str(tmp_path / "copy")
    monkeypatch.setenv("MINKNN_DATA", copy)  # the run's own root, which is here, wins; a line says so
    assert data_lines(knn) == (own, [f"data: {own}, the run's, not $MINKNN_DATA's {copy} (--data_dir for another)"])
    assert data_lines(knn + ["--data_dir", copy]) == (copy, [
        f"data: scoring on data root {copy} (from --data_dir), not the root the run trained on, {own}"])
    assert data_lines(knn + ["--data_dir", data_dir]) == (own, [])  # the flag naming the run's own root: no line

    # the run's root is not a folder here (a run moved to another machine): MINKNN_DATA's, in one line
    ckpt["data"]["root"] = str(tmp_path / "gone")
    torch.save(sealed({k: v for k, v in ckpt.items() if k != CHECKSUM}), tmp_path / "run" / "checkpoint.pt")
    assert data_lines(knn) == (copy, [f"data: scoring on data root {copy} (from MINKNN_DATA), not the root the run "
                                      f"trained on, {tmp_path / 'gone'} (not a folder here)"])

    monkeypatch.delenv("MINKNN_DATA")
    shutil.move(tmp_path / "copy", tmp_path / "data")  # a checkpoint without the record reads ./data, as before
    without_data_record(tmp_path / "run")
    assert evaluate.main(knn)["data_root"] == str(tmp_path / "data")


def test_a_run_whose_data_root_is_gone_is_one_line(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("MINKNN_DATA", raising=False)
    shutil.copytree(data_dir, tmp_path / "data")
    run_train(tiny_bert_dir, str(tmp_path / "data"), tmp_path / "run", "--epochs", "1", "--max_train", "16")
    shutil.move(tmp_path / "data", tmp_path / "moved")
    assert cli("evaluate.py", "--checkpoint", str(tmp_path / "run")) == (
        2, f"error: --checkpoint {tmp_path / 'run' / 'checkpoint.pt'}: the run read its data from {tmp_path / 'data'}, "
           f"which is not a folder here; give --data_dir (or MINKNN_DATA)")
    assert evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", str(tmp_path / "moved")])["sst"]["n"] == 15


def test_knn_refuses_training_examples_other_than_the_runs(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("MINKNN_DATA", raising=False)
    shutil.copytree(data_dir, tmp_path / "data")
    run_train(tiny_bert_dir, str(tmp_path / "data"), tmp_path / "run", "--epochs", "1")
    knn = ["--checkpoint", str(tmp_path / "run"), "--knn", "--k", "4"]
    evaluate.main(knn)
    train_file = tmp_path / "data" / "minbert" / "ids-sst-train.csv"
    lines = train_file.read_text().splitlines()
    lines[5] = lines[5][:-1] + ("1" if lines[5][-1] != "1" else "2")  # one label changed since the run read it
    train_file.write_text("\n".join(lines) + "\n")
    assert cli("evaluate.py", *knn) == (
        2, f"error: {train_file}: not the sst training examples the run trained on (changed since the run read it); "
           f"--knn builds its datastore from the run's own")
    code, err = cli("evaluate.py", *knn, "--data_dir", data_dir)  # the run's examples, in another root: accepted
    assert code == 0, err
    shutil.copytree(tmp_path / "data", tmp_path / "other")
    assert cli("evaluate.py", *knn, "--data_dir", str(tmp_path / "other"))[1].endswith(
        f"(the run read {tmp_path / 'data'}: use --data_dir {tmp_path / 'data'}); --knn builds its datastore from the run's own")
    without_data_record(tmp_path / "run")  # a checkpoint from before the record: no check, as before
    assert evaluate.main(knn + ["--data_dir", str(tmp_path / "data")])["sst"]["timing"]["datastore_size"] == 40


def test_evaluate_writes_its_metrics_beside_the_predictions(tiny_bert_dir, data_dir, tmp_path):
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--loss", "proxyanchor")
    result = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--knn", "--k", "4", "--proxy"])
    saved = json.load(open(tmp_path / "run" / "predictions-dev-proxy-knn-k4-metrics.json"))
    assert saved == result and saved["split"] == "dev" and saved["epoch"] == 1 and saved["sst"]["n"] == 15
    for rule in ("", "proxy_", "knn_", "mix_"):  # every rule's scores
        assert 0 <= saved["sst"][rule + "acc"] <= 1 and 0 <= saved["sst"][rule + "macro_f1"] <= 1, rule
    assert saved["sst"]["knn"] == {"k": 4, "phi": 0.25, "vote": "cosine", "temperature": None, "key": "mean",
                                   "index": {"index": "flat"}}
    dev = list(csv.reader(open(os.path.join(data_dir, "minbert", "ids-sst-dev.csv")), delimiter="\t"))[1:]
    for rule, name in (("", ""), ("proxy_", "-proxy"), ("knn_", "-knn-only-k4"), ("mix_", "-knn-k4")):
        rows = list(csv.reader(open(tmp_path / "run" / f"predictions-dev{name}.csv")))[1:]
        assert [(r[0], r[3]) for r in rows] == [(d[1], d[3]) for d in dev], f"{rule}: not the gold class in order"
        assert sum(r[1] == r[3] for r in rows) / len(rows) == saved["sst"][rule + "acc"], f"{rule}: the file disagrees"
    assert saved["sst"]["proxy_alpha"] == 0.5
    test = evaluate.main(["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir, "--split", "test",
                          "--out", str(tmp_path / "elsewhere" / "sst-test.csv")])
    saved = json.load(open(tmp_path / "elsewhere" / "sst-test-metrics.json"))
    assert saved == test and saved["split"] == "test" and set(saved["sst"]) == {"n", "predictions"}  # no labels, no scores
    assert sorted(os.listdir(tmp_path / "elsewhere")) == ["sst-test-metrics.json", "sst-test.csv"]


def test_evaluations_with_other_flags_keep_their_own_files(tiny_bert_dir, data_dir, tmp_path):
    """Each evaluate.py call used to overwrite the last one's predictions and metrics, whatever their flags: the
    files are named by the flags that change what is scored (the split, --max_eval, the rules and their flags), and
    the same flags again write the same files."""
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "1", "--loss", "proxyanchor")
    run = ["--checkpoint", str(tmp_path / "run"), "--data_dir", data_dir]
    evaluations = {  # the flags -> the metrics file they write
        (): "predictions-dev-metrics.json",
        ("--max_eval", "5"): "predictions-dev-max_eval5-metrics.json",
        ("--split", "train"): "predictions-train-metrics.json",
        ("--proxy",): "predictions-dev-proxy-metrics.json",
        ("--proxy", "--proxy_alpha", "0.2"): "predictions-dev-proxy-proxy_alpha0.2-metrics.json",
        ("--knn", "--k", "4"): "predictions-dev-knn-k4-metrics.json",
        ("--knn", "--k", "4", "--phi", "1"): "predictions-dev-knn-k4-phi1.0-metrics.json",
        ("--knn", "--k", "4", "--vote", "distance", "--index", "hnsw"):
            "predictions-dev-knn-distance-k4-hnsw-metrics.json",
        ("--knn", "--k", "4", "--sweep"): "predictions-dev-knn-k4-sweep-metrics.json",
    }
    results = {flags: evaluate.main(run + list(flags)) for flags in evaluations}
    for flags, name in evaluations.items():
        assert json.load(open(tmp_path / "run" / name)) == results[flags], \
            f"{name}, of evaluate.py {' '.join(flags)}, was overwritten by a later evaluation with other flags"
    subset = results[("--max_eval", "5")]["sst"]["predictions"]
    assert subset == str(tmp_path / "run" / "predictions-dev-max_eval5.csv")
    assert len(list(csv.reader(open(subset)))) == 6  # a header and 5 rows
    assert len(list(csv.reader(open(tmp_path / "run" / "predictions-dev.csv")))) == 16, "--max_eval 5 overwrote it"
    for alpha in ("", "-proxy_alpha0.2"):  # each --proxy_alpha's file; each --phi's mix, one kNN alone
        assert os.path.exists(tmp_path / "run" / f"predictions-dev-proxy{alpha}.csv")
    assert {n for n in os.listdir(tmp_path / "run") if n.startswith("predictions-dev-knn")} >= {
        "predictions-dev-knn-k4.csv", "predictions-dev-knn-k4-phi1.0.csv", "predictions-dev-knn-only-k4.csv",
        "predictions-dev-knn-distance-k4-hnsw.csv", "predictions-dev-knn-only-distance-k4-hnsw.csv",
        "predictions-dev-knn-k4-sweep.json"}
    again = evaluate.main(run + ["--knn", "--k", "4"])  # the same flags: the same files, rewritten
    assert json.load(open(tmp_path / "run" / "predictions-dev-knn-k4-metrics.json")) == again
