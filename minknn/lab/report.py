"""The grid's table, from results.jsonl alone (minknn/lab/runner.py writes it): the hyper-parameters
chosen on the selection split, then mean +- std over seeds on the test split, with the p-value
of a paired test against the baseline on the same seeds (minknn/lab/stats.py). Where the test has no
p (the t-test below 3 seeds, or with every seed's difference the same) the cell says "no p" and
a note under the table says why; a sign-flip table too small to reach 0.05 says that too.

Selection, per task, size and method: every candidate (a value of each training parameter and
each inference parameter) gets the mean over seeds of its selection score in the first --metric;
the best candidate is the method's, and its test scores are the ones reported. The test split
never takes part: its labels could be anything (tests/test_runner.py poisons them to check).
A grid run with --select none has no selection scores and one candidate per method, which wins.

Under the tables: the budget (each method's trainings per task, size and seed, and why two
differ: a --search value that does not apply to a method's loss), the values chosen, the
selection and the test split.
"""
import collections
import json
import os
import re

from minknn import MinknnError
from minknn.lab.grid import search_text
from minknn.lab.stats import (MAX_SIGN_FLIP, mean_std, paired_t, sign_flip, sign_flip_floor,
                              t_undefined)
from minknn.metrics import METRICS, RANGES
from minknn.tools.files import atomic_save, read_json, read_jsonl

LOWER_IS_BETTER = {"hamming"}
TESTS = {"t": "paired t-test", "signflip": "exact sign-flip test"}


def read_results(folder):
    path = os.path.join(folder, "results.jsonl")
    if not os.path.exists(path):
        raise MinknnError(f"{path}: not found; run the grid first (python -m minknn.lab.runner "
                          f"...)")
    fix = ("run the grid's command again: it rewrites results.jsonl from the cells' own "
           "runs/*/cell.json, retraining none")
    lines = read_jsonl(path, fix=fix)
    for n, line in enumerate(lines, 1):
        wrong = impossible_score(line)
        if wrong:
            raise MinknnError(f"{path}:{n}: {wrong}; {fix}")
    return lines


def impossible_score(line):
    """Where a result line holds a figure no score can be (an accuracy of 2.5 or -1, NaN, a
    string: an edit by hand, a damaged file), said in words: 'grid[0].test.acc is 2.5, ...'; else
    None. Scores are shares in [0, 1], or correlations in [-1, 1] (metrics.RANGES)."""
    places = [(f"{part}[{i}].{split}", entry.get(split))
              for part, split in (("grid", "select"), ("grid", "test"), ("sweep", "select"),
                                  ("sweep", "test"), ("curve", "dev"))
              for i, entry in enumerate(line.get(part) or []) if isinstance(entry, dict)]
    for where, scores in places:
        for metric, value in (scores.items() if isinstance(scores, dict) else []):
            if metric not in RANGES:
                continue
            low, high = RANGES[metric]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not low <= value <= high:  # NaN fails both comparisons
                return (f"{where}.{metric} is {json.dumps(value)}, which no {metric} can be (a "
                        f"number in [{low}, {high}])")
    return None


def candidate(line, entry):
    return (tuple(sorted(line["train_params"].items())), tuple(sorted(entry["params"].items())))


def better(metric, a, b):
    return a < b if metric in LOWER_IS_BETTER else a > b


