"""minknn/tools/run.py through train.py: a stopped run resumes exactly, no run is overwritten or shared,
divergence and a full disk stop a run with one line and leave the last good files in place.
(The bad flags and folders are rows of test_bad_inputs.py.)"""
import errno
import fcntl
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import minknn.tasks.data
import minknn.tools.checkpoint
import minknn.tools.files
import minknn.tools.run
import minknn.tools.trainer
import train
from minknn import MinknnError
from minknn.tools.checkpoint import LAST_ENTRIES, load_last, save_last
from minknn.tools.cli import run
from minknn.tools.files import lock_folder
from minknn.tools.run import close_run_folder, new_run_folder
from helpers import DATA, dev_falling, write_tiny_bert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flags(tiny_bert_dir, data_dir, *extra):
    return ["--task", "sst", "--model", tiny_bert_dir, "--data_dir", data_dir, "--batch_size", "8",
            "--max_len", "32", "--device", "cpu", "--epochs", "3", "--lr", "3e-3", *extra]


def stop_at(monkeypatch, step, exception):
    """Makes train.py's step number `step` (counted from 1 over the whole run) raise."""
    real, calls = train.train_step, []

    def step_or_stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise exception
        return real(*args, **kwargs)
    monkeypatch.setattr(train, "train_step", step_or_stop)


def assert_same_run(a, b, what, final=False, checkpoint=True):
    """Two run folders hold the same best checkpoint (weights, proxies, memory; checkpoint=False: a --save none
    run's, which has none) and the same records of every epoch (training losses and dev figures); with final, the
    same state after the last step too (last.pt, kept)."""
    files = ["checkpoint.pt"] * checkpoint + ["last.pt"] * final
    for file in files:
        ca, cb = (torch.load(os.path.join(f, file), weights_only=True) for f in (a, b))
        assert ca["epoch"] == cb["epoch"], f"{what}: {file}: the epoch differs"
        for part in ("model", "loss", "memory", "key_encoder"):
            for name, tensor in ca.get(part, {}).items():
                torch.testing.assert_close(cb[part][name], tensor, msg=lambda m: f"{what}: {file}: {part} {name}: {m}")

    def records(folder):
        return [{k: v for k, v in json.loads(line).items() if k != "epoch_seconds"}
                for line in open(os.path.join(folder, "metrics.jsonl"))]
    assert records(a) == records(b), f"{what}: the epochs' training losses or dev figures differ"


def keep_last(monkeypatch):
    """Leaves last.pt in place when a run finishes (train.py deletes it), to compare the final state."""
    real = os.remove
    monkeypatch.setattr(os, "remove", lambda path: None if str(path).endswith("last.pt") else real(path))


