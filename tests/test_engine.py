"""minknn/tools/engine.py: pair encodings, the endless shuffled batches, prediction in length order, and
--precision."""
import random

import pytest
import torch

from minknn.bert import BertModel
from minknn.model import Model
from minknn.tasks.data import Example, load_split
from minknn.tasks.registry import TASKS
from minknn.tokenizer import Tokenizer
from minknn.tools.engine import TrainBatches, autocast, default_precision, encode_batch, predict

PAIR = [Example("the cat eats an apple.", "a dog likes the house.", 1, "p0")]


@pytest.fixture
def tokenizer(tiny_bert_dir):
    return Tokenizer.from_folder(tiny_bert_dir, 32)


def test_cross_and_siamese_encode_a_pair_differently(tokenizer):
    cross, siamese = encode_batch(tokenizer, PAIR), encode_batch(tokenizer, PAIR, siamese=True)
    # cross: one sequence [CLS] a [SEP] b [SEP], token types 0 then 1; siamese: two sequences, types all 0
    assert cross["input_ids"].shape[0] == 1 and siamese["input_ids"].shape[0] == 2
    types = cross["token_type_ids"][0].tolist()
    assert types[0] == 0 and types[-1] == 1 and sorted(types) == types
    assert siamese["token_type_ids"].sum() == 0
    a, b = (tokenizer([PAIR[0].text])["input_ids"][0].tolist(), tokenizer([PAIR[0].text_b])["input_ids"][0].tolist())
    assert siamese["input_ids"][0, :len(a)].tolist() == a and siamese["input_ids"][1, :len(b)].tolist() == b
    assert cross["input_ids"][0].tolist() == a + b[1:]  # [CLS] a [SEP] + b [SEP]


def test_train_batches_redraw_a_small_task():
    stream = TrainBatches(5, 2, random.Random(0))
    batches = [next(stream) for _ in range(6)]  # two passes of 5 rows: 2 + 2 + 1, twice
    assert [len(b) for b in batches] == [2, 2, 1, 2, 2, 1]
    assert sorted(sum(batches[:3], [])) == list(range(5)) and sorted(sum(batches[3:], [])) == list(range(5))
    assert sum(batches[:3], []) != sum(batches[3:], [])  # each pass is shuffled anew


def test_train_batches_resume_where_they_stopped():
    """A stream rebuilt from its state_dict and its rng's state draws what the original would."""
    rng = random.Random(0)
    stream = TrainBatches(7, 3, rng)
    [next(stream) for _ in range(4)]  # into the second pass
    state, rng_state = stream.state_dict(), rng.getstate()
    expected = [next(stream) for _ in range(5)]
    again = random.Random(1)
    again.setstate(rng_state)
    resumed = TrainBatches(7, 3, again)
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(5)] == expected, "a resumed TrainBatches drew other batches"


@pytest.mark.parametrize("pair_mode", ["cross", "siamese"])
def test_predict_returns_each_example_in_order(tiny_bert_dir, tokenizer, data_dir, pair_mode):
    """Batched in length order, then put back: equal to one example at a time, for every kind."""
    tasks = [TASKS["sst"], TASKS["quora"], TASKS["sts"]]
    torch.manual_seed(0)
    model = Model(BertModel.from_pretrained(tiny_bert_dir), tasks, "mean", pair_mode).eval()
    for task in tasks:
        examples = load_split(task, "dev", data_dir)
        got, z = predict(model, tokenizer, task, examples, 5, torch.device("cpu"))
        with torch.no_grad():
            one_by_one = [model(task.name, **encode_batch(tokenizer, [e], model.siamese(task))) for e in examples]
        torch.testing.assert_close(got, torch.cat([o.logits for o in one_by_one]), atol=1e-5, rtol=1e-4,
                                   msg=f"{task.name} ({pair_mode}): outputs out of order or padded differently")
        if model.siamese(task):
            assert z is None  # a siamese pair has two vectors: no representation to store
        else:
            torch.testing.assert_close(z, torch.cat([o.z for o in one_by_one]), atol=1e-5, rtol=1e-4,
                                       msg=f"{task.name}: representations out of order")


def test_predict_returns_the_representation_key_names(tiny_bert_dir, tokenizer):
    torch.manual_seed(0)
    model = Model(BertModel.from_pretrained(tiny_bert_dir), [TASKS["sst"]], "mean", decoupled=True).eval()
    examples = [Example("the cat eats an apple ."), Example("a dog"), Example("the house is small and old .")]
    with torch.no_grad():
        one = [model("sst", **encode_batch(tokenizer, [e])) for e in examples]
    for key, expected in (("cls", torch.cat([o.hidden[:, 0] for o in one])),
                          ("decoupled", torch.cat([o.retrieval for o in one]))):
        _, z = predict(model, tokenizer, TASKS["sst"], examples, 2, torch.device("cpu"), key=key)
        torch.testing.assert_close(z, expected, atol=1e-5, rtol=1e-4, msg=f"predict(key={key!r}): wrong representation")


def test_precision_picks_the_autocast():
    """--precision bf16 runs the matmuls in bf16 on any device (the tests use it on the CPU); fp32
    runs nothing under autocast; no --precision is bf16 on CUDA and fp32 on the CPU."""
    layer, x, cpu = torch.nn.Linear(4, 4), torch.randn(2, 4), torch.device("cpu")
    for precision, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32), (None, torch.float32)):
        with autocast(cpu, precision):
            assert layer(x).dtype == dtype, f"--precision {precision} on the CPU: a matmul in {layer(x).dtype}"
    assert (default_precision(torch.device("cuda")), default_precision(cpu)) == ("bf16", "fp32")
    assert layer.weight.dtype == torch.float32  # autocast casts copies, never the weights


def test_predict_in_bf16_returns_fp32_near_the_fp32_outputs(tiny_bert_dir, tokenizer, data_dir):
    torch.manual_seed(0)
    model = Model(BertModel.from_pretrained(tiny_bert_dir), [TASKS["sst"]], "mean").eval()
    examples = load_split(TASKS["sst"], "dev", data_dir)
    cpu = torch.device("cpu")
    (logits, z), (logits16, z16) = (predict(model, tokenizer, TASKS["sst"], examples, 4, cpu, precision=p)
                                    for p in ("fp32", "bf16"))
    assert logits16.dtype == z16.dtype == torch.float32
    assert not torch.equal(logits16, logits), "predict(precision='bf16'): the fp32 outputs exactly: bf16 never ran"
    torch.testing.assert_close(logits16, logits, atol=0.05, rtol=0.05, msg="predict in bf16: logits far from fp32's")
    torch.testing.assert_close(z16, z, atol=0.05, rtol=0.05, msg="predict in bf16: z far from fp32's")
