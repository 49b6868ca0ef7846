"""The house's plan, held against the code's own imports: every file of minknn/ and the two
scripts in one layer, each file importing only from its own layer or the ones below, no circle
of imports, and no file of the library importing a script or the lab. A new file must be given
its layer here (LAYERS). The folders say what a file is (README, "File map"): the course
at minknn/, its tasks in minknn/tasks/, the machinery in minknn/tools/, the assignment's files in
minknn/assignment/, the lab in minknn/lab/; the layers say what it may import.

The layers, from the bottom (a file may import from its own layer and those below it):
    base      minknn/__init__.py (the errors, signals, bars), assignment/parts.py (the parts),
              tools/files.py (files written whole, checksums, locks)
    tasks     what is read and scored: tasks/ (registry, data, readers, lines, own_files,
              own_task), kinds, metrics
    model     the encoder and its files: bert, backbones, tokenizer, packed, model, and the base
              weights' cache (tools/weights, packaged, cache_record)
    machine   running the model: tools/engine (device, precision, batches, prediction),
              tools/distributed (torchrun)
    methods   the ideas of the papers: losses/, memory, knn, proxy, pcgrad, probe
    run       a run and what uses one: index, datastore, the rest of tools/ (options, checks,
              cli, trainer, step, run, checkpoint, curves, inference, predict, export, card,
              onnx_export), assignment/ (the student edition)
    scripts   train.py, evaluate.py
    lab       minknn/lab/: the research tools, built on the scripts (the one layer that imports
              them)
Imports inside functions count: an import is an arrow wherever it is written.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS = {
    "base": ["minknn", "minknn.assignment.parts", "minknn.tools.files"],
    "tasks": ["minknn.tasks", "minknn.kinds", "minknn.metrics"],
    "model": ["minknn.tools.weights", "minknn.tools.packaged", "minknn.tools.cache_record",
              "minknn.packed", "minknn.bert", "minknn.backbones", "minknn.tokenizer",
              "minknn.model"],
    "machine": ["minknn.tools.engine", "minknn.tools.distributed"],
    "methods": ["minknn.losses", "minknn.memory", "minknn.knn", "minknn.proxy", "minknn.pcgrad",
                "minknn.probe"],
    "run": ["minknn.index", "minknn.datastore", "minknn.tools", "minknn.assignment"],
    "scripts": ["train", "evaluate"],
    "lab": ["minknn.lab"],
}
ORDER = list(LAYERS)
LIBRARY = ORDER[:ORDER.index("scripts")]


def modules():
    """{module name: its file} of minknn/ and the scripts."""
    found = {"train": "train.py", "evaluate": "evaluate.py"}
    for folder, _, names in os.walk(os.path.join(ROOT, "minknn")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.relpath(os.path.join(folder, name), ROOT)
                module = path[:-3].replace(os.sep, ".").removesuffix(".__init__")
                found[module] = path
    return found


def layer_of(module):
    """The layer a module belongs to: its own entry, else its package's (minknn.losses.ce is in
    minknn.losses')."""
    best = None
    for layer, names in LAYERS.items():
        for name in names:
            if (module == name or module.startswith(name + ".")) and \
                    (best is None or len(name) > len(best[1])):
                best = (layer, name)
    return best and best[0]


def imports(path, known):
    """The project modules a file imports, anywhere in it: {module: first line}."""
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)
    found = {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from minknn import options` imports minknn.tools.options; `from minknn.x import f`, x
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        for name in names:
            if name in known:
                found.setdefault(name, node.lineno)
    return found


def graph():
    known = modules()
    return known, {m: imports(path, known) for m, path in known.items()}


def test_every_file_has_a_layer():
    known, _ = graph()
    missing = [f"{path} ({m})" for m, path in known.items() if layer_of(m) is None]
    assert not missing, (f"give each file a layer in tests/test_layout.py (LAYERS) and the "
                         f"README's file map: {', '.join(sorted(missing))}")


def test_no_file_imports_from_a_higher_layer():
    known, edges = graph()
    wrong = []
    for m, targets in edges.items():
        for target, line in targets.items():
            if ORDER.index(layer_of(target)) > ORDER.index(layer_of(m)):
                wrong.append(f"{known[m]}:{line} ({layer_of(m)}) imports {target} "
                             f"({layer_of(target)})")
    assert not wrong, "imports that run up the layers:\n" + "\n".join(sorted(wrong))


def test_the_library_imports_neither_a_script_nor_the_lab():
    known, edges = graph()
    wrong = [f"{known[m]}:{line} imports {target}" for m, targets in edges.items()
             if layer_of(m) in LIBRARY for target, line in targets.items()
             if layer_of(target) in ("scripts", "lab")]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_circle_of_imports():
    known, edges = graph()
    # a module's package __init__ runs first (minknn.losses.ce imports minknn.losses): that arrow
    # is Python's, not the file's, and is left out; each file's own imports are followed
    state, path, circles = {}, [], []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for target in edges[m]:
            if target == m:
                continue
            if state.get(target) == "open":
                circles.append(" -> ".join(known[x] for x in path[path.index(target):] +
                                           [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[m] = "done"
    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not circles, "circles of imports:\n" + "\n".join(circles)


def test_the_layers_are_what_the_plan_says():
    """A planted upward import is caught: the check is not vacuous."""
    assert layer_of("minknn.losses.ce") == "methods" and layer_of("minknn.lab.runner") == "lab"
    assert ORDER.index(layer_of("minknn.tools.checkpoint")) > ORDER.index(layer_of("minknn.knn"))
    _, edges = graph()
    assert "minknn.knn" in edges["minknn.datastore"] and "train" in edges["minknn.lab.cells"]


COURSE_FOLDERS = ("losses", "tasks", "tools", "assignment", "lab")  # the folders minknn/ shows
MOST_ENTRIES, MOST_LINES = 20, 430  # README, "File map"; the house's "files around 400 lines"


def test_minknn_shows_the_course_and_puts_the_machinery_behind_folders():
    """`ls minknn/` is where a student finds the course: the model and the methods as files, the
    rest behind a handful of folders that say what they hold."""
    entries = sorted(e for e in os.listdir(os.path.join(ROOT, "minknn"))
                     if not e.startswith((".", "__pycache__")) and not e.endswith(".egg-info"))
    folders = [e for e in entries if os.path.isdir(os.path.join(ROOT, "minknn", e))]
    assert sorted(folders) == sorted(COURSE_FOLDERS), (
        f"minknn/ holds the folders {folders}, not {list(COURSE_FOLDERS)}: a new folder needs its "
        f"place in the README's file map and here")
    assert len(entries) <= MOST_ENTRIES, (
        f"minknn/ shows {len(entries)} entries (at most {MOST_ENTRIES}): {', '.join(entries)}; "
        f"machinery goes under minknn/tools/, a task's files under minknn/tasks/")


def test_no_file_of_minknn_grows_past_the_house_size():
    known = modules()
    long = []
    for m, path in known.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MOST_LINES and path.startswith("minknn"):
            long.append(f"{path} ({n} lines)")
    assert not long, (f"files past {MOST_LINES} lines: {', '.join(long)}; give the new idea a file "
                      f"of its own (README, File map)")
