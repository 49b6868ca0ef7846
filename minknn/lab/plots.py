"""The grid's pictures, from results.jsonl alone (minknn/lab/runner.py writes it;
minknn/lab/report.py draws them after the table). One PNG per picture, scores plotted as they
are, in [0, 1]:

sweep-<task>-<size>.png   KNN-BERT's Figure 2 (Li et al.): the test score of each kNN method
                          against phi, the weight of the kNN vote against the linear head's
                          (phi = 1 is kNN alone), and against K (log axis); each panel at the
                          value the mix methods chose on the selection split (K = 64 and
                          phi = 0.25, KNN-BERT's, when none was chosen), or the nearest swept.
map-<task>-<size>-<name>.png   the test examples' representations in 2-D (PCA), coloured by class,
                          from the pretrained model and after fine-tuning: the clusters that the
                          contrastive and kNN papers show in their t-SNE pictures (first seed only).
curves-<task>-<size>.png  learning curves: the dev score after each epoch, every training on one
                          axis, and each training's loss on an axis of its own (the losses differ
                          in scale). A curve is a training (its loss and training parameters,
                          `proxyanchor[lam=0.1]`), not a method: the methods reading a cell share
                          its training.
bars-<size>.png           the table as a picture: one group of bars per task, one bar per method,
                          the test score of the candidate chosen on the selection split
                          (report.choose), mean +- std over seeds.

Every curve and bar is the mean over seeds, with +- 1 sample std (n - 1) as a band or error bar.
A diverged line has no scores and is left out everywhere. Each method keeps one colour throughout.
"""
import collections
import math
import os
import re
import statistics

import matplotlib
matplotlib.use("Agg")  # files only, no display; an ImportError here means no matplotlib
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullLocator  # noqa: E402

from minknn.lab.report import choose  # noqa: E402
from minknn.lab.stats import mean_std  # noqa: E402
from minknn.metrics import METRICS  # noqa: E402
from minknn.tools.files import atomic_save  # noqa: E402

DPI = 120
SWEEP_K, SWEEP_PHI = 64, 0.25  # KNN-BERT's defaults: each panel's fixed value when none was chosen
LEGEND_CLASSES = 10  # more classes than this: a colour scale instead of a legend


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def axis_label(split, metric):
    scale = "" if metric in ("pearson", "mcc") else " (0-1, not %)"  # those two are in [-1, 1]
    return f"{split} {METRICS[metric][1]}{scale}"


def namer(lines):
    """A line's legend name: its label; the method's full name where two methods share a label;
    with its training parameters where one method trains with several."""
    methods, trainings = collections.defaultdict(set), collections.defaultdict(set)
    for ln in lines:
        methods[ln["label"]].add(ln["method"])
        trainings[ln["method"]].add(tuple(sorted(ln["train_params"].items())))

    def name(ln):
        text = ln["label"] if len(methods[ln["label"]]) == 1 else ln["method"]
        if len(trainings[ln["method"]]) > 1:
            text += " (" + ",".join(f"{k}={v}" for k, v in sorted(ln["train_params"].items())) + ")"
        return text
    return name


def per_cell(lines, field, name):
    """The methods reading one cell share its training, hence its curve and its kNN sweep:
    {(their names): [the cell's line[field], one per seed]}."""
    cells = collections.OrderedDict()
    for ln in lines:
        cells.setdefault(ln["cell"], []).append(ln)
    out = collections.OrderedDict()
    for readers in cells.values():
        key = tuple(dict.fromkeys(name(ln) for ln in readers))
        out.setdefault(key, []).append(readers[0][field])
    return out


def band(ax, xs, runs, name, color):
    """The mean over runs ({x: value} each) at each x, and a shaded +- 1 std band."""
    xs = [x for x in xs if any(x in r for r in runs)]
    stats = [mean_std([r[x] for r in runs if x in r]) for x in xs]
    mean = [m for m, _ in stats]
    ax.plot(xs, mean, marker="o", markersize=3, label=f"{name} (n={len(runs)})", color=color)
    ax.fill_between(xs, [m - s for m, s in stats], [m + s for m, s in stats], color=color,
                    alpha=0.2, linewidth=0)


def save(fig, folder, filename, written):
    path = os.path.join(folder, filename)
    atomic_save(fig, path, lambda f, file: f.savefig(file, format="png", dpi=DPI,
                                                     bbox_inches="tight"))
    plt.close(fig)
    written.append(path)


