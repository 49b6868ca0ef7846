"""minknn as a course assignment: the student edition, written from this repository. The parts a
student writes, their solution blocks and their test commands are minknn/assignment/parts.py's.

    python -m minknn.assignment OUT                           every part
    python -m minknn.assignment OUT --parts 1,attention,4     a smaller one (numbers or names)
    python -m minknn.assignment --solve OUT                   puts this repository's blocks back
    python -m minknn.assignment --solve --force OUT           over a student's own code too

The first two write a complete copy of the repository in which each block of the chosen parts is
replaced by `raise NotImplementedError("part 2 attention: ...")` (the markers stay, to show where
to write), with HANDOUT.md beside it (the README's set-up, then the parts), a README.md for the
student (HANDOUT.md first, then this README less the instructor's lines), and in which
--attention defaults to the explicit attention() the student writes. The rest runs unchanged.
Left out of the copy (NOT_COPIED): the mutation testing, whose mutations quote the solution, and
the tests of the edition itself.
--solve is the round trip: run from this repository, it rewrites an edition's blocks from this
repository's, which gives back this repository's files byte for byte (tests/test_assignment.py).
It refuses to overwrite a block that is neither the stub nor the solution (a student's code)
unless given --force, and names those parts.

What is copied: the project's own files, never what one keeps beside them (a virtual
environment, runs/, grids/, downloaded data; a .venv in the clone once made each edition
1.1 GB). In a clone, the files git tracks, and untracked ones only inside minknn/, tests/ and
docs/ (OWN_FOLDERS), so that a new file of one's own there counts before it is committed, as it
does for `python -m pytest` (tests/mutate.py copies the same files); without .git (a zip
download, git archive), the entries PROJECT lists. Both skip SKIPPED folders and any folder
holding pyvenv.cfg, at any depth, so that an edition made with or without .git holds the same
files. A new top-level file must be committed, and added to PROJECT (tests/test_assignment.py
compares the two editions).
"""
import argparse
import os
import shutil
import subprocess
import tempfile

from minknn.assignment.parts import (BY_NAME, MARKER, NEEDS, NUMBER, PART_FILES, PARTS, ROOT,
                                     TRAINS, AssignmentError, find_blocks, is_stub, label,
                                     read_lines, stub)
from minknn.tools.cli import run

# the solution, quoted (the mutations), and the instructor's tests of the edition itself
NOT_COPIED = ("tests/mutations.py", "tests/mutate.py", "tests/test_assignment.py")
# What an edition copies (the module docstring says why): the project's own top-level entries,
# the folders where git's untracked files count, and the folders never copied (environments,
# caches, outputs; any folder holding pyvenv.cfg too)
PROJECT = (".ci", ".gitignore", "LICENSE", "README.md", "RESULTS.md", "constraints.txt",
           "data/README.md", "docs", "evaluate.py", "minknn", "pyproject.toml", "tests",
           "train.py")
OWN_FOLDERS = ("minknn", "tests", "docs")
SKIPPED = {".git", ".venv", "venv", "env", ".env", ".tox", ".conda", "node_modules", "__pycache__",
           ".pytest_cache", ".mypy_cache", ".ipynb_checkpoints", "runs", "grids"}
ATTENTION_LINE = ("minknn/bert.py", 'ATTENTION = "fused"\n', 'ATTENTION = "explicit"\n')
# the end-to-end figure a finished assignment should reach (README, Results: 3 seeds, 2-core CPU)
REFERENCE = ("python train.py --task sst", "SST dev accuracy 0.480 ± 0.003 (3 epochs, 3 seeds, "
             "all-MiniLM-L6-v2, CPU); BERT-base in the CS224N minBERT handout: 0.515")
# the README's lines that are the instructor's (making and solving editions), left out of the
# edition's README
INSTRUCTOR_LINES = ("minknn.assignment", "minknn/assignment/edition.py", "docs/assignment.md")


def readme_parts(root=ROOT):
    """(the README's title, its opening paragraphs, its sections from "## Set up" on)."""
    text = "".join(read_lines(os.path.join(root, "README.md")))
    title, _, rest = text.partition("\n")
    start = rest.find("\n## Set up\n")
    if not title.startswith("# ") or start < 0:
        raise AssignmentError(f"{os.path.join(root, 'README.md')}: no title line and '## Set up' "
                              f"section to write the edition's README and handout from")
    return title, rest[:start + 1], rest[start + 1:]


