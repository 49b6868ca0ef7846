"""`torchrun --nproc_per_node 2 train.py ...` end to end: 2 gloo processes on the CPU train the run
one process trains. The rule (minknn/tools/distributed.py): --batch_size is the global batch, each rank
encodes its slice of it, and every rank computes one process's loss on the gathered batch; so the
steps, the schedule and the examples do not change with the number of processes, and with dropout
0 the weights, proxies, memory, key encoder and records of a run are one process's, to float
tolerance (the ranks pad their slices to other lengths, so not to the bit).

- each kind of run (ce, supcon, proxyanchor, knnbert's queue, multi-task PCGrad, mlcon on a
  multi-label task, a probe head trained for --steps), with a batch of 7 that 2 ranks split 4 + 3 and a last batch of 5 (3 + 2):
  the run folder against one process's, every rank's final state against rank 0's, and the
  batch sizes each rank's model encoded against its slice;
- only rank 0 writes and prints: the run folder holds a 1-process run's files, each epoch's line
  is printed once;
- --resume across world sizes: stopped under 2 processes (torchrun SIGTERMed after epoch 1, as a
  cluster stops a job) then resumed by `python train.py --resume`, and the other way round;
- one rank's failure: an error line from that rank, no half-written file, and the run resumes;
- one rank killed, rank 0 included: a rank left says how the run stopped, once (summary.json,
  the resume line), whatever reaches it first; rank_0_gone, how it knows rank 0 is gone.

The 2-process runs start `python -m torch.distributed.run --standalone` (torchrun; a free port of
its own) on a copy of train.py with a test's hooks (WRAPPER below: keep last.pt, stop, fail,
dump each rank's state), each rank on 1 thread; every one of them is killed after TIMEOUT s, its
workers with it, and none of its processes outlives its test (torchrun starts each worker in a
session of its own, out of reach of a kill of torchrun's process group: they are found by a mark
in their environment). The 1-process references run here, in-process (train.main), once per set
of flags.
"""
import contextlib
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid

import pytest
import torch
from torch.testing import assert_close

import minknn.model
import minknn.tools.distributed as distributed
import train
from minknn.tools.checkpoint import load_last
from minknn.tools.distributed import sizes
from minknn.tools.files import lock_folder, rank_0_gone
from minknn.tools.run import close_run_folder
from helpers import DATA
from tests.test_runs import keep_last, stop_at

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300  # seconds, for any one torchrun: a hung collective fails the test, never hangs it
MARK = "DDP_TEST_TORCHRUN"  # in the environment of a torchrun and of every process it starts

CASES = {"ce": ["--task", "sst"],
         "supcon": ["--task", "sst", "--loss", "supcon"],
         "proxyanchor": ["--task", "sst", "--loss", "proxyanchor"],  # the proxies: "loss"
         "knnbert": ["--task", "sst", "--loss", "knnbert"],  # the queue, the key encoder
         "multitask pcgrad": ["--task", "multitask", "--tasks", "sst,mrpc,sts", "--pcgrad"],
         "mlcon": ["--task", "goemotions", "--loss", "mlcon"],  # multi-label: multi-hot targets
         # the head fit on every rank before DDP copies rank 0's (minknn/tools/trainer.py fit_probes);
         # 2 epochs of 5 steps, not of a pass's 6
         "probe head, --steps": ["--task", "sst", "--head_init", "probe", "--steps", "10"],
         # 29 examples: each pass ends in a batch of 1, which leaves rank 1 no rows (it encodes a
         # stand-in example that its outputs and keys then drop)
         "knnbert, a batch of 1": ["--task", "sst", "--loss", "knnbert", "--max_train", "29"]}