def draw_sweep(group, task, size, metric, name, color, folder, written):
    knn = [ln for ln in group if ln.get("sweep")]
    if not knn:
        return
    ks = sorted({p["k"] for ln in knn for p in ln["sweep"]})
    phis = sorted({p["phi"] for ln in knn for p in ln["sweep"]})
    # each panel at the value the mix methods chose (the median over them), else KNN-BERT's
    chosen = [dict(c["params"][1]) for c in choose([ln for ln in knn if ln["rule"] == "knn"],
                                                   metric).values() if c["params"]]
    k_chosen, phi_chosen = [c["k"] for c in chosen if "k" in c], [c["phi"] for c in chosen
                                                                    if "phi" in c]
    k_want = statistics.median_low(k_chosen) if k_chosen else SWEEP_K
    phi_want = statistics.median_low(phi_chosen) if phi_chosen else SWEEP_PHI
    k = min(ks, key=lambda kk: (abs(math.log(kk / k_want)), kk))
    phi = min(phis, key=lambda p: (round(abs(p - phi_want), 9), p))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for names, sweeps in per_cell(knn, "sweep", name).items():
        runs = [{(p["k"], p["phi"]): p["test"][metric] for p in sw if metric in p["test"]}
                for sw in sweeps]  # one {(K, phi): score} per seed
        n, col = " / ".join(names), color[names[0]]
        band(left, phis, [{p: r[kk, p] for kk, p in r if kk == k} for r in runs], n, col)
        band(right, ks, [{kk: r[kk, p] for kk, p in r if p == phi} for r in runs], n, col)
    def how(given):  # --select none: the one value given, chosen by nothing
        fixed = knn[0].get("select") == "none"
        return ("given" if fixed else "chosen on the selection split") if given else \
            "KNN-BERT's default"
    left.set(xlabel="phi (weight of the kNN vote; 1 = kNN alone)", title=f"K = {k} "
             f"({how(k_chosen)})")
    right.set(xlabel="K (neighbours, log scale)", xscale="log", title=f"phi = {phi:g} "
              f"({how(phi_chosen)})")
    right.set_xticks(ks, [str(k) for k in ks], minor=False)
    right.xaxis.set_minor_locator(NullLocator())
    left.set_ylabel(axis_label("test", metric))
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(f"{task}, {size}: kNN sweep on the test split (mean +- std over seeds)")
    fig.tight_layout()
    save(fig, folder, f"sweep-{safe(task)}-{safe(size)}.png", written)


def draw_map(ln, name, folder, written):
    m = ln["map"]
    classes = sorted(set(m["labels"]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    cmap = plt.get_cmap("tab10" if len(classes) <= LEGEND_CLASSES else "viridis")
    for ax, key, title in zip(axes, ("before", "after"),
                              ("before fine-tuning", f"after fine-tuning with {name(ln)}")):
        xy = m[key]
        if len(classes) <= LEGEND_CLASSES:  # one scatter per class, for the legend
            for i, c in enumerate(classes):
                pts = [p for p, lab in zip(xy, m["labels"]) if lab == c]
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, alpha=0.7,
                           color=cmap(i), label=m["label_names"][c]
                           if c < len(m["label_names"]) else str(c))
        else:
            dots = ax.scatter([p[0] for p in xy], [p[1] for p in xy], s=10, alpha=0.7,
                              cmap=cmap, c=m["labels"])
        ax.set(xlabel="PC 1", ylabel="PC 2", title=title)
    if len(classes) <= LEGEND_CLASSES:
        axes[1].legend(title="class", fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    else:
        fig.colorbar(dots, ax=axes[1], label=f"class (index, {len(classes)} classes)")
    fig.suptitle(f"{ln['task']}, {ln['size']}: PCA of test representations "
                 f"({len(m['labels'])} examples, seed {ln['seed']})")
    fig.tight_layout()
    save(fig, folder, f"map-{safe(ln['task'])}-{safe(ln['size'])}-{safe(name(ln))}.png", written)


def training_name(ln):
    """What trained a line's cell: its loss and training parameters, e.g. `knnbert` or
    `proxyanchor[lam=0.1]`; never the inference rule, which every method reading the cell adds
    to the same training."""
    params = ",".join(f"{k}={v}" for k, v in sorted(ln["train_params"].items()))
    loss = ln["label"].split("+")[0]  # label: loss+rule
    return f"{loss}[{params}]" if params else loss


def draw_curves(group, task, size, metric, color, folder, written):
    """The dev score of every training on one axis; each training's loss on its own, since the
    losses differ in scale (knnbert's is (1 - lam) CE + lam times its contrastive term)."""
    by_training = per_cell([ln for ln in group if ln.get("curve")], "curve", training_name)
    if not by_training:
        return
    n = len(by_training) + 1
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols + 2, 3.2 * rows), squeeze=False)
    dev, *loss_axes = axes.flat
    for ((name,), curves), ax in zip(by_training.items(), loss_axes):
        epochs = sorted({p["epoch"] for c in curves for p in c})
        col = color[name]
        band(ax, epochs, [{p["epoch"]: p["train_loss"] for p in c} for c in curves], name, col)
        band(dev, epochs, [{p["epoch"]: p["dev"][metric] for p in c if metric in p["dev"]}
                           for c in curves], name, col)
        ax.set(xlabel="epoch", ylabel="training loss", title=f"{name}: training loss")
    for ax in loss_axes[len(by_training):]:
        ax.remove()
    for ax in (dev, *loss_axes[:len(by_training)]):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    split = "a dev sample (no choice: --select none)" if group[0].get("select") == "none" else \
        "the selection split"
    dev.set(xlabel="epoch", ylabel=axis_label("dev", metric),
            title=f"{METRICS[metric][1]} on {split}")
    fig.suptitle(f"{task}, {size}: learning curves of each training (mean +- std over seeds)")
    fig.tight_layout()
    fig.legend(*dev.get_legend_handles_labels(), title="trained with", fontsize=8,
               loc="upper center", bbox_to_anchor=(0.5, 0), ncol=min(4, len(by_training)))
    save(fig, folder, f"curves-{safe(task)}-{safe(size)}.png", written)


