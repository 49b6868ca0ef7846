"""minknn/lab/setfit_package.py, the runner's `setfit-package` method, without the setfit package: a fake
`setfit` (and `datasets`) module records what the runner gives it (the model folder, the training texts and
labels, the seed, the texts to predict) and predicts by a fixed rule, so that the test knows what each line must
say. The real package is checked by hand (the module docstring's command)."""
import json
import re
import sys
import types

import numpy as np
import pytest

from minknn import MinknnError
from minknn.lab import report, runner
from minknn.data import eval_subset, load_split, training_examples
from minknn.kinds import score
from minknn.tasks import get_task

from helpers import DATA


def rule(text):
    """The fake model's prediction: a class from the text alone (its length's parity)."""
    return len(text) % 2


class FakeSetFit:
    """A stand-in for the setfit package: its SetFitModel, TrainingArguments and Trainer, recording their calls."""

    def __init__(self):
        self.loaded, self.trained, self.predicted, self.args, self.lengths = [], [], [], [], []
        fake = self

        class SetFitModel:
            def __init__(self):
                self.model_body = types.SimpleNamespace(max_seq_length=512)  # not the paper's 256

            @classmethod
            def from_pretrained(cls, path):
                fake.loaded.append(path)
                return cls()

            def predict(self, texts, as_numpy=False):
                fake.predicted.append(list(texts))
                return np.array([rule(t) for t in texts])

        class TrainingArguments:
            def __init__(self, **kwargs):
                fake.args.append(kwargs)

        class Trainer:
            def __init__(self, model, args, train_dataset):
                self.data, self.model = train_dataset, model

            def train(self):
                fake.trained.append(self.data)
                fake.lengths.append(self.model.model_body.max_seq_length)  # as it trained

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
    assert fake.predicted[1::2] == [[e.text for e in test]] * 3, "the package must predict the test split's texts"
    selection = eval_subset(load_split(task, "dev", DATA), 6)  # --select sample: as many as the training set
    assert fake.predicted[0::2] == [[e.text for e in selection]] * 3, "the package must score the selection sample"

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
    give = "give it as 'setfit-package' (its defaults) or 'setfit-package[setting=paper]' (the paper's), with no rule"
    for methods, tasks, says in [
            ("setfit-package+knn", "mr", give),
            ("setfit-package[setting=paper]+knn", "mr", give),
            ("setfit-package[lr=1e-5]", "mr", give),
            ("setfit-package[setting=paper;num_iterations=5]", "mr", give),
            ("setfit-package[setting=defaults]", "mr", "no setting 'defaults' of setfit-package; choose one of: paper"),
            ("setfit-package", "rte", "SetFit classifies single texts; rte is a pair task"),
            ("setfit-package", "goemotions", "goemotions is a multilabel task")]:
        with pytest.raises(MinknnError, match=re.escape(says)):
            run_grid(tiny_bert_dir, tmp_path / "g", methods=methods, tasks=tasks, seeds="0")
    monkeypatch.setitem(sys.modules, "setfit", None)  # not installed: `import setfit` raises ImportError
    with pytest.raises(MinknnError, match=r"trains the setfit package, which is not installed .*: pip install setfit"):
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
