"""The README's commands, run as a user types them, at tiny sizes; and every file the README and
docs/ name exists. A README line that stops working fails here, naming the file and line.

Which commands: every line of every ```bash block of README.md and docs/*.md, in order (a line
ending in a backslash goes on to the next; `a && b` is two commands; `#` starts a comment). Each
is one of
    python train.py ...               train.main      in-process, through minknn.tools.cli.run as the
    python evaluate.py ...            evaluate.main   scripts' __main__ does: a MinknnError is
    python -m minknn.lab.bench ...    bench.main      `error: ...` and exit status 2
    python -m minknn.lab.runner ...   runner.main
    python -m minknn.lab.attack ...   attack.main
    python -m minknn.assignment ...   minknn.assignment.edition.main
    python -m minknn.tools.export ...       minknn.tools.export.main
    python -m minknn.tools.predict ...      minknn.tools.predict.main
    torchrun ... train.py ...        a subprocess: python -m torch.distributed.run --standalone
                                     --nproc_per_node 2 train.py ..., 1 thread each (gloo)
or a set-up or test command that is not run here (NOT_RUN says why: it makes the virtual
environment the tests already run in, installs packages, sets MINKNN_DATA, is the test suite
itself or TensorBoard's server; in a student edition also IN_AN_EDITION's --solve, which an
edition refuses by design). A command of any other kind fails the test until it is added to
one or the other.

How each runs. A file's commands share one fresh working folder, in order, so the run a train line
writes to `runs/NAME` is the one a later evaluate line reads; train.py, evaluate.py and minknn/
are linked into it, as in a checkout. Small sizes are APPENDED to each command (argparse
keeps the last value of a flag given twice), so every flag the README gives is still parsed and
checked:
    train.py      --model TINY --epochs 1 --max_train 16 --max_eval 8 --max_len 32 --batch_size 8
                  --device cpu (so `--model path/to/...` and `--max_train 5000` become these)
    --resume      --device cpu alone: a resumed run takes its own flags and refuses others
    evaluate.py   --max_eval 8 --device cpu, and --k 4 with --knn (the datastore holds 16 keys)
    attack        --attack_n 4 --device cpu --attack_encoder TINY (and --k 4 for kNN)
    runner        --model TINY --epochs 1 --max_len 32 --batch_size 8 --device cpu --sizes 16
                  --seeds 0 (one seed, one size: every task and method of the line still runs)
    assignment    nothing: writing an edition copies files, already quick
    export        --k 4 with --knn (the run it reads is already tiny)
    predict       --device cpu, and --k 4 with --knn
    bench         --model TINY --device cpu --rounds 1 and the subcommand's smallest sizes (BENCH)
TINY is a random 2-layer BERT 32 wide (tests/helpers.py's, with 128 positions: bench knn encodes
at length 128); where the page's own --model names a RoBERTa, DistilBERT or MPNet folder
(`path/to/roberta-base`, `mpnet`), TINY is a tiny one of that architecture (tests/hf_folders.py). Three
things stand in for what would take long or reach outside:
- A train line whose run a later `--resume` line continues is stopped by Ctrl-C in its second
  epoch (`--epochs 2 --steps_per_epoch 1` appended), the stop the resume line's comment means;
  the test expects its exit status 130 and then the resumed run to finish.
- The runner draws no plots (minknn.lab.plots unimportable, as without matplotlib:
  tests/lab/test_plots.py draws them); bench's peak matmul (seconds of 2048x2048 products) is a
  constant.
- The data is what a user has who followed the README's set-up with downloads unavailable: the
  fixture datasets (tests/fixtures/data) less the files that are not in the copy `RESULTS.md` was
  measured on (data/README.md names them: Quora's train and test-student, QNLI's train, AG News'
  train, AAPD), plus an IMDB archive and Reuters' 22 files built here. MINKNN_DATA points at it.
  minknn.tasks.data.download fails as it does offline, and http(s)_proxy names a closed local port, so
  nothing here reaches the network. The files of their own the pages name (my/reviews.csv,
  mine.txt, ...: your_files) are written in the working folder, small, as a user's would be.
"""
import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from minknn.lab import bench
import evaluate
import minknn.assignment.edition
import minknn.lab.attack
import minknn.lab.runner
import minknn.tasks.data
import minknn.tools.export
import minknn.tools.predict
import train
from helpers import DATA, TINY, tiny_vocab
from hf_folders import write_distilbert, write_mpnet, write_roberta
from minknn.bert import BertConfig, BertModel
from minknn.tasks.data import DataError
from minknn.tools.cli import run
from minknn.tools.weights import save_safetensors
from test_readers import imdb_reviews, write_imdb
from test_runs import stop_at

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))

