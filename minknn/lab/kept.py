"""Which cells of a grid keep their checkpoints (minknn/lab/runner.py's --keep and --drop_kept).

A scored cell's checkpoint.pt (a setfit-package cell's: the body the package saved, setfit/) is
deleted once its scores are in its cell.json, unless the cell is kept: a run with --keep keeps
every cell of its grid, and grid.json records them ("kept": their names), so that a later run
without --keep keeps them too, and a rule added to the grid later is scored from them. Only
--drop_kept deletes kept checkpoints: after its grid is done, those of its own cells that are
scored, in one line saying how many and their size.

A grid.json written before the record was kept says nothing of it: the cells scored whose
checkpoint is still there are taken as kept (a run without --keep would have deleted it), once,
and recorded.
"""
import os
import shutil

from minknn import MinknnError
from minknn.lab.cells import saved_lines
from minknn.tools.files import read_json, write_json
from minknn.tools.packaged import megabytes

KEPT = "kept"  # grid.json's entry: the names of the cells kept


def checkpoints(folder):
    """The files and folders of a cell that --keep keeps: train.py's best model, or the body
    the setfit package saved."""
    return [p for p in (os.path.join(folder, "checkpoint.pt"), os.path.join(folder, "setfit"))
            if os.path.exists(p)]


def kept_cells(out, cells, keep):
    """The names of the grid's kept cells, as grid.json records them, with this run's cells
    where it is run with --keep (recorded before any of them is scored)."""
    path = os.path.join(out, "grid.json")
    grid = read_json(path)
    if isinstance(grid.get(KEPT), list):
        kept = set(grid[KEPT])
    else:  # a grid.json from before the record: what a run without --keep would have deleted
        runs = os.path.join(out, "runs")
        names = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
        kept = {n for n in names if saved_lines(os.path.join(runs, n)) is not None
                and checkpoints(os.path.join(runs, n))}
    if keep:
        kept |= {cell.name for cell in cells}
    if grid.get(KEPT) != sorted(kept):
        write_json(path, {**grid, KEPT: sorted(kept)})
    return kept


def drop_kept(out, cells, kept):
    """--drop_kept: the checkpoints of this grid's kept cells deleted, where the cell is scored
    for all its methods (a cell still lacking one keeps what would score it); says how many."""
    dropped, size = [], 0
    for cell, methods in cells.items():
        folder = os.path.join(out, "runs", cell.name)
        lines = saved_lines(folder)
        if cell.name not in kept or lines is None or any(m.name not in lines for m in methods):
            continue
        for path in checkpoints(folder):
            size += folder_size(path)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        dropped.append(cell.name)
    left = kept - set(dropped)
    if dropped:
        write_json(os.path.join(out, "grid.json"),
                   {**read_json(os.path.join(out, "grid.json")), KEPT: sorted(left)})
    others = f"; {len(left)} other kept cells keep theirs" if left else ""
    n = len(dropped)
    print(f"--drop_kept: deleted the kept checkpoints of {n} cell{'s' * (n != 1)} "
          f"({megabytes(size)}){others}")
    return len(dropped)


def folder_size(path):
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def check_flags(args):
    """--keep and --drop_kept say opposite things."""
    if args.keep and args.drop_kept:
        raise MinknnError("--keep and --drop_kept: give one; --drop_kept deletes the checkpoints "
                          "that --keep keeps")
