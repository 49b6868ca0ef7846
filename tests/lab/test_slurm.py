"""The runner's cells as submitit jobs (minknn/lab/slurm.py, `--launcher slurm`), run here by
submitit's LocalExecutor (`--slurm_cluster local`: each job a process): the figures are the
in-process runner's; a killed runner is rerun without submitting a live job again; a failed job is
named with its log while the other cells finish; a preempted job resumes its cell; the flags reach
sbatch. The jobs import this file (PYTHONPATH) to run the test's own CellJob subclasses."""
import json
import os
import signal
import sys
import time

import pytest
import torch

submitit = pytest.importorskip("submitit")  # the slurm extra; the test extra (CI's) installs it

import train
from minknn import MinknnError
from minknn.lab import runner, slurm

from helpers import DATA

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
METHODS = "ce,ce+knn[k=2]"  # two methods, one training: a cell (task, seed) scores both


def run_grid(tiny_bert_dir, out, *extra, tasks="mr,sst2", seeds="0-1"):
    return runner.main(["--tasks", tasks, "--methods", METHODS, "--sizes", "6", "--seeds", seeds,
                        "--out", str(out), "--model", tiny_bert_dir, "--data_dir", DATA,
                        "--epochs", "2", "--lr", "3e-3", "--batch_size", "4", "--max_len", "32",
                        "--device", "cpu", *extra])


def on_slurm(tiny_bert_dir, out, *extra, **grid):
    return run_grid(tiny_bert_dir, out, "--launcher", "slurm", "--slurm_cluster", "local", *extra,
                    **grid)