def choose(lines, metric):
    """(task, size, method) -> {"params": the chosen candidate, "test": {seed: test scores},
    "diverged": [seeds]}, in the order the lines first name them. metric: a score's name, or a
    dict task -> name. Candidates are compared over the seeds they all have (a candidate that
    diverged on a hard seed is not compared on the easy ones only)."""
    groups = collections.OrderedDict()
    for line in lines:
        groups.setdefault((line["task"], line["size"], line["method"]), []).append(line)
    chosen = collections.OrderedDict()
    for (task, size, method), group in groups.items():
        name = metric if isinstance(metric, str) else metric[task]
        diverged = sorted({ln["seed"] for ln in group if "diverged" in ln})
        by_candidate = collections.defaultdict(dict)  # candidate -> seed -> grid entry
        for line in group:
            for entry in line.get("grid", []):
                by_candidate[candidate(line, entry)][line["seed"]] = entry
        common = set.intersection(*map(set, by_candidate.values())) if by_candidate else set()
        best = None
        unscored = [c for c, seeds in by_candidate.items()
                    if not all(e.get("select") for e in seeds.values())]
        if unscored and len(by_candidate) > 1:  # --select none: nothing to choose between them
            raise MinknnError(f"{task} {size} {method}: {len(by_candidate)} candidates and no "
                              f"selection scores to choose one (--select none takes one value "
                              f"of each parameter)")
        for cand, seeds in by_candidate.items():  # the first of equals wins: the grid's order
            if unscored:  # the only candidate
                best = (None, cand)
                break
            values = [e["select"][name] for s, e in seeds.items() if s in common or not common]
            value = sum(values) / len(values)
            if best is None or better(name, value, best[0]):
                best = (value, cand)
        chosen[task, size, method] = {
            "params": best and best[1], "diverged": diverged,
            "test": {s: e["test"] for s, e in by_candidate[best[1]].items()} if best else {}}
    return chosen


def fmt(metric, value):
    return f"{value:.4f}" if metric in LOWER_IS_BETTER else f"{100 * value:.2f}"


def table(lines, metrics=None, baseline=None, test="t", chosen_on=None):
    """The Markdown report: one table per size and metric, then the choices and the notes. With
    chosen_on (the development tasks, runner --chosen_on), the development tasks and the held-out
    ones in tables of their own, each with its own mean."""
    if not lines:
        return "no finished cells yet\n"
    sizes = list(dict.fromkeys(ln["size"] for ln in lines))
    tasks = list(dict.fromkeys(ln["task"] for ln in lines))
    methods = list(dict.fromkeys(ln["method"] for ln in lines))
    labels = {ln["method"]: ln["label"] for ln in lines}
    if len(set(labels.values())) < len(labels):  # two grids of one label: show the full names
        labels = {m: m for m in methods}
    baseline = baseline or methods[0]
    first_metric = {ln["task"]: next(iter(ln["grid"][0]["test"])) for ln in lines if "grid" in ln}
    # one table per --metric, or one in each task's own first score
    tables = [{t: m for t in tasks} for m in metrics] if metrics else [first_metric]
    out = []
    for size in sizes:
        chosen = choose([ln for ln in lines if ln["size"] == size], tables[0])
        here = [t for t in tasks if any(k[0] == t for k in chosen)]
        groups = [("", here)] if chosen_on is None else [
            (f"Development tasks (the methods and settings were chosen on {', '.join(chosen_on)})"
             ":", [t for t in here if t in chosen_on]),
            ("Held out (nothing was chosen on them; fixed before any result on them):",
             [t for t in here if t not in chosen_on])]
        for title, group in groups:
            if not group:
                continue
            for metric_of in tables:
                out += ([""] + [title] if title else []) + size_table(
                    size, {t: metric_of[t] for t in group}, group, methods, labels,
                    {k: c for k, c in chosen.items() if k[0] in group}, baseline, test)
        out += choices_note(size, here, methods, labels, chosen, lines[0].get("select"))
    splits = {(ln["task"], ln["size"]): (ln["test_split"], ln["n_test"], ln["n_select"])
              for ln in lines if "grid" in ln}
    used = {m for metric_of in tables for m in metric_of.values()}
    scale = "scores x 100" + ("; Hamming loss as is" if "hamming" in used else "")
    select = next(ln["select"] for ln in lines)
    out += ["", f"Test split, mean ± std over seeds ({scale}). Bold: the best mean of a column "
            f"(the lowest Hamming loss). p: the two-sided {TESTS[test]} against {labels[baseline]} "
            f"over the seeds both have; * p < 0.05. mean: each seed's mean over the tasks."]
    out += budget_note(lines, methods, labels)
    if select == "none":
        out.append("Selection (none): the last epoch and the given values; no dev labels choose "
                   "anything (each epoch's dev scores draw the learning curve only). "
                   + "; ".join(f"{t} {size}: the curve on {n_sel} dev examples, scored on {name} "
                               f"({n_test})" for (t, size), (name, n_test, n_sel) in splits.items())
                   + ".")
    else:
        out.append(f"Selection ({select}): the epoch and every hyper-parameter, on "
                   + "; ".join(f"{t} {size}: {n_sel} dev examples, scored on {name} ({n_test})"
                               for (t, size), (name, n_test, n_sel) in splits.items()) + ".")
    counted = {}  # a cell's time once, whichever methods read it
    for ln in lines:
        if "seconds" in ln:
            counted[ln["cell"]] = ln["seconds"]["train"] + ln["seconds"]["evaluate"]
    out.append(f"Cells: {len({ln['cell'] for ln in lines})}, "
               f"{sum(counted.values()) / 60:.1f} min of training and evaluation.")
    return "\n".join(out) + "\n"