def set_up(root=ROOT):
    """The README's "## Set up" section, as is: the handout's set-up (one text, so the two
    agree)."""
    sections = readme_parts(root)[2]
    end = sections.find("\n## ", 1)
    return sections if end < 0 else sections[:end + 1]


def student_readme(parts, root=ROOT):
    """The edition's README.md: HANDOUT.md first, then the README less INSTRUCTOR_LINES."""
    _, opening, sections = readme_parts(root)
    sections = "".join(line for line in sections.splitlines(keepends=True)
                       if not any(s in line for s in INSTRUCTOR_LINES))
    return f"""# minknn: the student edition

Your assignment is [HANDOUT.md](HANDOUT.md): {len(parts)} parts of minknn to write, in order, each
a block of code that raises `NotImplementedError` until you write it, and the command that tests
it. Set up as below, then start with part {NUMBER[parts[0]]} ({parts[0]}). The rest of this README
is minknn's: what it runs once your parts are written.
{opening}{sections}"""


def rewrite(lines, path, parts, replacement):
    """The lines with each block of `parts` replaced by replacement(name, indent, index), index
    counting that part's blocks in the file."""
    out, last, seen = [], 0, {}
    for name, begin, end in find_blocks(lines, path):
        out += lines[last:begin + 1]
        if name in parts:
            index = seen[name] = seen.get(name, -1) + 1
            out += replacement(name, MARKER.match(lines[begin])["indent"], index)
        else:
            out += lines[begin + 1:end]
        last = end
    return out + lines[last:]


def git_files(root):
    """The files git tracks in root, and those it would track in OWN_FOLDERS; None where root is
    not the top of a clone (a zip download, a copy inside another repository, no git)."""
    def ls(*flags):
        return subprocess.run(["git", "ls-files", "-z", *flags], cwd=root, capture_output=True,
                              check=True).stdout.decode().split("\0")
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root,
                             capture_output=True, text=True)
        if top.returncode != 0 or not os.path.samefile(top.stdout.strip(), root):
            return None
        listed = ls("--cached") + ls("--others", "--exclude-standard", "--", *OWN_FOLDERS)
    except (OSError, subprocess.CalledProcessError):
        return None
    return [f for f in listed if f]


def skipped(path, root):
    """Whether a file lies in a SKIPPED folder or a virtual environment (pyvenv.cfg), or is
    bytecode."""
    folders = path.split("/")[:-1]
    return path.endswith(".pyc") or any(
        d in SKIPPED or os.path.isfile(os.path.join(root, *folders[:i + 1], "pyvenv.cfg"))
        for i, d in enumerate(folders))


def repository_files(root=ROOT):
    """The project's own files, relative to root (the module docstring says which and why)."""
    files = git_files(root)
    if files is None:
        files = []
        for entry in PROJECT:
            if os.path.isfile(os.path.join(root, entry)):
                files.append(entry)
            for folder, dirs, names in os.walk(os.path.join(root, entry)):
                dirs[:] = [d for d in dirs if d not in SKIPPED and  # not walked at all
                           not os.path.isfile(os.path.join(folder, d, "pyvenv.cfg"))]
                files += [os.path.relpath(os.path.join(folder, n), root).replace(os.sep, "/")
                          for n in names]
    return sorted(f for f in set(files)
                  if not skipped(f, root) and os.path.isfile(os.path.join(root, f)))


def blocks_by_part(root=ROOT, parts=None):
    """{part name: [its blocks' lines, in order]} from the repository's marked files; each part
    of `parts` (default: all) must have one."""
    found = {}
    for f in PART_FILES:
        lines = read_lines(os.path.join(root, f))
        for name, begin, end in find_blocks(lines, f):
            found.setdefault(name, []).append(lines[begin + 1:end])
    missing = [n for n in (BY_NAME if parts is None else parts) if n not in found]
    if missing:
        raise AssignmentError(f"parts without a solution block: {', '.join(missing)} (mark them "
                              f"with # BEGIN part NAME / # END part NAME in their files)")
    return found


def choose(spec):
    """The part names of --parts: comma-separated numbers or names; None is every part."""
    if spec is None:
        return [p.name for p in PARTS]
    chosen = []
    for item in spec.split(","):
        item = item.strip()
        if item.isdigit() and 1 <= int(item) <= len(PARTS):
            item = PARTS[int(item) - 1].name
        if item not in BY_NAME:
            raise AssignmentError(f"--parts: unknown part '{item}'; choose numbers 1 to "
                                  f"{len(PARTS)} or names: {', '.join(BY_NAME)}")
        chosen.append(item)
    return [p.name for p in PARTS if p.name in chosen]