# not in the copy of the data RESULTS.md was measured on (data/README.md); nor, offline, a user's
MISSING = ["minbert/quora-train.csv", "minbert/quora-test-student.csv", "glue/QNLI/train.tsv",
           "agnews/ag_news_csv/train.csv", "aapd"]

NOT_RUN = {  # command prefix: why the test does not run it
    ("python", "-m", "venv"): "makes the virtual environment the tests already run in",
    ("source",): "enters the virtual environment the tests already run in",
    ("python", "-m", "pip", "install"): "installs packages; the tests run with them installed",
    ("pip", "install"): "installs packages; the tests run with them installed",
    ("export", "MINKNN_DATA=/path/to/datasets"): "a placeholder path; the test sets MINKNN_DATA to its own copy",
    ("python", "-m", "pytest"): "the test suite itself",
    ("tensorboard",): "TensorBoard's web server, which serves until stopped; tests/test_curves.py reads the "
                      "event files with TensorBoard's own reader",
}

SMALL = ["--epochs", "1", "--max_train", "16", "--max_eval", "8", "--max_len", "32", "--batch_size", "8",
         "--device", "cpu"]
BENCH = {"model": ["--steps", "1", "--batch_size", "2", "--lengths", "16"],
         "epoch": ["--examples", "16", "--batch_size", "8", "--max_len", "32"],
         "knn": ["--steps", "1", "--k", "4"],
         "multitask": ["--steps", "1"],
         "ddp": ["--examples", "16", "--batch_size", "8", "--max_len", "32"],
         "grid": ["--sizes", "16", "--seeds", "0-1",
                  "--train_flags", "--epochs 1 --max_len 32 --batch_size 8 --max_eval 8"],
         "index": ["--sizes", "1000", "--dim", "16", "--queries", "10", "--k", "4"],
         "profile": ["--steps", "1", "--batch_size", "4", "--max_len", "16"],
         "predict": ["--texts", "50", "--k", "4", "--max_len", "32"],
         "onnx": ["--texts", "40", "--max_len", "32"]}


# ------------------------------------------------------------------------ reading the pages

