"""The kinds of task. A task's kind (Task.kind, minknn/tasks/registry.py) says, here and nowhere
else, what its head outputs, what its loss compares them with, how outputs become predictions and
how predictions are scored:

    kind        head output     loss (minknn/losses)               prediction      scores
    classify    C class logits  CE, or (1 - lam) CE + lam --loss   argmax          acc, macro-F1
    similarity  one score       MSE or L1 (--sts_loss)             the score       Pearson
    multilabel  C label logits  BCE, or BCE + lam mlcon            sigmoid > 0.5   micro-F1,
                                                                                   macro-F1, Hamming
A task may list other scores (Task.metrics: CoLA's MCC, MRPC's F1); the first one picks the best
epoch, and the mean over a run's tasks of that first score, put in [0, 1], is the run's overall
score (minBERT's: (sst_acc + para_acc + (pearson + 1) / 2) / 3 for SST, Quora and STS).

A sentence-pair task of any kind has the same head on the pair's pooled vector with
--pair_mode cross (one sequence [CLS] a [SEP] b [SEP]); with --pair_mode siamese the two texts
are encoded alone, u and v, and a classify or multilabel head reads [u, v, |u - v|] (SBERT's
classification head, Reimers & Gurevych 2019) while a similarity score is 2.5 (cos(u, v) + 1),
the cosine scaled to [0, 5], with no parameters (minknn/model.py).

Paraphrase detection (Quora, MRPC) is 2-class pair classification: two logits and CE carry the
same information as one logit and binary cross-entropy (their difference is that logit), and as
a classify task it gets every --loss, proxy inference and the kNN classifier, as RTE does.
"""
import numpy as np
import torch
import torch.nn as nn

from minknn.metrics import METRICS, MULTILABEL
from minknn.tasks.data import labelled


class Classify:
    default_loss = "ce"  # the base loss (minknn/losses): what --loss gives a task not of its kind
    metrics = ("acc", "macro_f1")

    def head(self, task, hidden, siamese):
        return nn.Linear(3 * hidden if siamese else hidden, len(task.labels))

    def start_head(self, head, task, examples):
        """Sets the head's starting point from the training examples (only multilabel does)."""

    def targets(self, task, examples, device):
        return torch.tensor([e.label for e in examples], device=device)

    def probabilities(self, outputs):
        return torch.softmax(outputs.double(), dim=-1)

    def decide(self, probabilities):
        return probabilities.argmax(-1).numpy()

    def answer(self, task, decided):
        """One example's answer as a user reads it (predict): its class's name."""
        return task.labels[int(decided)]

    def gold(self, task, examples):
        return np.array([e.label for e in examples])

    def rows(self, task, examples, pred):
        """The predictions file: its header and one row per example: the predicted class by index
        and by name, then, where the split has labels, the gold class likewise."""
        rows = [[e.id, int(p), task.labels[p]] for e, p in zip(examples, pred)]
        if not labelled(examples):
            return ["id", "prediction", "prediction_name"], rows
        return (["id", "prediction", "prediction_name", "gold", "gold_name"],
                [row + [e.label, task.labels[e.label]] for row, e in zip(rows, examples)])


class Similarity:
    default_loss = None  # --sts_loss
    metrics = ("pearson",)

    def head(self, task, hidden, siamese):
        # siamese: the scaled cosine, no parameters
        return None if siamese else nn.Linear(hidden, 1)

    def start_head(self, head, task, examples):
        """A similarity head keeps its random start."""

    def targets(self, task, examples, device):
        return torch.tensor([e.label for e in examples], dtype=torch.float, device=device)

    def probabilities(self, outputs):
        return outputs.double()  # the score itself

    def decide(self, probabilities):
        return probabilities.numpy()

    def answer(self, task, decided):
        """The score."""
        return float(decided)

    def gold(self, task, examples):
        return np.array([e.label for e in examples], dtype=np.float64)

    def rows(self, task, examples, pred):
        """The predicted score, then, where the split has labels, the gold score."""
        rows = [[e.id, f"{p:.4f}"] for e, p in zip(examples, pred)]
        if not labelled(examples):
            return ["id", "similarity"], rows
        return ["id", "similarity", "gold"], [row + [e.label] for row, e in zip(rows, examples)]