def figures(out):
    """results.jsonl's lines less their times."""
    with open(os.path.join(out, "results.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in f]


@pytest.fixture(autouse=True)
def jobs_env(monkeypatch):
    """The jobs: one torch thread (as the reference runs: the same float sums), and this file
    importable, for the CellJob subclasses below. No plots (lab/test_plots.py draws them)."""
    monkeypatch.setitem(sys.modules, "minknn.lab.plots", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, ROOT, os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def reference(tiny_bert_dir, tmp_path_factory):
    """The grid run in-process, at one thread, as the jobs run."""
    out, threads = tmp_path_factory.mktemp("reference") / "g", torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_grid(tiny_bert_dir, out)
    finally:
        torch.set_num_threads(threads)
    return figures(out)


def jobs_of(out):
    with open(os.path.join(out, "slurm", "jobs.json")) as f:
        return json.load(f)["jobs"]


def local_job(out, job_id):
    return submitit.LocalJob(out / "slurm", job_id)


def wait_until(condition, what, timeout=60):
    start = time.time()
    while not condition():
        assert time.time() - start < timeout, f"waited {timeout} s for {what}"
        time.sleep(0.2)


class Gated(slurm.CellJob):
    """A seed-1 cell's job waits while <out>/gate exists (at most a minute)."""

    def __call__(self, cell, methods, ctx):
        start = time.time()
        while cell.seed == 1 and os.path.exists(os.path.join(ctx.out, "gate")):
            assert time.time() - start < 60, "the test never opened the gate"
            time.sleep(0.2)
        return super().__call__(cell, methods, ctx)


class Broken(slurm.CellJob):
    """The seed-1 cell's training raises."""

    def __call__(self, cell, methods, ctx):
        if cell.seed == 1:
            raise RuntimeError("planted failure in training")
        return super().__call__(cell, methods, ctx)


class PreemptedOnce(slurm.CellJob):
    """The first time, the job is sent submitit's preemption signal (USR2) at the first step of
    epoch 2 (epoch 1 saved last.pt); <out>/preempted marks that it was. Each train.main call's
    first flag goes to <out>/train-calls."""

    def __call__(self, cell, methods, ctx):
        marker, real_step, real_main = os.path.join(ctx.out, "preempted"), train.train_step, train.main
        steps = []

        def step(*args, **kwargs):
            steps.append(1)
            if len(steps) == 3:  # 6 examples, batch 4: two steps an epoch
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGUSR2)
            return real_step(*args, **kwargs)

        def main(argv):
            with open(os.path.join(ctx.out, "train-calls"), "a") as f:
                f.write(argv[0] + "\n")
            return real_main(argv)
        if not os.path.exists(marker):
            train.train_step = step
        train.main = main
        return super().__call__(cell, methods, ctx)


def test_a_slurm_grid_gives_the_in_process_figures(reference, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "g"
    on_slurm(tiny_bert_dir, out)
    assert figures(out) == reference, \
        "runner --launcher slurm: results.jsonl differs from the in-process runner's (times aside)"
    said = capsys.readouterr().out
    assert "submitted 4 cells as jobs" in said, said
    assert said.count("] mr-6-ce-seed0: ") == 1, f"runner: a cell recorded twice?\n{said}"
    assert (out / "table.md").exists()
    assert sorted(jobs_of(out)) == sorted(line["cell"] for line in reference[::2]), \
        "slurm.save_jobs: jobs.json must hold each cell's job id"


def test_a_killed_runner_is_rerun_without_submitting_live_jobs(reference, tiny_bert_dir, tmp_path,
                                                               monkeypatch):
    """The runner is killed after its first finished cell, while the seed-1 jobs still run (held
    by a gate); one of them is then killed too. The rerun waits for the live ones and submits only
    the killed job's cell."""
    out = tmp_path / "g"
    out.mkdir()
    (out / "gate").touch()
    monkeypatch.setattr(slurm, "CellJob", Gated)
    real_write = runner.write_jsonl

    def write_then_kill(*args):
        real_write(*args)
        raise KeyboardInterrupt
    monkeypatch.setattr(runner, "write_jsonl", write_then_kill)
    with pytest.raises(SystemExit) as stop:
        on_slurm(tiny_bert_dir, out)
    assert stop.value.code == 130
    monkeypatch.setattr(runner, "write_jsonl", real_write)

    ids = jobs_of(out)
    assert len(ids) == 4, f"jobs.json must name the 4 jobs submitted: {ids}"
    live = {name: slurm.running(local_job(out, i), "local") for name, i in ids.items()}
    assert live["mr-6-ce-seed1"] and live["sst2-6-ce-seed1"], \
        f"slurm.running: the gated seed-1 jobs still run, but it says {live}"
    os.kill(int(ids["mr-6-ce-seed1"]), signal.SIGINT)  # as LocalJob.cancel(): the job ends
    wait_until(lambda: not slurm.running(local_job(out, ids["mr-6-ce-seed1"]), "local"),
               "the killed job to end")

    submitted, real_submit = [], slurm.submit
    monkeypatch.setattr(slurm, "submit", lambda executor, cells, todo, ctx: submitted.extend(
        c.name for c in todo) or real_submit(executor, cells, todo, ctx))
    (out / "gate").unlink()
    on_slurm(tiny_bert_dir, out)
    assert submitted == ["mr-6-ce-seed1"], \
        f"slurm.run_jobs: the rerun must submit only the cell whose job was killed, not {submitted}"
    assert jobs_of(out)["sst2-6-ce-seed1"] == ids["sst2-6-ce-seed1"], \
        "the live job's id must stay in jobs.json"
    assert figures(out) == reference, \
        "a killed and rerun slurm grid must give the in-process figures, each cell once"


def test_a_failed_job_is_named_with_its_log_and_the_others_finish(tiny_bert_dir, tmp_path,
                                                                 monkeypatch, capsys):
    out = tmp_path / "g"
    monkeypatch.setattr(slurm, "CellJob", Broken)
    with pytest.raises(SystemExit) as stop:
        on_slurm(tiny_bert_dir, out, tasks="mr")
    assert stop.value.code == 1, "a grid with a failed cell must end with a non-zero status"
    err = capsys.readouterr().err
    log = out / "slurm" / f"{jobs_of(out)['mr-6-ce-seed1']}_0_log.err"
    said = f"mr-6-ce-seed1: RuntimeError: planted failure in training; log {log}"
    assert f"failed: {said}" in err.splitlines(), f"the failure, named when it comes: {err}"
    assert err.splitlines()[-1] == (f"error: 1 of 2 cells failed (run the same command again to "
                                    f"retry them): {said}"), err
    assert "planted failure in training" in log.read_text(), f"{log} must hold the traceback"
    assert [line["cell"] for line in figures(out)] == ["mr-6-ce-seed0"] * 2, \
        "the other cell must finish and be recorded, once per method"


def test_a_preempted_job_is_requeued_and_resumes_its_cell(reference, tiny_bert_dir, tmp_path,
                                                          monkeypatch, capsys):
    out = tmp_path / "g"
    monkeypatch.setattr(slurm, "CellJob", PreemptedOnce)
    try:
        on_slurm(tiny_bert_dir, out, tasks="mr", seeds="0")
    except SystemExit:
        said = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("warning")]
        pytest.fail(f"the preempted job failed: {said}")
    assert (out / "preempted").exists(), "the job was never preempted: the test checks nothing"
    log = (out / "slurm" / f"{jobs_of(out)['mr-6-ce-seed0']}_0_log.out").read_text()
    assert "Calling checkpoint method" in log and log.count("Starting with JobEnvironment") == 2, \
        f"submitit must call CellJob.checkpoint and run the job again:\n{log}"
    calls = (out / "train-calls").read_text().split()
    assert calls == ["--model", "--resume"], \
        f"the requeued job must resume the cell (train.py --resume), not start it over: {calls}"
    epochs = [json.loads(line)["epoch"] for line in
              (out / "runs" / "mr-6-ce-seed0" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2], f"metrics.jsonl holds epochs {epochs}: epoch 1 from the first job, 2 from the requeued one"
    assert figures(out) == reference[:2], \
        "a preempted and resumed cell must give the uninterrupted cell's figures"


def test_without_submitit_the_launcher_says_how_to_install_it(tiny_bert_dir, tmp_path,
                                                              monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit: ImportError
    with pytest.raises(MinknnError, match=r"^--launcher slurm needs submitit: pip install -e "
                                                 r"'.\[slurm\]' \(in the clone; it installs submitit 1.5.4\)$"):
        on_slurm(tiny_bert_dir, tmp_path / "g")
    assert not (tmp_path / "g").exists(), "nothing is written before the grid is checked"


def test_the_flags_reach_sbatch(tmp_path, monkeypatch):
    """On a fake SLURM (an sbatch that only prints a job id): the array's submission script
    carries the partition, time, GPUs, parallelism, a --slurm_param and the requeue signal."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("srun", ""), ("sbatch", "echo 'Submitted batch job 4242'")):
        (bin_ / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_ / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    args, flags = runner.get_args([
        "--tasks", "mr", "--seeds", "0-2", "--out", str(tmp_path / "g"), "--launcher", "slurm",
        "--slurm_partition", "dev", "--slurm_time", "90", "--gpus_per_cell", "2",
        "--slurm_max_parallel", "2", "--slurm_param", "cpus_per_task=6",
        "--slurm_param", 'slurm_additional_parameters={"qos": "high"}', "--data_dir", DATA])
    ctx, _ = runner.check_grid(args, flags, cells := runner.cells_of(
        args.task_list, args.method_list, args.size_list, args.seed_list))
    jobs = slurm.submit(slurm.make_executor(args), cells, list(cells), ctx)
    assert [job.job_id for job in jobs.values()] == ["4242_0", "4242_1", "4242_2"]
    script = (tmp_path / "g" / "slurm" / "4242_submission.sh").read_text()
    for line in ("#SBATCH --partition=dev", "#SBATCH --time=90", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --array=0-2%2", "#SBATCH --cpus-per-task=6", "#SBATCH --qos=high",
                 "#SBATCH --signal=USR2@90", "#SBATCH --job-name=minknn-g"):
        assert line in script.splitlines(), f"slurm.make_executor: no `{line}` in\n{script}"
    with pytest.raises(MinknnError, match="--slurm_param: .*'slurm_qos_level'"):
        args.slurm_params = {"slurm_qos_level": "high"}
        slurm.make_executor(args)


def test_bad_slurm_flags_stop_in_one_line(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "g"
    for flags, says in ((["--slurm_param", "cpus_per_task"], "--slurm_param cpus_per_task: give "
                                                             "key=value, e.g. cpus_per_task=8"),
                        (["--slurm_time", "0"], "--slurm_time must be at least 1, got 0"),
                        (["--gpus_per_cell", "-1"], "--gpus_per_cell must be at least 0, got -1")):
        with pytest.raises(SystemExit):
            on_slurm(tiny_bert_dir, out, *flags)
        assert says in capsys.readouterr().err, f"{flags}: the error should say `{says}`"
    assert not out.exists(), "nothing is written before the flags are checked"
    with pytest.raises(MinknnError, match=r"^--slurm_param: Unknown argument 'qos_level'"):
        on_slurm(tiny_bert_dir, out, "--slurm_param", "slurm_qos_level=high")
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun: not a SLURM cluster
    with pytest.raises(MinknnError, match=r'^--launcher slurm: Could not detect "srun".* '
                                                 r"\(--slurm_cluster local runs the jobs"):
        run_grid(tiny_bert_dir, out, "--launcher", "slurm")
    assert not (out / "runs").exists(), "no cell may start when the jobs cannot be submitted"