def bash_commands(page):
    """[(line number, words)] of the page's ```bash blocks: one entry per command."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    commands = []
    for block in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M):
        lines = block.group(1).split("\n")
        first = text.count("\n", 0, block.start(1)) + 1
        i = 0
        while i < len(lines):
            number, line = first + i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i]
            i += 1
            command = []
            for word in shlex.split(line, comments=True) + ["&&"]:
                if word != "&&":
                    command.append(word)
                elif command:
                    commands.append((number, command))
                    command = []
    return commands


# In a student edition (HANDOUT.md at its root) --solve is refused by design: it puts the solution
# back from the minknn that holds it (docs/assignment.md), which this repository's own run checks
IN_AN_EDITION = {("python", "-m", "minknn.assignment", "--solve"): "runs from the minknn that "
                 "holds the solutions; an edition refuses it (docs/assignment.md)"}


def script(words, where):
    """(the script's name, its arguments), or None for a command the test does not run."""
    edition = os.path.exists(os.path.join(ROOT, "HANDOUT.md"))
    for prefix in [*NOT_RUN, *(IN_AN_EDITION if edition else ())]:
        if tuple(words[:len(prefix)]) == prefix:
            return None
    for prefix, name in ((["python", "train.py"], "train"), (["python", "evaluate.py"], "evaluate"),
                         (["python", "-m", "minknn.lab.bench"], "bench"), (["python", "-m", "minknn.lab.runner"], "runner"),
                         (["python", "-m", "minknn.lab.attack"], "attack"),
                         (["python", "-m", "minknn.assignment"], "assignment"),
                         (["python", "-m", "minknn.tools.export"], "export"),
                         (["python", "-m", "minknn.tools.predict"], "predict"), (["torchrun"], "torchrun")):
        if words[:len(prefix)] == prefix:
            return name, words[len(prefix):]
    raise AssertionError(f"{where}: `{' '.join(words)}`: the test does not know this command; run it in "
                         f"tests/test_readme.py (script) or say in NOT_RUN why not")


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


def tiny_args(name, args, model, stopped):
    """The arguments the test runs: the page's, then the small sizes."""
    if name == "train" and "--resume" in args:
        return args + ["--device", "cpu"]
    if name == "train":
        stop = ["--epochs", "2", "--steps_per_epoch", "1"] if flag(args, "--out") in stopped else []
        return args + ["--model", model] + SMALL + stop
    if name == "attack":  # the meaning encoder TINY too
        knn = flag(args, "--attack") in ("knn", "knn-only")
        return args + ["--attack_n", "4", "--device", "cpu", "--attack_encoder", model] + \
            (["--k", "4"] if knn else [])
    if name == "evaluate":
        return args + ["--max_eval", "8", "--device", "cpu"] + (["--k", "4"] if "--knn" in args else [])
    if name == "predict":
        return args + ["--device", "cpu"] + (["--k", "4"] if "--knn" in args else [])
    if name == "export":
        return args + (["--k", "4"] if "--knn" in args else [])
    if name == "runner" and "--table" in args:
        return args
    if name == "runner":
        return args + ["--model", model, "--epochs", "1", "--max_len", "32", "--batch_size", "8",
                       "--device", "cpu", "--sizes", "16", "--seeds", "0"]
    if name == "bench":
        return args + ["--model", model, "--device", "cpu", "--rounds", "1"] + BENCH.get(args[0], [])
    if name == "torchrun":  # torchrun's own flags become one machine's 2 processes
        assert "train.py" in args, f"torchrun {' '.join(args)}: the test runs train.py under torchrun only"
        script_args = args[args.index("train.py") + 1:]
        return ["--standalone", "--nproc_per_node", "2", "train.py"] + tiny_args("train", script_args, model, ())
    return args


MAINS = {"train": train.main, "evaluate": evaluate.main, "bench": bench.main, "runner": minknn.lab.runner.main,
         "attack": minknn.lab.attack.main,
         "assignment": minknn.assignment.edition.main, "export": minknn.tools.export.main, "predict": minknn.tools.predict.main}


# ------------------------------------------------------------------------ what a user has

def write_bert(folder):
    """tests/helpers.py's tiny BERT with 128 positions (bench knn encodes at length 128)."""
    os.makedirs(folder)
    vocab = tiny_vocab()
    config = dict(TINY, vocab_size=len(vocab), max_position_embeddings=128)
    save_safetensors(BertModel(BertConfig.from_dict(config)).state_dict(),
                     os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    return folder


def user_data(root):
    """The fixture datasets as a user without the MISSING files has them, IMDB and Reuters whole."""
    shutil.copytree(DATA, root)
    for path in MISSING:
        path = os.path.join(root, path)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    write_imdb(os.path.join(root, "imdb", "aclImdb_v1.tar.gz"), imdb_reviews())
    sgml = open(os.path.join(DATA, "reuters21578", "reut2-001.sgm"), encoding="latin-1").read()
    for i in range(2, 22):  # the registry reads all 22 files; the fixture has the first two
        with open(os.path.join(root, "reuters21578", f"reut2-{i:03d}.sgm"), "w", encoding="latin-1") as f:
            f.write(re.sub(r'NEWID="1(\d{3})"', lambda m: f'NEWID="{i}{m.group(1)}"', sgml))
    return root


def your_files(folder):
    """The files of their own the pages' commands name (docs/tasks.md, docs/predict.md), as a user
    would have them, in the working folder: my/*.csv, .tsv, .jsonl and mine.txt."""
    words = ["a gripping film", "wonderful acting", "a moving story", "superb cast", "a dull film",
             "terrible acting", "a tedious story", "weak cast"]
    rows = [(t, "positive" if i < 4 else "negative") for i, t in enumerate(words)] * 6
    os.makedirs(os.path.join(folder, "my"))

    def write(name, text):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    write("my/reviews.csv", "text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    write("my/reviews-test.csv", "text,label\n" + "".join(f"{t},{y}\n" for t, y in rows[:16]))
    for name in ("my/nli-train.jsonl", "my/nli-dev.jsonl"):
        write(name, "".join(json.dumps({"premise": t, "hypothesis": words[-1 - i % 8], "label":
                                        ["entailment", "contradiction"][i % 2]}) + "\n"
                            for i, (t, _) in enumerate(rows)))
    write("my/tags.csv", "text,tags\n" + "".join(f"{t},{'cinema|acting' if 'act' in t else 'cinema'}\n"
                                                 for t, _ in rows))
    write("my/stars.tsv", "text\tlabel\n" + "".join(f"{t}\t{i % 5}\n" for i, (t, _) in enumerate(rows)))
    write("mine.txt", "a gripping film\na dull one\n")


def offline(url, path, blob=None, timeout=60):
    raise DataError(f"cannot download {url} to {path}: offline (tests/test_readme.py). Point "
                    f"--data_dir or MINKNN_DATA at a copy")


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(the tiny BERT's folder, the data root)."""
    base = tmp_path_factory.mktemp("user")
    return write_bert(str(base / "bert")), user_data(str(base / "data"))


@pytest.fixture(scope="module")
def tiny_models(user, tmp_path_factory):
    """The tiny folder that stands in for a page's --model, by the architecture its name says."""
    base = tmp_path_factory.mktemp("models")
    kinds = {"roberta": write_roberta, "distilbert": write_distilbert, "mpnet": write_mpnet}
    for kind, write in kinds.items():
        write(str(base / kind))
    return {"bert": user[0], **{kind: str(base / kind) for kind in kinds}}


def stand_in(args, models):
    """The tiny model for a command: RoBERTa's, DistilBERT's or MPNet's where its --model names
    one."""
    named = (flag(args, "--model") or "").lower()
    return next((models[kind] for kind in ("distilbert", "roberta", "mpnet") if kind in named),
                models["bert"])


# ------------------------------------------------------------------------ the tests

@pytest.mark.parametrize("page", PAGES)
def test_every_command_runs(page, user, tiny_models, tmp_path, monkeypatch, capsys):
    data = user[1]
    for name in ("train.py", "evaluate.py", "minknn"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    your_files(str(tmp_path))
    monkeypatch.setenv("MINKNN_DATA", data)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setattr(minknn.tasks.data, "download", offline)
    monkeypatch.setattr(bench, "peak_matmul_flops", lambda device: 1e11)
    monkeypatch.delattr(minknn, "plots", raising=False)  # imported by an earlier test, or not
    monkeypatch.setitem(sys.modules, "minknn.lab.plots", None)

    commands = [(n, words, script(words, f"{page}:{n}")) for n, words in bash_commands(page)]
    runs = [(n, s) for n, _, s in commands if s]
    resumed = {flag(args, "--resume") for _, (name, args) in runs if name == "train"} - {None}
    for number, words, what in commands:
        if what is None:
            continue
        name, args = what
        model = stand_in(args, tiny_models)
        argv = tiny_args(name, args, model, resumed)
        where = f"{page}:{number}: `{' '.join(words)}` (run as {name} {' '.join(argv).replace(model, 'TINY')})"
        stop = name == "train" and flag(args, "--out") in resumed
        with monkeypatch.context() as m:
            if stop:
                stop_at(m, 2, KeyboardInterrupt)  # the first step of epoch 2: one a step
            if name == "torchrun":
                status, err = run_torchrun(argv, where)
            else:
                status, err = run_main(MAINS[name], argv, where), capsys.readouterr().err
        said = [line for line in err.splitlines() if line.startswith("error") or "interrupted" in line]
        extra = optional_extra(name, args)
        if extra and importlib.util.find_spec(extra) is None:  # what a user without it gets
            assert status == 2 and said and f"needs {extra}: pip install -e '.[" in said[-1], (
                f"{where}: without {extra} installed it should stop in one line naming the pip "
                f"command; it exited with status {status}: {err.strip()[-500:]}")
            continue
        want = 130 if stop else 0
        assert status == want, (f"{where} exited with status {status}, not {want}: "
                                f"{said[-1] if said else err.strip()[-500:]}")


def optional_extra(name, args):
    """The optional package (the README's extras) a command cannot run without, or None: the
    runner's --launcher slurm needs submitit. (The runner's plots need matplotlib, but it runs
    without it; the test makes it absent for every page.)"""
    if name == "runner" and flag(args, "--launcher") == "slurm":
        return "submitit"
    return None


def run_torchrun(argv, where):
    """(exit status, stderr) of `python -m torch.distributed.run ARGV` in the working folder."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *argv], env=env,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{where} ran for more than 300 s") from None
    return done.returncode, done.stderr


def run_main(main, argv, where):
    """The exit status of main(argv) run as a script's __main__ runs it."""
    try:
        run(lambda: main(argv))
    except SystemExit as e:
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except Exception as e:  # a traceback a user would have seen
        raise AssertionError(f"{where} raised {type(e).__name__}: {e}") from e
    return 0


def test_multitask_without_quora_names_the_file_and_what_runs_instead(user, tmp_path, monkeypatch, capsys):
    """`--task multitask` alone trains minBERT's sst,quora,sts; where quora-train.csv cannot be had,
    the one line names it and the README's alternative, --tasks sst,mrpc,sts."""
    model, data = user
    monkeypatch.setattr(minknn.tasks.data, "download", offline)
    status = run_main(train.main, ["--task", "multitask", "--data_dir", data, "--out", str(tmp_path / "run"),
                                   "--model", model] + SMALL, "train.py --task multitask")
    lines = capsys.readouterr().err.strip().splitlines()
    said = [line for line in lines if not line.startswith("warning: ")]
    assert status == 2 and len(said) == 1, f"expected exit status 2 and one line, got {status}: {said}"
    assert "quora-train.csv" in said[0] and "--tasks sst,mrpc,sts" in said[0], (
        f"the line must name quora-train.csv and the --tasks sst,mrpc,sts alternative: {said[0]}")


def test_ci_runs_the_readmes_set_up_and_test_commands():
    """.ci/run installs what the README's set-up installs and runs its test command (less -q); a
    line ending in a backslash goes on to the next, as in bash."""
    readme = [" ".join(w for w in words if w != "-q") for _, words in bash_commands("README.md")]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    for line in lines:
        line = line.split("#")[0].strip()
        if line.startswith(("python -m pip", "python -m pytest")):
            ci = " ".join(w for w in shlex.split(line) if w != "-q")
            assert ci in readme, f".ci/run runs `{line}`, which the README's blocks do not say"


DOCUMENTS = PAGES + ["data/README.md"]
TOP = {"README.md", "RESULTS.md", "LICENSE", "pyproject.toml", ".ci", "minknn",
       "tests", "docs", "train.py", "evaluate.py"}


def anchors(path):
    """GitHub's anchors for a Markdown file's headings."""
    heads = re.findall(r"^#+ (.*)$", open(path, encoding="utf-8").read(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", DOCUMENTS)
def test_every_path_and_link_names_a_file_that_exists(page):
    """Each relative link ([text](path#anchor), relative to the page) and each `path` in backticks
    that starts at a top-level entry of the repository (relative to the root; data/ is the user's,
    but for data/README.md) names a file or folder that exists, and an anchor a heading of it."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    faults = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target, line = m.group(1), text.count("\n", 0, m.start()) + 1
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), file)) if file else os.path.join(ROOT, page)
        if not os.path.exists(path):
            faults.append(f"{page}:{line}: the link ({target}) names no file")
        elif anchor and anchor not in anchors(path):
            faults.append(f"{page}:{line}: the link ({target}): {file or page} has no such heading")
    for m in re.finditer(r"`([^`\s]+)`", text):
        name, line = m.group(1).rstrip(".,:;"), text.count("\n", 0, m.start()) + 1
        if name.split("/")[0] not in TOP and name != "data/README.md" or re.search(r"[<>{}]", name):
            continue
        found = glob.glob(os.path.join(ROOT, name)) if "*" in name else os.path.exists(os.path.join(ROOT, name))
        edition = os.path.exists(os.path.join(ROOT, "HANDOUT.md"))  # a student edition leaves some out
        if not found and not (edition and name in minknn.assignment.edition.NOT_COPIED):
            faults.append(f"{page}:{line}: `{name}` names no file of the repository")
    assert not faults, "\n".join(faults)


GONE = {  # a command a page once gave that no longer exists: what to write instead
    "huggingface-cli": "huggingface_hub 1.0 replaced it with `hf` (`hf download REPO --local-dir DIR`)",
}


def test_no_page_or_message_names_a_command_that_is_gone():
    """The pages (and the messages of the code) give only commands that exist: `huggingface-cli`
    is gone from huggingface_hub 1.0 on, whose CLI is `hf`."""
    files = DOCUMENTS + sorted(os.path.relpath(p, ROOT) for p in
                               glob.glob(os.path.join(ROOT, "minknn", "**", "*.py"), recursive=True)
                               + [os.path.join(ROOT, "train.py"), os.path.join(ROOT, "evaluate.py")])
    faults = [f"{f}:{n}: `{gone}`: {instead}" for f in files
              for n, line in enumerate(open(os.path.join(ROOT, f), encoding="utf-8"), 1)
              for gone, instead in GONE.items() if gone in line]
    assert not faults, "\n".join(faults)


@pytest.mark.parametrize("page", PAGES)
def test_a_resume_line_says_it_is_for_a_stopped_run(page):
    """A `--resume` line fails on a run that finished (by design): its block is not introduced as
    lines that run in order, and its comment says the line is for a stopped run (the test above
    stops the run it resumes, as that comment says)."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    faults = []
    for block in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M):
        before = text[:block.start()].rstrip().rsplit("\n\n", 1)[-1]  # the paragraph above it
        for i, line in enumerate(block.group(1).splitlines()):
            if "--resume" not in line.split("#")[0]:
                continue
            number = text.count("\n", 0, block.start(1)) + 1 + i
            if "stopped" not in line.partition("#")[2]:
                faults.append(f"{page}:{number}: a --resume line whose comment does not say it is for a stopped run")
            if re.search(r"in (this|that|the given) order", before):
                faults.append(f"{page}:{number}: a --resume line in a block said to run in order; on the "
                              f"run the block finished it fails")
    assert not faults, "\n".join(faults)


def test_no_page_names_an_issue_number():
    """The pages and RESULTS.md say what a sentence refers to, not an issue number a reader of
    the clone cannot look up ("issue 40's item 3"); another project's, "setfit issue #208", is a
    source, and has its #."""
    faults = [f"{page}:{n}: {m.group(0)!r}" for page in DOCUMENTS + ["RESULTS.md"]
              for n, line in enumerate(open(os.path.join(ROOT, page), encoding="utf-8"), 1)
              for m in re.finditer(r"\bissues? \d+", line, re.I)]
    assert not faults, "name what is meant instead of the issue:\n" + "\n".join(faults)