# train.py with a test's hooks. torchrun starts it on every rank; the flags are train.py's.
WRAPPER = '''"""train.py with a test's hooks (tests/test_ddp.py writes this file); $DDP_TEST_HOOKS
is a JSON object naming them:
  keep_last    last.pt stays when a run ends (train.py removes it): the final state to compare
  term_after   N: once rank 0 saved epoch N, SIGTERM to torchrun (this process's parent), as a
               cluster stops a job; rank 0 waits in here for it to come back
  fail         [rank, step]: that rank's train_step raises a MinknnError at its step `step`
  kill         [rank, step]: that rank kills itself (SIGKILL, as kill -9) at its step `step`, and
               torchrun's SIGTERM reaches the rank left as it reads last.pt to say how the run
               stopped (when it comes is a race: here it is made to come at that worst moment)
  first        with kill, what the rank left meets first at its step `step` (without it, a race):
               "sigterm", torchrun's (it waits for it before the step), or "lost peer", its
               collective's error (a SIGTERM that comes during the step is held until it fails)
  runs         [[argv, dump], ...]: train.py's runs one after the other in one process group
               (without it: one run of this file's arguments); after each, each rank writes
               into its dump folder rank<r>.pt: its exit status, weights, proxies, memory and
               key encoder, the batch sizes its model encoded in training, each step's gradient
               norm before clipping, the files it wrote (os.replace: each of minknn's saves is a
               rename, checkpoint.atomic_save) and the `error:` lines it printed
"""
import json
import os
import signal
import sys
import time

import torch

import minknn.model
import minknn.tools.run
import train
from minknn import MinknnError
from minknn.tools import distributed
from minknn.tools.cli import run

HOOKS, RANK = json.loads(os.environ["DDP_TEST_HOOKS"]), int(os.environ.get("RANK", 0))
built, encoded, norms, written = [], [], [], []

if HOOKS.get("keep_last"):
    remove = os.remove
    os.remove = lambda path: None if str(path).endswith("last.pt") else remove(path)

if "term_after" in HOOKS:
    save = train.save

    def save_then_stop(trainer, epoch, *rest):
        save(trainer, epoch, *rest)
        if RANK == 0 and epoch == HOOKS["term_after"]:
            os.kill(os.getppid(), signal.SIGTERM)
            time.sleep(60)  # torchrun sends SIGTERM on to its workers: it stops the run in here
            raise SystemExit("rank 0: torchrun sent no SIGTERM back within 60 s")
    train.save = save_then_stop

if "fail" in HOOKS:
    step, calls = train.train_step, []

    def failing_step(*args, **kwargs):
        calls.append(1)
        if [RANK, len(calls)] == HOOKS["fail"]:
            raise MinknnError(f"planted failure on rank {RANK} at its step {len(calls)}")
        return step(*args, **kwargs)
    train.train_step = failing_step

if "kill" in HOOKS:
    step, calls = train.train_step, []

    def killing_step(*args, **kwargs):
        calls.append(1)
        killed, at = HOOKS["kill"]
        if len(calls) == at and RANK == killed:
            os.kill(os.getpid(), signal.SIGKILL)
        if len(calls) == at and HOOKS.get("first") == "sigterm":
            while True:  # until torchrun's SIGTERM raises Terminated (in here, whichever of the
                time.sleep(1)  # process's threads the signal lands on)
        if len(calls) == at and HOOKS.get("first") == "lost peer":
            came, handler = [], signal.signal(signal.SIGTERM, lambda *_: came.append(1))
            try:
                return step(*args, **kwargs)  # its collective fails: the killed rank is gone
            finally:  # the SIGTERM that came meanwhile, now, as the error goes up
                signal.signal(signal.SIGTERM, handler)
                if came:
                    signal.raise_signal(signal.SIGTERM)
        return step(*args, **kwargs)
    train.train_step = killing_step
    load_last = minknn.tools.run.load_last

    def sigterm_then_load(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return load_last(*args, **kwargs)
    minknn.tools.run.load_last = sigterm_then_load

if "runs" not in HOOKS:
    run(train.main)
    sys.exit()

build, forward, replace = train.build, minknn.model.Model.forward, os.replace
clip = torch.nn.utils.clip_grad_norm_


def build_kept(*args, **kwargs):
    built.append(build(*args, **kwargs))
    return built[-1]


def forward_counted(self, task, input_ids, *args, **kwargs):
    if self.training:  # a training step's batch (the key encoder and the fill run in eval)
        encoded.append([task, len(input_ids)])
    return forward(self, task, input_ids, *args, **kwargs)


def clip_kept(*args, **kwargs):
    norms.append(clip(*args, **kwargs).item())
    return torch.tensor(norms[-1])


def replace_kept(src, dst, *args, **kwargs):
    written.append(str(dst))
    return replace(src, dst, *args, **kwargs)


class Said:
    """sys.stderr, keeping the lines that start with `error:`."""

    def __init__(self, stream):
        self.stream, self.errors = stream, []

    def write(self, text):
        self.errors += [line for line in text.splitlines() if line.startswith("error:")]
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def dump(folder, status, errors):
    state = {"exit": status, "encoded": encoded, "norms": norms, "written": written,
             "errors": errors}
    if built:
        trainer = built[0][0]
        model = getattr(trainer.model, "module", trainer.model)  # a DDP wrapper's model
        state.update(model=model.state_dict(), loss=trainer.losses.state_dict())
        if trainer.moco:
            state["memory"] = trainer.moco.memory.state_dict()
            if trainer.moco.key_encoder:
                state["key_encoder"] = trainer.moco.key_encoder.encoder.state_dict()
    torch.save(state, os.path.join(folder, f"rank{RANK}.pt"))


# one process group for all the runs: train.main's setup joins it once, its teardown waits
group, setup, teardown = [], distributed.setup, distributed.teardown


def setup_once(device):
    if not group:
        group.extend(setup(device))
    return group


distributed.setup, distributed.teardown = setup_once, lambda: None
train.build, minknn.model.Model.forward, os.replace = build_kept, forward_counted, replace_kept
torch.nn.utils.clip_grad_norm_ = clip_kept
for argv, folder in HOOKS["runs"]:
    del built[:], encoded[:], norms[:], written[:]
    stderr = sys.stderr = Said(sys.__stderr__)
    try:
        run(lambda: train.main(argv))
        status = 0
    except SystemExit as e:
        status = e.code
    dump(folder, status, stderr.errors)
teardown()
'''


