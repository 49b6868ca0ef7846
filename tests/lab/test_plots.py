"""minknn/lab/plots.py on synthetic results.jsonl lines: the file names, valid PNGs, diverged lines
skipped, no picture without its data. matplotlib is an optional extra: skipped without it."""
import os
import random

import pytest

pytest.importorskip("matplotlib")
from minknn.lab import plots  # noqa: E402
from minknn.lab.plots import draw_all, safe, training_name  # noqa: E402

PNG = b"\x89PNG"


def line(task, size, seed, method, rule, cell=None, classes=0, epochs=3):
    """One results.jsonl line as minknn/lab/runner.py writes it, with made-up scores in [0, 1]."""
    rng = random.Random(f"{task}{size}{seed}{method}")

    def scores():
        return {"acc": rng.random(), "macro_f1": rng.random()}
    label = method.split("[")[0]
    ln = {"task": task, "size": size, "seed": seed, "method": method, "label": label,
          "rule": rule, "cell": cell or f"{task}-{size}-{label}-seed{seed}", "train_params": {},
          "select": "sample", "test_split": "test", "n_train": 32, "n_select": 8, "n_test": 8,
          "best_epoch": 1, "seconds": {"train": 1.0, "evaluate": 0.1},
          "grid": [{"params": {"alpha": a}, "select": scores(), "test": scores()}
                   for a in (0.25, 0.5)],
          "curve": [{"epoch": e + 1, "train_loss": 2.0 / (e + 1) + rng.random() / 4,
                     "dev": scores()} for e in range(epochs)]}
    if rule.startswith("knn"):
        ln["sweep"] = [{"k": k, "phi": i / 10, "select": scores(), "test": scores()}
                       for k in (1, 4, 16, 32) for i in range(11)]  # K capped at n_train
    if classes:
        n = 12 * classes
        labels = [i % classes for i in range(n)]
        ln["map"] = {"labels": labels, "label_names": [f"class {c}" for c in range(classes)],
                     "before": [[rng.gauss(0, 1), rng.gauss(0, 1)] for _ in labels],
                     "after": [[3 * (c % 3) + rng.gauss(0, 0.4), 3 * (c // 3) + rng.gauss(0, 0.4)]
                               for c in labels]}
    return ln


def grid(tasks=("mr", "cr"), sizes=("8",), seeds=(0, 1), knn=True, classes=2):
    """ce (linear), proxyanchor+proxy[...] and, in one cell, knnbert+knn and knnbert+knn-only;
    the maps on the first seed's lines, as the runner writes them."""
    out = []
    for task in tasks:
        for size in sizes:
            for seed in seeds:
                first = classes if seed == seeds[0] else 0
                out.append(line(task, size, seed, "ce", "linear", classes=first))
                out.append(line(task, size, seed, "proxyanchor+proxy[alpha=0.25,0.5]", "proxy",
                                classes=first))
                if knn:
                    cell = f"{task}-{size}-knnbert-seed{seed}"
                    out.append(line(task, size, seed, "knnbert+knn", "knn", cell, first))
                    out.append(line(task, size, seed, "knnbert+knn-only", "knn-only", cell))
    return out


def names(paths):
    return sorted(os.path.basename(p) for p in paths)


def check_pngs(folder, paths):
    assert sorted(os.listdir(folder)) == names(paths)  # no temporary file left behind
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(4) == PNG, path


def test_small_grid(tmp_path):
    folder = tmp_path / "plots"
    paths = draw_all(grid(tasks=("mr",)), str(folder))
    assert names(paths) == ["bars-8.png", "curves-mr-8.png", "map-mr-8-ce.png",
                            "map-mr-8-knnbert+knn.png", "map-mr-8-proxyanchor+proxy.png",
                            "sweep-mr-8.png"]
    check_pngs(folder, paths)


def test_diverged_and_missing_data(tmp_path):
    lines = grid(tasks=("mr",), knn=False, classes=0)
    lines.append({"task": "mr", "size": "8", "seed": 2, "method": "ce", "label": "ce",
                  "rule": "linear", "cell": "mr-8-ce-seed2", "train_params": {},
                  "select": "sample", "diverged": "loss is nan at epoch 1"})
    lines.append(dict(lines[-1], task="sst", cell="sst-8-ce-seed2"))  # a task with nothing else
    for ln in lines[:2]:
        ln["curve"] = []
    paths = draw_all(lines, str(tmp_path / "p"), metric="macro_f1")
    assert names(paths) == ["bars-8.png", "curves-mr-8.png"]  # no sweep, no map, no sst
    check_pngs(tmp_path / "p", paths)
    assert draw_all(lines[-2:], str(tmp_path / "none")) == []  # only diverged lines


def test_many_tasks_methods_and_classes(tmp_path):
    """The layout with 6 tasks x 4 methods x 5 seeds, 6 classes in a map and 14 in another
    (a colour scale, no legend). Kept fast: no curves or sweeps, maps on one task only."""
    lines = grid(tasks=[f"task{i}" for i in range(6)], sizes=("full",), seeds=range(5),
                 classes=0)
    for ln in lines:
        ln.pop("sweep", None)
        ln["curve"] = []
    lines[0]["map"] = line("task0", "full", 0, "ce", "linear", classes=6)["map"]
    lines[1]["map"] = line("task0", "full", 0, "ce", "linear", classes=14)["map"]
    lines[1]["label"] = "odd name/with:chars"
    paths = draw_all(lines, str(tmp_path))
    assert names(paths) == ["bars-full.png", "map-task0-full-ce.png",
                            "map-task0-full-odd_name_with_chars.png"]
    check_pngs(tmp_path, paths)


def test_safe():
    assert safe("a+b[k=1,2]/c d") == "a+b_k_1_2__c_d"


def test_curves_give_each_training_its_own_loss_axis(tmp_path, monkeypatch):
    """ce, knnbert (read by knnbert+knn and knnbert+knn-only) and proxyanchor at two lam: four
    trainings, four loss axes, one dev axis; every curve named by its training."""
    lines = grid(tasks=("mr",), classes=0)
    for ln in lines:
        ln.pop("sweep", None)
    lines = [ln for ln in lines if ln["label"] != "proxyanchor+proxy"]
    for lam in (0.1, 0.5):
        for seed in (0, 1):
            ln = line("mr", "8", seed, "proxyanchor[lam=0.1,0.5]+proxy", "proxy",
                      cell=f"mr-8-proxyanchor-lam{lam}-seed{seed}")
            ln["train_params"] = {"lam": lam}
            lines.append(ln)
    figures = {}
    monkeypatch.setattr(plots, "save", lambda fig, folder, filename, written:
                        figures.setdefault(filename, fig))
    draw_all(lines, str(tmp_path))
    fig = figures["curves-mr-8.png"]
    trainings = ["ce", "knnbert", "proxyanchor[lam=0.1]", "proxyanchor[lam=0.5]"]
    axes = {ax.get_title(): ax for ax in fig.axes}
    loss_axes = [t for t in axes if t.endswith(": training loss")]
    assert loss_axes == [f"{t}: training loss" for t in trainings], \
        f"plots.draw_curves: one training-loss axis per training, titled by it; got {list(axes)}"
    for title in loss_axes:
        curves = axes[title].get_lines()
        assert len(curves) == 1, f"plots.draw_curves: {title} mixes {len(curves)} trainings' losses"
        name = title.split(":")[0]
        runs = [ln for ln in lines if training_name(ln) == name and ln["rule"] != "knn-only"]
        want = [sum(ln["curve"][e]["train_loss"] for ln in runs) / len(runs) for e in range(3)]
        assert list(curves[0].get_ydata()) == pytest.approx(want), \
            f"plots.draw_curves: {title} does not plot that training's mean loss per epoch"
    dev = axes["accuracy on the selection split"]
    assert [c.get_label() for c in dev.get_lines()] == [f"{t} (n=2)" for t in trainings], \
        "plots.draw_curves: the dev axis holds one curve per training"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [f"{t} (n=2)" for t in trainings], \
        f"plots.draw_curves: the dev curves are named by their training, not a rule: {legend}"
    assert len(fig.axes) == 5, f"plots.draw_curves: no empty axes left over: {len(fig.axes)}"
    for f in figures.values():
        plots.plt.close(f)
