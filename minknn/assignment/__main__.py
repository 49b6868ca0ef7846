"""python -m minknn.assignment OUT: the student edition (minknn/assignment/edition.py)."""
from minknn.assignment.edition import main
from minknn.tools.cli import run

run(main)