def compare(test, a, b):
    """(p, None), or (None, why the test gives no p) for a method's scores a against the
    baseline's b on the seeds both have."""
    if not a:
        return None, "no seed in common with the baseline"
    if test == "t":
        why = t_undefined(a, b)
        return (None, why) if why else (paired_t(a, b), None)
    return sign_flip(a, b), None


def size_table(size, metric_of, tasks, methods, labels, chosen, baseline, test):
    """One table: rows methods, columns tasks (each in metric_of[task]) and, when they share a
    metric, their mean; under it, the cells without a p and why."""
    by_seed = {}  # (method, task) -> {seed: value}
    for (task, _, method), c in chosen.items():
        by_seed[method, task] = {s: v[metric_of[task]] for s, v in c["test"].items()}
    shared = len(set(metric_of.values())) == 1
    columns = tasks + (["mean"] if len(tasks) > 1 and shared else [])
    metric_of = dict(metric_of, mean=metric_of[tasks[0]])
    for method in methods:  # each seed's mean over the tasks, for the seeds all tasks have
        seeds = set.intersection(*(set(by_seed.get((method, t), {})) for t in tasks))
        by_seed[method, "mean"] = {s: sum(by_seed[method, t][s] for t in tasks) / len(tasks)
                                   for s in sorted(seeds)}
    means = {k: mean_std(list(v.values())) for k, v in by_seed.items() if v}
    what = f"{size[:-2]} per class" if size.endswith("pc") else \
        "all examples" if size == "full" else f"{size} examples"
    header = [c if shared else f"{c} ({METRICS[metric_of[c]][1]})" for c in columns]
    score_name = METRICS[metric_of[tasks[0]]][1] if shared else "each task's first score"
    rows = [f"| {what}, {score_name} | " + " | ".join(header) + " |",
            "|---" * (len(columns) + 1) + "|"]
    no_p = collections.defaultdict(dict)  # why -> method -> the columns it has no p in
    pairs = []  # each p's number of seeds
    for method in methods:
        cells = []
        for column in columns:
            if (method, column) not in means:
                cells.append("–")
                continue
            metric, (mean, std) = metric_of[column], means[method, column]
            best = all(not better(metric, means[m, column][0], mean)
                       for m in methods if (m, column) in means)
            text = f"{fmt(metric, mean)} ± {fmt(metric, std)}"
            text = f"**{text}**" if best else text
            base = by_seed.get((baseline, column), {})
            paired = sorted(set(base) & set(by_seed[method, column]))  # by seed, not by position
            if method != baseline:
                p, why = compare(test, [by_seed[method, column][s] for s in paired],
                                 [base[s] for s in paired])
                if why:
                    no_p[why].setdefault(labels[method], []).append(column)
                    text += " (no p)"
                else:
                    pairs.append(len(paired))
                    text += f" (p {p:.3f}{'*' if p < 0.05 else ''})"
            cells.append(text)
        rows.append(f"| {labels[method]} | " + " | ".join(cells) + " |")
    seeds = sorted({s for (m, t), v in by_seed.items() if t != "mean" for s in v})
    notes = ["No p for " + "; ".join(f"{m} ({', '.join(cols)})" for m, cols in where.items())
             + f": {why}." for why, where in no_p.items()]
    if test == "signflip" and pairs and sign_flip_floor(min(pairs)) >= 0.05:
        n = min(pairs)
        notes.append(f"The sign-flip test's smallest p with {n} paired seed{'s' * (n > 1)} is "
                     f"{sign_flip_floor(n):.3g}: no star is possible below 6 seeds.")
    return ["", f"Seeds: {', '.join(map(str, seeds))}.", ""] + rows + \
        (["", *notes] if notes else [])


