"""The runner's cells as jobs on a SLURM cluster, through submitit (facebookincubator/submitit):
`python -m minknn.lab.runner ... --launcher slurm`. submitit is an optional extra:
pip install -e '.[slurm]' (submitit 1.5.4).

The grid's unfinished cells are submitted as one array job, a task per cell, each trained and
scored by the runner's own run_cell: a cell is the same folder, files and figures as on this
machine. The runner waits, prints each cell as it finishes, and writes results.jsonl, table.md
and the plots as a local grid does.

- Out of time or preempted: SLURM signals a job before it stops it (submitit asks for USR2,
  90 s before the time limit). submitit then calls CellJob.checkpoint, which submits the same
  cell again, and requeues the job; the requeued job finds the cell's last.pt and resumes it
  (train.py --resume). A cluster that preempts with SIGTERM alone stops train.py the way Ctrl-C
  does (its epoch files whole); SLURM's own requeue, or the runner's next run, resumes the cell.
- A failed job costs its own cell: the runner names the cell and its log, the other cells go
  on, and at the end the runner exits with status 1, listing the failed cells. Running the same
  command again submits them again (each resumes from its last epoch).
- A killed runner loses nothing: its jobs go on without it. Their ids are kept in
  <out>/slurm/jobs.json, so the same command run again reads back the finished cells, waits
  again for the jobs still pending or running, and submits only the cells that have neither.

<out>/slurm/ holds submitit's files: each job's pickled call and result, its logs
(<job id>_0_log.out, <job id>_0_log.err) and jobs.json. It must be on storage the nodes share,
as --out must. `--slurm_cluster local` runs the same code on this machine with submitit's
LocalExecutor (each job a local process, all started at once, no cap): it is how the tests check
this file without a cluster, not a way to run a grid.
"""
import os
import pickle
import sys
import time

from minknn import MinknnError
from minknn.lab.cells import run_cell
from minknn.tools.files import read_json, write_json

POLL_S = {"slurm": 15, "local": 0.5}  # between two looks at the jobs (sacct is rate-limited too)


def import_submitit():
    try:
        import submitit
    except ImportError:
        raise MinknnError("--launcher slurm needs submitit: pip install -e '.[slurm]' (in the "
                          "clone; it installs submitit 1.5.4)") from None
    return submitit


class CellJob:
    """One cell as a submitit job: run_cell's result lines (also in the cell's cell.json).
    checkpoint() is what submitit calls when SLURM is about to stop the job (its time is up, or
    it is preempted): the same call, submitted again; the requeued job resumes the cell from its
    last finished epoch, since run_cell finds its last.pt."""

    def __call__(self, cell, methods, ctx):
        return run_cell(cell, methods, ctx)

    def checkpoint(self, cell, methods, ctx):
        from submitit.helpers import DelayedSubmission
        return DelayedSubmission(self, cell, methods, ctx)


def make_executor(args):
    """submitit's executor for the grid, its folder <out>/slurm, the flags as its parameters."""
    submitit = import_submitit()
    try:
        executor = submitit.AutoExecutor(os.path.join(args.out, "slurm"),
                                         cluster=args.slurm_cluster)
    except RuntimeError as e:  # no srun: not on a SLURM cluster's login node
        raise MinknnError(f"--launcher slurm: {e} (--slurm_cluster local runs the jobs on this "
                          f"machine, for testing)") from None
    params = dict(name=f"minknn-{os.path.basename(os.path.abspath(args.out))}",
                  timeout_min=args.slurm_time, gpus_per_node=args.gpus_per_cell,
                  slurm_partition=args.slurm_partition,
                  slurm_array_parallelism=args.slurm_max_parallel)
    params.update(args.slurm_params)  # --slurm_param key=value: any other submitit parameter
    try:
        executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    except (NameError, AssertionError, ValueError, TypeError) as e:  # submitit's own checks
        raise MinknnError(f"--slurm_param: {str(e).splitlines()[0]}") from None
    return executor


