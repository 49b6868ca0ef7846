"""tests/conftest.py keeps the user's shell out of the suite: a session started with MINKNN_DATA
and any other MINKNN_* variable exported (bogus values here) sees none of them, and the code reads
its defaults (data_root() is ./data, not the exported folder). And its --kernels flag reaches the
processes the tests start."""
import os
import subprocess
import sys

import kernels

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

PROBE = '''
import os
from minknn.tasks.data import data_root

def test_the_session_sees_no_minknn_variable():
    assert sorted(n for n in os.environ if n.startswith("MINKNN_")) == ["MINKNN_WRITE_REFERENCES"]
    assert os.environ["MINKNN_WRITE_REFERENCES"] == "0", "the suite's own switch is kept"

def test_the_code_reads_its_default_data_root():
    assert data_root() == "data"  # the exported MINKNN_DATA is not a folder: it would raise
'''


def test_a_session_ignores_the_users_minknn_variables(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, ROOT]), "OMP_NUM_THREADS": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "MINKNN_DATA": str(tmp_path / "no-such-root"),
           "MINKNN_SOMETHING_LATER": "bogus", "MINKNN_WRITE_REFERENCES": "0"}
    # tests/conftest.py as a plugin of a session of the probe alone
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "conftest", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


KERNELS_PROBE = '''
import subprocess, sys, torch

SAY = ("import torch; print(torch.get_num_threads(), torch.backends.mkldnn.enabled, "
       "torch.backends.cpu.get_cpu_capability())")

def test_the_kernels_here_and_in_a_process_it_starts():
    here = f"{torch.get_num_threads()} {torch.backends.mkldnn.enabled} " \\
           f"{torch.backends.cpu.get_cpu_capability()}"
    child = subprocess.run([sys.executable, "-c", SAY], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert here == child and here.split()[:2] == ["2", "False"], (here, child)
    assert here.split()[2] != "AVX512", here
'''


def test_kernels_reach_the_session_and_the_processes_it_starts(tmp_path):
    """`pytest --kernels=two-threads,no-mkldnn,avx2` (tests/kernels.py) holds the session and a
    Python process it starts to 2 threads, oneDNN off and kernels no wider than AVX2."""
    (tmp_path / "test_probe.py").write_text(KERNELS_PROBE)
    env = {k: v for k, v in os.environ.items() if k not in kernels.AVX2 and k not in (
        "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(PYTHONPATH=os.pathsep.join([TESTS, ROOT]), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "conftest", "--rootdir", str(tmp_path), str(tmp_path),
                           "--kernels=two-threads,no-mkldnn,avx2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-3000:]
