"""Mutation testing: plant each mistake of tests/mutations.py in a copy of the repository and run
the part's own test command (minknn/assignment/parts.py, PARTS). A mutation is caught when that command
fails with a message naming the part (`part 2 attention: ...`) within the time limit; one that
passes is a missing test. A caught mistake is caught generically when that first failure is a
value check's, which says only that a number differs from a reference ("the loss on the 'mixed'
batch differs from the literal transcription ..."; tests/grading.py, GENERIC), not what is wrong:
the score gives the share of the caught ones whose failure says more. A part's command runs its
own test file (each loss's: tests/losses/test_<loss>.py; the training part's:
tests/test_training_step.py) or a -k selection of one (the BERT parts': tests/test_bert.py).

    python tests/mutate.py                      every mutation, 2 at a time
    python tests/mutate.py --part attention     one part's
    python tests/mutate.py --generic            list only those caught generically (and any not
                                                caught)
    python tests/mutate.py --check              only check the list (each mistake applies once,
                                                inside a solution block of its part)
    python tests/mutate.py --list FILE          another list: a Python file defining MUTATIONS
                                                (a held-out set of mistakes, kept out of the repo)
        --sha256 HEX                            ... only if FILE is still the list frozen then
        --record FILE.tsv                       ... each verdict and first line, to classify
                                                (docs/assignment.md: the held-out practice)
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grading import GENERIC  # noqa: E402
from minknn.assignment.edition import repository_files  # noqa: E402
from minknn.assignment.parts import BY_NAME, command_argv, find_blocks, label, read_lines  # noqa: E402
from mutations import MUTATIONS as LISTED  # noqa: E402

LIMIT = 10.0  # seconds: a part's test command must catch a mistake within this


def check_list(mutations, root=ROOT):
    """Problems with the list, one line each: an unknown part, a mistake that is not one
    replacement inside a solution block of its part, a duplicate."""
    problems, seen = [], set()
    for i, (part, file, old, new, what) in enumerate(mutations):
        where = f"tests/mutations.py, mutation {i + 1} ({what})"
        if part not in BY_NAME:
            problems.append(f"{where}: unknown part '{part}'")
            continue
        if file != BY_NAME[part].file:
            problems.append(f"{where}: part {part} lives in {BY_NAME[part].file}, not {file}")
            continue
        text = "".join(read_lines(os.path.join(root, file)))
        if text.count(old) != 1:
            problems.append(f"{where}: the text to replace occurs {text.count(old)} times in "
                            f"{file}; it must occur once")
            continue
        lines = text.splitlines(keepends=True)
        start = text.index(old)
        first = text.count("\n", 0, start)
        last = text.count("\n", 0, start + len(old.rstrip("\n")))  # its own last line
        inside = any(name == part and begin < first and last < end
                     for name, begin, end in find_blocks(lines, file))
        if not inside:
            problems.append(f"{where}: the text is not inside a '# BEGIN part {part}' block")
        if old == new or (part, file, old, new) in seen:
            problems.append(f"{where}: a duplicate or a no-op")
        seen.add((part, file, old, new))
    return problems


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_list(path):
    """MUTATIONS of the Python file at path (run: it is the developer's own file)."""
    scope = {}
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), scope)
    if "MUTATIONS" not in scope:
        sys.exit(f"--list {path}: defines no MUTATIONS")
    return scope["MUTATIONS"]


def copy_repository(dest):
    """The project's own files (no environment, runs or data kept beside them) into dest."""
    for f in repository_files(ROOT):
        os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))


def run_one(copy, mutation, timeout, threads=1):
    """(verdict, seconds, the output's last lines) for one mutation planted in `copy`."""
    part, file, old, new, _ = mutation
    path = os.path.join(copy, file)
    original = open(path, encoding="utf-8").read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(original.replace(old, new, 1))
    # this interpreter, not the `python` on PATH (a virtual environment's, not activated)
    command = command_argv(BY_NAME[part].test) + ["-x", "-p", "no:cacheprovider"]
    # no stale bytecode between mutants; no third-party pytest plugins (2.5 s a run, none used)
    # and one share of the cores per job, so that two mutants' torch threads do not fight
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(threads))
    env.pop("MINKNN_WRITE_REFERENCES", None)  # it would rewrite the references and pass
    start = time.perf_counter()
    try:
        r = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True,
                           timeout=timeout)
        seconds, out = time.perf_counter() - start, r.stdout + r.stderr
        if r.returncode == 0:
            verdict = "SURVIVED"
        elif r.returncode != 1:  # 2: interrupted or a collection error, 5: no tests ran
            verdict = f"ERROR (pytest exit {r.returncode})"
        elif label(part) not in out:
            verdict = f"UNNAMED (no '{label(part)}' in the failure)"
        elif seconds > LIMIT:
            verdict = f"SLOW (over {LIMIT:.0f} s)"
        else:
            verdict = "caught"
    except subprocess.TimeoutExpired as e:
        seconds, out, verdict = timeout, str(e.stdout or ""), "TIMEOUT"
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)
    tail = [line for line in out.splitlines() if label(part) in line][:1] or out.splitlines()[-3:]
    return verdict, seconds, tail


