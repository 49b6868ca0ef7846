"""The suite's check that it holds on another CPU: `python -m pytest --kernels=SETTING` runs it
with kernels that sum in another order, here and in every Python process the tests start
(train.py, torchrun, an edition's pytest). Without the flag nothing changes. conftest.py calls
apply() once per session and undo() at its end.

    one-thread    torch.set_num_threads(1); OMP_NUM_THREADS=1 and MKL_NUM_THREADS=1 for children
    two-threads   the same with 2
    no-mkldnn     torch.backends.mkldnn.enabled = False, in children through a sitecustomize.py
                  that a folder of the session's own, put first on PYTHONPATH, holds
    avx2          ATen's vectorised kernels, MKL and oneDNN held to AVX2 (ATEN_CPU_CAPABILITY,
                  MKL_ENABLE_INSTRUCTIONS, DNNL_MAX_CPU_ISA): the sums of a CPU without AVX-512

Settings combine: --kernels=one-thread,no-mkldnn. A test that starts a process with a PYTHONPATH
of its own, not added to (test_new_loss.py, test_readme.py's torchrun, test_packaged.py), loses
no-mkldnn there; every other setting is an environment variable and reaches it.
"""
import os
import shutil
import tempfile

import torch

SETTINGS = ("default", "one-thread", "two-threads", "no-mkldnn", "avx2")

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2"}

# Run by every Python process started with the folder on PYTHONPATH, before any of its code. It
# turns oneDNN off once torch is imported (not before: importing torch here would slow every
# process and load it where the code never does).
SITECUSTOMIZE = '''
import importlib.abc, importlib.util, sys

class MkldnnOff(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module._C._set_mkldnn_enabled(False)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, MkldnnOff())
'''


def parse(value):
    """The settings named by --kernels (a comma-separated list), or ValueError naming the one
    not known."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        if name not in SETTINGS:
            raise ValueError(f"--kernels: unknown setting '{name}'; choose from "
                             f"{', '.join(SETTINGS)} (comma-separated)")
    if "one-thread" in names and "two-threads" in names:
        raise ValueError("--kernels: one-thread and two-threads exclude each other")
    return [n for n in names if n != "default"]


def apply(names):
    """Sets the named kernels here and in os.environ for the processes the tests start; returns
    what undo() needs to put everything back."""
    saved = {"environ": dict(os.environ), "threads": torch.get_num_threads(),
             "mkldnn": torch.backends.mkldnn.enabled, "folder": None}
    for name, threads in (("one-thread", 1), ("two-threads", 2)):
        if name in names:
            torch.set_num_threads(threads)
            os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if "no-mkldnn" in names:
        torch.backends.mkldnn.enabled = False
        saved["folder"] = tempfile.mkdtemp(prefix="minknn-kernels-")
        with open(os.path.join(saved["folder"], "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [saved["folder"]] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if "avx2" in names:
        os.environ.update(AVX2)  # read at their first use, which has not come yet in this process
        if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "DEFAULT"):
            raise RuntimeError("--kernels avx2: ATen chose its kernels before the flag was read "
                               f"({torch.backends.cpu.get_cpu_capability()}); export "
                               "ATEN_CPU_CAPABILITY=avx2 before pytest instead")
    return saved


def undo(saved):
    """Everything apply() changed, back as it was."""
    torch.set_num_threads(saved["threads"])
    torch.backends.mkldnn.enabled = saved["mkldnn"]
    os.environ.clear()
    os.environ.update(saved["environ"])
    if saved["folder"]:
        shutil.rmtree(saved["folder"], ignore_errors=True)