def draw_bars(lines, size, metric, color, folder, written):
    chosen = choose([ln for ln in lines if metric in ln["grid"][0]["test"]], metric)
    tasks = list(dict.fromkeys(t for t, _, _ in chosen))
    name = namer([dict(ln, train_params={}) for ln in lines])  # one bar per method
    methods = {ln["method"]: name(ln) for ln in lines}
    order = list(dict.fromkeys(methods.values()))
    width = 0.8 / len(order)
    fig, ax = plt.subplots(figsize=(max(6, 1.0 + len(tasks) * (0.4 + 0.22 * len(order))), 4.5))
    for (task, _, method), c in chosen.items():
        values = [v[metric] for v in c["test"].values()]
        if not values:
            continue
        mean, std = mean_std(values)
        i, j = tasks.index(task), order.index(methods[method])
        ax.bar(i - 0.4 + width * (j + 0.5), mean, width, yerr=std, capsize=2,
               color=color[methods[method]], label=methods[method])
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry per method
    ax.legend([handles[n] for n in order if n in handles], [n for n in order if n in handles],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 if len(tasks) < 7 else -0.2),
              ncol=len(order) if len(order) <= 6 else (len(order) + 1) // 2, fontsize=8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=0 if len(tasks) < 7 else 30)
    ax.set_ylabel(axis_label("test", metric))
    ax.set_title(f"size {size}: the chosen candidate on test (mean +- std over seeds)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save(fig, folder, f"bars-{safe(size)}.png", written)


def draw_all(lines, folder, metric=None):
    """Every picture of these results.jsonl lines into folder; returns the paths written."""
    lines = [ln for ln in lines if "diverged" not in ln and ln.get("grid")]
    if not lines:
        return []
    metric = metric or next(iter(lines[0]["grid"][0]["test"]))
    os.makedirs(folder, exist_ok=True)
    name = namer(lines)
    color = collections.defaultdict(lambda: f"C{len(color) % 10}")  # one per name, throughout
    for n in [*map(name, lines), *map(training_name, lines)]:
        color[n]  # the first mention takes the next colour; a training named as a method shares it
    written = []
    groups = collections.OrderedDict()
    for ln in lines:
        groups.setdefault((ln["task"], ln["size"]), []).append(ln)
    for (task, size), group in groups.items():
        draw_sweep(group, task, size, metric, name, color, folder, written)
        for ln in group:
            if "map" in ln:
                draw_map(ln, name, folder, written)
        draw_curves(group, task, size, metric, color, folder, written)
    for size in dict.fromkeys(ln["size"] for ln in lines):
        draw_bars([ln for ln in lines if ln["size"] == size], size, metric, color, folder,
                  written)
    return written
