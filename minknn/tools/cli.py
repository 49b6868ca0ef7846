"""The command line that train.py, evaluate.py, the lab's tools and the assignment share: one-line
errors (run, Parser), --help that shows each default once, and the check that a count is at
least 1 (below_one). The flags they share are declared once, in minknn/tools/options.py (add_flags).
"""
import argparse
import re
import sys

from minknn import (MinknnError, Terminated, exit_as_rank_0_says, first_process, says_errors,
                    sigterm_raises)
from minknn.assignment.parts import not_written, stubbed_part

def below_one(args, names):
    """The flags of `names` given a value below 1: '--NAME must be at least 1, got V' for each
    count (an epoch count, a batch size, a number of examples), in order."""
    return [f"--{n} must be at least 1, got {getattr(args, n)}" for n in names
            if getattr(args, n, None) is not None and getattr(args, n) < 1]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, `error: <message>`, as every other minknn
    error is (argparse's own print the whole usage first)."""

    def __init__(self, **kwargs):
        super().__init__(formatter_class=HelpFormatter, **kwargs)
        # argparse reads -1 and -.5 as values but -1e-4 as an unknown flag; let it read that too,
        # so that `--lr -1e-4` reaches check_args and its one-line error. (_negative_number_matcher
        # is argparse's own, private, pattern: Python 3.10-3.13 name it so.)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$", re.I)

    def error(self, message):
        if first_process():  # under torchrun every rank reads the same flags
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)
        exit_as_rank_0_says()


class HelpFormatter(argparse.HelpFormatter):
    """--help shows each flag's default once: appended where the help text does not state it."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = (action.default is None or action.default is False
                 or action.default == argparse.SUPPRESS)
        if not unset and "default" not in text:
            text += " (default: %(default)s)"
        return text


def run(main):
    """Runs a script's main(): a MinknnError becomes `error: <message>` on stderr (under torchrun
    once: minknn.says_errors) and exit status 2, and so does the NotImplementedError of a part a
    student edition has not written yet (minknn/assignment/parts.py); Ctrl-C that main() does not
    handle itself, `interrupted` and status 130; SIGTERM, `terminated` and status 143 (128 + 15, the
    shells' status for it)."""
    try:
        with sigterm_raises():
            main()
    except MinknnError as e:
        if says_errors():  # under torchrun a bad input's line comes once, from rank 0
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        exit_as_rank_0_says()
    except NotImplementedError as e:
        name = stubbed_part(str(e))
        if name is None:  # not a part's stub: a real bug, with its traceback
            raise
        print(f"error: {not_written(name)}", file=sys.stderr)
        sys.exit(2)
    except Terminated:
        print("\nterminated", file=sys.stderr)
        sys.exit(143)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
