"""The lab's three commands run from any folder (minknn/lab/__init__.py): they import train.py and
evaluate.py, which sit beside the package in the clone, not in it. Each command runs as a new user
would, from an empty folder with only the package on the path; a minknn without the scripts
beside it (copied, as a wheel installs it) stops with one line."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ("minknn.lab.runner", "minknn.lab.attack", "minknn.lab.bench")


def run(module, cwd, path):
    """`python -m module --help` in `cwd` with only `path` added to Python's path (none of the
    user's PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = path
    return subprocess.run([sys.executable, "-m", module, "--help"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module", COMMANDS)
def test_a_lab_command_runs_from_another_folder(tmp_path, module):
    # the package reached through a link from elsewhere, as an installed package is: its scripts
    # are found beside the files the link points to, not in the current folder
    site = tmp_path / "site"
    site.mkdir()
    os.symlink(os.path.join(ROOT, "minknn"), site / "minknn")
    (tmp_path / "elsewhere").mkdir()
    done = run(module, tmp_path / "elsewhere", str(site))
    assert done.returncode == 0 and "usage:" in done.stdout, (
        f"python -m {module} --help from a folder outside the clone ended with status "
        f"{done.returncode}:\n{done.stderr[-1500:]}")


def test_a_minknn_without_the_scripts_beside_it_says_so_in_one_line(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(os.path.join(ROOT, "minknn"), site / "minknn",
                    ignore=shutil.ignore_patterns("__pycache__"))
    done = run("minknn.lab.runner", tmp_path, str(site))
    assert done.returncode == 1, f"status {done.returncode}: {done.stderr[-1500:]}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "train.py" in lines[0] \
        and str(site) in lines[0], f"not one line naming the folder and train.py:\n{done.stderr}"
