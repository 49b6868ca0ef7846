"""SetFit's contrastive fine-tuning (Tunstall et al. 2022, "Efficient Few-Shot Learning Without
Prompts", sec. 3.1): pairs of training texts, the cosine similarity of the pair's two embeddings
regressed onto 1 for a pair of one class and onto 0 for a pair of two classes (the
sentence-transformers CosineSimilarityLoss, SetFit's default):

    L = 1/B sum_i (cos(u_i, v_i) - t_i)^2,     t_i = 1 if y(u_i) = y(v_i), else 0

over a batch of B pairs, u_i and v_i the pooled z of the pair's two texts. The batch holds the B
first texts, then the B second ones (as a siamese pair batch does, minknn/tools/engine.py
encode_batch): z is (2B, dim), labels (2B,) the texts' classes, and a pair's target is whether
its two classes are equal.

The pairs (draw_pairs) are SetFit v0.x's (src/setfit/modeling.py sentence_pairs_generation, which
SetFitTrainer.train calls num_iterations times): R iterations (--setfit_iterations, default 20, the
paper's), each giving every training example one positive partner, drawn uniformly from its class
(itself included: SetFit's np.random.choice over the class's rows), and one negative, drawn
uniformly from the other classes. R x 2 x N pairs, shuffled into batches of --batch_size pairs each
epoch (minknn/tools/engine.py PairBatches). Left out: v0.x's multi-label and distillation pairs and
its other losses (batch-hard triplet, SupCon). SetFit v1 (the `setfit` package >= 1.0,
ContrastiveDataset) draws otherwise by default: every unordered pair once, itself included, the
rarer kind (positive or negative) repeated to as many as the other ("oversampling"); it draws
R x 2 x N pairs only when given num_iterations. minknn/lab/setfit_package.py runs that package.

SetFit's defaults for this step (v0.7 SetFitTrainer, v1 TrainingArguments): 1 epoch, 16 pairs a
batch, lr 2e-5 (v1's body_learning_rate), 10% warm-up then linear decay, AdamW (weight decay
0.01, none on biases and LayerNorm) and gradients clipped to norm 1 (sentence-transformers'
fit), dropout on. train.py's own defaults differ (3 epochs, 32, 5e-5, 6%): pass SetFit's as
flags, `--epochs 1 --batch_size 16 --lr 2e-5 --warmup 0.1`.

By default no linear head trains: the pair loss is the whole objective (lam = 1). At the end of
each epoch, before the dev set is scored, train.py fits the head as SetFit fits its
LogisticRegression(): scikit-learn's L2 logistic regression, C = 1, on the trained encoder's
z of the training examples (minknn/probe.py fit_head). The checkpoint's head is that regression,
so evaluate.py and the runner's rules (linear, knn, knn-only) read it as any other head.
Normalisation: SetFit's all-MiniLM-L6-v2 ends in a Normalize module, so its regression sees unit
vectors; ours sees z as the head reads it at inference (W z + b, minknn/model.py), unnormalised.
A unit-vector fit could not be written into that head (z / ||z|| is no linear function of z).
The cosine loss does not care; the regression does: the base model's mean-pooled z are 3 to 5.4
long (CR, 8 per class), so with C = 1 its penalty is about 10 to 30 times weaker than on unit
vectors (C ||z||^2 plays C's part). The kNN rule votes by cosine and is not affected.

With --lam below 1 (not SetFit's; minknn/losses/__init__.py Objective) the head trains with the
encoder instead: (1 - lam) CE(F(z), y) + lam L over the batch's 2B texts, each with its own
class. With --head_init probe the head starts as the frozen encoder's logistic regression: the
LP-FT start of minknn's few-shot recipe (Kumar et al. 2022; RESULTS.md) given to SetFit's body.
"""
import torch.nn as nn
import torch.nn.functional as F

from minknn import MinknnError

ITERATIONS = 20   # R, SetFit's num_iterations (the paper's value)


def draw_pairs(labels, rng, setfit_iterations=ITERATIONS):
    """SetFit's pairs of a training set (labels: its class indices, in row order): for each of
    R = setfit_iterations rounds, for each row i in order, (i, a row of i's class), then (i, a
    row of another class); rng a random.Random. Returns [(first row, second row)], 2 x R x N."""
    rows_of = {}
    for i, y in enumerate(labels):
        rows_of.setdefault(y, []).append(i)
    if len(rows_of) < 2:
        raise MinknnError("--loss setfit pairs each example with one of another class; the "
                          "training set has one class only")
    others = {y: [i for i, c in enumerate(labels) if c != y] for y in rows_of}
    pairs = []
    for _ in range(setfit_iterations):
        for i, y in enumerate(labels):
            pairs.append((i, rng.choice(rows_of[y])))   # positive: itself possible, as SetFit
            pairs.append((i, rng.choice(others[y])))    # negative
    return pairs


class SetFitLoss(nn.Module):
    lam = 1.0            # the pair loss alone: no cross-entropy term
    part = "setfit"      # the assignment's (minknn/assignment/parts.py)
    trains_head = False  # minknn/losses/__init__.py Objective leaves the head out
    pairs = True         # called on pair batches: z (2B, dim), the first texts then the second
    flags = {"setfit_iterations": {"type": int, "default": ITERATIONS, "min": 1,  # train.py's
                                   "help": "R, rounds of one positive and one negative pair per "
                                           "example; an epoch is a pass over the pairs"}}

    def __init__(self, num_classes=None, dim=None, setfit_iterations=ITERATIONS):
        super().__init__()
        self.iterations = setfit_iterations

    def draw_pairs(self, labels, rng):
        """The pairs the run's batches are made of (draw_pairs above, R = --setfit_iterations)."""
        return draw_pairs(labels, rng, self.iterations)

    def forward(self, z, labels):
        if len(z) % 2:
            raise ValueError(f"a SetFit batch holds pairs (the first texts, then the second); "
                             f"got {len(z)} vectors")
        # z (2B, dim), labels (2B,). u = z[:B], v = z[B:]: cos(u_i, v_i) for each pair i
        # (F.cosine_similarity along the features), the target t_i = 1.0 where the two labels
        # are equal, else 0.0, and the mean of the squared differences over the B pairs.
        # BEGIN part setfit
        u, v = z.chunk(2)
        cos = F.cosine_similarity(u, v, dim=-1)                     # (B,)
        B = len(u)
        target = (labels[:B] == labels[B:]).to(cos.dtype)           # 1: one class, 0: two
        return F.mse_loss(cos, target)
        # END part setfit
