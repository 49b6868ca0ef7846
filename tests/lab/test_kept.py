"""--keep is sticky (minknn/lab/kept.py): a cell kept by one run of a grid stays kept by the runs after it,
grid.json records which, and only --drop_kept deletes kept checkpoints, saying how many. The grids are the
runner tests' tiny ones (tests/helpers.py run_grid): one task, two seeds, trained once per test."""
import json

import pytest

import train
from minknn import MinknnError

from helpers import lines_of, run_grid


def checkpoints(out):
    """{cell name: whether its checkpoint.pt is there}."""
    return {cell.name: (cell / "checkpoint.pt").exists() for cell in sorted((out / "runs").iterdir())}


def grid_json(out):
    return json.loads((out / "grid.json").read_text())


def test_a_cell_kept_once_stays_kept_until_drop_kept(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    """The issue's case: a --keep grid run again without --keep kept its checkpoints, and a rule added after
    that is scored from them (not refused as 'their checkpoints are gone'); --drop_kept then deletes them, in
    one line."""
    out = tmp_path / "g"
    run_grid(tiny_bert_dir, out, "--keep", tasks="mr", methods="ce")
    names = sorted(checkpoints(out))
    assert checkpoints(out) == dict.fromkeys(names, True) and len(names) == 2, "the premise: --keep kept both"
    assert grid_json(out)["kept"] == names, "grid.json should record the cells --keep kept"
    monkeypatch.setattr(train, "main", lambda argv: pytest.fail(f"retrained: {argv}"))
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    assert checkpoints(out) == dict.fromkeys(names, True), \
        "a rerun without --keep must not delete the checkpoints an earlier --keep run kept"
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce,ce+knn[k=2]")
    assert [ln["method"] for ln in lines_of(out)] == ["ce", "ce+knn[k=2]"] * 2, \
        "a rule added later should be scored from the kept checkpoints"
    assert checkpoints(out) == dict.fromkeys(names, True)
    capsys.readouterr()
    run_grid(tiny_bert_dir, out, "--drop_kept", tasks="mr", methods="ce,ce+knn[k=2]")
    said = [line for line in capsys.readouterr().out.splitlines() if "drop_kept" in line]
    assert len(said) == 1 and said[0].startswith("--drop_kept: deleted the kept checkpoints of 2 cells ("), said
    assert checkpoints(out) == dict.fromkeys(names, False), "--drop_kept should delete the kept checkpoints"
    assert grid_json(out)["kept"] == [], "the cells dropped are no longer recorded as kept"


def test_the_record_decides_and_a_grid_from_before_it_keeps_what_it_has(tiny_bert_dir, tmp_path, monkeypatch):
    """A cell that grid.json does not record as kept loses its checkpoint once scored (as a run without --keep
    killed before deleting it would leave it), however it got there; a grid.json from before the record (no
    "kept") keeps every scored cell whose checkpoint is still there, and records them."""
    out = tmp_path / "g"
    run_grid(tiny_bert_dir, out, "--keep", tasks="mr", methods="ce")
    kept, other = sorted(checkpoints(out))
    monkeypatch.setattr(train, "main", lambda argv: pytest.fail(f"retrained: {argv}"))
    (out / "grid.json").write_text(json.dumps({**grid_json(out), "kept": [kept]}))
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    assert checkpoints(out) == {kept: True, other: False}, "only the cell recorded as kept keeps its checkpoint"
    before = grid_json(out)
    del before["kept"]
    (out / "grid.json").write_text(json.dumps(before))
    run_grid(tiny_bert_dir, out, tasks="mr", methods="ce")
    assert checkpoints(out) == {kept: True, other: False}, \
        "a grid.json from before the record: the checkpoint still there is kept"
    assert grid_json(out)["kept"] == [kept], "and recorded as kept"


def test_keep_and_drop_kept_together_are_refused_in_one_line(tiny_bert_dir, tmp_path):
    with pytest.raises(MinknnError) as e:
        run_grid(tiny_bert_dir, tmp_path / "g", "--keep", "--drop_kept", tasks="mr", methods="ce")
    assert str(e.value) == "--keep and --drop_kept: give one; --drop_kept deletes the checkpoints that --keep keeps"
    assert not (tmp_path / "g").exists(), "refused before anything is written"