def handout(parts, root=ROOT):
    """HANDOUT.md for an edition of these parts: the README's set-up, what to write, in order,
    and how it is graded;
    the dependencies (NEEDS), the attention note and the note that RoBERTa, DistilBERT and MPNet
    run the student's BERT only where the chosen parts have them."""
    notes = ["; ".join(f"{label(n)} runs {', '.join(label(m) for m in NEEDS[n])}" for n in parts
                       if any(m in parts for m in NEEDS.get(n, ())))]
    trains = [label(n) for n in TRAINS if n in parts]
    if trains:
        notes.append(f"`train.py` trains nothing until {', '.join(trains)} are written")
    needs = "".join(f" {n[0].upper()}{n[1:]}." for n in notes if n)
    attention = "" if "attention" not in parts else """
**The attention you write is the attention that trains**: in this edition `--attention` defaults
to `explicit` (your `attention()`); `--attention fused` runs PyTorch's kernel instead. On a 2-core
CPU the two take the same time (RESULTS.md, `python -m minknn.lab.bench model`); on an H200 the
fused one was 1.09x to 1.23x faster.
"""
    backbones = "" if not {"embeddings", "attention", "layer"} & set(parts) else """
The parts are BERT's, and the tests grade them on BERT. RoBERTa, DistilBERT and MPNet
(`minknn/backbones.py`) reuse them: that file changes only their tables (RoBERTa's positions,
DistilBERT's missing token types, MPNet's relative-position bias, which reaches your attention()
inside its mask) and runs your embeddings, attention and layer, so your BERT runs all four
(`--model` a RoBERTa or DistilBERT folder, or `mpnet`).
"""
    rows = "\n".join(f"| {NUMBER[n]} | {n} | `{BY_NAME[n].file}` | {BY_NAME[n].statement} | "
                     f"{BY_NAME[n].source} | `{BY_NAME[n].test}` |" for n in parts)
    return f"""# minknn: the assignment

You will write the parts of minknn listed below, in this order. Each is a block of code in one
file, marked `# BEGIN part NAME` ... `# END part NAME`, where the code now raises
`NotImplementedError("part N NAME: ...")`. The file's docstring and the comments around the block
give the equation, the shapes and the defaults; read them first.
{backbones}
{set_up(root)}
## The parts

| part | name | file | what to write | equation | test |
| --- | --- | --- | --- | --- | --- |
{rows}

**Testing a part.** Run its test command. A failing test names the part and what is off
(`{label(parts[0])}: ...`). Tests that compare with stored reference outputs
(tests/fixtures/references/) are the sanity checks: fixed inputs, the solution's outputs. Work in
the order above: a part's tests pass once it and the parts before it are written.{needs}
{attention}
**When every part passes**, `python -m pytest -q` passes, and

    MINKNN_DATA=path/to/data {REFERENCE[0]}

should reach about the reference: {REFERENCE[1]}.
"""


def write_edition(out, spec=None, root=ROOT):
    """Writes the student edition of `root` to the new folder `out` (through a temporary folder,
    renamed when complete); returns the parts it asks for."""
    parts = choose(spec)
    out = os.path.normpath(out)  # hw/ is hw
    if os.path.exists(out):
        raise AssignmentError(f"{out}: already exists; the edition is written to a new folder")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise AssignmentError(f"{out}: its parent folder does not exist")
    blocks_by_part(root, parts)  # each part has a block, every marker is well formed
    tmp = tempfile.mkdtemp(prefix=".edition-", dir=os.path.dirname(os.path.abspath(out)))
    try:
        for f in repository_files(root):
            if f in NOT_COPIED:
                continue
            os.makedirs(os.path.dirname(os.path.join(tmp, f)), exist_ok=True)
            if f not in PART_FILES:  # the only files with solution blocks
                shutil.copy2(os.path.join(root, f), os.path.join(tmp, f))
                continue
            lines = rewrite(read_lines(os.path.join(root, f)), f, parts,
                            lambda name, indent, _: stub(name, indent))
            if f == ATTENTION_LINE[0]:
                lines = [ATTENTION_LINE[2] if line == ATTENTION_LINE[1] else line
                         for line in lines]
            with open(os.path.join(tmp, f), "w", encoding="utf-8") as fh:
                fh.writelines(lines)
            shutil.copymode(os.path.join(root, f), os.path.join(tmp, f))
        with open(os.path.join(tmp, "HANDOUT.md"), "w", encoding="utf-8") as fh:
            fh.write(handout(parts, root))
        with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as fh:
            fh.write(student_readme(parts, root))
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return parts