class MultiLabel:
    default_loss = "bce"
    metrics = ("micro_f1", "macro_f1", "hamming")

    def head(self, task, hidden, siamese):
        return nn.Linear(3 * hidden if siamese else hidden, len(task.labels))

    @torch.no_grad()
    def start_head(self, head, task, examples):
        """Each class's bias starts at the log odds of its share p_c of the training examples,
        b_c = log(p_c / (1 - p_c)), so the untrained head predicts the prior instead of 0.5 for
        every class (a per-class version of the prior initialisation of Lin et al. 2017, "Focal
        Loss", sec. 4.1, which starts every class at one prior pi = 0.01). With
        90 mostly rare classes, AdamW at lr 5e-5 would otherwise need thousands of steps to move
        the biases from 0 to their priors, and the head would predict nearly nothing meanwhile.
        A class absent from the examples counts as half an example."""
        counts = self.gold(task, examples).sum(0).clip(0.5, len(examples) - 0.5)
        p = torch.tensor(counts / len(examples), dtype=head.bias.dtype)
        head.bias.copy_(torch.log(p / (1 - p)))

    def targets(self, task, examples, device):
        """Multi-hot (B, C): y_ic = 1 when example i has class c."""
        return torch.tensor(self.gold(task, examples), dtype=torch.float, device=device)

    def probabilities(self, outputs):
        return torch.sigmoid(outputs.double())

    def decide(self, probabilities):
        return (probabilities > 0.5).numpy()

    def answer(self, task, decided):
        """The names of the classes decided (a multi-hot row), in the classes' order."""
        return [task.labels[c] for c in np.flatnonzero(decided)]

    def gold(self, task, examples):
        y = np.zeros((len(examples), len(task.labels)), dtype=bool)
        for i, e in enumerate(examples):
            y[i, list(e.label)] = True
        return y

    def rows(self, task, examples, pred):
        """Each example's predicted classes, by index and by name, separated by spaces, then,
        where the split has labels, its gold classes likewise."""
        def names(classes):
            return [" ".join(str(c) for c in classes), " ".join(task.labels[c] for c in classes)]
        rows = [[e.id, *names(np.flatnonzero(p))] for e, p in zip(examples, pred)]
        if not labelled(examples):
            return ["id", "prediction", "prediction_name"], rows
        return (["id", "prediction", "prediction_name", "gold", "gold_name"],
                [row + names(e.label) for row, e in zip(rows, examples)])


KINDS = {"classify": Classify(), "similarity": Similarity(), "multilabel": MultiLabel()}


def kind_of(task):
    return KINDS[task.kind]


def task_metrics(task):
    return task.metrics or kind_of(task).metrics


def score(task, pred, gold):
    """The task's scores ({name: value}, in Task.metrics order) of predictions against gold."""
    functions = {**{name: f for name, (f, _) in METRICS.items()},
                 **(MULTILABEL if task.kind == "multilabel" else {})}
    return {name: functions[name](pred, gold) for name in task_metrics(task)}


def selection_score(task, scores):
    """The task's first score, put in [0, 1] for the overall score: a correlation r as (r + 1) / 2.
    Every first score is higher-is-better (tests/test_data.py checks the registry: no Hamming
    loss)."""
    name = task_metrics(task)[0]
    return (scores[name] + 1) / 2 if name in ("pearson", "mcc") else scores[name]


def overall(tasks, scores):
    """The mean over the tasks of their selection scores (scores: task name -> score())."""
    return sum(selection_score(t, scores[t.name]) for t in tasks) / len(tasks)


def describe(scores):
    """'accuracy 0.4600, macro-F1 0.4040'."""
    return ", ".join(f"{METRICS[name][1]} {value:.4f}" for name, value in scores.items())


def describe_run(tasks, scores):
    """'sst accuracy 0.4600, macro-F1 0.4040', and '; overall 0.6400' for several tasks."""
    text = "; ".join(f"{t.name} {describe(scores[t.name])}" for t in tasks)
    return text + (f"; overall {scores['overall']:.4f}" if len(tasks) > 1 else "")
