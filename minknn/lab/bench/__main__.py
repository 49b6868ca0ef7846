"""python -m minknn.lab.bench SUBCOMMAND ...: the benchmarks (minknn/lab/bench/__init__.py)."""
from minknn.lab.bench import main
from minknn.tools.cli import run

run(main)
