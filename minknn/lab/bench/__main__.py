"""python -m minknn.lab.bench SUBCOMMAND ...: the benchmarks (minknn/lab/bench/__init__.py)."""
from minknn.cli import run
from minknn.lab.bench import main

run(main)