@pytest.fixture(scope="module")
def bert_dir(tiny_bert_dir, tmp_path_factory):
    """The tiny BERT without dropout (and so its heads): two runs of the same seed then differ
    only by the arithmetic of the ranks, not by their random masks."""
    folder = tmp_path_factory.mktemp("tiny-bert-no-dropout")
    shutil.copytree(tiny_bert_dir, folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def flags(bert_dir, case, *extra):
    """A run of 2 epochs of 6 steps over sst's 40 examples: batches of 7 (4 + 3 on 2 ranks), the
    last one of each pass 5 (3 + 2)."""
    return [*CASES[case], "--model", bert_dir, "--data_dir", DATA, "--device", "cpu",
            "--batch_size", "7", "--max_len", "16", "--max_eval", "8", "--epochs", "2",
            "--lr", "3e-3", *extra]


def marked(token):
    """The processes alive whose environment holds MARK=token: a torchrun, its workers and
    whatever they started, wherever their sessions are. Read from /proc (Linux; elsewhere none)."""
    pids, needle = [], f"{MARK}={token}".encode()
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{name}/environ", "rb") as f:  # a zombie's reads empty
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except (OSError, ValueError):  # not a process, another user's, or ended meanwhile
            continue
    return pids


def kill_marked(token):
    """SIGKILL to every process marked with token, again while one not yet killed is found (one
    may have been starting another)."""
    killed = set()
    while new := set(marked(token)) - killed:
        for pid in new:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        killed |= new


def torchrun(argv, tmp_path, hooks=None, script=None, timeout=TIMEOUT, processes=2):
    """`python -m torch.distributed.run --standalone --nproc_per_node PROCESSES SCRIPT ARGV`,
    SCRIPT the WRAPPER with `hooks` (default), or train.py itself: the finished process (stdout,
    stderr), killed with its workers after `timeout` s. No process of it outlives the call."""
    if script is None:
        script = tmp_path / "train_hooked.py"
        script.write_text(WRAPPER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    token = uuid.uuid4().hex
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DDP_TEST_HOOKS=json.dumps(hooks or {}),
               PYTHONPATH=os.pathsep.join([ROOT, *filter(None, [env.get("PYTHONPATH")])]),
               **{MARK: token})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(processes), str(script), *map(str, argv)]
    p = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_marked(token)  # the workers too: they hold the pipes communicate() reads to the end
        with contextlib.suppress(ProcessLookupError):  # without /proc: torchrun alone
            os.killpg(p.pid, signal.SIGKILL)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = "", "(unread: a process that outlived the kill holds its pipes)"
        pytest.fail(f"torchrun {' '.join(map(str, argv))} did not end in {timeout} s (a rank "
                    f"waiting for another at a collective?); its stderr ends:\n{err[-3000:]}")
    finally:
        kill_marked(token)  # none outlives the test, however it ended
    return subprocess.CompletedProcess(command, p.returncode, out, err)


def lines(text):
    """The lines a run printed, without tqdm's bars."""
    return [line for line in text.replace("\r", "\n").splitlines() if line.strip()
            and "%|" not in line]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """reference(argv): the folder of `python train.py ARGV` run here, once per argv, last.pt
    kept; reference.encoded[folder]: the batch sizes its model encoded in training steps, and
    reference.norms[folder] each step's gradient norm before clipping."""
    runs, encoded, norms = {}, {}, {}

    def reference(argv):
        key = json.dumps(argv)
        if key not in runs:
            out, seen, norm = tmp_path_factory.mktemp("one-process") / "run", [], []
            forward, clip = minknn.model.Model.forward, torch.nn.utils.clip_grad_norm_

            def counted(self, task, input_ids, *args, **kwargs):
                if self.training:
                    seen.append([task, len(input_ids)])
                return forward(self, task, input_ids, *args, **kwargs)

            def clip_kept(*args, **kwargs):
                norm.append(clip(*args, **kwargs).item())
                return torch.tensor(norm[-1])
            with pytest.MonkeyPatch.context() as mp:
                keep_last(mp)
                mp.setattr(minknn.model.Model, "forward", counted)
                mp.setattr(torch.nn.utils, "clip_grad_norm_", clip_kept)
                train.main([*argv, "--out", str(out)])
            runs[key], encoded[str(out)], norms[str(out)] = out, seen, norm
        return runs[key]
    reference.encoded, reference.norms = encoded, norms
    return reference