def submit(executor, cells, todo, ctx):
    """The cells as one array job: {cell: its job}."""
    jobs = executor.map_array(CellJob(), todo, [cells[c] for c in todo], [ctx] * len(todo))
    return dict(zip(todo, jobs))


def running(job, cluster):
    """Whether a job is still pending or running: not once its result file is written (its
    process may take seconds more to exit), else SLURM's word (sacct). A local job is a process
    (its controller): asked of the OS, since a runner run again holds no handle on the processes
    of the one before (Linux's /proc; an ended process not yet reaped, a zombie, has no cmdline)."""
    if cluster == "slurm" or job.paths.result_pickle.exists():
        return not job.done()
    try:
        with open(f"/proc/{job.job_id}/cmdline", "rb") as f:
            return b"submitit" in f.read()  # and not another process given the same pid since
    except OSError:
        return False


def jobs_file(out):
    return os.path.join(out, "slurm", "jobs.json")


def attach(submitit, cluster, out, todo):
    """The unfinished cells whose jobs, submitted by an earlier runner, still pend or run:
    {cell: job}. sacct's UNKNOWN (a job it no longer lists) is no longer running."""
    path = jobs_file(out)
    saved = read_json(path) if os.path.exists(path) else {}
    if saved.get("cluster") != cluster:
        return {}
    folder, job_class = os.path.dirname(path), {"slurm": submitit.SlurmJob,
                                                "local": submitit.LocalJob}[cluster]
    jobs = {c: job_class(folder, saved["jobs"][c.name]) for c in todo if c.name in saved["jobs"]}
    return {c: job for c, job in jobs.items() if running(job, cluster) and
            (cluster == "local" or job.state.upper() != "UNKNOWN")}


def save_jobs(out, cluster, jobs):
    """<out>/slurm/jobs.json: each cell's latest job id, written whole (atomic_save)."""
    path = jobs_file(out)
    saved = read_json(path) if os.path.exists(path) else {}
    known = saved.get("jobs", {}) if saved.get("cluster") == cluster else {}
    write_json(path, {"cluster": cluster,
                      "jobs": {**known, **{c.name: job.job_id for c, job in jobs.items()}}})


def why_failed(job):
    """The last line of the job's error (submitit's result file holds its traceback), or how it
    ended when it left none (killed, out of memory, cancelled)."""
    if job.paths.result_pickle.exists():
        with open(job.paths.result_pickle, "rb") as f:
            outcome, trace = pickle.load(f)
        return trace.strip().splitlines()[-1]
    return f"ended without a result ({job.state})"


def run_jobs(args, cells, todo, ctx, record):
    """The cells in `todo` as jobs: those of an earlier runner still pending or running are
    waited for, the others submitted. Each finished cell goes to record(cell, lines), as a local
    one does. Returns the failed cells' lines, '<cell>: <why>; log <path>'."""
    if not todo:
        return []
    submitit, cluster = import_submitit(), args.slurm_cluster
    executor = make_executor(args)
    jobs = attach(submitit, cluster, args.out, todo)
    if jobs:
        print(f"{len(jobs)} cells still pending or running from before: waiting for their jobs")
    new = [c for c in todo if c not in jobs]
    if new:
        submitted = submit(executor, cells, new, ctx)
        save_jobs(args.out, cluster, submitted)  # at once: a runner killed now loses no job
        jobs.update(submitted)
        print(f"submitted {len(new)} cells as jobs (the first: {submitted[new[0]].job_id}); their "
              f"logs in {os.path.join(args.out, 'slurm')}", flush=True)
    failed = []
    while jobs:
        for cell, job in list(jobs.items()):
            if running(job, cluster):
                continue
            del jobs[cell]
            try:
                lines = job.result()  # waits a while for a slow shared disk to show the file
            except Exception:  # noqa: BLE001 (submitit's FailedJobError, UncompletedJobError)
                failed.append(f"{cell.name}: {why_failed(job)}; log {job.paths.stderr}")
                print(f"failed: {failed[-1]}", file=sys.stderr, flush=True)
                continue
            record(cell, lines)
        if jobs:
            time.sleep(POLL_S[cluster])
    return failed
