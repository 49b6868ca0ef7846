"""train.py --proxy_init names (minknn/proxy.py start_at_names, AncSetFit's idea): each proxy starts at
sqrt(H) times the unit vector of the loaded encoder's z of its class's name, checked against a slow
transcription (the tokenizer, BERT's forward and the mean of the name's hidden states); the default random start
is left as it was; a resumed run keeps its trained proxies; the flag is refused, in one line, where it cannot
work; and the runner passes it through from a method's brackets."""
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

import minknn.tools.trainer
import train
from minknn import MinknnError
from minknn.bert import BertModel
from minknn.lab import cells, runner
from minknn.tasks.registry import TASKS, get_task
from minknn.tokenizer import Tokenizer
from minknn.tools import options
from minknn.tools.weights import resolve_model_path

from helpers import DATA

MAX_LEN = 32
REAL_STEP, REAL_START = train.train_step, minknn.tools.trainer.start_at_names


def run(tiny_bert_dir, out, *extra):
    return train.main(["--task", "sst", "--model", tiny_bert_dir, "--data_dir", DATA, "--out", str(out),
                       "--batch_size", "8", "--max_len", str(MAX_LEN), "--device", "cpu", "--max_eval", "8", *extra])


def watching(monkeypatch, stop_at=None):
    """train.train_step, recorded: a list of what each step starts from (the first task's proxies, the model's
    weights, the batch's rows); with stop_at, Ctrl-C at that call (before its step). Also counts the calls of
    start_at_names (the list's `named`)."""
    seen = []

    def step(trainer, batches):
        if len(seen) + 1 == stop_at:
            raise KeyboardInterrupt
        t = trainer.tasks[0].name
        seen.append({"proxies": trainer.losses[t].metric.proxies.detach().clone(),
                     "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
                     "rows": batches[t][2].tolist(), "torch_rng": torch.get_rng_state()})
        return REAL_STEP(trainer, batches)
    monkeypatch.setattr(train, "train_step", step)
    named = []
    monkeypatch.setattr(minknn.tools.trainer, "start_at_names",
                        lambda *a, **k: named.append(a[2].name) or REAL_START(*a, **k))
    return seen, named


def z_of_name(tiny_bert_dir, name):
    """The oracle, slowly: the name alone through the tokenizer ([CLS] name [SEP], cut at --max_len), the loaded
    BERT with dropout off, and the mean of its last hidden states over the tokens (all real: one text, no
    padding), as --pooling mean does."""
    tokenizer = Tokenizer.from_folder(tiny_bert_dir, MAX_LEN)
    (ids, types), = tokenizer.encode([name])
    bert = BertModel.from_pretrained(tiny_bert_dir).eval()
    with torch.no_grad():
        h = bert(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), torch.tensor([types]))[0]  # (T, H)
    return h.mean(0)


@pytest.mark.parametrize("loss", ["proxyanchor", "proxynca"])
def test_each_proxy_starts_at_its_class_names_z(tiny_bert_dir, tmp_path, monkeypatch, capsys, loss):
    """At the first step, proxy c is sqrt(H) z(name_c) / ||z(name_c)||, name_c the task's c-th readable name
    (Task.names; here sst's labels in reverse, so that names read from the labels would put each proxy at another
    class's name, and be named as such); the run's first line says the names."""
    monkeypatch.setitem(TASKS, "sst", dataclasses.replace(TASKS["sst"], names=TASKS["sst"].labels[::-1]))
    seen, named = watching(monkeypatch)
    run(tiny_bert_dir, tmp_path / "run", "--loss", loss, "--proxy_init", "names", "--epochs", "1",
        "--steps_per_epoch", "1")
    assert named == ["sst"], f"--proxy_init names: start_at_names ran for {named}, not once for sst"
    labels = get_task("sst").names
    first = capsys.readouterr().out.splitlines()[0]
    assert "proxies at the class names sst: " + ", ".join(map(repr, labels)) in first, \
        f"the run's first line does not list the names the proxies start from: {first}"
    P = seen[0]["proxies"]
    z = torch.stack([z_of_name(tiny_bert_dir, name) for name in labels])
    H = z.shape[1]
    cos = F.normalize(P, dim=-1) @ F.normalize(z, dim=-1).T  # (C, C): cos(P_c, z(name_d))
    for c, name in enumerate(labels):
        d = int(cos[c].argmax())
        assert not (d != c and cos[c, d] > 1 - 1e-5), (
            f"{loss}: proxy {c} ({name!r}) is along z({labels[d]!r}) (its own name's cos {cos[c, c]:.4f}): the "
            f"proxies are not at task.names in their order")
        assert cos[c, c] > 1 - 1e-5, (
            f"{loss}: proxy {c} ({name!r}) is not along z({name!r}): cos {cos[c, c]:.6f} (nearest: z({labels[d]!r}), "
            f"{cos[c, d]:.4f}); the name was encoded otherwise than the task's texts by the loaded encoder with "
            f"dropout off (dropout on? another pooling or --max_len? after a step?)")
        assert math.isclose(P[c].norm(), math.sqrt(H), rel_tol=1e-5), \
            f"{loss}: proxy {c} ({name!r}) has length {P[c].norm():.4f}, not sqrt(H) = {math.sqrt(H):.4f}"


