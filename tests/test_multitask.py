"""minknn/multitask.py: pair encodings, heads, per-task losses, prediction order and the scores,
on the tiny random BERT and the fixture datasets."""
import random

import pytest
import torch
import torch.nn.functional as F

from minknn.bert import BertModel
from minknn.data import TASKS, Example, load_split
from minknn.losses.contrastive import contrastive
from minknn.losses.mnrl import mnrl_pairs
from minknn.multitask import (MultiTaskLoss, MultiTaskModel, encode_batch, endless_batches, overall, predict_task,
                              predictions, score)
from minknn.tokenizer import Tokenizer

TASK_TRIO = [TASKS["sst"], TASKS["quora"], TASKS["sts"]]


@pytest.fixture
def tokenizer(tiny_bert_dir):
    return Tokenizer.from_folder(tiny_bert_dir, 32)


def make_model(tiny_bert_dir, pair_mode, seed=0):
    torch.manual_seed(seed)
    return MultiTaskModel(BertModel.from_pretrained(tiny_bert_dir), TASK_TRIO, "mean", pair_mode).eval()


PAIR = [Example("the cat eats an apple.", "a dog likes the house.", 1, "p0")]


def test_cross_and_siamese_encode_a_pair_differently(tiny_bert_dir, tokenizer):
    cross, siamese = encode_batch(tokenizer, PAIR, "cross"), encode_batch(tokenizer, PAIR, "siamese")
    # cross: one sequence [CLS] a [SEP] b [SEP], token types 0 then 1; siamese: two sequences, types all 0
    assert cross["input_ids"].shape[0] == 1 and siamese["input_ids"].shape[0] == 2
    types = cross["token_type_ids"][0].tolist()
    assert types[0] == 0 and types[-1] == 1 and sorted(types) == types
    assert siamese["token_type_ids"].sum() == 0
    assert cross["input_ids"].shape[1] > siamese["input_ids"].shape[1]
    a, b = (tokenizer([PAIR[0].text])["input_ids"][0].tolist(), tokenizer([PAIR[0].text_b])["input_ids"][0].tolist())
    assert siamese["input_ids"][0, :len(a)].tolist() == a and siamese["input_ids"][1, :len(b)].tolist() == b
    assert cross["input_ids"][0].tolist() == a + b[1:]  # [CLS] a [SEP] + b [SEP]

    models = {mode: make_model(tiny_bert_dir, mode) for mode in ("cross", "siamese")}
    with torch.no_grad():
        z_cross = models["cross"]("quora", **cross).embeddings
        z_siamese = models["siamese"]("quora", **siamese).embeddings
    assert z_cross.shape == (1, 32) and z_siamese.shape == (2, 32)
    assert not torch.allclose(z_cross[0], z_siamese[0]) and not torch.allclose(z_cross[0], z_siamese[1])


def test_siamese_heads_follow_their_formulas(tiny_bert_dir, tokenizer, data_dir):
    model = make_model(tiny_bert_dir, "siamese")
    batch = load_split(TASKS["sts"], "dev", data_dir)[:4]
    with torch.no_grad():
        sts = model("sts", **encode_batch(tokenizer, batch, "siamese"))
        para = model("quora", **encode_batch(tokenizer, batch, "siamese"))
    u, v = sts.embeddings.chunk(2)
    assert torch.allclose(sts.logits, 2.5 * (F.cosine_similarity(u, v) + 1), atol=1e-6)
    assert "sts" not in model.heads  # the scaled cosine has no parameters
    head = model.heads["quora"]  # [u, v, |u - v|] -> one logit (dropout is off in eval mode)
    assert torch.allclose(para.logits, head(torch.cat([u, v, (u - v).abs()], -1)).squeeze(-1), atol=1e-6)
    assert para.logits.shape == (4,) and head.in_features == 3 * 32