def records(folder):
    return [{k: v for k, v in json.loads(line).items() if k != "epoch_seconds"}
            for line in open(os.path.join(folder, "metrics.jsonl"))]


def assert_close_records(want, got, what, where=""):
    """metrics.jsonl's records: the same epochs, keys and figures, numbers to 1e-5."""
    if isinstance(want, dict):
        held = sorted(got) if isinstance(got, dict) else got
        assert isinstance(got, dict) and got.keys() == want.keys(), \
            f"{what}: metrics.jsonl{where} holds {held}, not {sorted(want)}"
        for k in want:
            assert_close_records(want[k], got[k], what, f"{where}[{k!r}]")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), \
            f"{what}: metrics.jsonl{where}: {len(got) if isinstance(got, list) else got} " \
            f"entries, not {len(want)}"
        for i, (a, b) in enumerate(zip(want, got)):
            assert_close_records(a, b, what, f"{where}[{i}]")
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6), \
            f"{what}: metrics.jsonl{where} is {got}, one process's {want}"
    else:
        assert got == want, f"{what}: metrics.jsonl{where} is {got!r}, one process's {want!r}"


def assert_same_tensors(want, got, what):
    """Two state dicts (name -> tensor): the same names, and the tensors to float tolerance."""
    assert got.keys() == want.keys(), f"{what}: other tensors: missing " \
        f"{sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}"
    for name, tensor in want.items():
        assert_close(got[name], tensor, msg=lambda m: f"{what} {name}: {m}")


PARTS = ("model", "loss", "memory", "key_encoder")  # weights, proxies, a memory loss's


def assert_same_run(ref, got, what, final=True):
    """Run folder `got` holds run `ref`: the best checkpoint (weights, proxies, memory), with final
    last.pt too (the state after the last step: those, the key encoder, the optimiser's moments
    and step, the schedule, the batch streams' places, the random generators), and the records."""
    for file in ["checkpoint.pt"] + ["last.pt"] * final:
        want, state = (torch.load(os.path.join(f, file), weights_only=True) for f in (ref, got))
        assert state["epoch"] == want["epoch"], f"{what}: {file} holds epoch {state['epoch']}, " \
            f"one process's {want['epoch']}"
        for part in PARTS:
            assert (part in state) == (part in want), f"{what}: {file}: {part} is " \
                f"{'missing' if part in want else 'there, and not in one process run'}"
            if part in want:
                assert_same_tensors(want[part], state[part], f"{what}: {file}: {part}")
        if file == "last.pt":
            # the same examples in the same steps, and the same schedule
            assert state["streams"] == want["streams"], f"{what}: last.pt: the batch streams " \
                f"stand elsewhere than one process's: other examples were drawn"
            assert state["rng"] == want["rng"], f"{what}: last.pt: the batch streams' random " \
                f"generator made other draws than one process's"
            assert state["scheduler"] == want["scheduler"], f"{what}: last.pt: the schedule " \
                f"is {state['scheduler']}, one process's {want['scheduler']}"
            moments = [(i, k) for i, s in want["optimizer"]["state"].items() for k in s]
            for i, k in moments:
                assert_close(state["optimizer"]["state"][i][k], want["optimizer"]["state"][i][k],
                             msg=lambda m: f"{what}: last.pt: AdamW's {k} of parameter {i}: {m}")
    assert_close_records(records(ref), records(got), what)


HOOKED = [case for case in CASES if case != "ce"]  # ce runs train.py itself


@pytest.fixture(scope="module")
def two_processes(bert_dir, tmp_path_factory):
    """One torchrun of 2 ranks training each HOOKED case in turn, in one process group (a
    torchrun costs seconds of start-up): (the finished torchrun, case -> its folder, holding
    run/ and dump/)."""
    root, runs, folders = tmp_path_factory.mktemp("two-processes"), [], {}
    for case in HOOKED:
        folders[case] = root / case.replace(" ", "-")
        (folders[case] / "dump").mkdir(parents=True)
        runs.append([[*flags(bert_dir, case), "--out", str(folders[case] / "run")],
                     str(folders[case] / "dump")])
    done = torchrun([], root, {"keep_last": True, "runs": runs}, timeout=TIMEOUT + 30 * len(runs))
    return done, folders