@pytest.mark.parametrize("loss", ["ce", "proxyanchor", "knnbert", "setfit", "ancsetfit"])
def test_a_run_stopped_mid_epoch_resumes_as_if_never_stopped(loss, tiny_bert_dir, data_dir, tmp_path, monkeypatch,
                                                             capsys):
    """Stopped by Ctrl-C in epoch 2 (step 5, at 3 steps an epoch), then --resume: the same weights, proxies, MoCo
    memory, SetFit pairs (AncSetFit triplets) and head, and dev figures as the same run left alone, so every state a step reads was saved and restored. Epochs
    of 3 steps end mid-pass over the 5 batches of the training set, so the batch streams' places matter too."""
    argv = flags(tiny_bert_dir, data_dir, "--loss", loss, "--steps_per_epoch", "3")
    real_step = train.train_step
    keep_last(monkeypatch)
    train.main([*argv, "--out", str(tmp_path / "alone")])
    stop_at(monkeypatch, 5, KeyboardInterrupt)
    with pytest.raises(SystemExit) as stopped:
        train.main([*argv, "--out", str(tmp_path / "stopped")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning")
           and "%|" not in line]  # not tqdm's bars (a slow machine prints more of them)
    assert stopped.value.code == 130 and len(err) == 1, f"Ctrl-C: exit {stopped.value.code}, stderr {err}"
    assert "epoch 1" in err[0] and f"python train.py --resume {tmp_path / 'stopped'}" in err[0], err[0]
    summary = json.load(open(tmp_path / "stopped" / "summary.json"))
    assert summary["stopped"] == "interrupted" and summary["epochs"] == 1, summary
    monkeypatch.setattr(train, "train_step", real_step)
    train.main(["--resume", str(tmp_path / "stopped")])
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"resuming {tmp_path / 'stopped'} from epoch 2 of 3", (
        f"a resumed run's first line says where it goes on, not what a new run says: {said[:2]}")
    assert_same_run(tmp_path / "alone", tmp_path / "stopped", f"--loss {loss} resumed after epoch 1", final=True)
    assert "stopped" not in json.load(open(tmp_path / "stopped" / "summary.json"))


class SignalsAt:
    """A file that sends this process `signum` as its byte `at` is written."""

    def __init__(self, f, at, signum):
        self.f, self.at, self.signum, self.written = f, at, signum, 0

    def write(self, data):
        if self.written <= self.at < self.written + len(data):
            os.kill(os.getpid(), self.signum)
        self.written += len(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()


def signal_in(monkeypatch, signum, where, nth):
    """Sends this process `signum`, as Ctrl-C or a cluster would, right after train.py's nth training step of the
    run (where="step"), or while the nth save of the file `where` (checkpoint.pt, last.pt, metrics.jsonl) is
    half written: at its byte 20,000 (of some 100,000), or 100 for metrics.jsonl."""
    calls = []
    if where == "step":
        real_step = train.train_step

        def step(*args, **kwargs):
            calls.append(1)
            result = real_step(*args, **kwargs)
            if len(calls) == nth:
                os.kill(os.getpid(), signum)
            return result
        monkeypatch.setattr(train, "train_step", step)
        return
    real_save = minknn.tools.files.atomic_save

    def save(obj, path, writer=torch.save):
        if os.path.basename(path) == where:
            calls.append(1)
            if len(calls) == nth:
                at = 100 if where.endswith(".jsonl") else 20000
                return real_save(obj, path, lambda o, f: writer(o, SignalsAt(f, at, signum)))
        return real_save(obj, path, writer)
    for module in (minknn.tools.checkpoint, minknn.tools.files):  # save_checkpoint's and save_last's; write_jsonl's
        monkeypatch.setattr(module, "atomic_save", save)


@pytest.fixture(scope="module")
def left_alone(tiny_bert_dir, tmp_path_factory):
    """A run of 3 epochs of 3 steps, never stopped, its last.pt kept."""
    out = tmp_path_factory.mktemp("alone") / "run"
    with pytest.MonkeyPatch.context() as mp:
        keep_last(mp)
        train.main([*flags(tiny_bert_dir, DATA, "--steps_per_epoch", "3"), "--out", str(out)])
    return out


@pytest.mark.parametrize("signum, where, nth, epochs", [
    (signal.SIGINT, "step", 5, 1),
    (signal.SIGTERM, "step", 5, 1),
    (signal.SIGINT, "checkpoint.pt", 1, 1),
    (signal.SIGTERM, "last.pt", 2, 2),
    (signal.SIGINT, "metrics.jsonl", 1, 1),
], ids=["SIGINT-in-epoch-2", "SIGTERM-in-epoch-2", "SIGINT-saving-checkpoint.pt-1", "SIGTERM-saving-last.pt-2",
        "SIGINT-saving-metrics.jsonl-1"])
def test_ctrl_c_or_sigterm_at_any_moment_then_resume_is_the_run_left_alone(signum, where, nth, epochs, left_alone,
                                                                          tiny_bert_dir, data_dir, tmp_path,
                                                                          monkeypatch, capsys):
    """SIGINT (Ctrl-C) or SIGTERM (a cluster stopping the job) in the middle of an epoch, or while one of an
    epoch's three files is half written: the epoch's files are all finished first (train.py holds the signals
    while it saves them), then the run stops with exit 130 or 143, summary.json's "stopped", and one line naming
    the best checkpoint, which is the one on disk. --resume then ends with the weights and records of the run
    left alone. The signal handlers are the ones there before (train.main runs in-process here and in the
    runner)."""
    how, status = ("terminated", 143) if signum == signal.SIGTERM else ("interrupted", 130)

    def not_train(signum, frame):  # SIGTERM's default would end pytest itself
        pytest.fail("SIGTERM reached the handler train.main found, not its own (minknn.sigterm_raises)")
    outer = signal.signal(signal.SIGTERM, not_train)
    try:
        handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        stopped = tmp_path / "stopped"
        signal_in(monkeypatch, signum, where, nth)
        with pytest.raises(SystemExit) as exit_:
            train.main([*flags(tiny_bert_dir, data_dir, "--steps_per_epoch", "3"), "--out", str(stopped)])
            pytest.fail(f"{signum.name} {where} {nth}: the run went on to its end")
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers, \
            "train.main left its own signal handlers behind"
    finally:
        signal.signal(signal.SIGTERM, outer)
    monkeypatch.undo()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning")
           and "%|" not in line]
    assert exit_.value.code == status and len(err) == 1, f"{signum.name}: exit {exit_.value.code}, stderr {err}"
    summary = json.load(open(stopped / "summary.json"))
    assert summary["stopped"] == how and summary["epochs"] == epochs, \
        f"{signum.name} {where} {nth}: summary.json says {summary.get('stopped')!r} after {summary['epochs']} " \
        f"epochs (train.py must finish an epoch's files before the signal stops it: signals_held)"
    last = torch.load(stopped / "last.pt", weights_only=True)
    best = torch.load(stopped / "checkpoint.pt", weights_only=True)["epoch"]
    assert last["epoch"] == epochs, f"{signum.name} {where} {nth}: last.pt holds epoch {last['epoch']}, not {epochs}"
    assert err[0] == f"{how}: the best checkpoint (epoch {best}) is {stopped / 'checkpoint.pt'}; continue with: " \
                     f"python train.py --resume {stopped}", f"checkpoint.pt holds epoch {best}: {err[0]}"
    assert not glob.glob(str(stopped / "*.tmp")), "a temporary file was left"
    keep_last(monkeypatch)
    train.main(["--resume", str(stopped)])
    assert_same_run(left_alone, stopped, f"{signum.name} {where} {nth}, then resumed", final=True)


def test_ctrl_c_while_the_last_epoch_saves_then_resume_finishes_the_run(left_alone, tiny_bert_dir, data_dir,
                                                                       tmp_path, monkeypatch, capsys):
    """Ctrl-C while the last epoch's last.pt is half written: the save is finished first, so last.pt covers every
    epoch and the run stops "interrupted" with its --resume line. That line must work: --resume trains nothing
    and does what the end of a run does (summary.json without "stopped", last.pt deleted, the `done:` line), not
    refuse the run as if its run.json had been edited."""
    stopped = tmp_path / "stopped"
    signal_in(monkeypatch, signal.SIGINT, "last.pt", 3)  # the third epoch's, of 3
    with pytest.raises(SystemExit) as exit_:
        train.main([*flags(tiny_bert_dir, data_dir, "--steps_per_epoch", "3"), "--out", str(stopped)])
    monkeypatch.undo()
    said = capsys.readouterr().err
    summary = json.load(open(stopped / "summary.json"))
    assert exit_.value.code == 130 and summary["stopped"] == "interrupted" and summary["epochs"] == 3, \
        f"exit {exit_.value.code}, summary.json {summary}"
    assert f"continue with: python train.py --resume {stopped}" in said, said[-2000:]
    monkeypatch.setattr(train, "train_step", lambda *a, **k: pytest.fail("--resume trained a step of a run that "
                                                                         "had done all its epochs"))
    try:
        train.main(["--resume", str(stopped)])
    except MinknnError as e:
        pytest.fail(f"--resume of a run stopped while its last epoch was saved was refused: {e}")
    summary = json.load(open(stopped / "summary.json"))
    assert "stopped" not in summary and summary["epochs"] == 3 and summary["best_epoch"], summary
    assert not (stopped / "last.pt").exists(), "a finished run keeps no last.pt"
    out = capsys.readouterr().out
    assert "done: " in out, "the finished run's last line was not printed"
    assert out.splitlines()[0] == f"resuming {stopped} after its last epoch (3): the run only finishes", \
        f"the first line says that nothing is left to train: {out.splitlines()[:2]}"
    assert_same_run(left_alone, stopped, "stopped while saving the last epoch, then resumed")


def test_ctrl_c_after_the_run_finished_leaves_its_summary(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C after the run's summary.json is written and its last.pt deleted (as its last line prints): the run is
    finished, and stays so: summary.json is not rewritten as an "interrupted" run with no epoch done (whose --resume
    would train it again from the start)."""
    real_finish = train.finish

    def finish_then_ctrl_c(*args):
        real_finish(*args)
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "finish", finish_then_ctrl_c)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        train.main([*flags(tiny_bert_dir, data_dir, "--epochs", "1"), "--out", str(out)])
    summary = json.load(open(out / "summary.json"))
    assert "stopped" not in summary and summary["epochs"] == 1, f"a finished run's summary.json became {summary}"
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("interrupted")]
    assert exit_.value.code == 130 and err == [f"interrupted after the run finished; evaluate it with: python "
                                               f"evaluate.py --checkpoint {out}"], (exit_.value.code, err)


def test_kill_9_between_the_last_epochs_last_pt_and_metrics_then_resume_finishes_whole(left_alone, tmp_path):
    """A kill -9 after the last epoch's last.pt is renamed into place, before its metrics.jsonl is: no summary.json,
    metrics.jsonl one epoch short. --resume finishes the run, and its metrics.jsonl holds every epoch again (what
    the save of that epoch would have written), as the run left alone's does."""
    killed = tmp_path / "killed"
    shutil.copytree(left_alone, killed)  # its last.pt kept: the state after the last step
    (killed / "summary.json").unlink()
    lines = (killed / "metrics.jsonl").read_text().splitlines(keepends=True)
    (killed / "metrics.jsonl").write_text("".join(lines[:-1]))
    train.main(["--resume", str(killed)])
    assert "stopped" not in json.load(open(killed / "summary.json"))
    assert_same_run(left_alone, killed, "killed before the last epoch's metrics.jsonl, then resumed")


@pytest.mark.parametrize("entry", [*LAST_ENTRIES, "random['numpy']", "memory", "memory['keys']"])
def test_a_last_pt_without_an_entry_is_refused_naming_it(entry, tmp_path):
    """Every entry --resume reads from last.pt (a memory loss's memory too) is checked on loading: a file saved
    without one (by a bug, or another version) is one line naming it, not a KeyError in the middle of resuming."""
    state = {name: {} for name in LAST_ENTRIES}
    state.update(epoch=1, records=[], rng=(3, (1, 2), None), memory_fill_seconds=None,
                 random={"python": None, "torch": torch.zeros(2, dtype=torch.uint8), "numpy": []},
                 memory={"keys": torch.zeros(4, 2)})
    save_last(str(tmp_path), **state)
    assert load_last(str(tmp_path), needs=("memory",))["epoch"] == 1, "a whole last.pt was refused"
    part, _, sub = entry.partition("['")
    (state[part] if sub else state).pop(sub[:-2] if sub else part)
    save_last(str(tmp_path), **state)
    with pytest.raises(MinknnError) as e:
        load_last(str(tmp_path), needs=("memory",))
        pytest.fail(f"a last.pt without {entry} was loaded (checkpoint.load_last must check LAST_ENTRIES and `needs`)")
    assert str(e.value).startswith(f"{tmp_path / 'last.pt'}: has no {entry}; it is not a whole run state"), \
        str(e.value)


def test_sigterm_stops_a_real_run_as_ctrl_c_does(tiny_bert_dir, data_dir, tmp_path):
    """A real SIGTERM to train.py in its own process, once epoch 1 is on disk: exit 143, "terminated" in
    summary.json and its one line, and --resume in a new process ends as the run left alone."""
    argv = flags(tiny_bert_dir, data_dir, "--epochs", "6")  # 5 epochs left after the first: time to stop it
    train.main([*argv, "--out", str(tmp_path / "alone")])
    stopped = tmp_path / "stopped"
    p = subprocess.Popen([sys.executable, "train.py", *argv, "--out", str(stopped)], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not os.path.exists(stopped / "last.pt") and p.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=120)[1]
    assert p.returncode == 143, f"SIGTERM: exit status {p.returncode}, expected 143; stderr: {err[-2000:]}"
    summary = json.load(open(stopped / "summary.json"))
    assert summary["stopped"] == "terminated" and summary["epochs"] < 6, summary
    said = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("terminated")]
    assert len(said) == 1 and said[0].endswith(f"; continue with: python train.py --resume {stopped}"), err[-2000:]
    done = subprocess.run([sys.executable, "train.py", "--resume", str(stopped)], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_run(tmp_path / "alone", stopped, "stopped by SIGTERM, then resumed")


def test_a_pretrain_run_refuses_to_resume_on_a_changed_base_model(tiny_bert_dir, data_dir, tmp_path, monkeypatch,
                                                                  capsys):
    """--option pretrain: the checkpoints name the base model's folder for the frozen BERT. If that folder's weights
    change while the run is stopped, a resumed run would go on training heads for the old BERT and save checkpoints
    naming the new one: --resume must refuse, in one line."""
    base = tmp_path / "base"
    shutil.copytree(tiny_bert_dir, base)
    argv = flags(str(base), data_dir, "--option", "pretrain", "--epochs", "2")
    stop_at(monkeypatch, 7, KeyboardInterrupt)  # in epoch 2, after epoch 1 was saved
    with pytest.raises(SystemExit):
        train.main([*argv, "--out", str(tmp_path / "run")])
    monkeypatch.undo()
    write_tiny_bert(str(base), seed=1)  # other weights, the same names and shapes
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run(lambda: train.main(["--resume", str(tmp_path / "run")]))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and "the base model" in err and "changed since the run started" in err, err


def test_save_none_keeps_the_scores_and_still_resumes(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """--save none: never a checkpoint.pt, yet last.pt while the run is unfinished, so a run stopped by Ctrl-C in
    epoch 2 (step 7, at 5 steps an epoch) resumes and ends with the records of the run left alone. Its message
    points at summary.json, not at a checkpoint."""
    argv = flags(tiny_bert_dir, data_dir, "--epochs", "2", "--save", "none")
    train.main([*argv, "--out", str(tmp_path / "alone")])
    stopped = tmp_path / "stopped"
    stop_at(monkeypatch, 7, KeyboardInterrupt)
    with pytest.raises(SystemExit):
        train.main([*argv, "--out", str(stopped)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning")
           and "%|" not in line]  # less the progress bars
    assert err == [f"interrupted: the best epoch so far (1) is in {stopped / 'summary.json'} (--save none: no "
                   f"checkpoint); continue with: python train.py --resume {stopped}"], err
    left = sorted(os.listdir(stopped))
    assert left == ["last.pt", "metrics.jsonl", "run.json", "summary.json"], f"stopped: {left}"
    monkeypatch.undo()
    train.main(["--resume", str(stopped)])
    assert_same_run(tmp_path / "alone", stopped, "--save none, resumed after epoch 1", checkpoint=False)
    for folder in (tmp_path / "alone", stopped):
        left = sorted(os.listdir(folder))
        assert left == ["metrics.jsonl", "run.json", "summary.json"], f"{folder.name}, finished: {left}"
        summary = json.load(open(folder / "summary.json"))
        assert summary["save"] == "none" and "stopped" not in summary and summary["dev"], summary


def test_save_last_keeps_the_last_epoch_even_when_an_earlier_was_better(tiny_bert_dir, data_dir, tmp_path,
                                                                         monkeypatch, capsys):
    """--save last (the runner's --select none): checkpoint.pt holds the last epoch's weights and dev scores, not
    the best epoch's, though epoch 1 scores best on dev; a run stopped in epoch 3 resumes to the same files."""
    argv = flags(tiny_bert_dir, data_dir, "--save", "last")
    keep_last(monkeypatch)
    dev_falling(monkeypatch)
    summary = train.main([*argv, "--out", str(tmp_path / "alone")])
    assert summary["best_epoch"] == 1, "the falling dev scores must make epoch 1 the best, or this checks nothing"
    ckpt = torch.load(tmp_path / "alone" / "checkpoint.pt", weights_only=True)
    final = torch.load(tmp_path / "alone" / "last.pt", weights_only=True)
    assert ckpt["epoch"] == 3, f"--save last: checkpoint.pt holds epoch {ckpt['epoch']}, not the last (3)"
    records = [json.loads(line) for line in open(tmp_path / "alone" / "metrics.jsonl")]
    assert ckpt["dev"] == records[-1]["dev"], "--save last: the checkpoint's dev scores are not its own epoch's"
    for name, tensor in final["model"].items():
        torch.testing.assert_close(ckpt["model"][name], tensor,
                                   msg=lambda m: f"--save last: checkpoint.pt's {name} is not the final weight: {m}")
    assert "holds the last epoch: --save last" in capsys.readouterr().out

    monkeypatch.undo()  # stopped in epoch 3 (step 11, at 5 steps an epoch): checkpoint.pt is epoch 2's
    keep_last(monkeypatch)
    dev_falling(monkeypatch)
    real_step = train.train_step
    stop_at(monkeypatch, 11, KeyboardInterrupt)
    stopped = tmp_path / "stopped"
    with pytest.raises(SystemExit):
        train.main([*argv, "--out", str(stopped)])
    err = capsys.readouterr().err
    assert f"the last epoch's checkpoint (epoch 2) is {stopped / 'checkpoint.pt'}" in err, err
    assert torch.load(stopped / "checkpoint.pt", weights_only=True)["epoch"] == 2
    monkeypatch.setattr(train, "train_step", real_step)
    train.main(["--resume", str(stopped)])
    assert_same_run(tmp_path / "alone", stopped, "--save last, resumed after epoch 2", final=True)


def test_a_run_stopped_before_its_first_epoch_starts_again(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    argv = flags(tiny_bert_dir, data_dir, "--epochs", "2")
    train.main([*argv, "--out", str(tmp_path / "alone")])
    stop_at(monkeypatch, 2, KeyboardInterrupt)
    with pytest.raises(SystemExit):
        train.main([*argv, "--out", str(tmp_path / "stopped")])
    assert "no epoch had finished" in capsys.readouterr().err
    monkeypatch.undo()
    train.main(["--resume", str(tmp_path / "stopped")])
    assert_same_run(tmp_path / "alone", tmp_path / "stopped", "resumed before epoch 1 ended")
    left = sorted(os.listdir(tmp_path / "stopped"))  # a finished run keeps no state to resume from
    assert left == ["checkpoint.pt", "metrics.jsonl", "run.json", "summary.json"], left


def test_kill_9_at_any_moment_loses_nothing(tiny_bert_dir, data_dir, tmp_path):
    """A real kill -9 (no handler runs), as soon as epoch 1's state is on disk, then --resume in a new process."""
    argv = flags(tiny_bert_dir, data_dir, "--epochs", "6")  # 5 epochs left after the first: time to kill it
    train.main([*argv, "--out", str(tmp_path / "alone")])
    p = subprocess.Popen([sys.executable, "train.py", *argv, "--out", str(tmp_path / "killed")], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not os.path.exists(tmp_path / "killed" / "last.pt") and p.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL, "the run finished before it could be killed: give it more epochs"
    (tmp_path / "killed" / "last.pt.x1y2z3.tmp").write_bytes(b"half a save")  # as a kill during a save leaves
    done = subprocess.run([sys.executable, "train.py", "--resume", str(tmp_path / "killed")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_run(tmp_path / "alone", tmp_path / "killed", "killed by SIGKILL, then resumed")
    assert not glob.glob(str(tmp_path / "killed" / "*.tmp")), "a kill's temporary file outlived the resume"
    assert not os.path.exists(tmp_path / "killed" / "run.lock"), "the run.lock a kill left outlived the resume"


def test_seeds_started_together_never_share_a_folder(tiny_bert_dir, data_dir, tmp_path):
    """Four runs started at once with the default --out (two of them identical): four folders, four results."""
    argv = flags(tiny_bert_dir, data_dir, "--epochs", "1")
    seeds = ["0", "1", "2", "2"]
    procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *argv, "--seed", s], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for s in seeds]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()[-2000:]
    folders = sorted(os.listdir(tmp_path / "runs"))
    assert len(folders) == 4, folders
    assert sorted(json.load(open(tmp_path / "runs" / f / "summary.json"))["seed"] for f in folders) == [0, 1, 2, 2]
    assert all(f.startswith("sst-ce-seed") for f in folders), folders


def test_a_second_writer_stops_with_one_line(tiny_bert_dir, data_dir, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    held = lock_folder(str(tmp_path / "run"))  # as a run in progress holds it
    try:
        with pytest.raises(SystemExit):
            run(lambda: train.main([*flags(tiny_bert_dir, data_dir), "--out", str(tmp_path / "run")]))
            pytest.fail("a second run trained in a folder whose run.lock another process holds (files.lock_folder)")
        err = capsys.readouterr().err.strip()
        assert err == f"error: {tmp_path / 'run'} is in use by another training process (pid {os.getpid()}); " \
                      f"wait for it to finish, or choose another --out", err
    finally:
        held.close()


def test_a_lock_on_a_removed_run_lock_does_not_count(tmp_path, monkeypatch):
    """The race close_run_folder opens by removing run.lock before it lets go: process B opens run.lock, the run
    A holding it ends (removes the file, then unlocks), a third process C creates and locks a new run.lock, and
    only then does B's flock go through, on the removed file. B must see that it locked a file no longer at the
    path and try again, to find C's lock: else B and C both train in the folder. Played in one process: B's
    flock call lets A end and C start first."""
    folder = str(tmp_path)
    a = minknn.tools.files.lock_folder(folder)
    real_flock, calls, held = fcntl.flock, [], []

    def a_ends_and_c_starts(f, how):
        calls.append(1)
        if len(calls) == 1:  # B's first flock, on the file A still holds
            close_run_folder(folder, a, [])
            assert not os.path.exists(tmp_path / "run.lock"), "close_run_folder left run.lock"
            held.append(minknn.tools.files.lock_folder(folder))  # C: a new run.lock
        return real_flock(f, how)
    monkeypatch.setattr(fcntl, "flock", a_ends_and_c_starts)
    try:
        with pytest.raises(MinknnError, match="is in use by another training process"):
            b = minknn.tools.files.lock_folder(folder)
            b.close()
            pytest.fail("B locked the run.lock A had removed while C held the new one: two writers in one "
                        "folder (files.lock_folder must compare the locked file with the one at the path)")
    finally:
        for lock in held:
            lock.close()


def test_a_lock_on_a_removed_run_lock_tries_again(tmp_path, monkeypatch):
    """As above, but no third process: B's retry creates the new run.lock and holds it, so a later run is refused."""
    folder = str(tmp_path)
    a = minknn.tools.files.lock_folder(folder)
    real_flock, calls = fcntl.flock, []

    def a_ends(f, how):
        calls.append(1)
        if len(calls) == 1:
            close_run_folder(folder, a, [])
        return real_flock(f, how)
    monkeypatch.setattr(fcntl, "flock", a_ends)
    b = minknn.tools.files.lock_folder(folder)
    try:
        lock_file = tmp_path / "run.lock"
        assert lock_file.exists() and os.fstat(b.fileno()).st_ino == os.stat(lock_file).st_ino, \
            "B's lock is on a removed run.lock, not on the file at the path (files.lock_folder must try again)"
        monkeypatch.setattr(fcntl, "flock", real_flock)
        with pytest.raises(MinknnError, match="is in use by another training process"):
            minknn.tools.files.lock_folder(folder).close()
    finally:
        b.close()


@pytest.mark.parametrize("save", ["best", "none"])
def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(save, tiny_bert_dir, data_dir, tmp_path,
                                                                     monkeypatch, capsys):
    """A NaN that appears in epoch 2 (planted in a weight before step 6): one line naming the epoch, step and loss;
    the checkpoint of epoch 1 is left as it was; nothing non-finite is saved. With --save none the line points at
    summary.json, which keeps epoch 1's scores."""
    real, calls = train.train_step, []

    def poisoned(trainer, batches):
        calls.append(1)
        if len(calls) == 6:
            with torch.no_grad():
                trainer.model.bert.embeddings.word_embeddings.weight[:] = float("nan")
        return real(trainer, batches)
    monkeypatch.setattr(train, "train_step", poisoned)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        run(lambda: train.main([*flags(tiny_bert_dir, data_dir, "--save", save), "--out", str(out)]))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and err.startswith("error: epoch 2, step 1: the sst loss became nan"), err
    summary = json.load(open(out / "summary.json"))
    assert summary["stopped"].startswith("diverged: epoch 2, step 1") and summary["best_epoch"] == 1, summary
    assert not os.path.exists(out / "run.lock"), "a diverged run left its run.lock (run.close_run_folder)"
    if save == "none":
        assert f"the best epoch so far (1) is in {out / 'summary.json'} (--save none: no checkpoint)" in err, err
        assert not os.path.exists(out / "checkpoint.pt")
        return
    assert f"the best checkpoint (epoch 1) is {out / 'checkpoint.pt'}" in err, err
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 1 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_a_huge_learning_rate_saves_nothing(tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        run(lambda: train.main([*flags(tiny_bert_dir, data_dir, "--lr", "1e30"), "--out", str(out)]))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: epoch 1, step ") and "nothing was saved; try a lower --lr" in err, err
    assert not os.path.exists(out / "checkpoint.pt") and not os.path.exists(out / "last.pt")


class NearlyFullDisk(io.FileIO):
    """A file on a disk with room for 1,000 more bytes: the write that would pass them fails with ENOSPC."""
    room = 1000

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_a_full_disk_during_a_save_is_one_line(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """The disk fills up after run.json, as epoch 1's checkpoint is written (torch.save's own writer turns such
    a failure into a RuntimeError and a second traceback, so atomic_save must not hand it the file)."""
    real, calls = os.fdopen, []

    def nearly_full_after_run_json(fd, *args, **kwargs):
        calls.append(1)
        return real(fd, *args, **kwargs) if len(calls) == 1 else NearlyFullDisk(fd, "wb")
    monkeypatch.setattr(os, "fdopen", nearly_full_after_run_json)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        run(lambda: train.main([*flags(tiny_bert_dir, data_dir), "--out", str(out)]))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and err == (f"error: {out / 'checkpoint.pt'}: cannot be written (No space left on "
                                             f"device); any earlier version of it is unchanged"), err
    assert not glob.glob(str(out / "*.tmp")), "the failed save left its temporary file"


@pytest.mark.parametrize("what, plant, says", [
    ("gradient norm", "gradient", "epoch 1, step 2: the gradient norm became inf"),
    ("weight", "weight", "epoch 1: the weight sst.metric.proxies is not finite"),
    ("dev score", "dev", "epoch 1: the dev score sst acc is not finite"),
], ids=["gradient", "weight", "dev"])
def test_each_non_finite_value_stops_the_run(what, plant, says, tiny_bert_dir, data_dir, tmp_path, monkeypatch,
                                             capsys):
    """Each check in its own place: an infinite gradient with a finite loss (before the optimiser step), an
    infinite weight the dev scores do not read (the proxies, under --lam 0.5), a dev score that is NaN."""
    real_step, real_evaluate, calls = train.train_step, train.dev_scores, []

    def step(trainer, batches):
        calls.append(1)
        if plant == "gradient" and len(calls) == 2:
            trainer.model.heads["sst"].weight.register_hook(lambda g: torch.full_like(g, float("inf")))
        result = real_step(trainer, batches)
        if plant == "weight" and len(calls) == 5:
            with torch.no_grad():
                trainer.losses["sst"].metric.proxies.fill_(float("inf"))
        return result
    monkeypatch.setattr(train, "train_step", step)
    if plant == "dev":
        monkeypatch.setattr(train, "dev_scores", lambda *a: {**real_evaluate(*a), "sst": {"acc": float("nan")}})
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        run(lambda: train.main([*flags(tiny_bert_dir, data_dir, "--loss", "proxyanchor"), "--out", str(out)]))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {says}") and "nothing was saved" in err, f"a non-finite {what}: {err}"
    assert not os.path.exists(out / "checkpoint.pt"), f"a non-finite {what} was saved"


def test_default_folders_never_collide(tmp_path):
    """Runs started in the same second with the same flags get the name, then -2, -3 (exclusive creation)."""
    default = str(tmp_path / "runs" / "sst-ce-seed0-20260101-000000")
    folders = [new_run_folder(None, default) for _ in range(3)]
    assert [f for f, _, _ in folders] == [default, default + "-2", default + "-3"]
    for folder, lock, created in reversed(folders):  # the first, which made runs/, goes last
        assert created
        close_run_folder(folder, lock, created)  # nothing started in them: they go again
    assert not os.path.exists(tmp_path / "runs"), "runs/ was made by the first run, which never started: it goes too"
    os.mkdir(tmp_path / "runs")  # a runs/ that was there before stays
    close_run_folder(*new_run_folder(None, default))
    assert os.path.isdir(tmp_path / "runs"), "a run that never started removed a runs/ it did not make"


def test_a_run_that_fails_before_its_first_step_leaves_nothing(tiny_bert_dir, data_dir, tmp_path, monkeypatch,
                                                               capsys):
    """A bad input found while loading (here --queue_size larger than the training set) must not leave a folder
    that then refuses the corrected command, nor a stray folder under runs/."""
    monkeypatch.chdir(tmp_path)
    argv = flags(tiny_bert_dir, data_dir, "--loss", "knnbert", "--epochs", "1")
    for out in (["--out", str(tmp_path / "run")], []):
        with pytest.raises(SystemExit):
            run(lambda: train.main([*argv, "--queue_size", "41", *out]))
        assert "--queue_size 41" in capsys.readouterr().err
    assert os.listdir(tmp_path) == [], f"a run that never started left {os.listdir(tmp_path)} (runs/ included)"
    train.main([*argv, "--queue_size", "40", "--out", str(tmp_path / "run")])  # the corrected command runs


def test_ctrl_c_before_the_first_step(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(minknn.tasks.data, "training_examples", interrupted)  # read_examples reads the data
    with pytest.raises(SystemExit):
        train.main([*flags(tiny_bert_dir, data_dir), "--out", str(tmp_path / "run")])
    assert capsys.readouterr().err.strip() == "interrupted before the first step; nothing was saved"
    assert not os.path.exists(tmp_path / "run")


def test_resume_refuses_other_training_examples(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """The data root is saved resolved; a run resumed on changed training files stops with one line."""
    shutil.copytree(data_dir, tmp_path / "data")
    stop_at(monkeypatch, 7, KeyboardInterrupt)
    with pytest.raises(SystemExit):
        train.main([*flags(tiny_bert_dir, str(tmp_path / "data")), "--out", str(tmp_path / "run")])
    monkeypatch.undo()
    sst = tmp_path / "data" / "minbert" / "ids-sst-train.csv"
    sst.write_text(sst.read_text().replace(" .", " !"))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run(lambda: train.main(["--resume", str(tmp_path / "run")]))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: --resume {tmp_path / 'run'}: the training examples under {tmp_path / 'data'} "
                          f"are not the ones the run started with"), err


def test_evaluate_says_a_run_is_still_training_and_scores_its_best_epoch_so_far(tiny_bert_dir, data_dir, tmp_path,
                                                                              monkeypatch, capsys):
    """evaluate.py on a run whose run.lock a live process holds (here this one, as the training process would): one
    note line saying so and which epoch it scores, then the scores as ever. A run.lock nobody holds (left by a
    kill -9) is no run in progress: no note."""
    import evaluate
    out = tmp_path / "run"
    stop_at(monkeypatch, 7, KeyboardInterrupt)  # in epoch 2 of 2: epoch 1 saved
    with pytest.raises(SystemExit):
        train.main([*flags(tiny_bert_dir, data_dir, "--epochs", "2"), "--out", str(out)])
    monkeypatch.undo()
    capsys.readouterr()
    held = lock_folder(str(out))
    try:
        result = evaluate.main(["--checkpoint", str(out)])
    finally:
        held.close()  # run.lock stays, unheld, as a kill -9 leaves it
    notes = [line for line in capsys.readouterr().out.splitlines() if "still training" in line]
    assert notes == [f"note: {out} is still training (run.lock held): scoring its best epoch so far, 1"], \
        f"evaluate.py on a run still training (its run.lock held) says so in one note line, not {notes}"
    assert "acc" in result["sst"] and result["epoch"] == 1, f"the run still training is scored all the same: {result}"
    evaluate.main(["--checkpoint", str(out)])
    assert (out / "run.lock").exists() and "still training" not in capsys.readouterr().out, \
        "a run.lock that no process holds is no run in progress"


def test_ctrl_c_in_evaluate_is_one_line(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C outside train.py's own handler (here in evaluate.py's prediction pass): `interrupted`, status 130."""
    import evaluate
    import minknn.tools.inference
    train.main([*flags(tiny_bert_dir, data_dir, "--epochs", "1"), "--out", str(tmp_path / "run")])

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(minknn.tools.inference, "predict", interrupted)  # evaluate.py's pass
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run(lambda: evaluate.main(["--checkpoint", str(tmp_path / "run")]))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning")]
    assert exit_.value.code == 130 and err == ["interrupted"], err


# --- --resume checks every file it keeps (issue 51): checkpoint.pt, the datastores, last.pt's planned epochs ---

DAMAGES = {  # what can happen to a stopped run's checkpoint.pt on disk, each a function of the file's path
    "replaced": lambda path: path.write_bytes(b"not a checkpoint, a file that took its name\n" * 100),
    "cut in half": lambda path: path.write_bytes(path.read_bytes()[:path.stat().st_size // 2]),
    "a byte flipped": lambda path: path.write_bytes(flipped(path.read_bytes(), path.stat().st_size // 2)),
}


def flipped(data, at):
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, epochs, step, *extra):
    """tmp/run: a run of `epochs` epochs of 3 steps whose dev score falls every epoch (epoch 1 the best), stopped
    by Ctrl-C at its step `step` (counted over the run), with its folder as the stop left it."""
    dev_falling(monkeypatch)
    stop_at(monkeypatch, step, KeyboardInterrupt)
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        train.main([*flags(tiny_bert_dir, data_dir, "--epochs", str(epochs), "--steps_per_epoch", "3", *extra),
                    "--out", str(out)])
    monkeypatch.undo()
    return out


def resume_refused(out, capsys, monkeypatch):
    """--resume `out`, which must stop with one line before its first step: that line."""
    monkeypatch.setattr(train, "train_step", lambda *a, **k: pytest.fail("--resume trained before it refused"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run(lambda: train.main(["--resume", str(out)]))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning")]
    assert exit_.value.code == 2 and len(err) == 1, f"exit {exit_.value.code}, stderr {err}"
    monkeypatch.undo()
    return err[0]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_is_written_again_from_last_pt_when_it_holds_that_epoch(damage, tiny_bert_dir, data_dir,
                                                                                     tmp_path, monkeypatch, capsys):
    """Stopped in epoch 2 of 2: last.pt holds epoch 1, which is the best (the dev score falls), so checkpoint.pt
    holds it too. That checkpoint.pt replaced, cut in half or with one byte flipped: --resume says so, writes it
    again from last.pt's weights, and finishes with epoch 1 as its best, evaluable. Before, it trained on, kept the
    damaged file as the best model, and deleted last.pt, the last good copy of epoch 1."""
    out = stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, 2, 4)
    last = torch.load(out / "last.pt", weights_only=True)
    assert last["epoch"] == last["best"]["epoch"] == 1, "the premise: last.pt holds the best epoch, 1"
    DAMAGES[damage](out / "checkpoint.pt")
    dev_falling(monkeypatch)
    capsys.readouterr()
    summary = train.main(["--resume", str(out)])
    said = capsys.readouterr().out
    assert summary["best_epoch"] == 1, summary
    notes = [line for line in said.splitlines() if "checkpoint.pt" in line and "last.pt" in line]
    assert len(notes) == 1 and "damaged" in notes[0] and "written again from" in notes[0], \
        f"{damage}: one line says checkpoint.pt was damaged and is written again from last.pt: {said[:1500]}"
    ckpt = minknn.tools.checkpoint.load_checkpoint(str(out))  # whole: its checksum holds
    assert ckpt["epoch"] == 1 and ckpt["dev"] == last["best"]["dev"], (ckpt["epoch"], ckpt["dev"])
    for name, tensor in last["model"].items():
        assert torch.equal(ckpt["model"][name], tensor), f"{damage}: checkpoint.pt's {name} is not epoch 1's"


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_of_an_epoch_last_pt_no_longer_holds_stops_resume_keeping_both(damage, tiny_bert_dir,
                                                                                           data_dir, tmp_path,
                                                                                           monkeypatch, capsys):
    """Stopped in epoch 3 of 3: last.pt holds epoch 2, and only checkpoint.pt held epoch 1, the best. Damaged, it
    cannot be written again: --resume stops in one line, before any step, saying what is damaged and what is kept,
    and leaves both files as they were (finishing would delete last.pt, and a finished run's best model would be
    the damaged file)."""
    out = stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, 3, 7)
    DAMAGES[damage](out / "checkpoint.pt")
    before = {name: (out / name).read_bytes() for name in ("checkpoint.pt", "last.pt")}
    err = resume_refused(out, capsys, monkeypatch)
    assert err.startswith(f"error: --resume {out}: {out / 'checkpoint.pt'}"), err
    assert "damaged" in err and "epoch 1" in err and "last.pt" in err and "epoch 2" in err, \
        f"the line names the damaged file, the best epoch it held, and what last.pt keeps: {err}"
    assert {name: (out / name).read_bytes() for name in before} == before, "a refused --resume changed a file"


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_checkpoint_damaged_while_the_run_trains_on_keeps_last_pt(damage, tiny_bert_dir, data_dir, tmp_path,
                                                                    monkeypatch, capsys):
    """A run of 2 epochs whose best is epoch 1 (the dev score falls): checkpoint.pt damaged during epoch 2, after
    --resume's checks could have seen it. Finishing would delete last.pt and leave the damaged file as the best
    model: the run stops in one line naming checkpoint.pt, and last.pt stays."""
    dev_falling(monkeypatch)
    out, real, calls = tmp_path / "run", train.train_step, []

    def damaging(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # epoch 2's first step: epoch 1's checkpoint.pt and last.pt are written
            DAMAGES[damage](out / "checkpoint.pt")
        return real(*args, **kwargs)
    monkeypatch.setattr(train, "train_step", damaging)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run(lambda: train.main([*flags(tiny_bert_dir, data_dir, "--epochs", "2", "--steps_per_epoch", "3"),
                                "--out", str(out)]))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert exit_.value.code == 2 and len(err) == 1, f"{damage}: exit {exit_.value.code}, error lines {err}"
    assert str(out / "checkpoint.pt") in err[0] and "damaged" in err[0] and "last.pt" in err[0], err[0]
    assert (out / "last.pt").exists(), f"{damage}: the finishing run deleted last.pt beside a damaged checkpoint.pt"
    assert not (out / "summary.json").exists(), "a run that kept no whole best model wrote summary.json"


def test_a_whole_checkpoint_of_another_run_is_never_overwritten(tiny_bert_dir, data_dir, tmp_path, monkeypatch,
                                                                capsys):
    """checkpoint.pt replaced by a whole checkpoint (its checksum holds) that is not this run's epoch 1: another
    run's file, which --resume must neither keep as this run's best nor overwrite. One line, both files kept."""
    out = stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, 2, 4)
    path = out / "checkpoint.pt"
    other = torch.load(path, weights_only=True)
    other.pop(minknn.tools.files.CHECKSUM)
    other.update(epoch=3, dev={**other["dev"], "overall": 0.123})
    torch.save(minknn.tools.files.sealed(other), path)
    before = path.read_bytes()
    err = resume_refused(out, capsys, monkeypatch)
    assert f"{path}" in err and "not this run's" in err and "epoch 3" in err, err
    assert path.read_bytes() == before and (out / "last.pt").exists()


def other_run(tmp_path, tiny_bert_dir, data_dir, epochs):
    """tmp/other: another run of the same task (seed 1, --save last), `epochs` epochs of 3 steps, its last.pt kept."""
    other = tmp_path / "other"
    with pytest.MonkeyPatch.context() as mp:
        keep_last(mp)
        train.main([*flags(tiny_bert_dir, data_dir, "--epochs", str(epochs), "--steps_per_epoch", "3", "--seed", "1",
                            "--save", "last"), "--out", str(other)])
    return other


def run_id(folder):
    return json.load(open(folder / "run.json"))["id"]


@pytest.mark.parametrize("epoch", [1, 2], ids=["the-kept-epoch", "the-epoch-after-last-pts"])
def test_another_runs_checkpoint_is_refused_by_the_runs_id_whatever_epoch_it_holds(epoch, tiny_bert_dir, data_dir,
                                                                                   tmp_path, monkeypatch, capsys):
    """A run of 2 epochs stopped in epoch 2 (last.pt and checkpoint.pt hold epoch 1), its checkpoint.pt replaced by
    another run's whole one. Of epoch 2, last.pt's epoch + 1, it passed as a kill between that epoch's two saves:
    the finished run's best model was the other run's, and last.pt was deleted. The id run.json gives the run and
    each checkpoint records tells them apart at any epoch: one line naming both runs, every file kept."""
    out = stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, 2, 4)
    other = other_run(tmp_path, tiny_bert_dir, data_dir, epoch)
    shutil.copy(other / "checkpoint.pt", out / "checkpoint.pt")
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == epoch, "the premise: its epoch"
    before = {name: (out / name).read_bytes() for name in ("checkpoint.pt", "last.pt", "run.json")}
    err = resume_refused(out, capsys, monkeypatch)
    assert err.startswith(f"error: --resume {out}: {out / 'checkpoint.pt'} is a whole checkpoint, but not this "
                          f"run's"), err
    assert f"saved by the run {run_id(other)}" in err and f"run.json names the run {run_id(out)}" in err, err
    assert {name: (out / name).read_bytes() for name in before} == before, "a refused --resume changed a file"


def test_another_runs_last_pt_is_named_as_the_file_that_is_not_the_runs(tiny_bert_dir, data_dir, tmp_path,
                                                                      monkeypatch, capsys):
    """last.pt replaced by another run's (its checkpoint.pt the run's own): the line names last.pt, not
    checkpoint.pt, and the two runs."""
    out = stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, 2, 4)
    other = other_run(tmp_path, tiny_bert_dir, data_dir, 1)
    shutil.copy(other / "last.pt", out / "last.pt")
    err = resume_refused(out, capsys, monkeypatch)
    assert err.startswith(f"error: --resume {out}: {out / 'last.pt'} is not this run's"), err
    assert f"saved by the run {run_id(other)}" in err and f"run.json names the run {run_id(out)}" in err, err


@pytest.mark.parametrize("key, value, trained", [("loss", "supcon", "ce"), ("lr", 0.1, 0.003), ("seed", 7, 0)])
def test_run_json_edited_since_last_pt_is_refused_naming_the_value(key, value, trained, tiny_bert_dir, data_dir,
                                                                   tmp_path, monkeypatch, capsys):
    """run.json's arguments changed by hand after the run stopped, each within its type and bounds: CE's weights
    would go on under SupCon in a run called SupCon, an lr the optimiser in last.pt ignores would be recorded as the
    run's. last.pt records run.json's arguments: one line naming the key, its value and the one trained with."""
    out = stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, 2, 4)
    saved = json.load(open(out / "run.json"))
    assert saved["args"][key] == trained, f"the premise: the run trained with {key} {trained}"
    saved["args"][key] = value
    json.dump(saved, open(out / "run.json", "w"))
    err = resume_refused(out, capsys, monkeypatch)
    assert f"run.json's {key} is {json.dumps(value)}, and the run trained with {json.dumps(trained)} (last.pt)" \
        in err and "was the file edited?" in err, err


@pytest.mark.parametrize("epochs_done", [0, 1], ids=["no-epoch-done", "one-epoch-done"])
def test_the_flag_rule_holds_at_resume(epochs_done, tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """run.json edited to loss supcon with lam 0, which the command line refuses (the term would weigh nothing):
    --resume holds run.json to the same rule, whether the run restarts (no epoch done) or goes on."""
    out = stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, 2, 2 if epochs_done == 0 else 4)
    assert (out / "last.pt").exists() == bool(epochs_done), "the premise: last.pt iff an epoch finished"
    saved = json.load(open(out / "run.json"))
    saved["args"].update(loss="supcon", lam=0.0)
    json.dump(saved, open(out / "run.json", "w"))
    err = resume_refused(out, capsys, monkeypatch)
    assert err.startswith(f"error: {out / 'run.json'}: as a command line its flags would be refused: --lam 0"), err
    assert err.endswith("(was the file edited?)"), err


def test_a_last_pt_resealed_past_its_own_plan_is_refused(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """A run of 2 epochs stopped after its last save: last.pt's epoch set to 5, its checksum made again. It was
    resumed "after its last epoch (5)", trained epoch 2 again and exited 0: the plan was compared with run.json
    only, not with the epoch last.pt says it holds."""
    out = stopped_after_last_save(tmp_path, tiny_bert_dir, data_dir, monkeypatch)
    state = torch.load(out / "last.pt", weights_only=True)
    state.pop(minknn.tools.files.CHECKSUM)
    state["epoch"] = 5
    torch.save(minknn.tools.files.sealed(state), out / "last.pt")
    err = resume_refused(out, capsys, monkeypatch)
    assert f"{out / 'last.pt'} says it holds epoch 5, with 2 epochs' records, of the 2 it planned" in err, err


def test_a_damaged_datastore_stops_resume_in_one_line(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """A stopped run evaluated with --knn keeps datastore-mean.pt beside its checkpoint; bits rotted in it are one
    line at --resume, before any step, as last.pt's and checkpoint.pt's are."""
    import evaluate
    out = stopped_in(tmp_path, tiny_bert_dir, data_dir, monkeypatch, 2, 4)
    evaluate.main(["--checkpoint", str(out), "--knn", "--k", "2", "--max_eval", "8", "--device", "cpu"])
    path = out / "datastore-mean.pt"
    saved = torch.load(path, weights_only=True)
    saved["keys"][0, 0] += 1  # the checksum saved before: bit rot on the disk
    torch.save(saved, path)
    err = resume_refused(out, capsys, monkeypatch)
    assert err.startswith(f"error: --resume {out}: {path}: its contents do not match the checksum"), err
    assert "evaluate.py --knn builds it again" in err, err


def constant_lr(monkeypatch):
    """train.py's schedule replaced by one that never reaches 0 (a student's part 5 may end anywhere)."""
    real = train.make_optimizer

    def make(*args):
        optimizer, _ = real(*args)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    monkeypatch.setattr(train, "make_optimizer", make)


def stopped_after_last_save(tmp_path, tiny_bert_dir, data_dir, monkeypatch):
    """tmp/run: a run of 2 epochs with a constant learning rate, stopped by Ctrl-C while its last epoch's last.pt
    was written (the save finished first): every epoch done, not finished."""
    constant_lr(monkeypatch)
    signal_in(monkeypatch, signal.SIGINT, "last.pt", 2)
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        train.main([*flags(tiny_bert_dir, data_dir, "--epochs", "2", "--steps_per_epoch", "3"), "--out", str(out)])
    monkeypatch.undo()
    return out


def test_last_pt_records_the_epochs_it_planned_and_resume_finishes_whatever_the_schedule(tiny_bert_dir, data_dir,
                                                                                      tmp_path, monkeypatch):
    """last.pt records the run's --epochs. A run stopped after its last save is told from run.json's epochs lowered
    by hand by that record, not by the learning rate having reached exactly 0 (which a schedule that ends elsewhere
    never does): --resume finishes it."""
    out = stopped_after_last_save(tmp_path, tiny_bert_dir, data_dir, monkeypatch)
    last = torch.load(out / "last.pt", weights_only=True)
    assert last["epoch"] == 2 and last.get("epochs") == 2, f"last.pt records epochs {last.get('epochs')}, not 2"
    assert last["optimizer"]["param_groups"][0]["lr"] > 0, "the premise: the learning rate did not end at 0"
    constant_lr(monkeypatch)
    monkeypatch.setattr(train, "train_step", lambda *a, **k: pytest.fail("--resume trained a finished run's step"))
    summary = train.main(["--resume", str(out)])
    assert "stopped" not in summary and summary["epochs"] == 2 and not (out / "last.pt").exists(), summary


@pytest.mark.parametrize("epochs, done_says", [(1, "the run trained with 2"), (3, "the run trained with 2")])
def test_epochs_edited_in_run_json_are_refused_by_last_pts_record(epochs, done_says, tiny_bert_dir, data_dir,
                                                                  tmp_path, monkeypatch, capsys):
    """run.json's epochs changed by hand after the run stopped (lowered below those done, or raised, which would
    stretch the schedule last.pt's optimiser is half-way through): one line, whatever the learning rate."""
    out = stopped_after_last_save(tmp_path, tiny_bert_dir, data_dir, monkeypatch)
    saved = json.load(open(out / "run.json"))
    saved["args"]["epochs"] = epochs
    json.dump(saved, open(out / "run.json", "w"))
    err = resume_refused(out, capsys, monkeypatch)
    assert f"run.json's epochs is {epochs}" in err and done_says in err and "was the file edited?" in err, err


@pytest.mark.parametrize("edited", [False, True])
def test_a_last_pt_from_before_the_record_still_resumes_by_its_learning_rate(edited, left_alone, tmp_path,
                                                                            monkeypatch, capsys):
    """A last.pt written before it recorded its epochs (here the run left alone's final one, its record taken out):
    the learning rate still tells a finished schedule from run.json's epochs lowered to those done."""
    out = tmp_path / "old"
    shutil.copytree(left_alone, out)
    (out / "summary.json").unlink()
    state = torch.load(out / "last.pt", weights_only=True)
    state.pop(minknn.tools.files.CHECKSUM)
    state.pop("epochs", None)
    torch.save(minknn.tools.files.sealed(state), out / "last.pt")
    if not edited:
        assert "stopped" not in train.main(["--resume", str(out)])
        return
    state["optimizer"]["param_groups"][0]["lr"] = 1e-5  # a schedule with further to go
    torch.save(minknn.tools.files.sealed(state), out / "last.pt")
    err = resume_refused(out, capsys, monkeypatch)
    assert "run.json's epochs is 3, and the run has done 3 (last.pt); was the file edited?" in err, err


# --- a killed save's temporary files, and Ctrl-C inside a progress bar (issue 51) ---

@pytest.mark.parametrize("bar", [1, 2], ids=["the-epochs-bar", "the-dev-scores-bar"])
def test_ctrl_c_while_a_progress_bar_is_built_prints_nothing_from_its_destructor(bar, tiny_bert_dir, data_dir,
                                                                                 tmp_path, monkeypatch, capsys):
    """A real SIGINT that lands inside tqdm's __init__ (after it set `disable`, before `pos`): a bar built by half
    is collected after the run's `interrupted:` line, and its __del__ raised AttributeError ('tqdm' object has no
    attribute 'pos'), which Python printed as "Exception ignored in: <function tqdm.__del__>". The bars are built
    with Ctrl-C held (minknn.progress_bar): the signal then stops the run with the bar whole."""
    import gc
    import tqdm.std
    real, built = tqdm.std.EMA, []

    def ema(*args, **kwargs):  # three a bar, all between `disable` and `pos`
        built.append(1)
        if len(built) == 3 * (bar - 1) + 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)
    monkeypatch.setattr(tqdm.std, "EMA", ema)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    try:  # not pytest.raises: its exception info would keep the interrupted frames, and the bar, alive
        train.main([*flags(tiny_bert_dir, data_dir, "--epochs", "1", "--steps_per_epoch", "2"),
                    "--out", str(tmp_path / "run")])
        code = 0
    except SystemExit as e:
        code = e.code
    gc.collect()
    assert code == 130 and len(built) >= 3 * (bar - 1) + 1, f"the premise: Ctrl-C inside the bar (exit {code})"
    assert not unraisable, f"a destructor raised after Ctrl-C: {[repr(u.exc_value) for u in unraisable]}"
    assert "Exception ignored" not in capsys.readouterr().err


def leftovers(folder):
    """A killed save's temporary files in a run folder, named as files.atomic_save names them."""
    names = ["datastore-mean.pt.k1ll3d.tmp", "checkpoint.pt.a1b2c3.tmp", "last.pt.x9y8z7.tmp"]
    for name in names:
        (folder / name).write_bytes(b"half a file")
    return names


def test_every_command_that_opens_a_run_removes_a_killed_saves_temporary_files(tiny_bert_dir, data_dir, tmp_path,
                                                                               capsys):
    """A save killed mid-write (kill -9, a power cut) leaves its temporary file. evaluate.py and the export remove
    them when they open the run, as train.py --resume does; a temporary file a live writer holds (another
    evaluate.py saving its datastore) stays."""
    import evaluate
    from minknn.tools import export
    out = tmp_path / "run"
    train.main([*flags(tiny_bert_dir, data_dir, "--epochs", "1"), "--out", str(out)])
    for command in ("evaluate", "export"):
        names = leftovers(out)
        writing = out / "datastore-mean.pt.l1v3.tmp"
        held = open(writing, "wb")
        fcntl.flock(held, fcntl.LOCK_EX)  # as atomic_save holds its temporary file while it writes
        try:
            if command == "evaluate":
                evaluate.main(["--checkpoint", str(out), "--max_eval", "8", "--device", "cpu"])
            else:
                export.main([str(out), str(tmp_path / "exported")])
        finally:
            held.close()
        left = sorted(glob.glob(str(out / "*.tmp")))
        assert left == [str(writing)], f"{command}: left {left} of {names} (and removed the live writer's: " \
                                       f"{not writing.exists()})"
        writing.unlink()


def test_a_checkpoint_outside_its_run_folder_leaves_the_other_files_beside_it(tiny_bert_dir, data_dir, tmp_path):
    """checkpoint.pt copied into a folder that is not a run's (no run.json: a downloads folder) may lie beside other
    programs' temporary files, which minknn neither made nor locks: evaluate.py leaves them."""
    import evaluate
    out, elsewhere = tmp_path / "run", tmp_path / "downloads"
    train.main([*flags(tiny_bert_dir, data_dir, "--epochs", "1"), "--out", str(out)])
    elsewhere.mkdir()
    shutil.copy(out / "checkpoint.pt", elsewhere / "checkpoint.pt")
    theirs = elsewhere / "report.docx.a1b2c3.tmp"
    theirs.write_bytes(b"another program's file")
    evaluate.main(["--checkpoint", str(elsewhere / "checkpoint.pt"), "--max_eval", "8", "--device", "cpu"])
    assert theirs.exists(), "evaluate.py removed a temporary file from a folder that is not a run's"


def test_a_save_whose_temporary_file_is_removed_before_it_is_locked_still_writes(tmp_path, monkeypatch):
    """atomic_save locks its temporary file right after creating it; a cleaner that removed the file in between
    (it was not locked yet) must not make the save fail: it writes a new one."""
    real = minknn.tools.files.tempfile.mkstemp
    calls = []
    (tmp_path / "run.json").write_text("{}")  # a run's folder, which remove_leftovers cleans

    def mkstemp_then_cleaned(*args, **kwargs):
        fd, path = real(*args, **kwargs)
        calls.append(path)
        if len(calls) == 1:
            minknn.tools.files.remove_leftovers(str(tmp_path))
        return fd, path
    monkeypatch.setattr(minknn.tools.files.tempfile, "mkstemp", mkstemp_then_cleaned)
    minknn.tools.files.write_json(str(tmp_path / "x.json"), {"a": 1})
    assert json.load(open(tmp_path / "x.json")) == {"a": 1} and len(calls) == 2
    assert not glob.glob(str(tmp_path / "*.tmp"))