def test_names_change_the_proxies_only(tiny_bert_dir, tmp_path, monkeypatch):
    """The default (random) never calls start_at_names, and its proxies are torch.randn(C, H), drawn at the losses'
    turn in build() (minknn/tools/trainer.py), as before the flag. A run with names is, at its first step, the random
    run of the same seed but for the proxies: the same weights, batch and torch random state (the random proxies
    drawn all the same, the names drawing nothing, dropout off)."""
    flags = ("--loss", "proxyanchor", "--epochs", "1", "--steps_per_epoch", "1")
    states, build_losses = [], minknn.tools.trainer.build_losses
    monkeypatch.setattr(minknn.tools.trainer, "build_losses",
                        lambda *a, **k: states.append(torch.get_rng_state()) or build_losses(*a, **k))
    seen, named = watching(monkeypatch)
    run(tiny_bert_dir, tmp_path / "random", *flags)
    assert named == [], f"--proxy_init random (the default) called start_at_names for {named}"
    random = seen[0]
    torch.set_rng_state(states[0])
    drawn = torch.randn(random["proxies"].shape)
    assert torch.equal(random["proxies"], drawn), \
        "--proxy_init random: the proxies at the first step are not torch.randn(C, H) drawn when build_losses ran"
    run(tiny_bert_dir, tmp_path / "names", *flags, "--proxy_init", "names")
    names = seen[1]
    differ = [k for k in random["model"] if not torch.equal(random["model"][k], names["model"][k])]
    assert not differ, f"--proxy_init names changed the model's weights at the first step: {differ[:3]}"
    assert random["rows"] == names["rows"], \
        f"--proxy_init names changed the first batch: rows {names['rows']}, random's {random['rows']}"
    assert torch.equal(random["torch_rng"], names["torch_rng"]), \
        ("--proxy_init names left torch's random state at the first step other than random's: it drew numbers (no "
         "random proxies first? dropout on while encoding the names?), and dropout will differ")
    assert not torch.allclose(random["proxies"], names["proxies"]), "--proxy_init names left the random proxies"


def test_a_resumed_run_keeps_its_trained_proxies(tiny_bert_dir, tmp_path, monkeypatch):
    """--proxy_init names is the run's (run.json): Ctrl-C in epoch 2, then --resume, starts epoch 2 from last.pt's
    proxies (trained one epoch), without encoding the names again, and ends as the run left alone."""
    flags = ("--loss", "proxyanchor", "--proxy_init", "names", "--epochs", "2", "--steps_per_epoch", "2")
    alone, _ = watching(monkeypatch)
    run(tiny_bert_dir, tmp_path / "alone", *flags)
    stopped, _ = watching(monkeypatch, stop_at=3)  # epoch 2's first step
    with pytest.raises(SystemExit):
        run(tiny_bert_dir, tmp_path / "stopped", *flags)
    assert torch.equal(stopped[0]["proxies"], alone[0]["proxies"]), "two runs of one seed started apart"
    resumed_steps, named = watching(monkeypatch)
    train.main(["--resume", str(tmp_path / "stopped")])
    assert named == [], f"--resume encoded the names again ({named}): last.pt holds the proxies (trainer.build)"
    trained, resumed = alone[2]["proxies"], resumed_steps[0]["proxies"]
    assert not torch.allclose(trained, alone[0]["proxies"]), "the proxies did not move in epoch 1: no test"
    assert torch.equal(resumed, trained), (
        f"the resumed run's proxies at epoch 2's first step are not the left-alone run's (trained one epoch): "
        f"largest difference {(resumed - trained).abs().max():.3g}; "
        f"{'they are the names start again' if torch.allclose(resumed, alone[0]['proxies']) else 'something else'}")
    left, continued = ([{k: r[k] for k in ("epoch", "train_loss", "dev")}
                        for r in map(json.loads, open(tmp_path / name / "metrics.jsonl"))] for name in ("alone", "stopped"))
    assert continued == left, f"stopped and resumed: {continued}; left alone: {left}"