def generic(verdict, tail):
    """A caught mistake whose failure (its first line naming the part) is a value check's."""
    return verdict == "caught" and GENERIC in tail[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", help="only this part's mutations (a name from PARTS)")
    p.add_argument("--jobs", type=int, default=2, help="mutations run at once, each in its copy")
    p.add_argument("--check", action="store_true", help="only check the list")
    p.add_argument("--generic", action="store_true", help="list only the mutations caught "
                   "generically, by a value check (and any not caught)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a run is stopped")
    p.add_argument("--list", help="a Python file defining MUTATIONS, in place of "
                   "tests/mutations.py")
    p.add_argument("--sha256", help="with --list: the list's sha256 as recorded when it was "
                   "frozen; a list that has changed since is refused")
    p.add_argument("--record", help="write each mutation's verdict and first line here (a TSV "
                   "to classify, headed by the list's sha256)")
    args = p.parse_args(argv)
    digest = sha256_of(args.list) if args.list else None
    if args.sha256 and digest != args.sha256.lower():
        sys.exit(f"--list {args.list}: its sha256 is {digest}, not the {args.sha256} recorded "
                 f"when it was frozen: the list changed since")
    listed = read_list(args.list) if args.list else LISTED
    problems = check_list(listed)
    if problems:
        sys.exit("\n".join(problems))
    mutations = [m for m in listed if args.part in (None, m[0])]
    if args.part and not mutations:
        sys.exit(f"--part {args.part}: no mutations; parts: {', '.join(BY_NAME)}")
    print(f"{len(listed)} mutations over {len({m[0] for m in listed})} parts: the list is "
          f"well formed" + (f" (sha256 {digest})" if digest else ""))
    if args.check:
        return
    copies = [tempfile.mkdtemp(prefix="minknn-mutant-") for _ in range(args.jobs)]
    record = None
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    try:
        for c in copies:
            copy_repository(c)
        free = list(copies)

        def job(m):
            copy = free.pop()
            try:
                return m, run_one(copy, m, args.timeout, threads)
            finally:
                free.append(copy)

        caught = diagnosed = 0
        record = open(args.record, "w", encoding="utf-8") if args.record else None
        if record:
            record.write(f"# {args.list or 'tests/mutations.py'} sha256 {digest or '-'}\n"
                         f"# index\tpart\tverdict\tseconds\tmistake\tfirst line\n")
        with ThreadPoolExecutor(args.jobs) as pool:
            for i, (m, (verdict, seconds, tail)) in enumerate(pool.map(job, mutations), 1):
                if record:
                    line = tail[0].strip().removeprefix("E").strip() if tail else ""
                    record.write("\t".join([str(i), m[0], verdict, f"{seconds:.1f}", m[4],
                                            line.replace("\t", " ")]) + "\n")
                caught += verdict == "caught"
                diagnosed += verdict == "caught" and not generic(verdict, tail)
                if generic(verdict, tail):
                    verdict = "caught, generic"
                elif args.generic and verdict == "caught":
                    continue
                print(f"[{i}/{len(mutations)}] {verdict:8s} {seconds:5.1f} s  {label(m[0])}: "
                      f"{m[4]}")
                if not verdict.startswith("caught"):
                    print("        " + "\n        ".join(tail))
                else:
                    print(f"        {tail[0].strip()}")  # whole: it is what a student reads
    finally:
        if record:
            record.close()
        for c in copies:
            shutil.rmtree(c, ignore_errors=True)
    print(f"mutation score: {caught}/{len(mutations)} caught "
          f"({100 * caught / len(mutations):.0f}%); {diagnosed} of them "
          f"({100 * diagnosed / max(1, caught):.0f}%) say what is wrong")
    sys.exit(0 if caught == len(mutations) else 1)


if __name__ == "__main__":
    main()
