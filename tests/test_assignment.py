"""The student edition (minknn/assignment.py) and the mutation list (tests/mutations.py): every part
has its solution block, the edition fails part by part with the part's name, putting the
solution back gives this repository byte for byte, and the mutation list is well formed."""
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from minknn import assignment
from minknn.assignment import (BY_NAME, NEEDS, NUMBER, PARTS, AssignmentError, choose,
                               find_blocks, label, read_lines, repository_files, solve,
                               write_edition)

from mutate import check_list  # tests/ is on sys.path, as for conftest
from mutations import MUTATIONS

ROOT = assignment.ROOT


def test_every_part_has_a_solution_block_in_its_file():
    for part in PARTS:
        lines = read_lines(os.path.join(ROOT, part.file))
        names = [name for name, _, _ in find_blocks(lines, part.file)]
        assert part.name in names, (f"{label(part.name)}: no '# BEGIN part {part.name}' block in "
                                    f"{part.file} (PARTS in minknn/assignment.py names that file)")


def test_no_markers_outside_the_parts_files():
    """A marker in a file PARTS does not name would stay in the edition with its solution."""
    files = set(assignment.PART_FILES)
    for f in repository_files():
        if f.endswith(".py") and f not in files and f != "minknn/assignment.py":
            marked = [i + 1 for i, line in enumerate(read_lines(os.path.join(ROOT, f)))
                      if assignment.MARKER.match(line)]
            assert not marked, (f"{f}:{marked[:1]} has a solution block's marker, but no part in "
                                f"PARTS (minknn/assignment.py) lives in that file")


@pytest.mark.parametrize("lines, error", [
    (["# BEGIN part attention\n", "x = 1\n"], "never ENDed"),
    (["# BEGIN part attention\n", "# BEGIN part attention\n"], "inside part attention"),
    (["x = 1\n", "# END part attention\n"], "without a BEGIN"),
    (["    # BEGIN part attention\n", "    x = 1\n", "# END part attention\n"], "same indent"),
    (["# BEGIN part atention\n"], "unknown part 'atention'"),
    (["# BEGIN part pooling\n", "# END part pooling\n"], "lives in minknn/model.py"),
])
def test_bad_markers_name_the_file_and_line(lines, error):
    with pytest.raises(AssignmentError, match=error) as e:
        find_blocks(lines, "minknn/bert.py")
    assert str(e.value).startswith("minknn/bert.py:")


def test_parts_are_chosen_by_number_or_name_in_the_handout_order():
    assert choose("attention,1") == ["embeddings", "attention"]
    assert choose(None) == [p.name for p in PARTS]
    with pytest.raises(AssignmentError, match="unknown part 'atention'; choose numbers 1 to"):
        choose("atention")
    with pytest.raises(AssignmentError, match=f"unknown part '{len(PARTS) + 1}'"):
        choose(str(len(PARTS) + 1))


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hw") / "hw")
    write_edition(out)
    return out