@pytest.mark.parametrize("flags, says", [
    (["--proxy_init", "names"], "--loss ce has none"),
    (["--loss", "supcon", "--proxy_init", "names"], "--loss supcon has none"),
    (["--loss", "softtriple", "--proxy_init", "names"], "--loss softtriple has K centres a class"),
    (["--task", "sts", "--proxy_init", "names"], "--loss mse has none"),
    (["--task", "rte", "--loss", "proxyanchor", "--proxy_init", "names"], "rte's examples are pairs of texts"),
    (["--task", "multitask", "--tasks", "sst,quora", "--loss", "proxynca", "--proxy_init", "names"],
     "quora's examples are pairs of texts"),
], ids=["ce", "supcon", "softtriple", "regression", "pair task", "multitask with a pair task"])
def test_names_are_refused_where_they_cannot_start_proxies(capsys, flags, says):
    with pytest.raises(SystemExit) as exit:
        options.get_args(flags)
        pytest.fail(f"train.py {' '.join(flags)} was accepted (minknn/tools/checks.py check_proxy_init)")
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and "\n" not in err and err.startswith("error: --proxy_init names"), err
    assert says in err, f"train.py {' '.join(flags)}: {err!r} does not say {says!r}"


def test_names_are_refused_on_a_task_without_readable_names(capsys, monkeypatch):
    """A task whose labels are codes and that the registry gives no names (TREC's, had it none) is refused in one
    line naming the task and its codes."""
    monkeypatch.setitem(TASKS, "trec", dataclasses.replace(TASKS["trec"], names=None))
    with pytest.raises(SystemExit):
        options.get_args(["--task", "trec", "--loss", "proxyanchor", "--proxy_init", "names"])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --proxy_init names: trec has no readable class names") \
        and "ABBR, DESC" in err, err


def test_every_single_text_classification_task_has_names_of_whole_words():
    """--proxy_init names and AncSetFit read a class as text: every single-text classification task of the
    registry has one readable name a class, each word of it one token of the default tokenizer's vocabulary
    (all-MiniLM-L6-v2's; no '##' pieces, no [UNK]), not a code such as TREC's 'ENTY' ('en', '##ty')."""
    tokenizer = Tokenizer.from_folder(resolve_model_path("minilm"))
    vocab = tokenizer.tok.get_vocab()
    for t in TASKS.values():
        if t.kind != "classify" or t.pair:
            continue
        assert t.names and len(t.names) == len(t.labels), \
            f"{t.name}: {len(t.names or [])} names for its {len(t.labels)} classes (minknn/tasks/registry.py names=)"
        for name in t.names:
            pieces = tokenizer.tok.encode(name, add_special_tokens=False).tokens
            bad = [p for p in pieces if p.startswith("##") or p == tokenizer.UNK or p not in vocab]
            assert not bad, (f"{t.name}'s class name {name!r} is no whole words: it tokenises into {pieces} "
                             f"({bad}: word pieces); give the dataset's documented meaning in words")


def test_names_take_a_multitask_run_whose_proxy_tasks_have_names():
    """sst trains proxies, sts a regression (no proxies, no names needed)."""
    args = options.get_args(["--task", "multitask", "--tasks", "sst,sts", "--loss", "proxynca", "--proxy_init",
                             "names"])
    assert args.proxy_init == "names"


def test_the_runner_passes_proxy_init_from_a_methods_brackets(tmp_path):
    """`proxyanchor[proxy_init=names]+proxy[alpha=1]` gives each cell train.py --proxy_init names; `ce[...]` is
    refused before any training, naming the method."""
    argv = ["--tasks", "mr", "--sizes", "6", "--out", str(tmp_path / "g"), "--data_dir", DATA]
    args, rest = runner.get_args([*argv, "--methods", "proxyanchor[proxy_init=names;lam=0.5]+proxy[alpha=1]"])
    grid = runner.cells_of(args.task_list, args.method_list, args.size_list, args.seed_list)
    ctx, _ = runner.check_grid(args, rest, grid)
    argv_of = cells.train_argv(next(iter(grid)), ctx, str(tmp_path / "cell"))
    assert "--proxy_init" in argv_of and argv_of[argv_of.index("--proxy_init") + 1] == "names", argv_of
    with pytest.raises(MinknnError, match=r"--methods ce\[proxy_init=names\]: --proxy_init names"):
        runner.main([*argv, "--methods", "ce[proxy_init=names]"])
    assert not (tmp_path / "g").exists(), "the refused grid wrote its folder"