def solve(edition, root=ROOT, force=False):
    """Puts this repository's solution blocks back into an edition (every part), and its
    explicit-attention default and README back to this repository's. A block that is neither its
    stub nor this repository's block is the student's code: refused, naming its parts, unless force.
    Returns the parts of those it overwrote (force)."""
    blocks = blocks_by_part(root, [])
    stubbed = sorted((n for n, bodies in blocks.items() if any(is_stub(n, b) for b in bodies)),
                     key=NUMBER.__getitem__)
    if stubbed:  # run from an edition: its "solution" would be the stubs
        raise AssignmentError(f"{root} is itself a student edition ({label(stubbed[0])} is a "
                              f"stub there): run python -m minknn.assignment --solve "
                              f"{os.path.abspath(edition)} from the minknn that holds the "
                              f"solutions")
    missing = [f for f in PART_FILES if not os.path.isfile(os.path.join(edition, f))]
    if missing:
        raise AssignmentError(f"{edition}: not a student edition (no {', '.join(missing[:3])})")
    edited, theirs = {}, {}  # theirs: {part: its file} of the blocks holding a student's code
    for f in PART_FILES:  # every file checked before any is written
        path = os.path.join(edition, f)
        lines = read_lines(path)
        counts = {}
        for name, begin, end in find_blocks(lines, f):
            counts[name] = counts.get(name, 0) + 1
            body = lines[begin + 1:end]
            if not is_stub(name, body) and body not in blocks.get(name, ()):
                theirs[name] = path
        for name, n in counts.items():
            if n != len(blocks.get(name, ())):
                raise AssignmentError(f"{path}: {n} blocks of part {name}, where this repository "
                                      f"has {len(blocks.get(name, ()))}: not an edition of it")
        edited[path] = rewrite(lines, f, set(blocks), lambda name, indent, i: blocks[name][i])
    theirs = sorted(theirs.items(), key=lambda item: NUMBER[item[0]])
    if theirs and not force:
        listed = ", ".join(f"{NUMBER[n]} {n} ({path})" for n, path in theirs)
        one = len(theirs) == 1
        raise AssignmentError(f"part{'' if one else 's'} {listed} hold{'s' if one else ''} code "
                              f"of {'its' if one else 'their'} own, neither the stub nor the "
                              f"solution; --solve --force overwrites {'it' if one else 'them'}")
    for path, lines in edited.items():
        if path == os.path.join(edition, ATTENTION_LINE[0]):
            lines = [ATTENTION_LINE[1] if line == ATTENTION_LINE[2] else line for line in lines]
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(lines)
    shutil.copyfile(os.path.join(root, "README.md"), os.path.join(edition, "README.md"))
    return [n for n, _ in theirs]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minknn.assignment",
                                description=__doc__.split("\n")[0])
    p.add_argument("out", help="the new folder for the student edition (or, with --solve, an "
                   "edition to put the solution back into)")
    p.add_argument("--parts", help="comma-separated part numbers or names (default: all "
                   f"{len(PARTS)})")
    p.add_argument("--solve", action="store_true", help="put the solution blocks back into OUT")
    p.add_argument("--force", action="store_true", help="--solve: also over blocks holding code "
                   "of the student's own")
    args = p.parse_args(argv)
    if args.solve:
        if args.parts:
            raise AssignmentError("--solve puts every part back; --parts chooses the parts of a "
                                  "new edition")
        overwritten = solve(args.out, force=args.force)
        print(f"{args.out}: every solution block put back" + (
            f"; the student's code of {', '.join(label(n) for n in overwritten)} overwritten"
            if overwritten else ""))
        return
    if args.force:
        raise AssignmentError("--force goes with --solve (overwrite a student's code)")
    parts = write_edition(args.out, args.parts)
    print(f"{args.out}: the student edition, {len(parts)} parts "
          f"({', '.join(label(n) for n in parts)}); the handout is {args.out}/HANDOUT.md")


if __name__ == "__main__":
    run(main)
