"""The real SetFit beside minknn's own (minknn/losses/setfit.py): the runner's method
`setfit-package`, whose cell does not run train.py but trains the `setfit` package (Tunstall et
al. 2022; `pip install -e '.[setfit]'`, an optional dependency imported only here, as matplotlib is
for the plots) on exactly the training examples the runner drew for the cell, and scores the same
selection and test examples. Its result line is the other methods' (the linear rule, a grid of
one entry with params {}), written into the cell's cell.json, so that results.jsonl, the table
and the paired p-values cover it.

    python -m minknn.lab.runner --tasks sst5,cr --sizes 8pc --seeds 0-9 --out grids/setfit \\
        --methods 'setfit,knnbert+knn,setfit-package,setfit-package[setting=paper]' \\
        --epochs 1 --batch_size 16

Two settings, two methods (two rows of the table, two cells per seed):
    setfit-package                 the package's defaults: TrainingArguments(seed, output_dir,
                                   report_to) and nothing else
    setfit-package[setting=paper]  the paper's, PAPER below: a baseline runs in its strongest
                                   documented setting, not only its package's defaults
and, on either, minknn's kNN rules over the trained body (the same cell, one training):
    setfit-package[setting=paper]+knn[k=4]       s = (1 - phi) P(q) + phi KNN(q): the package's
                                                 head's probabilities P (its predict_proba) mixed
                                                 with the kNN vote over the training set's
                                                 embeddings (minknn/knn.py; phi 0.25 by default)
    setfit-package[setting=paper]+knn-only[k=4]  the vote alone

The paper's setting, and whose each value is. The paper's runs are its script
scripts/setfit/run_fewshot.py in github.com/huggingface/setfit (its README: "the default settings
used in the paper"); setfit 1.2.0 names them in its TrainingArguments:
    num_iterations=20       R = 20 rounds of pair generation (sec. 3.1; the script's --num_epochs
                            20 is R: it calls sentence_pairs_generation 20 times; lewtun in
                            setfit issue #86: "num_iterations=20 and num_epochs=1"). The
                            package's defaults draw "oversampling" instead: every unordered pair
                            once, the rarer kind repeated (CR at 8 a class: 144 pairs, not 640).
                            With it, 1.2.0 draws R x N positive and R x N negative pairs, the
                            paper's number and balance, by cycling through the shuffled list of
                            unique pairs (itself included); the paper's v0 drew each example's
                            partner at random each round (minknn's `setfit` loss does, exactly)
    num_epochs=1            one pass over the pairs (the script: model.fit(epochs=1))
    batch_size=16           16 pairs a batch (the script's --batch_size)
    body_learning_rate=2e-5 the rate the paper's runs trained at: the script's --lr 1e-3 (the
                            paper's text says 1e-3, as setfit issue #208 quotes it) is never
                            passed to model.fit, which trains at sentence-transformers' default
                            2e-5 (#208's reporter found 1e-3 "extremely unstable")
    warmup_proportion=0.1   10% linear warm-up (the script: ceil(0.1 x steps))
    max_seq_length=256      the body's, set on model.model_body as the script sets it
                            (TrainingArguments.max_length acts only on a differentiable head)
    head                    scikit-learn's LogisticRegression() on the body's embeddings (the
                            script's SKLearnWrapper; SetFitModel.from_pretrained's default)
All but num_iterations equal 1.2.0's defaults; the paper's setting passes each of them all the
same, so that a later release's defaults cannot change it unseen.

What the cell does, and whose each choice is:
    model      SetFitModel.from_pretrained(the --model folder; 'minilm' is the default weights'
               folder, minknn/bert.py resolve_model_path), read as a SentenceTransformer: its
               modules.json (all-MiniLM-L6-v2: the encoder, mean pooling, Normalize), and a
               scikit-learn LogisticRegression() head
    training   setfit.Trainer(model, TrainingArguments(seed=the cell's seed, and the paper's
               setting's values), the cell's texts and class indices): the package's defaults
               for everything else (v1.x: 1 epoch of 16 pairs a batch, body lr 2e-5, 10%
               warm-up, "oversampling" pairs; then the head fit on the normalised embeddings).
               train.py's flags of the grid (--epochs, --lr, --max_len, --device, ...) are not
               passed on: they are minknn's recipe, not SetFit's
    selection  none: SetFit trains once and chooses nothing (no epoch, no hyper-parameter). The
               selection examples are scored only so that the line has the shape of the
               others; with one entry in its grid, nothing is chosen on them ("selection" in
               the line says so)
    scores     the body's embeddings of the selection and test texts (model.encode), then the
               head's predict (the linear rule: what model.predict does) or predict_proba (the
               kNN mix), scored by the task's metrics; kNN votes over the training texts'
               embeddings (cosine), through the datastore every kNN rule of minknn uses

The package saves its body at the end of training (<cell>/setfit/checkpoint-N, N its last step).
A cell killed after that point, or asked for a rule added to the grid since, is scored from that
body (SetFitModel.from_pretrained on it, the head fit again by the package's train_classifier:
the same fit on the same embeddings) instead of trained again; a cell killed earlier trains again.
Once scored, the saved body goes (1.3 GB at base size, with its optimiser's state), unless --keep.
Its cell.json is written whole once scored, as every cell's is. Single-text classification tasks
only (SetFit reads one text per example).
"""
import glob
import json
import os
import shutil
import time

