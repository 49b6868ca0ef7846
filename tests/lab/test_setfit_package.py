"""minknn/lab/setfit_package.py, the runner's `setfit-package` method, without the setfit package: a fake
`setfit` (and `datasets`) module records what the runner gives it (the model folder, the training texts and
labels, the seed, the texts to predict) and predicts by a fixed rule, so that the test knows what each line must
say. The real package is checked by hand (the module docstring's command)."""
import json
import os
import re
import sys
import types
import zlib

import numpy as np
import pytest

from minknn import MinknnError
from minknn.kinds import score
from minknn.lab import report, runner
from minknn.tasks.data import eval_subset, load_split, training_examples
from minknn.tasks.registry import get_task

from helpers import DATA


def rule(text):
    """The fake model's prediction: a class from the text alone (its length's parity)."""
    return len(text) % 2


def vector(text):
    """The fake body's embedding of a text: its class by rule() in the first two features, then two that differ
    from text to text, so that its nearest training texts are not simply those of its class."""
    p, h = rule(text), zlib.crc32(text.encode())
    return np.array([0.3 * (1 - p), 0.3 * p, (h % 97) / 97 - 0.5, (h // 97 % 89) / 89 - 0.5])


def head_proba(vectors):
    """The fake head's probabilities: 0.52 to 0.97 on the class rule() gives (its predict, the argmax), the rest
    on the other; against a one-hot vote of weight 0.25 the head wins above 2/3, below it the vote does."""
    sure = 0.52 + 0.9 * np.abs(vectors[:, 2])
    return np.where((vectors[:, 0] > vectors[:, 1])[:, None], np.stack([sure, 1 - sure], 1),
                    np.stack([1 - sure, sure], 1))


class FakeSetFit:
    """A stand-in for the setfit package: its SetFitModel, TrainingArguments and Trainer, recording their calls.
    Its Trainer.train saves a finished checkpoint, as the package's does (checkpoint-N, N its last step)."""

    def __init__(self):
        self.loaded, self.trained, self.encoded, self.args, self.lengths, self.head_fits = [], [], [], [], [], []
        fake = self

        class Head:
            def predict(self, vectors):
                return head_proba(vectors).argmax(1)

            def predict_proba(self, vectors):
                return head_proba(vectors)

        class SetFitModel:
            def __init__(self):
                self.model_body = types.SimpleNamespace(max_seq_length=512)  # not the paper's 256
                self.model_head = Head()

            @classmethod
            def from_pretrained(cls, path):
                fake.loaded.append(path)
                return cls()

            def encode(self, texts):
                fake.encoded.append(list(texts))
                return np.stack([vector(t) for t in texts])

        class TrainingArguments:
            def __init__(self, **kwargs):
                fake.args.append(kwargs)
                self.output_dir = kwargs["output_dir"]

        class Trainer:
            def __init__(self, model, args, train_dataset):
                self.data, self.model, self.args = train_dataset, model, args

            def train(self):
                fake.trained.append(self.data)
                fake.lengths.append(self.model.model_body.max_seq_length)  # as it trained
                saved = os.path.join(self.args.output_dir, "checkpoint-3")
                os.makedirs(saved, exist_ok=True)
                with open(os.path.join(saved, "trainer_state.json"), "w") as f:
                    json.dump({"global_step": 3, "max_steps": 3}, f)

            def train_classifier(self, texts, labels):
                fake.head_fits.append((texts, labels))

        self.module = types.ModuleType("setfit")
        self.module.__version__ = "0.0-fake"
        self.module.SetFitModel, self.module.TrainingArguments, self.module.Trainer = (
            SetFitModel, TrainingArguments, Trainer)
        self.datasets = types.ModuleType("datasets")
        self.datasets.Dataset = types.SimpleNamespace(from_dict=lambda columns: columns)


@pytest.fixture
def fake(monkeypatch):
    fake = FakeSetFit()
    monkeypatch.setitem(sys.modules, "setfit", fake.module)
    monkeypatch.setitem(sys.modules, "datasets", fake.datasets)
    return fake


def run_grid(tiny_bert_dir, out, methods="ce,setfit-package", tasks="mr", seeds="0-2"):
    return runner.main(["--tasks", tasks, "--methods", methods, "--sizes", "6", "--seeds", seeds,
                        "--out", str(out), "--model", tiny_bert_dir, "--data_dir", DATA, "--epochs", "1",
                        "--batch_size", "4", "--max_len", "32", "--device", "cpu"])


def test_the_package_trains_on_the_cells_draw_and_scores_the_test_split(fake, tiny_bert_dir, tmp_path):
    out = tmp_path / "g"
    text = run_grid(tiny_bert_dir, out)
    task = get_task("mr", DATA)
    test = load_split(task, "test", DATA)  # mr's fixture has a labelled test split: every example scored
    assert fake.loaded == [tiny_bert_dir] * 3, f"SetFitModel.from_pretrained got {fake.loaded}, not the --model folder"
    assert [a["seed"] for a in fake.args] == [0, 1, 2], "each cell trains with its own seed"
    for seed, data in zip((0, 1, 2), fake.trained):
        drawn = training_examples(task, DATA, 6, seed)  # what train.py draws for the ce cell of this seed
        assert data == {"text": [e.text for e in drawn], "label": [e.label for e in drawn]}, \
            f"seed {seed}: the package trained on other examples than the runner's draw"
    assert fake.encoded[1::2] == [[e.text for e in test]] * 3, "the package must predict the test split's texts"
    selection = eval_subset(load_split(task, "dev", DATA), 6)  # --select sample: as many as the training set
    assert fake.encoded[0::2] == [[e.text for e in selection]] * 3, "the package must score the selection sample"

    lines = report.read_results(str(out))
    ours = [ln for ln in lines if ln["method"] == "setfit-package"]
    ce = {ln["seed"]: ln for ln in lines if ln["method"] == "ce"}
    want = score(task, np.array([rule(e.text) for e in test]), np.array([e.label for e in test]))
    for ln in ours:
        assert ln["grid"] == [{"params": {}, "select": ln["grid"][0]["select"], "test": want}], ln["grid"]
        assert (ln["rule"], ln["label"], ln["train_params"], ln["package"]) == ("linear", "setfit-package", {},
                                                                                 "setfit 0.0-fake")
        assert ln["selection"].startswith("none") and ln["n_train"] == 6
        assert (ln["test_split"], ln["n_test"], ln["n_select"]) == \
            (ce[ln["seed"]]["test_split"], ce[ln["seed"]]["n_test"], ce[ln["seed"]]["n_select"])
        cell = json.load(open(out / "runs" / ln["cell"] / "cell.json"))
        assert cell["lines"] == [ln], "cell.json holds the line results.jsonl has"
    assert re.search(r"\n\| setfit-package \| [^|]* \(p \d", text), f"no setfit-package row with a p-value:\n{text}"

    run_grid(tiny_bert_dir, out)  # the finished cells are read back, not trained again
    assert len(fake.trained) == 3
    assert not any((out / "runs" / ln["cell"] / "setfit").exists() for ln in ours), \
        "a scored cell keeps its scores, not the package's saved body (unless --keep)"


def test_the_paper_setting_passes_the_papers_arguments_and_is_its_own_row(fake, tiny_bert_dir, tmp_path):
    """setfit-package[setting=paper]: the SetFit paper's arguments (written out here, as the module docstring
    gives them with their sources), each passed, none left to the package's defaults; the body's maximum length
    set to 256 before it trains; its own cells and its own row, with a p-value, beside the defaults'."""
    out = tmp_path / "g"
    text = run_grid(tiny_bert_dir, out, methods="setfit-package,setfit-package[setting=paper]", seeds="0-1")
    base = {"output_dir", "report_to"}
    paper = {"num_iterations": 20, "num_epochs": 1, "batch_size": 16, "body_learning_rate": 2e-5,
             "warmup_proportion": 0.1}
    defaults, papers = fake.args[0::2], fake.args[1::2]  # per seed: the defaults' cell, then the paper's
    for seed, given in enumerate(defaults):
        assert set(given) == base | {"seed"} and given["seed"] == seed, f"the defaults' cell got {given}"
    for seed, given in enumerate(papers):
        extra = {k: v for k, v in given.items() if k not in base}
        assert extra == {"seed": seed, **paper}, f"the paper setting passed {extra}, not the paper's {paper}"
    assert fake.lengths == [512, 256] * 2, "the paper setting trains at the paper's maximum length, 256"

    lines = report.read_results(str(out))
    cells = {(ln["method"], ln["seed"]): ln["cell"] for ln in lines}
    assert len(set(cells.values())) == 4, f"each setting and seed is its own cell: {cells}"
    by_method = {ln["method"]: ln for ln in lines if ln["seed"] == 0}
    assert by_method["setfit-package[setting=paper]"]["setfit_args"] == {**paper, "max_seq_length": 256}
    assert by_method["setfit-package"]["setfit_args"] == {"max_seq_length": 512}
    assert "paper setting" in by_method["setfit-package[setting=paper]"]["selection"]
    assert re.search(r"\n\| setfit-package \| ", text) and \
        re.search(r"\n\| setfit-package\[setting=paper\] \| [^|]* \((p \d|no p)", text), \
        f"the two settings are not two rows:\n{text}"


def test_setfit_package_errors_are_one_line_before_training(fake, monkeypatch, tiny_bert_dir, tmp_path):
    give = ("give it as 'setfit-package' (its defaults) or 'setfit-package[setting=paper]' (the paper's), with its "
            "own head or a kNN rule (+knn, +knn-only)")
    for methods, tasks, says in [
            ("setfit-package+probe", "mr", give),
            ("setfit-package[setting=paper]+proxy", "mr", give),
            ("setfit-package[lr=1e-5]", "mr", give),
            ("setfit-package[setting=paper;num_iterations=5]", "mr", give),
            ("setfit-package[setting=defaults]", "mr", "no setting 'defaults' of setfit-package; choose one of: paper"),
            ("setfit-package", "rte", "SetFit classifies single texts; rte is a pair task"),
            ("setfit-package", "goemotions", "goemotions is a multilabel task")]:
        with pytest.raises(MinknnError, match=re.escape(says)):
            run_grid(tiny_bert_dir, tmp_path / "g", methods=methods, tasks=tasks, seeds="0")
    monkeypatch.setitem(sys.modules, "setfit", None)  # not installed: `import setfit` raises ImportError
    with pytest.raises(MinknnError, match=r"trains the setfit package, which is not installed .*: pip install -e '\.\[setfit\]'"):
        run_grid(tiny_bert_dir, tmp_path / "g", methods="ce,setfit-package", seeds="0")
    assert fake.trained == [] and not (tmp_path / "g" / "runs").exists(), "nothing may train before the checks"


def test_under_select_none_and_search_the_package_line_is_marked_as_the_others(fake, tiny_bert_dir,
                                                                               tmp_path):
    """--search does not apply to setfit-package (it trains with the package's defaults: one
    training, and the budget line says so); under --select none its line keeps no selection
    scores, as train.py's cells' lines do."""
    out = tmp_path / "g"
    runner.main(["--tasks", "mr", "--methods", "ce,setfit-package", "--sizes", "6", "--seeds", "0",
                 "--out", str(out), "--model", tiny_bert_dir, "--data_dir", DATA, "--epochs", "1",
                 "--batch_size", "4", "--max_len", "32", "--device", "cpu", "--select", "none",
                 "--search", "lr=1e-3"])
    lines = {ln["method"]: ln for ln in report.read_results(str(out))}
    assert len(fake.trained) == 1, "setfit-package: one training per cell, whatever --search says"
    for method, line in lines.items():
        assert all("select" not in e for e in line["grid"]), (
            f"{method}: --select none keeps no selection scores, and this line has them")
        assert line.get("search") == {"lr": [0.001]}, f"{method}: the line does not say what was searched"


def test_the_knn_rules_vote_over_the_packages_body_and_mix_with_its_head(fake, tiny_bert_dir, tmp_path):
    """setfit-package+knn-only[k=1]: each test text takes the class of the training text whose embedding (the
    package body's) is nearest by cosine; +knn[k=1;phi=0.25]: 0.75 x the head's predict_proba + 0.25 x that
    one-hot vote. Written out here with numpy as the oracle; all three rules from one training per seed."""
    out = tmp_path / "g"
    paper = "setfit-package[setting=paper]"
    run_grid(tiny_bert_dir, out, methods=f"{paper},{paper}+knn-only[k=1],{paper}+knn[k=1;phi=0.25]", seeds="0-1")
    assert len(fake.trained) == 2, f"the three rules of a seed share one training; the package trained " \
                                   f"{len(fake.trained)} times for 2 seeds"
    task = get_task("mr", DATA)
    test = load_split(task, "test", DATA)
    gold = np.array([e.label for e in test])
    q = np.stack([vector(e.text) for e in test])
    lines = {(ln["method"], ln["seed"]): ln for ln in report.read_results(str(out))}
    differ = set()
    for seed in (0, 1):
        drawn = training_examples(task, DATA, 6, seed)
        keys = np.stack([vector(e.text) for e in drawn])
        cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (keys / np.linalg.norm(keys, axis=1, keepdims=True)).T
        nearest = np.array([drawn[i].label for i in cos.argmax(1)])
        mixed = (0.75 * head_proba(q) + 0.25 * np.eye(2)[nearest]).argmax(1)
        for method, params, pred in [(f"{paper}+knn-only[k=1]", {"k": 1, "phi": 1.0}, nearest),
                                     (f"{paper}+knn[k=1;phi=0.25]", {"k": 1, "phi": 0.25}, mixed),
                                     (paper, {}, head_proba(q).argmax(1))]:
            grid = lines[method, seed]["grid"]
            assert [e["params"] for e in grid] == [params], f"{method}: its grid is {grid}"
            want, got = score(task, pred, gold), grid[0]["test"]
            assert got == pytest.approx(want), f"seed {seed}, {method}: test scores {got}, the oracle's {want}"
        differ |= {"vote" if (nearest != head_proba(q).argmax(1)).any() else None,
                   "mix" if ((mixed != nearest) & (nearest != head_proba(q).argmax(1))).any() else None}
    assert {"vote", "mix"} <= differ, \
        "the fixture cannot tell the rules apart: the vote, the head and the mix agree on every test text"


def test_a_rule_added_later_is_scored_from_the_body_the_package_saved(fake, tiny_bert_dir, tmp_path):
    """With --keep, the package's finished checkpoint stays; a kNN rule added to the grid later is scored from
    that body (loaded, its head fit again by the package's train_classifier) without training the body again, and
    the line scored before is kept as it was. Without --keep the body goes, and a rule added later trains again."""
    def grid(out, methods, *extra):
        runner.main(["--tasks", "mr", "--methods", methods, "--sizes", "6", "--seeds", "0", "--out", str(out),
                     "--model", tiny_bert_dir, "--data_dir", DATA, "--epochs", "1", "--max_len", "32",
                     "--device", "cpu", *extra])
        return {ln["method"]: ln for ln in report.read_results(str(out))}

    out = tmp_path / "kept"
    before = grid(out, "setfit-package", "--keep")
    cell = out / "runs" / before["setfit-package"]["cell"]
    record = json.loads((cell / "cell.json").read_text())
    record["lines"][0]["seconds"]["train"] = before["setfit-package"]["seconds"]["train"] = 123.4  # the fake's ~0 s
    (cell / "cell.json").write_text(json.dumps(record))
    after = grid(out, "setfit-package,setfit-package+knn-only[k=1]", "--keep")
    assert len(fake.trained) == 1, "a rule added later must be scored from the saved body, not trained again"
    assert fake.loaded[-1] == str(cell / "setfit" / "checkpoint-3"), \
        f"the added rule's cell loaded {fake.loaded[-1]}, not the package's finished checkpoint"
    drawn = training_examples(get_task("mr", DATA), DATA, 6, 0)
    assert fake.head_fits == [([e.text for e in drawn], [e.label for e in drawn])], \
        "the loaded body's head must be fit again, on the cell's training texts"
    assert after["setfit-package"] == before["setfit-package"], "the line scored before must be kept as it was"
    assert after["setfit-package+knn-only[k=1]"]["seconds"]["train"] == 123.4, \
        "a rule scored from the saved body took no training: its line gives the first training's time"
    assert after["setfit-package+knn-only[k=1]"]["grid"][0]["params"] == {"k": 1, "phi": 1.0}

    out = tmp_path / "dropped"
    grid(out, "setfit-package")
    assert not (out / "runs" / before["setfit-package"]["cell"] / "setfit").exists(), \
        "without --keep, a scored cell's saved body must go"
    grid(out, "setfit-package,setfit-package+knn-only[k=1]")
    assert len(fake.trained) == 3, "with its body gone, a cell asked for a new rule trains again"


def test_only_a_checkpoint_at_the_last_step_counts_as_the_trained_body(tmp_path):
    from minknn.lab.setfit_package import trained_body
    for step, last in [(2, 5), (5, 5), (10, 10)]:
        os.makedirs(tmp_path / f"checkpoint-{step}")
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"global_step": step, "max_steps": last}))
    (tmp_path / "checkpoint-12").mkdir()  # killed while it was being written: no trainer_state.json
    got = trained_body(str(tmp_path))
    assert got == str(tmp_path / "checkpoint-10"), \
        f"trained_body chose {got}; the last finished checkpoint (step 10 of 10) is checkpoint-10"
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text(json.dumps({"global_step": 4, "max_steps": 10}))
    got = trained_body(str(tmp_path))
    assert got == str(tmp_path / "checkpoint-5"), \
        f"trained_body chose {got}; checkpoint-10 stopped at step 4 of 10, so the finished one is checkpoint-5"
    assert trained_body(str(tmp_path / "none")) is None


def test_a_body_kept_once_stays_until_drop_kept(fake, tiny_bert_dir, tmp_path, capsys):
    """--keep is sticky for the package's saved body too (minknn/lab/kept.py): a rule added by a run without
    --keep is scored from it and leaves it in place; --drop_kept deletes it."""
    def grid(methods, *extra):
        runner.main(["--tasks", "mr", "--methods", methods, "--sizes", "6", "--seeds", "0", "--out", str(out),
                     "--model", tiny_bert_dir, "--data_dir", DATA, "--epochs", "1", "--max_len", "32",
                     "--device", "cpu", *extra])
    out = tmp_path / "g"
    grid("setfit-package", "--keep")
    (cell,) = (out / "runs").iterdir()
    grid("setfit-package,setfit-package+knn-only[k=1]")
    assert len(fake.trained) == 1, "the added rule should be scored from the kept body"
    assert (cell / "setfit").exists(), "a run without --keep must not delete the body an earlier --keep run kept"
    capsys.readouterr()
    grid("setfit-package,setfit-package+knn-only[k=1]", "--drop_kept")
    assert not (cell / "setfit").exists(), "--drop_kept should delete the kept body"
    assert "--drop_kept: deleted the kept checkpoints of 1 cell (" in capsys.readouterr().out