def test_each_task_loss_follows_its_formula(tiny_bert_dir, tokenizer, data_dir):
    model = make_model(tiny_bert_dir, "siamese")
    sst, quora, sts = (load_split(t, "train", data_dir)[:6] for t in TASK_TRIO)
    labels = {name: torch.tensor([e.label for e in b]) for name, b in (("sst", sst), ("quora", quora), ("sts", sts))}
    outputs = {name: model(name, **encode_batch(tokenizer, b, "siamese"))
               for name, b in (("sst", sst), ("quora", quora), ("sts", sts))}

    for sts_loss, reduce in (("mse", lambda d: d.pow(2).mean()), ("l1", lambda d: d.abs().mean())):
        loss_fn = MultiTaskLoss(TASK_TRIO, 32, sts_loss=sts_loss)
        assert torch.allclose(loss_fn("sts", outputs["sts"], labels["sts"])[0],
                              reduce(outputs["sts"].logits - labels["sts"]), atol=1e-6)
    loss_fn = MultiTaskLoss(TASK_TRIO, 32)
    p, y = torch.sigmoid(outputs["quora"].logits), labels["quora"].float()
    bce = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    assert torch.allclose(loss_fn("quora", outputs["quora"], labels["quora"])[0], bce, atol=1e-6)
    assert torch.allclose(loss_fn("sst", outputs["sst"], labels["sst"])[0],
                          F.cross_entropy(outputs["sst"].logits, labels["sst"]), atol=1e-6)

    u, v = outputs["quora"].embeddings.chunk(2)
    d = (F.normalize(u, dim=-1) - F.normalize(v, dim=-1)).norm(dim=-1)
    with_contrastive = MultiTaskLoss(TASK_TRIO, 32, pair_loss="contrastive")  # lam 0.1, margin 0.5
    expected = 0.9 * bce + 0.1 * contrastive(d, 1 - labels["quora"], 0.5).mean()
    assert torch.allclose(with_contrastive("quora", outputs["quora"], labels["quora"])[0], expected, atol=1e-6)
    with_mnrl = MultiTaskLoss(TASK_TRIO, 32, lam=0.3, pair_loss="mnrl")
    positive = labels["quora"] == 1
    assert positive.sum() >= 2
    expected = 0.7 * bce + 0.3 * mnrl_pairs(u[positive], v[positive], 20.0)
    assert torch.allclose(with_mnrl("quora", outputs["quora"], labels["quora"])[0], expected, atol=1e-6)
    no_paraphrase = torch.zeros_like(labels["quora"])
    assert torch.isfinite(with_mnrl("quora", outputs["quora"], no_paraphrase)[0])


@pytest.mark.parametrize("pair_mode", ["cross", "siamese"])
def test_predict_task_returns_each_example_in_order(tiny_bert_dir, tokenizer, data_dir, pair_mode):
    """Batched in length order, then put back: equal to one example at a time."""
    model = make_model(tiny_bert_dir, pair_mode)
    for task in TASK_TRIO:
        examples = load_split(task, "dev", data_dir)
        got = predict_task(model, tokenizer, task, examples, 5, torch.device("cpu"))
        with torch.no_grad():
            one_by_one = torch.cat([model(task.name, **encode_batch(tokenizer, [e], pair_mode)).logits for e in examples])
        assert torch.allclose(got, one_by_one, atol=1e-5), task.name


def test_predictions_scores_and_overall():
    assert predictions(TASKS["quora"], torch.tensor([0.3, -0.1, 0.0])).tolist() == [1, 0, 0]
    assert predictions(TASKS["sst"], torch.tensor([[0.1, 0.9], [2.0, 1.0]])).tolist() == [1, 0]
    sst = score(TASKS["sst"], [0, 1, 2, 2], [0, 1, 2, 3])
    para = score(TASKS["quora"], [1, 0], [1, 1])
    sts = score(TASKS["sts"], [1, 2, 3, 4], [2, 1, 4, 3])  # Pearson 0.6 (see test_metrics)
    assert sst["acc"] == 0.75 and para["acc"] == 0.5 and sts["pearson"] == pytest.approx(0.6)
    # minBERT's overall score: (sst_acc + para_acc + (pearson + 1) / 2) / 3
    assert overall({"sst": sst, "quora": para, "sts": sts}) == pytest.approx((0.75 + 0.5 + 1.6 / 2) / 3)


def test_endless_batches_redraw_a_small_task():
    stream = endless_batches(5, 2, random.Random(0))
    batches = [next(stream) for _ in range(6)]  # two passes of 5 rows: 2 + 2 + 1, twice
    assert [len(b) for b in batches] == [2, 2, 1, 2, 2, 1]
    assert sorted(sum(batches[:3], [])) == list(range(5)) and sorted(sum(batches[3:], [])) == list(range(5))
    assert sum(batches[:3], []) != sum(batches[3:], [])  # each pass is shuffled anew