import numpy as np
import torch

from minknn import MinknnError
from minknn.kinds import kind_of, score
from minknn.knn import settings
from minknn.lab.grid import knn_grid
from minknn.tools.inference import knn_scores
from minknn.tools.options import make_parser
from minknn.tools.weights import resolve_model_path

METHOD = "setfit-package"
PAPER = {"num_iterations": 20, "num_epochs": 1, "batch_size": 16, "body_learning_rate": 2e-5,
         "warmup_proportion": 0.1}         # TrainingArguments, the docstring's table
PAPER_MAX_LENGTH = 256                     # the body's max_seq_length, as the paper's script
SETTINGS = {"paper": PAPER}                # setfit-package[setting=NAME]
RULES = ("linear", "knn", "knn-only")      # its head, and minknn's kNN over its body
SELECTION = ("none: {}, one training, nothing chosen; the selection examples are scored only to "
             "fill the line")


def import_setfit():
    """The setfit package and `datasets.Dataset` (its training set's type), or one line."""
    try:
        import setfit
        from datasets import Dataset
    except ImportError as e:
        raise MinknnError(f"--methods {METHOD} trains the setfit package, which is not installed "
                          f"({e}): pip install -e '.[setfit]'") from None
    return setfit, Dataset


def check(cell, methods, task):
    """Before any cell trains: what a setfit-package method cannot be (one line each)."""
    for m in methods:
        if m.rule not in RULES or set(m.train_grid) - {"setting"}:
            raise MinknnError(f"--methods {m.name}: {METHOD} trains with the package's own "
                              f"arguments: give it as '{METHOD}' (its defaults) or "
                              f"'{METHOD}[setting=paper]' (the paper's), with its own head or a "
                              f"kNN rule (+knn, +knn-only)")
        unknown = [v for v in m.train_grid.get("setting", []) if v not in SETTINGS]
        if unknown:
            raise MinknnError(f"--methods {m.name}: no setting '{unknown[0]}' of {METHOD}; "
                              f"choose one of: {', '.join(SETTINGS)} (or no bracket: the "
                              f"package's defaults)")
    if task.kind != "classify" or task.pair:
        raise MinknnError(f"--methods {METHOD}: SetFit classifies single texts; {cell.task} is a "
                          f"{'pair' if task.pair else task.kind} task")
    import_setfit()


def model_folder(ctx):
    """The cell's --model (the train.py flag given to the grid), as a folder."""
    return resolve_model_path(make_parser().parse_args(ctx.train_flags).model)  # as every cell