def printed_once(stdout, run, what):
    """Rank 0 alone prints: the lines of the run in `run` (from its first line, which names its
    folder, to the next run's), each epoch's and the last one once."""
    blocks = re.split(r"^(?=train/dev examples:)", stdout, flags=re.M)
    mine = [lines(b) for b in blocks if b.split("\n")[0].endswith(f"run folder {run}")]
    assert len(mine) == 1, f"{what}: {len(mine)} first lines name the run folder {run} (rank 0 " \
                           f"alone prints)"
    for start in ("epoch 1:", "epoch 2:", "done:"):
        said = [line for line in mine[0] if line.startswith(start)]
        assert len(said) == 1, f"{what}: {len(said)} lines start with {start!r} (rank 0 alone " \
                               f"prints): {said}"


@pytest.mark.parametrize("case", list(CASES))
def test_torchrun_trains_the_run_one_process_trains(case, bert_dir, one_process, tmp_path,
                                                    request):
    """torchrun with 2 ranks against one process, same flags: the same best checkpoint, final
    state and records (a mistake in the wiring moves the weights: a local-batch loss, a rank
    drawing its own rows, proxies or a queue not the same on every rank). Rank 0 alone writes
    and prints: the run folder holds one process's files, each epoch's line is printed once. ce
    runs `torchrun ... train.py` itself; the others run it with the hooks, which also show that
    every rank ends with rank 0's weights, proxies, memory and key encoder, that each encodes
    its slice of each batch, and that rank 1 writes no file (ce: with --tensorboard, one event
    file, rank 0's)."""
    argv = flags(bert_dir, case)
    ref = one_process(argv)
    if case == "ce":
        run = tmp_path / "run"
        done = torchrun([*argv, "--out", run, "--tensorboard"], tmp_path,
                        script=os.path.join(ROOT, "train.py"))
        assert done.returncode == 0, f"ce: torchrun exit {done.returncode}:\n{done.stderr[-3000:]}"
        files = sorted(set(os.listdir(ref)) - {"last.pt"} | {"tensorboard"})  # last.pt: removed
        assert sorted(os.listdir(run)) == files, \
            f"ce: the run folder holds {sorted(os.listdir(run))}, one process's {files}"
        events = os.listdir(run / "tensorboard")
        assert len(events) == 1, f"ce --tensorboard: {events} (rank 0 alone writes the curves)"
        printed_once(done.stdout, run, "ce")
        assert_same_run(ref, run, "ce, 2 processes", final=False)
        read = done.stderr.count("ids-sst-train.csv: read 40 examples")
        assert read == 1, f"ce: the warning about sst's training set is printed {read} times " \
                          f"(rank 0 alone prints; the others' warnings are noise)"
        return

    done, folders = request.getfixturevalue("two_processes")
    run, dump = folders[case] / "run", folders[case] / "dump"
    if not all((dump / f"rank{r}.pt").exists() for r in (0, 1)):
        pytest.fail(f"{case}: a rank never finished this run (a case that crashes stops the ones "
                    f"after it); torchrun exit {done.returncode}:\n{done.stderr[-3000:]}")
    ranks = [torch.load(dump / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0]["exit"] == ranks[1]["exit"] == 0, f"{case}: the ranks exited " \
        f"{ranks[0]['exit']} and {ranks[1]['exit']}, saying {ranks[0]['errors']} and " \
        f"{ranks[1]['errors']}"
    assert sorted(os.listdir(run)) == sorted(os.listdir(ref)), \
        f"{case}: the run folder holds {sorted(os.listdir(run))}, one process's " \
        f"{sorted(os.listdir(ref))}"
    printed_once(done.stdout, run, case)
    assert_same_run(ref, run, f"{case}, 2 processes")
    assert ranks[1]["written"] == [], f"{case}: rank 1 wrote {ranks[1]['written']} (rank 0 " \
                                      f"alone writes the run's files)"
    for part in PARTS:
        if part in ranks[0]:
            assert_same_tensors(ranks[0][part], ranks[1][part], f"{case}: rank 1's {part} (not "
                                f"rank 0's: the ranks drifted apart)")
    whole = one_process.encoded[str(ref)]
    assert len(ranks[0]["encoded"]) == len(ranks[1]["encoded"]) == len(whole), \
        f"{case}: the ranks' models encoded {len(ranks[0]['encoded'])} and " \
        f"{len(ranks[1]['encoded'])} training batches, one process {len(whole)}"
    for i, ((task, n), (t0, n0), (t1, n1)) in enumerate(zip(whole, *(r["encoded"] for r in ranks))):
        slices = [max(1, k) for k in sizes(n, 2)]  # no rows: one stand-in example, dropped
        assert t0 == t1 == task and [n0, n1] == slices, \
            f"{case}: training forward {i + 1}: one process encodes {n} rows of {task}, the " \
            f"ranks {n0} of {t0} and {n1} of {t1}, not their slices {slices} of the global batch"
    # AdamW's step hardly changes when every gradient is scaled alike (a gather that drops the
    # other ranks' share of the gradient: 1/N of it): the norms before clipping show a scale
    want = one_process.norms[str(ref)]
    for r, rank in enumerate(ranks):
        assert len(rank["norms"]) == len(want), \
            f"{case}: rank {r} took {len(rank['norms'])} steps, one process {len(want)}"
        for i, (got, norm) in enumerate(zip(rank["norms"], want)):
            assert math.isclose(got, norm, rel_tol=1e-4), \
                f"{case}: step {i + 1}: rank {r}'s gradient norm (before clipping) is {got:.6g}, " \
                f"one process's {norm:.6g}: the gradients are not the whole batch's"


def test_torchrun_trains_an_mpnet_run_as_one_process_does(tiny_mpnet_dir, one_process, tmp_path):
    """The knnbert case on a tiny MPNet (its relative bias a weight DDP must keep in step; its key
    encoder a copy of it): the same best checkpoint, final state and records as one process."""
    folder = tmp_path / "mpnet"
    shutil.copytree(tiny_mpnet_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    argv = flags(str(folder), "knnbert")
    ref = one_process(argv)
    run = tmp_path / "run"
    done = torchrun([*argv, "--out", run], tmp_path, script=os.path.join(ROOT, "train.py"))
    assert done.returncode == 0, f"mpnet: torchrun exit {done.returncode}:\n{done.stderr[-3000:]}"
    assert_same_run(ref, run, "mpnet knnbert, 2 processes", final=False)


# epochs of 4 steps: epoch 1 ends 28 rows into sst's pass of 40, so a rank that resumed without
# the streams' places (or the generator's) would draw other batches than rank 0
MID_PASS = ("--steps_per_epoch", "4")


def assert_stopped_after_epoch_1(folder, what):
    """A run stopped after epoch 1: its last.pt (epoch 1) and checkpoint.pt load, no temporary
    file is left, and summary.json says it stopped after 1 epoch."""
    assert not glob.glob(os.path.join(folder, "*.tmp")), \
        f"{what}: a half-written file is left: {glob.glob(os.path.join(folder, '*.tmp'))}"
    last = load_last(str(folder))
    assert last is not None and last["epoch"] == 1, f"{what}: last.pt holds " \
        f"{'nothing' if last is None else 'epoch ' + str(last['epoch'])}, not epoch 1"
    torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)
    assert os.path.exists(os.path.join(folder, "summary.json")), \
        f"{what}: no summary.json: no rank said how the run stopped"
    summary = json.load(open(os.path.join(folder, "summary.json")))
    assert "stopped" in summary and summary["epochs"] == 1, f"{what}: summary.json: {summary}"
    return summary


def test_stopped_under_two_processes_resumes_in_one(bert_dir, one_process, tmp_path, monkeypatch):
    """torchrun SIGTERMed once rank 0 saved epoch 1 (as a cluster stops a job): the run stops
    with "terminated" and its files whole; `python train.py --resume` then ends with the run of
    one process left alone (knnbert: the queue and key encoder saved by rank 0 go on in 1)."""
    argv = flags(bert_dir, "knnbert", *MID_PASS)
    ref, run = one_process(argv), tmp_path / "run"
    done = torchrun([*argv, "--out", run], tmp_path, {"term_after": 1})
    assert done.returncode != 0, "torchrun SIGTERMed after epoch 1 exited 0"
    summary = assert_stopped_after_epoch_1(run, "torchrun stopped after epoch 1")
    assert summary["stopped"] == "terminated", f"SIGTERM: summary.json says {summary['stopped']}"
    said = [line for line in lines(done.stderr) if line.startswith("terminated")]
    assert len(said) == 1 and said[0].endswith(f"continue with: python train.py --resume {run}"), \
        f"SIGTERM under torchrun: {said} (one line, from rank 0)"
    assert not re.search(r"\[rank\d\]: Traceback|error: ", done.stderr), \
        f"SIGTERM under torchrun: a rank printed an error or a traceback:\n{done.stderr[-3000:]}"
    keep_last(monkeypatch)
    train.main(["--resume", str(run)])
    assert_same_run(ref, run, "2 processes stopped after epoch 1, resumed in 1")


def test_stopped_in_one_process_resumes_under_two(bert_dir, one_process, tmp_path, monkeypatch):
    """A 1-process run stopped by Ctrl-C in epoch 2, resumed by `torchrun ... train.py --resume`:
    every rank restores last.pt (the weights, the optimiser, the streams, the queue and key
    encoder) and the run ends as one process left alone."""
    argv = flags(bert_dir, "knnbert", *MID_PASS)
    ref, run = one_process(argv), tmp_path / "run"
    stop_at(monkeypatch, 6, KeyboardInterrupt)  # epoch 2's step 2: epoch 1 (4 steps) is saved
    with pytest.raises(SystemExit):
        train.main([*argv, "--out", str(run)])
    monkeypatch.undo()
    assert_stopped_after_epoch_1(run, "1 process stopped in epoch 2")
    done = torchrun(["--resume", run], tmp_path, {"keep_last": True})
    assert done.returncode == 0, \
        f"torchrun --resume: exit {done.returncode}:\n{done.stderr[-3000:]}"
    assert_same_run(ref, run, "1 process stopped after epoch 1, resumed in 2")


def test_a_rank_that_fails_stops_the_run_which_resumes(bert_dir, one_process, tmp_path,
                                                       monkeypatch):
    """Rank 1's train_step raises (a MinknnError) at epoch 2's step 2: torchrun exits non-zero,
    the failure is one line `error: ...` (no traceback of it, nor of the collective the other
    rank was in), nothing is half written, last.pt holds epoch 1, summary.json says the run
    stopped, and `python train.py --resume` ends as the run left alone."""
    argv = flags(bert_dir, "ce")
    ref, run = one_process(argv), tmp_path / "run"
    done = torchrun([*argv, "--out", run], tmp_path, {"fail": [1, 8]})
    assert done.returncode != 0, "torchrun exited 0 though rank 1 failed"
    # rank 1's line may follow rank 0's progress bar on one line of the terminal
    said = re.findall(r"[^\r\n]*planted failure[^\r\n]*", done.stderr)
    assert len(said) == 1 and said[0].endswith("error: planted failure on rank 1 at its step 8"), \
        f"rank 1's failure must be one line `error: ...`, once: {said}\n{done.stderr[-3000:]}"
    assert_stopped_after_epoch_1(run, "rank 1 failed in epoch 2")
    keep_last(monkeypatch)
    train.main(["--resume", str(run)])
    assert_same_run(ref, run, "rank 1 failed in epoch 2, resumed in 1 process")
    # last: the other ranks stop with a line too, not with the traceback of a collective whose
    # peer is gone (torchrun's own report of the failure is torchrun's)
    assert not re.search(r"\[rank\d\]: Traceback", done.stderr), \
        f"rank 1's failure: a rank printed a traceback:\n{done.stderr[-3000:]}"


LOST_LINE = ("error: rank {} stopped: another rank failed or was killed (its error, or torchrun's "
             "report of it, says which); continue with: python train.py --resume {}")


@pytest.mark.parametrize("killed, first, processes",
                         [(1, None, 2), (0, None, 2), (0, "sigterm", 2), (0, "lost peer", 2),
                          (0, None, 3)],
                         ids=["rank-1-killed", "rank-0-killed", "rank-0-killed-sigterm-first",
                              "rank-0-killed-lost-peer-first", "rank-0-killed-of-3"])
def test_a_rank_killed_stops_the_run_with_its_resume_line(killed, first, processes, bert_dir,
                                                          one_process, tmp_path, monkeypatch):
    """kill -9 of one rank at epoch 2's step 2 (torchrun then SIGTERMs the other): the rank left
    says how the run stopped, once: summary.json, and one line with the resume command; its exit
    is torchrun's report of the kill. Rank 1 killed: rank 0 says it, as a lost peer ("failed: ...",
    `error: rank 0 stopped: ...`) or, when torchrun's SIGTERM reaches it before its collective's
    error, as a stop ("terminated"; it cannot tell the two apart). Rank 0 killed: rank 1 finds rank
    0 gone (its run.lock left at its path, unheld) and says it in rank 0's place, as a lost peer,
    whichever it met first: the SIGTERM (the silent case this test once failed on, on a loaded
    machine) or its collective's error. `first` makes each come first in turn; without it the
    machine decides. Of 3 ranks, the 2 left race for run.lock: one says it, the other nothing.
    Either way run.lock is gone, and the run resumes to the run left alone."""
    argv = flags(bert_dir, "ce")
    run = tmp_path / "run"
    hooks = {"kill": [killed, 8], **({"first": first} if first else {})}
    done = torchrun([*argv, "--out", run], tmp_path, hooks, processes=processes)
    assert done.returncode != 0, f"torchrun exited 0 though rank {killed} was killed"
    # a line may follow the killed rank's progress bar on one line of the terminal
    said = re.findall(r"(?:error: rank \d stopped|terminated:)[^\r\n]*", done.stderr)
    lost = [LOST_LINE.format(r, run) for r in range(processes) if r != killed]
    if killed == 1 and said == [f"terminated: the best checkpoint (epoch 1) is "
                                f"{run / 'checkpoint.pt'}; continue with: python train.py "
                                f"--resume {run}"]:
        stopped = "terminated"  # torchrun's SIGTERM reached rank 0 first
    else:
        assert len(said) == 1 and said[0] in lost, f"rank {killed} killed: a rank left must " \
            f"say it once, with the resume line: {said}\n{done.stderr[-3000:]}"
        stopped = "failed: another rank failed or was killed"
    assert not re.search(r"\[rank\d\]: Traceback|^terminated\s*$", done.stderr, re.M), \
        f"rank {killed} killed: a traceback or a bare `terminated`:\n{done.stderr[-3000:]}"
    summary = assert_stopped_after_epoch_1(run, f"rank {killed} killed in epoch 2")
    assert summary["stopped"] == stopped, f"rank {killed} killed: summary.json says " \
        f"{summary['stopped']!r} after the line {said}"
    assert not (run / "run.lock").exists(), \
        f"rank {killed} killed: run.lock is left: the rank that spoke did not let go of the run"
    if killed == 0:
        keep_last(monkeypatch)
        train.main(["--resume", str(run)])
        assert_same_run(one_process(argv), run, "rank 0 killed in epoch 2, resumed in 1 process")


def test_a_rank_takes_over_run_lock_only_from_a_rank_0_that_died(tmp_path):
    """rank_0_gone: nothing while rank 0 holds run.lock (alive: it says how the run ended), nothing
    once it has removed it (it has said it); a run.lock that a kill -9 left at its path, unheld, is
    taken, by one rank only (a second finds it held, then removed once the first has spoken)."""
    folder = str(tmp_path)
    alive = lock_folder(folder)
    assert rank_0_gone(folder) is None, "rank 0 holds run.lock: it is alive"
    close_run_folder(folder, alive, [])
    assert rank_0_gone(folder) is None, "rank 0 removed run.lock: it said how it ended"
    assert not (tmp_path / "run.lock").exists(), "rank_0_gone made a run.lock"
    code = ("import fcntl, sys; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "run.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert rank_0_gone(folder) is None, "another process holds run.lock"
    finally:
        holder.kill()  # kill -9: the OS lets go of its lock, and the file stays
        holder.communicate(timeout=30)
    taken = rank_0_gone(folder)
    assert taken is not None, "run.lock left unheld by a killed rank 0 was not taken"
    assert rank_0_gone(folder) is None, "two ranks took over run.lock"
    close_run_folder(folder, taken, [])
    assert rank_0_gone(folder) is None, "run.lock taken over, spoken for, let go: " \
                                                    "a second rank took it again"


def test_plain_python_is_one_process(monkeypatch):
    """Without torchrun (no RANK) there is no process group: rank 0 of 1, and gather is the
    identity, so `python train.py` is unchanged."""
    monkeypatch.delenv("RANK", raising=False)
    assert not distributed.launched(), "launched() without RANK"
    assert (distributed.rank(), distributed.world(), distributed.is_main()) == (0, 1, True)
    x = torch.randn(5, 3)
    assert distributed.gather(x, [5]) is x, "gather without a process group must return x itself"
    monkeypatch.setenv("RANK", "0")
    assert distributed.launched(), "launched() with RANK=0 (torchrun's rank 0)"


def test_a_quiet_rank_waits_for_rank_0_to_say_the_fault():
    """A rank other than 0 that finds the fault every rank finds exits quietly, but not before rank
    0 has said it: torchrun stops every rank once one has exited, so a quiet rank out first could
    cut rank 0 short (seen once in CI: `--lr -1` under torchrun, no error line at all). It waits
    until torchrun's SIGTERM, and ends without a word."""
    code = "from minknn.tools.cli import Parser; Parser().error('bad flag')"
    env = {**os.environ, "PYTHONPATH": ROOT, "RANK": "1"}
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=5)  # (python and minknn's imports take about a second)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGTERM and err == "", \
        f"rank 1 after SIGTERM: status {process.returncode}, stderr {err!r} (want the signal's, nothing)"


@pytest.mark.parametrize("bad, says", [
    (["--lr", "-1"], "--lr must be a finite number >= 0, got -1.0"),  # argparse's check
    (["--task", "nosuch"], "unknown --task 'nosuch'"),                # a MinknnError, before the group
    (["--model", "no-model"], "--model 'no-model' is neither"),       # one in the group, in build()
], ids=["lr", "task", "model"])
def test_a_bad_flag_is_one_line_under_torchrun(bad, says, bert_dir, tmp_path):
    """Every rank reads the same command line and files: rank 0 alone says what is wrong with
    them (not one line per process), the others exit with status 2 and nothing said (torchrun
    may SIGTERM one first), and no run folder is made."""
    run = tmp_path / "run"
    done = torchrun([*flags(bert_dir, "ce"), *bad, "--out", run], tmp_path,
                    script=os.path.join(ROOT, "train.py"))
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and len(errors) == 1 and says in errors[0], \
        f"torchrun train.py {' '.join(bad)}: exit {done.returncode}, error lines {errors} (want one)"
    assert not run.exists(), f"torchrun train.py {' '.join(bad)} made the run folder"
