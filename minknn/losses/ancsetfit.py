"""AncSetFit (Pauli, Derczynski and Assent, EMNLP 2023, "Anchoring Fine-tuning of Sentence
Transformer with Semantic Label Information for Efficient Truly Few-shot Classification"): SetFit's
fine-tuning with each class anchored at a sentence that states it. Every training text is pulled
towards the statement of its own class and pushed from a text of another class by a triplet loss
whose anchor is that statement:

    L = 1/B sum_i max(0, d(s_{y_i}, x_i) - d(s_{y_i}, n_i) + margin),   d(a, b) = 1 - cos(a, b)

over a batch of B triplets: s_{y_i} the encoder's z of the statement of x_i's class, x_i the
training text, n_i a training text of another class; margin 0.25. The statement is the task's
template filled with the class's description (minknn/tasks/registry.py: "The movie is terrible" for
SST-5's class 0, as AncSetFit's templates.py writes it), encoded by the same encoder as the texts,
in the same batch, so the anchors move with it. Then, as SetFit, a logistic regression on the
trained encoder's z of the training texts classifies (trains_head False: minknn/probe.py fit_head
after each epoch).

Where each choice comes from: the authors' code (github.com/AmaliePauli/AncSetfit,
run_fewshot_ancsetfit.py; its README gives the paper's command). Their triplets
(sentence_generates_achor): for each of R rounds (--num_itaration 40), each training text in
order with its class's statement and one text drawn uniformly from the other classes (draw_pairs
below); sentence-transformers' TripletLoss with the cosine distance and margin 0.25 (the README's
--margin 0.25), whose value is the mean over the batch; 1 epoch, 16 triplets a batch, 10% warm-up,
sentence-transformers' default lr 2e-5, maximum length 256; scikit-learn's LogisticRegression().
The paper's command trains with this loss alone: SetFit's pair loss is its baseline
(--loss CosineSimilarityLoss, R = 20), not a term beside it. Runner method (the paper's setting,
RESULTS.md): ancsetfit[epochs=1;lr=2e-5;warmup=0.1] with --batch_size 16.

A batch holds the B anchors, then the B texts, then the B negatives (minknn/tools/engine.py
PairBatches: z (3B, dim)); an anchor's row is below 0, -1 - c for class c's statement
(minknn/tools/step.py batch() encodes it). The labels are the texts' classes; the loss reads only
the triplets' places in the batch.
"""
import math

import torch.nn as nn
import torch.nn.functional as F

from minknn import MinknnError

ITERATIONS = 40   # R, AncSetFit's --num_itaration
MARGIN = 0.25     # AncSetFit's --margin


def statement_row(c):
    """The batch row that stands for class c's statement (rows of training texts are >= 0)."""
    return -1 - c


def draw_pairs(labels, rng, iterations=ITERATIONS):
    """AncSetFit's triplets of a training set (labels: its class indices, in row order): for each
    of R = iterations rounds, for each row i in order, (class y_i's statement, i, a row of another
    class drawn uniformly); rng a random.Random. Returns [(statement row, row, row)], R x N."""
    others = {y: [i for i, c in enumerate(labels) if c != y] for y in set(labels)}
    if len(others) < 2:
        raise MinknnError("--loss ancsetfit pushes each example from one of another class; the "
                          "training set has one class only")
    return [(statement_row(y), i, rng.choice(others[y]))
            for _ in range(iterations) for i, y in enumerate(labels)]


class AncSetFitLoss(nn.Module):
    lam = 1.0            # the triplet loss alone: no cross-entropy term
    trains_head = False  # a logistic regression after each epoch, as SetFit
    pairs = True         # called on tuples it draws (draw_pairs): z (3B, dim)
    anchored = True      # its tuples begin with a class's statement (tasks/registry.py names)
    flags = {"anc_iterations": {"type": int, "default": ITERATIONS, "min": 1,
                                "help": "R, rounds of one triplet per example (AncSetFit's 40)"},
             "anc_margin": {"type": float, "default": MARGIN, "min": 0.0,
                            "help": "the triplet loss's margin on 1 - cos (AncSetFit's 0.25)"}}

    @staticmethod
    def refuse(anc_iterations, anc_margin):
        """train.py's one line for a margin no triplet loss can take (minknn/tools/checks.py)."""
        if not math.isfinite(anc_margin):
            return f"--anc_margin must be a finite number >= 0, got {anc_margin}"
        return None

    def __init__(self, num_classes=None, dim=None, anc_iterations=ITERATIONS, anc_margin=MARGIN):
        super().__init__()
        self.iterations, self.margin = anc_iterations, anc_margin

    def draw_pairs(self, labels, rng):
        """The triplets the run's batches are made of (draw_pairs above)."""
        return draw_pairs(labels, rng, self.iterations)

    def forward(self, z, labels):
        if len(z) % 3:
            raise ValueError(f"an AncSetFit batch holds triplets (the anchors, the texts, the "
                             f"negatives); got {len(z)} vectors")
        anchor, positive, negative = z.chunk(3)                       # (B, dim) each
        d_pos = 1 - F.cosine_similarity(anchor, positive, dim=-1)      # (B,)
        d_neg = 1 - F.cosine_similarity(anchor, negative, dim=-1)
        return F.relu(d_pos - d_neg + self.margin).mean()