def run_cell(cell, methods, ctx, folder, trained_seconds=None, keep=False):
    """Trains the package on the cell's examples (or reads back the body it saved at the end of
    training), scores each method's rule and returns their result lines, in the methods' order,
    less their heads (cells.line_head), which cells.record writes to <folder>/cell.json.
    trained_seconds: the training's time, from the lines scored before (a body read back took
    none; its time is then the first training's, where the cell's earlier lines give it). keep:
    whether the cell keeps the body once scored (cells.keeps: --keep, now or in an earlier run)."""
    setfit, Dataset = import_setfit()
    os.makedirs(folder, exist_ok=True)
    start = time.time()
    task = ctx.task(cell.task)
    train_set = ctx.train_examples(cell)
    selection, test, test_name = ctx.splits(cell.task, len(train_set))
    setting = dict(cell.params).get("setting")  # None: the package's defaults
    given = SETTINGS.get(setting, {})
    model = setfit.SetFitModel.from_pretrained(model_folder(ctx))
    length = PAPER_MAX_LENGTH if setting == "paper" else model.model_body.max_seq_length
    saved = trained_body(os.path.join(folder, "setfit"))
    if saved:  # the body the package saved: its own config does not hold the maximum length
        model = setfit.SetFitModel.from_pretrained(saved)
    model.model_body.max_seq_length = length
    args = setfit.TrainingArguments(seed=cell.seed, output_dir=os.path.join(folder, "setfit"),
                                    report_to="none", **given)  # where it would write; no logger
    texts, labels = [e.text for e in train_set], [e.label for e in train_set]
    trainer = setfit.Trainer(model=model, args=args,
                             train_dataset=Dataset.from_dict({"text": texts, "label": labels}))
    if saved:
        trainer.train_classifier(texts, labels)  # the head, as train() fits it after the body
    else:
        trainer.train()
    trained = time.time()
    kind, splits = kind_of(task), {"select": selection, "test": test}
    vectors = {s: embeddings(model, ex) for s, ex in splits.items()}
    gold = {s: kind.gold(task, ex) for s, ex in splits.items()}
    linear = {s: score(task, np.asarray(model.model_head.predict(v.numpy()), dtype=int), gold[s])
              for s, v in vectors.items()}
    knn = knn_scorer(task, model, train_set, vectors, gold, methods)
    common = {"package": f"setfit {setfit.__version__}",
              "setfit_args": {**given, "max_seq_length": model.model_body.max_seq_length},
              "test_split": test_name, "n_train": len(train_set), "n_select": len(selection),
              "n_test": len(test),
              "seconds": {"train": round(trained_seconds if saved and trained_seconds is not None
                                         else trained - start, 1),
                          "evaluate": round(time.time() - trained, 1)}}
    selected = SELECTION.format(f"the {setting} setting" if setting else "the package's defaults")
    lines = []
    for m in methods:
        grid = ([{"params": {}, **linear}] if m.rule == "linear" else
                knn_grid(m, task.kind, len(train_set), knn))
        lines.append({"grid": grid, "selection": selected, **common})
    if not keep:  # the scores are in the lines; the body and its optimiser go
        shutil.rmtree(os.path.join(folder, "setfit"), ignore_errors=True)
    return lines


def knn_scorer(task, model, train_set, vectors, gold, methods):
    """(k, phi) -> {"select":, "test":} scores of (1 - phi) P(q) + phi KNN(q): P the head's
    probabilities, KNN the vote of the k nearest training texts by the body's embeddings."""
    wanted = [m for m in methods if m.rule != "linear"]
    if not wanted:
        return None
    k_most = max(k for m in wanted for k in m.rule_grid.get("k", [settings(task.kind).k]))
    head = {s: torch.as_tensor(np.asarray(model.model_head.predict_proba(v.numpy())),
                               dtype=torch.float64) for s, v in vectors.items()}
    return knn_scores(task, train_set, embeddings(model, train_set), vectors, head, gold,
                      k_most)[0]


def embeddings(model, examples):
    """The package body's embeddings of the examples' texts (what its head reads), (N, dim)."""
    return torch.as_tensor(np.asarray(model.encode([e.text for e in examples])),
                           dtype=torch.float32)


def trained_body(output_dir):
    """The folder of the body the package saved at its last training step (its checkpoint-N
    whose trainer_state.json says global_step == max_steps), or None."""
    folders = glob.glob(os.path.join(output_dir, "checkpoint-*"))
    steps = {int(p.rsplit("-", 1)[1]): p for p in folders if p.rsplit("-", 1)[1].isdigit()}
    for step in sorted(steps, reverse=True):  # the last saved first
        path = steps[step]
        try:
            with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
                state = json.load(f)
            if state["global_step"] == state["max_steps"] > 0:
                return path
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None
