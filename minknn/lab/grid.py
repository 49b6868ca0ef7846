"""The grid's grammar: methods, sizes, seeds, and the cells they make (runner.py runs them).

A method is a training loss, optionally with an inference rule: `ce`, `proxyanchor+proxy`,
`knnbert+knn`, `knnbert+knn-only`. Rules: the linear head (no rule), `proxy` (proxy inference,
minknn/proxy.py), `knn` (the model mixed with kNN, minknn/knn.py), `knn-only` (kNN alone) and
`probe` (the trained head replaced by a logistic regression fit on the trained encoder's training
representations, minknn/probe.py; on `ce[option=pretrain]` it is the linear probe of the frozen
base model).
Either part may carry a small grid in brackets: `proxyanchor[lam=0.1,0.5]+proxy[alpha=0.25,0.5]`,
`knnbert+knn[k=16,64;phi=0.25,0.5]`; a training parameter is any train.py flag, an inference one
alpha (proxy), k and phi (knn; knn-only has phi 1). The runner's --search 'lr=1e-5,3e-5;lam=0.1'
adds its training values to every method they apply to (with_search), as if written in each
method's brackets; a method's own values for a flag win.

A cell is (task, size, loss and one value of each training parameter, seed): it is trained once,
and every rule its methods ask for is scored on that one model, so `proxyanchor` and
`proxyanchor+proxy` share their training. Sizes: `full`, N (N examples drawn by class, train.py
--max_train) or Npc (N of each class, --per_class).
"""
import dataclasses
import itertools
import re
from dataclasses import dataclass

from minknn import MinknnError
from minknn.knn import settings

RULES = {"linear": (), "proxy": ("alpha",), "knn": ("k", "phi"), "knn-only": ("k",), "probe": ()}


@dataclass(frozen=True)
class Method:
    name: str         # as given, brackets and all
    loss: str
    train_grid: dict  # train.py flag -> values
    rule: str         # a key of RULES
    rule_grid: dict   # alpha, k or phi -> values

    @property
    def label(self):  # the table's row: the method without its grids
        return self.loss + ("" if self.rule == "linear" else "+" + self.rule)


@dataclass(frozen=True)
class Cell:
    task: str
    size: str
    seed: int
    loss: str
    params: tuple     # ((train.py flag, value), ...)

    @property
    def name(self):
        params = "".join(f"-{k}{v}" for k, v in self.params)
        return f"{self.task}-{self.size}-{self.loss}{params}-seed{self.seed}"


def knn_grid(method, kind, n_train, at):
    """A kNN method's grid entries, [{"params": {"k", "phi"}, **at(k, phi)}]: its bracket's K and
    phi values, else the task kind's defaults (minknn/knn.py); knn-only is phi = 1. K is capped at
    the training set's size, as the vote is."""
    default = settings(kind)
    phis = method.rule_grid.get("phi", [default.phi]) if method.rule == "knn" else [1.0]
    return [{"params": {"k": min(k, n_train), "phi": phi}, **at(k, phi)}
            for k, phi in itertools.product(method.rule_grid.get("k", [default.k]), phis)]


def split_top(text, sep):
    """Splits on `sep` outside brackets: 'a[x=1,2],b' -> ['a[x=1,2]', 'b']."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == sep and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    return pieces + [text[start:]]


def parse_grid(text, where, flag="--methods"):
    """'lam=0.1,0.5;k=16' -> {'lam': [0.1, 0.5], 'k': [16]} (numbers where they parse)."""
    grid, written = {}, {}
    for item in filter(None, text.split(";")):
        name, _, values = item.partition("=")
        name = name.strip()
        if not name or not values:
            raise MinknnError(f"{flag} {where}: '{item}' is not name=value,value")
        if name in grid:  # else the last would win, silently
            raise MinknnError(f"{flag} {where}: {name} is given twice; give its values once, "
                              f"e.g. {name}={written[name]},{values.strip()}")
        grid[name], written[name] = [number(v.strip()) for v in values.split(",")], values.strip()
    return grid


def number(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_method(text):
    m = re.fullmatch(r"([\w-]+)(?:\[([^\]]*)\])?(?:\+([\w-]+)(?:\[([^\]]*)\])?)?", text.strip())
    if not m:
        raise MinknnError(f"--methods: cannot read '{text}'; write loss[param=v,v]+rule[param=v], "
                          f"e.g. proxyanchor[lam=0.1,0.5]+proxy")
    loss, train_text, rule, rule_text = m.groups()
    rule = rule or "linear"
    if rule not in RULES or rule == "linear" and rule_text:
        raise MinknnError(f"--methods {text}: unknown inference rule '{rule}'; choose one of: "
                          f"{', '.join(r for r in RULES if r != 'linear')}")
    rule_grid = parse_grid(rule_text or "", text)
    wrong = [p for p in rule_grid if p not in RULES[rule]]
    if wrong:
        raise MinknnError(f"--methods {text}: the {rule} rule has no parameter "
                          f"{', '.join(wrong)}; it has: {', '.join(RULES[rule]) or 'none'}")
    for name, values in rule_grid.items():
        bad = [v for v in values if not (isinstance(v, int) and v >= 1 if name == "k" else
                                         isinstance(v, (int, float)) and 0 <= v <= 1)]
        if bad:
            need = "a whole number >= 1" if name == "k" else "a number in [0, 1]"
            raise MinknnError(f"--methods {text}: {name} must be {need}, got {bad[0]}")
    return Method(text.strip(), loss, parse_grid(train_text or "", text), rule, rule_grid)


def with_search(method, search, applies):
    """The method trained with every value of --search that applies to it (applies(flag) says
    whether train.py takes the flag with this method's loss); its own bracketed values win:
    `ce[lr=1e-5]` with --search 'lr=1e-5,3e-5;lam=0.1,0.5' trains ce at lr 1e-5 only, and
    without lam, which ce has no term to weigh."""
    added = {flag: values for flag, values in search.items()
             if flag not in method.train_grid and applies(flag)}
    return dataclasses.replace(method, train_grid={**added, **method.train_grid})


def search_text(search):
    """--search as one canonical string (grid.json, the table): 'lr=1e-05,3e-05;lam=0.1'."""
    return ";".join(f"{k}={','.join(map(str, v))}" for k, v in search.items())


def parse_sizes(text):
    sizes = [s.strip() for s in text.split(",")]
    for s in sizes:
        if not re.fullmatch(r"full|[1-9]\d*(pc)?", s):
            raise MinknnError(f"--sizes: '{s}' is not full, N (examples) or Npc (per class)")
    return sizes


def parse_seeds(text):
    seeds = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise MinknnError(f"--seeds: '{part}' is not a seed or a range like 0-4")
        seeds += range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)
    return sorted(set(seeds))


def size_flags(size):
    if size == "full":
        return []
    if size.endswith("pc"):
        return ["--per_class", size[:-2]]
    return ["--max_train", size]


def cells_of(tasks, methods, sizes, seeds):
    """Every cell of the grid in running order (size, seed, task, then method: a grid stopped
    early holds whole seeds), and for each the methods that read it."""
    cells = {}
    for size, seed, task, method in itertools.product(sizes, seeds, tasks, methods):
        names = list(method.train_grid)
        for values in itertools.product(*method.train_grid.values()):
            cell = Cell(task, size, seed, method.loss, tuple(zip(names, values)))
            cells.setdefault(cell, []).append(method)
    return cells
