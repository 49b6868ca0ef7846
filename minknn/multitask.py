"""Multi-task fine-tuning: one BERT shared by several tasks, one head per task (the CS224N minBERT
extension: SST sentiment, Quora paraphrase, STS similarity). train.py --task multitask drives it.

What each kind of task (data.Task.kind) predicts from the pooled representation z = pool(BERT(x)):
    classify    logits = W dropout(z) + b            (B, C)  cross-entropy, or (1 - lam) CE + lam --loss
    paraphrase  one logit = w . dropout(f) + b       (B,)    binary cross-entropy; paraphrase when > 0
    similarity  one score, trained towards [0, 5]    (B,)    MSE or L1 (--sts_loss); scored by Pearson

Sentence pairs (a, b) are encoded one of two ways (--pair_mode):
    cross    one sequence [CLS] a [SEP] b [SEP], token types 0 for a and 1 for b, so every layer
             attends across the two sentences (the report's "segments" network); f = z, and the
             similarity score is w . dropout(z) + b
    siamese  u = pool(BERT(a)), v = pool(BERT(b)) with the same weights, in one forward pass over
             the 2B sentences; the pair is judged only through the two vectors:
               paraphrase  f = [u, v, |u - v|] (SBERT's classification head, Reimers & Gurevych 2019)
               similarity  2.5 (cos(u, v) + 1), the cosine scaled to [0, 5], with no parameters
             --pair_loss contrastive|mnrl adds a metric term on (u, v) to the paraphrase loss:
               (1 - lam) BCE + lam L_pair, with the registry's contrastive() (similar pairs pulled
               together, the others pushed to the margin) or mnrl_pairs() over the batch's paraphrases
The report found cross far better for STS (0.743 Pearson against 0.021 for its siamese network).

An epoch takes one batch from every task per step, for as many steps as the largest task needs
for one pass (or --steps_per_epoch); a smaller task starts a new shuffled pass whenever it runs out.
The dev score of a run is minBERT's overall score: the mean over tasks of accuracy (classify,
paraphrase) or (pearson + 1) / 2 (similarity); for SST, Quora and STS that is
(sst_acc + para_acc + (pearson + 1) / 2) / 3.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from minknn.bert import BertModel
from minknn.engine import autocast, batches_by_length, texts_of, to_device, train_batches
from minknn.losses import Objective
from minknn.losses.contrastive import ContrastiveLoss, contrastive
from minknn.losses.mnrl import MNRLoss, mnrl_pairs
from minknn.metrics import accuracy, macro_f1, pearson
from minknn.model import Output, pool

PAIR_MODES = ("cross", "siamese")
STS_LOSSES = {"mse": F.mse_loss, "l1": F.l1_loss}
PAIR_LOSSES = {"contrastive": ContrastiveLoss, "mnrl": MNRLoss}  # their lam and margin / scale


class MultiTaskModel(nn.Module):
    def __init__(self, bert, tasks, pooling="mean", pair_mode="cross", option="finetune"):
        super().__init__()
        self.bert, self.pooling, self.pair_mode = bert, pooling, pair_mode
        self.tasks, self.kinds = list(tasks), {t.name: t.kind for t in tasks}
        self.dropout = nn.Dropout(bert.config.hidden_dropout_prob)
        H, siamese = bert.config.hidden_size, pair_mode == "siamese"
        heads = {}
        for t in tasks:
            if t.kind == "classify":
                heads[t.name] = nn.Linear(H, len(t.labels))
            elif t.kind == "paraphrase":
                heads[t.name] = nn.Linear(3 * H if siamese else H, 1)
            elif not siamese:  # a siamese similarity is the scaled cosine: no head
                heads[t.name] = nn.Linear(H, 1)
        self.heads = nn.ModuleDict(heads)
        for p in self.bert.parameters():
            p.requires_grad = option == "finetune"

    def forward(self, task, input_ids, attention_mask, token_type_ids=None):
        """Output(logits, embeddings=z) for one task's batch. logits: (B, C) class logits, or (B,)
        the paraphrase logit or similarity score. A siamese pair batch holds the B first sentences,
        then the B second ones (encode_batch), so z is (2B, H)."""
        z = pool(self.bert(input_ids, attention_mask, token_type_ids), attention_mask, self.pooling)
        kind = self.kinds[task]
        if kind == "classify" or self.pair_mode == "cross":
            out = self.heads[task](self.dropout(z))
            return Output(logits=out if kind == "classify" else out.squeeze(-1), embeddings=z)
        u, v = z.chunk(2)
        if kind == "paraphrase":
            features = torch.cat([u, v, (u - v).abs()], dim=-1)
            return Output(logits=self.heads[task](self.dropout(features)).squeeze(-1), embeddings=z)
        return Output(logits=2.5 * (F.cosine_similarity(u, v, dim=-1) + 1), embeddings=z)

    @classmethod
    def from_config(cls, bert_config, tasks, pooling, pair_mode):
        return cls(BertModel(bert_config), tasks, pooling, pair_mode)


def encode_batch(tokenizer, examples, pair_mode):
    """Tokenizer inputs for a batch: single sentences, pairs as one sequence (cross), or pairs as
    the B first sentences followed by the B second ones (siamese), padded to the longest."""
    texts, texts_b = texts_of(examples)
    if texts_b is not None and pair_mode == "siamese":
        return tokenizer(texts + texts_b)
    return tokenizer(texts, texts_b)


class MultiTaskLoss(nn.Module):
    """Each task's loss on its own batch: loss_fn(task, output, labels) -> (loss, parts).
    The classify tasks use the loss registry's Objective (so --loss and --lam work as for one
    task); it holds the only parameters (proxies), saved with the checkpoint."""

    def __init__(self, tasks, dim, loss="ce", lam=None, sts_loss="mse", pair_loss=None):
        super().__init__()
        self.kinds = {t.name: t.kind for t in tasks}
        self.objectives = nn.ModuleDict({t.name: Objective(loss, len(t.labels), dim, lam)
                                         for t in tasks if t.kind == "classify"})
        self.sts_loss, self.pair_loss = sts_loss, pair_loss
        self.pair = PAIR_LOSSES[pair_loss]() if pair_loss else None
        self.pair_lam = (self.pair.lam if lam is None else lam) if pair_loss else 0.0

    def forward(self, task, output, labels):
        kind = self.kinds[task]
        if kind == "classify":
            return self.objectives[task](output, labels)
        if kind == "similarity":
            return STS_LOSSES[self.sts_loss](output.logits.float(), labels.float()), {}
        bce = F.binary_cross_entropy_with_logits(output.logits.float(), labels.float())
        if self.pair is None:
            return bce, {}
        u, v = output.embeddings.float().chunk(2)
        if self.pair_loss == "contrastive":  # d = ||u/|u| - v/|v|||; a non-paraphrase is "dissimilar"
            d = (F.normalize(u, dim=-1) - F.normalize(v, dim=-1)).norm(dim=-1)
            metric = contrastive(d, 1 - labels, self.pair.margin).mean()
        else:  # mnrl: each paraphrase's second sentence against the other paraphrases' second ones
            positive = labels == 1
            metric = mnrl_pairs(u[positive], v[positive], self.pair.scale) if positive.any() else bce * 0.0
        total = (1 - self.pair_lam) * bce + self.pair_lam * metric
        return total, {"bce": bce.detach(), self.pair_loss: metric.detach()}


@torch.inference_mode()
def predict_task(model, tokenizer, task, examples, batch_size, device, progress=None):
    """The model's outputs on one task's examples as a float32 CPU tensor in their order: (N, C)
    class logits, or (N,) paraphrase logits or similarity scores."""
    model.eval()
    texts, texts_b = texts_of(examples)
    if texts_b is not None and model.pair_mode == "siamese":  # tokenised once, each sentence alone
        encodings = list(zip(tokenizer.encode(texts), tokenizer.encode(texts_b)))
        lengths = [max(len(a[0]), len(b[0])) for a, b in encodings]
    else:
        encodings = [(e,) for e in tokenizer.encode(texts, texts_b)]
        lengths = [len(e[0][0]) for e in encodings]
    chunks, inverse = batches_by_length(lengths, batch_size, progress)
    outputs = []
    for chunk in chunks:
        parts = [[encodings[i][side] for i in chunk] for side in range(len(encodings[0]))]
        batch = to_device(tokenizer.pad([e for side in parts for e in side]), device)
        with autocast(device):
            outputs.append(model(task.name, **batch).logits.float().cpu())
    return torch.cat(outputs)[inverse]


def predictions(task, outputs):
    """Class indices (classify, paraphrase) or similarity scores (similarity), as a numpy array."""
    if task.kind == "classify":
        return outputs.argmax(-1).numpy()
    if task.kind == "paraphrase":
        return (outputs > 0).long().numpy()
    return outputs.numpy()


def score(task, pred, gold):
    """The task's dev metrics; "score" is its share of the overall score, in [0, 1]."""
    if task.kind == "similarity":
        r = pearson(pred, gold)
        return {"pearson": r, "score": (r + 1) / 2}
    acc = accuracy(pred, gold)
    return {"acc": acc, "macro_f1": macro_f1(pred, gold), "score": acc}


def overall(scores):
    """minBERT's overall score: the mean of the tasks' scores (dict task -> score())."""
    return sum(s["score"] for s in scores.values()) / len(scores)


def endless_batches(n, batch_size, rng):
    """Batches of row indices into n examples, pass after shuffled pass, for ever: how a smaller
    task keeps up with the largest one. The last batch of a pass may be short."""
    while True:
        yield from train_batches(n, batch_size, rng)


def predict_and_score(model, tokenizer, tasks, splits, batch_size, device, split="dev"):
    """Each task's predictions on its examples (splits: task name -> Examples) and, when they are
    labelled, its metrics: {name: (predictions, score() or None)}."""
    results = {}
    for task in tasks:
        examples = splits[task.name]
        outputs = predict_task(model, tokenizer, task, examples, batch_size, device, progress=f"{task.name} {split}")
        pred = predictions(task, outputs)
        labelled = all(e.label is not None for e in examples)
        results[task.name] = (pred, score(task, pred, [e.label for e in examples]) if labelled else None)
    return results
