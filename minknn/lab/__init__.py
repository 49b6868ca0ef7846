"""The lab: the research tools built on train.py and evaluate.py (the runner with its grids, cells,
reports and plots; the bench; the attack). They import the two scripts, which are no part of the
installed package but sit beside it in the clone, so importing minknn.lab puts the clone's root
first on sys.path: `python -m minknn.lab.runner` then runs from any folder once the clone is
installed (pip install -e .). A minknn without the scripts beside it (installed from a wheel, or
copied) stops here with one line saying where they are wanted.
"""
import os
import sys

CLONE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
SCRIPTS = ("train.py", "evaluate.py")

missing = [s for s in SCRIPTS if not os.path.isfile(os.path.join(CLONE, s))]
if missing:
    raise SystemExit(f"error: minknn's lab runs train.py and evaluate.py from the clone that holds "
                     f"the minknn package, and {CLONE} has no {' or '.join(missing)}; clone the "
                     f"repository and install it with pip install -e . (README, Set up)")
if CLONE not in sys.path:
    sys.path.insert(0, CLONE)  # before the current folder: the clone's train.py, not one there