def budget_note(lines, methods, labels):
    """Each method's trainings per task, size and seed (its training candidates), and where it has
    fewer than the most, the flags it lacks: a --search flag that does not apply to its loss (or
    one it was not given), or fewer values of its own."""
    trainings = collections.defaultdict(lambda: collections.defaultdict(set))  # method -> cell
    values = collections.defaultdict(lambda: collections.defaultdict(set))  # method -> flag
    search = {}
    for ln in lines:
        key = (ln["task"], ln["size"], ln["seed"])
        trainings[ln["method"]][key].add(tuple(sorted(ln["train_params"].items())))
        for flag, value in ln["train_params"].items():
            values[ln["method"]][flag].add(value)
        search.update(ln.get("search") or {})
    counts = {m: sorted({len(t) for t in trainings[m].values()}) for m in methods}
    top = max(c[-1] for c in counts.values())
    searched = f" (--search {search_text(search)})" if search else ""
    if top == 1 and not search:
        return []  # one training each, nothing searched: nothing to say
    full = [m for m in methods if counts[m] == [top]]
    if len(full) == len(methods):
        return [f"Budget: {top} training{'s' * (top > 1)} per task, size and seed for every "
                f"method{searched}."]
    most = {}  # flag -> the most values a method of the full budget has
    for m in full:
        for flag, vs in values[m].items():
            most[flag] = max(most.get(flag, 0), len(vs))
    budgets = []
    for m in methods:
        if m in full:
            continue
        n = "-".join(map(str, counts[m]))
        why = [f"{flag} does not apply" if flag in search else f"no {flag}"
               for flag in most if flag not in values[m]]
        why += [f"its own {flag}={','.join(map(str, sorted(values[m][flag])))}"
                for flag in most if 0 < len(values[m].get(flag, ())) < most[flag]]
        budgets.append(f"{labels[m]}: {n} training{'s' * (n != '1')}"
                     + (f" ({', '.join(why)})" if why else ""))
    rest = f"{labels[full[0]]}: {top} trainings" if len(full) == 1 else f"the others {top}"
    return [f"Budget, trainings per task, size and seed{searched}: {', '.join(budgets)}, {rest}."]


def choices_note(size, tasks, methods, labels, chosen, select=None):
    notes = []
    for method in methods:
        for task in tasks:
            c = chosen.get((task, size, method))
            if not c:
                continue
            params = [f"{k}={v}" for part in (c["params"] or ()) for k, v in part]
            if c["diverged"]:
                notes.append(f"{labels[method]} on {task}: diverged with seed(s) "
                             f"{', '.join(map(str, c['diverged']))} (left out)")
            if params:
                notes.append(f"{labels[method]} on {task}: {', '.join(params)}")
    what = "Given, chosen by nothing" if select == "none" else "Chosen"
    return ["", f"{what} ({size}): " + "; ".join(notes) + "."] if notes else []


