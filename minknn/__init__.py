"""minknn: fine-tune a hand-written BERT with kNN classifiers and metric-learning losses.

What every file shares: the errors (MinknnError, Terminated), which process speaks under torchrun
(first_process, warn), and the signals: SIGTERM raised as Terminated (sigterm_raises), Ctrl-C and
SIGTERM held while a file or a progress bar is made whole (signals_held, progress_bar)."""
import contextlib
import os
import signal
import sys
import threading
import time

from tqdm import tqdm


class MinknnError(Exception):
    """A problem with the user's input (a file, a flag, a value). Scripts run through
    `minknn.tools.cli.run` print its message as one line and exit with status 2, not a traceback."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, what a cluster sends a job before it stops or preempts it, raised where Ctrl-C
    raises KeyboardInterrupt (a subclass of it: every handler of Ctrl-C handles it too), so a run
    stops the same way: its files whole, summary.json saying so, a line saying how to go on."""


def first_process():
    """Not under torchrun, or its rank 0 (read from RANK, so before any process group exists):
    the one process that says what every process would say alike (a warning, a bad flag)."""
    return os.environ.get("RANK", "0") == "0"


# Under torchrun: whether this rank's run has passed every check (trainer.begin sets it, for the
# rest of the process: cli.run reads it after the run's block has ended); see says_errors
_RUN_BEGUN = [False]


def run_begun():
    _RUN_BEGUN[0] = True


def says_errors():
    """Whether this process prints an error: not under torchrun, its rank 0, or another rank once
    its run has begun. Before that every rank reads the same flags and files and finds the same
    fault, which rank 0 says once; after it, an error of a rank's is its own, which it alone says
    (the other ranks only lose a peer: minknn/tools/run.py)."""
    return first_process() or _RUN_BEGUN[0]


def exit_as_rank_0_says():
    """Exit with status 2 after a fault that rank 0 says for every rank (says_errors is False
    here). Under torchrun a rank other than 0 first waits for rank 0 to say it: torchrun stops
    every rank as soon as one has exited, and a quiet rank out first would cut rank 0 short before
    its line. rank 0's exit, or torchrun's SIGTERM, ends the wait without a word."""
    if not first_process() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # torchrun's stop: end quietly
        time.sleep(60)
    sys.exit(2)


def warn(message):
    """`warning: message` on stderr, once: under torchrun rank 0 alone says it (every process reads
    the same files and would say the same). Through tqdm.write: a progress bar on screen (an
    epoch's) is cleared first and drawn again below the line, which a bare print would join."""
    if first_process():
        tqdm.write(f"warning: {message}", file=sys.stderr)


# The SIGTERMs that came while a stop was already on its way up (sigterm_raises): they raised
# nothing, and a rank that lost a peer finds here that torchrun's came (distributed.stop_awaited)
_NOTED = []


def stop_noted():
    """Whether a SIGTERM came while a stop was on its way up (sigterm_raises)."""
    return bool(_NOTED)


def stopping():
    """Whether a stop is on its way up in this thread: a KeyboardInterrupt (Ctrl-C, Terminated),
    or a collective's error that lost another rank (minknn/tools/distributed.py: lost_peer), being
    handled (an `except`, a `finally` or a `with` block's exit runs for it)."""
    error = sys.exc_info()[1]
    if isinstance(error, KeyboardInterrupt):
        return True
    distributed = sys.modules.get("minknn.tools.distributed")  # not imported: no process group
    return bool(distributed and distributed.lost_peer(error))


@contextlib.contextmanager
def sigterm_raises():
    """Inside the block SIGTERM raises Terminated; the handler that was there before comes back
    after it (train.main runs in-process in the runner and the tests). A SIGTERM that comes while
    a stop is already on its way up (stopping) raises nothing: it is noted (stop_noted). Python
    runs a handler at the first line of Python after the signal, and that can be in the middle of
    the stop, before the handler that says how the run ended (under torchrun, rank 1's collective
    loses rank 0 and torchrun's SIGTERM comes as its error unwinds): Terminated raised there would
    replace the stop, past that handler, and the run would end with a bare `terminated`. Only the
    main thread can set a handler: elsewhere the block changes nothing. Each block starts with
    none noted: a run that train.main runs after another in one process (the runner, the tests)
    waits for its own SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _NOTED.clear()

    def terminated(signum, frame):
        if stopping():
            _NOTED.append(signum)
            return
        raise Terminated
    before = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


@contextlib.contextmanager
def signals_held(signums=(signal.SIGINT, signal.SIGTERM)):
    """Ctrl-C (SIGINT) and SIGTERM that arrive inside the block wait until it ends, then go to the
    handlers that were there before (KeyboardInterrupt, minknn.Terminated, or the default that
    ends the process). Without this, the KeyboardInterrupt raised inside torch.save's writer
    comes out as its own RuntimeError, and the file is left half written. Only the main thread
    can set handlers (and only it runs them): elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    before = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in signums}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in dict.fromkeys(arrived):  # each signal once, in the order they came; its
            signal.raise_signal(s)          # KeyboardInterrupt wins over an error of the block


def signals_ignored():
    """Ctrl-C and SIGTERM ignored from here on; returns the handlers they had (restore_signals).
    A run that is stopping says how (summary.json, one line) to the end: a second Ctrl-C, or
    the SIGTERM torchrun sends every rank left as soon as one fails, would cut that short (it
    came while rank 0 read last.pt, which left no summary.json and a bare `terminated`). Only the
    main thread can set handlers: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(handlers):
    for s, handler in handlers.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def progress_bar(*args, **kwargs):
    """tqdm(*args, **kwargs), built whole: Ctrl-C and SIGTERM wait while tqdm's __init__ runs
    (signals_held, above). One that landed inside it left a bar without its `pos`, whose __del__,
    collected after the run's `interrupted:` line, printed "Exception ignored in: <function
    tqdm.__del__> ... AttributeError: 'tqdm' object has no attribute 'pos'"."""
    with signals_held():
        return tqdm(*args, **kwargs)
