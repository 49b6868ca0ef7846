"""tests/conftest.py keeps the user's shell out of the suite: a session started with MINKNN_DATA
and any other MINKNN_* variable exported (bogus values here) sees none of them, and the code reads
its defaults (data_root() is ./data, not the exported folder)."""
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

PROBE = '''
import os
from minknn.data import data_root

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