def block_file(path, tag):
    """The text of the file a table goes into (RESULTS.md) and the pattern of its block, checked
    before any table is written: the file is there, readable, writable, and holds the block."""
    start, end = f"<!-- {tag} -->", f"<!-- /{tag} -->"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise MinknnError(f"--write {path}: not found; create it with the two markers '{start}' "
                          f"and '{end}' where the table goes") from None
    except UnicodeDecodeError:
        raise MinknnError(f"--write {path}: not UTF-8 text; give the Markdown file the table "
                          f"goes into") from None
    except OSError as e:  # a folder, no permission
        raise MinknnError(f"--write {path}: cannot be read ({e.strerror}); give the Markdown "
                          f"file the table goes into") from None
    if not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
        raise MinknnError(f"--write {path}: its folder cannot be written (the file is replaced "
                          f"by a renamed copy)")
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise MinknnError(f"--write {path}: no block '{start}' ... '{end}' to replace; add the two "
                          f"markers where the table goes")
    return text, pattern


def write_block(path, tag, lines):
    """Replaces the block between `<!-- TAG -->` and `<!-- /TAG -->` in the file at path
    (RESULTS.md) with lines, so that its tables are a command's output, never typed by hand."""
    text, pattern = block_file(path, tag)
    block = "\n".join([f"<!-- {tag} -->", *lines, f"<!-- /{tag} -->"])
    atomic_save(pattern.sub(lambda _: block, text), path, lambda t, f: f.write(t.encode()))
    print(f"written into {path}")


def check_test(test, lines):
    seeds = {ln["seed"] for ln in lines}
    if test == "signflip" and len(seeds) > MAX_SIGN_FLIP:
        raise MinknnError(f"--test signflip enumerates 2^n sign patterns: {len(seeds)} seeds are "
                          f"more than {MAX_SIGN_FLIP}; use --test t")


def runner_tag(folder):
    """The name of a grid's block in a --write file: `runner NAME`, NAME the folder's name."""
    return f"runner {os.path.basename(os.path.normpath(folder))}"


def write_report(folder, metric=None, baseline=None, test="t", write=None):
    """Writes <folder>/table.md, and with `write` the table into that file's block
    `<!-- runner NAME -->` (NAME: the folder's name); returns the table's text."""
    lines = read_results(folder)
    grid = os.path.join(folder, "grid.json")  # --chosen_on (a grid from before it: none)
    chosen_on = read_json(grid).get("chosen_on") if os.path.exists(grid) else None
    metrics = metric.split(",") if metric else None
    unknown = [m for m in metrics or [] if m not in METRICS]
    methods = list(dict.fromkeys(ln["method"] for ln in lines))
    if unknown or (baseline and baseline not in methods):
        what = f"--metric {','.join(unknown)}: choose from {', '.join(METRICS)}" if unknown else \
            f"--baseline {baseline}: not a method of this grid ({', '.join(methods)})"
        raise MinknnError(what)
    for m in metrics or []:
        missing = next((ln for ln in lines if "grid" in ln and m not in ln["grid"][0]["test"]),
                       None)
        if missing:
            raise MinknnError(f"--metric {m}: not a score of {missing['task']} (it has: "
                              f"{', '.join(missing['grid'][0]['test'])})")
    check_test(test, lines)
    tag = runner_tag(folder)
    if write:
        block_file(write, tag)  # before table.md: a bad --write leaves nothing half done
    text = table(lines, metrics, baseline, test, chosen_on)
    path = os.path.join(folder, "table.md")
    atomic_save(text, path, lambda t, f: f.write(t.encode()))
    print(text)
    print(f"table in {path}")
    if write:
        write_block(write, tag, text.rstrip("\n").split("\n"))
    return text