def test_the_edition_stubs_every_block_and_keeps_the_rest(edition):
    for f in repository_files():
        theirs = os.path.join(edition, f)
        if f in assignment.NOT_COPIED:
            assert not os.path.exists(theirs), f"{f} quotes the solution; it must not be copied"
            continue
        ours = read_lines(os.path.join(ROOT, f)) if f.endswith((".py", ".md")) else None
        if f not in assignment.PART_FILES:
            assert open(theirs, "rb").read() == open(os.path.join(ROOT, f), "rb").read(), \
                f"{f} has no part; the edition must copy it unchanged"
            continue
        text = "".join(read_lines(theirs))
        compile(text, theirs, "exec")  # the stubbed file still parses
        for name, begin, end in find_blocks(ours, f):
            assert re.search(rf"raise NotImplementedError\(['\"]{label(name)}: ", text), \
                f"{f}: the edition has no stub naming {label(name)}"
            for line in ours[begin + 1:end]:
                if len(line.strip()) > 30 and "# BEGIN" not in line:
                    assert line not in text.splitlines(keepends=True) or \
                        ours.count(line) > 1, f"{f}: a line of {label(name)}'s solution " \
                        f"is still in the edition: {line.strip()}"
    # nor elsewhere in the edition (the tests hold oracles, not copies: the README says so)
    solution = {line.strip() for p in PARTS for line in block_lines(p.file)
                if len(line.strip()) > 30 and not line.strip().startswith("#")}
    solution -= {"optimizer.zero_grad(set_to_none=True)"}  # any training loop has it (bench.py)
    for f in repository_files():
        if f in assignment.NOT_COPIED or f.startswith("tests/") or f in assignment.PART_FILES:
            continue
        try:
            text = open(os.path.join(edition, f), encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        quoted = [line for line in solution if line in text]
        assert not quoted, f"{f} quotes a solution line in the edition: {quoted[0]}"
    handout = open(os.path.join(edition, "HANDOUT.md"), encoding="utf-8").read()
    for part in PARTS:
        assert f"| {assignment.NUMBER[part.name]} | {part.name} |" in handout, part.name
        assert part.test in handout, part.name
    bert = "".join(read_lines(os.path.join(edition, "minknn/bert.py")))
    assert 'ATTENTION = "explicit"' in bert, "the student edition must train with attention()"


def block_lines(file):
    lines = read_lines(os.path.join(ROOT, file))
    return [line for _, begin, end in find_blocks(lines, file) for line in lines[begin + 1:end]]


def test_putting_the_solution_back_gives_this_repository(edition, tmp_path):
    """The round trip: every stub replaced by this repository's block, byte for byte."""
    copy = str(tmp_path / "solved")
    shutil.copytree(edition, copy)
    solve(copy)
    for f in repository_files():
        if f not in assignment.NOT_COPIED:
            assert open(os.path.join(copy, f), "rb").read() == \
                open(os.path.join(ROOT, f), "rb").read(), f"{f} differs after --solve"


def test_the_whole_suite_passes_in_a_finished_edition(edition, tmp_path):
    """The handout's promise: every part written (the solution put back), the edition's default
    explicit attention kept, `python -m pytest -q` passes. It catches a test that holds only for
    the fused kernel this repository defaults to."""
    copy = str(tmp_path / "finished")
    shutil.copytree(edition, copy)
    solve(copy)
    bert = os.path.join(copy, assignment.ATTENTION_LINE[0])
    text = open(bert, encoding="utf-8").read()
    with open(bert, "w", encoding="utf-8") as f:
        f.write(text.replace(*assignment.ATTENTION_LINE[1:]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"],
                       cwd=copy, env=edition_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, ("the finished student edition (explicit attention) fails its own "
                               f"suite:\n{(r.stdout + r.stderr)[-1500:]}")


def test_the_edition_refuses_an_existing_folder_and_bad_parts(tmp_path):
    run = [sys.executable, "-m", "minknn.assignment"]
    r = subprocess.run(run + [str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "already exists" in r.stderr
    r = subprocess.run(run + [str(tmp_path / "hw"), "--parts", "attention,nope"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "unknown part 'nope'" in r.stderr and r.stderr.count("\n") == 1
    assert not os.path.exists(tmp_path / "hw")
    assert [p for p in os.listdir(tmp_path) if p.startswith(".edition")] == []


def edition_env():
    """The environment an edition's tests run in: no stale bytecode, no third-party plugins, and
    never MINKNN_WRITE_REFERENCES (it would rewrite the references and pass)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("MINKNN_WRITE_REFERENCES", None)
    return env


def run_part(out, part):
    """The part's test command in an edition where it alone is stubbed."""
    write_edition(out, part.name)
    env = edition_env()
    r = subprocess.run(part.test.split() + ["-x", "-p", "no:cacheprovider"], cwd=out, env=env,
                       capture_output=True, text=True, timeout=300)
    return part, r.returncode, r.stdout + r.stderr


def test_each_part_alone_fails_its_own_test_naming_the_part(tmp_path):
    """--parts NAME: the part's test command fails (pytest exit 1, not a collection error) and
    says which part to write."""
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: run_part(str(tmp_path / p.name), p), PARTS))
    for part, rc, out in results:
        assert rc == 1, (f"{label(part.name)}: `{part.test}` in its edition exited {rc}:\n"
                         f"{out[-800:]}")
        assert f"NotImplementedError: {label(part.name)}" in out, \
            f"{label(part.name)}: the failure does not show the part's stub:\n{out[-800:]}"


def run_with_its_needs(out, part):
    """The part's test command in an edition where only it and the parts it NEEDS are written."""
    written = {part.name, *NEEDS.get(part.name, ())}
    write_edition(out, ",".join(p.name for p in PARTS if p.name not in written))
    r = subprocess.run(part.test.split() + ["-p", "no:cacheprovider"], cwd=out, env=edition_env(),
                       capture_output=True, text=True, timeout=300)
    return part, r.returncode, r.stdout + r.stderr


def test_each_part_passes_with_only_the_parts_it_needs(tmp_path):
    """Every other part a stub: the part's tests pass once it and the earlier parts NEEDS names
    are written, so a student who works in the handout's order is never blocked by a later part
    (and the handout's list of dependencies is the truth)."""
    for name, needs in NEEDS.items():
        for m in needs:
            assert NUMBER[m] < NUMBER[name], f"NEEDS: {label(name)} needs the later {label(m)}"
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: run_with_its_needs(str(tmp_path / p.name), p), PARTS))
    for part, rc, out in results:
        stubs = sorted(set(re.findall(r"NotImplementedError: (part \d+ [a-z-]+)", out)))
        assert rc == 0, (f"{label(part.name)}: `{part.test}` fails with only it and "
                         f"{NEEDS.get(part.name, 'no other part')} written; it ran {stubs}: add "
                         f"them to NEEDS in minknn/assignment.py if they come earlier, else grade "
                         f"the part on a stand-in:\n{out[-800:]}")


def test_the_mutation_list_is_well_formed():
    """Each mistake applies once, inside a solution block of its part (tests/mutate.py runs them:
    the README gives the score)."""
    problems = check_list(MUTATIONS)
    assert not problems, "\n".join(problems)
    assert len(MUTATIONS) >= 60, f"{len(MUTATIONS)} mutations; the project keeps at least 60"
    untested = [p.name for p in PARTS if p.name not in {m[0] for m in MUTATIONS}]
    assert not untested, f"parts with no mutation in tests/mutations.py: {', '.join(untested)}"


def test_mutate_catches_a_planted_mistake(tmp_path):
    """The script itself: the attention-dropout mistake is caught and named."""
    import mutate
    mutate.copy_repository(str(tmp_path))
    mutation = next(m for m in MUTATIONS if m[0] == "attention")
    verdict, seconds, tail = mutate.run_one(str(tmp_path), mutation, timeout=120)
    assert verdict in ("caught", f"SLOW (over {mutate.LIMIT:.0f} s)"), (verdict, tail)
    assert label("attention") in tail[0]
    assert open(tmp_path / mutation[1]).read() == open(os.path.join(ROOT, mutation[1])).read(), \
        "run_one must put the file back"


def test_mutate_tells_a_diagnosis_from_a_value_check():
    """mutate.py counts a caught mistake as generic when its failure is a value check's: grading's
    close(), matches_reference() and differs() all say GENERIC, check() adds nothing, and no part's
    test file writes the phrase itself (a property check saying it would count as generic)."""
    import grading
    import mutate
    import torch
    messages = {}
    for name, fail in (
            ("close", lambda: grading.close("supcon", torch.zeros(2), torch.ones(2), "the loss")),
            ("differs", lambda: grading.differs("supcon", "the loss", "the oracle's", ": 1 vs 2")),
            ("check", lambda: grading.check("supcon", False, "the anchor must not be its own "
                                            "positive"))):
        with pytest.raises(AssertionError) as e:
            fail()
        messages[name] = [f"E   AssertionError: {str(e.value).splitlines()[0]}"]
    assert [mutate.generic("caught", messages[n]) for n in ("close", "differs", "check")] == \
        [True, True, False], messages
    assert not mutate.generic("SURVIVED", messages["close"])
    for test_file in sorted({p.test.split()[4] for p in PARTS}):
        text = open(os.path.join(ROOT, test_file), encoding="utf-8").read()
        assert grading.GENERIC not in text, (f"{test_file} writes '{grading.GENERIC.strip()}': "
                                             f"only grading's value checks say it (GENERIC)")


def test_every_part_names_a_known_file_and_test():
    for part in PARTS:
        assert os.path.exists(os.path.join(ROOT, part.file)), part
        test_file = part.test.split()[4]
        assert os.path.exists(os.path.join(ROOT, test_file)), part
        assert BY_NAME[part.name] is part
