"""minknn/tools/options.py and minknn/tools/checks.py, through train.py's get_args: the defaults that depend on
other flags, and each combination that cannot work refused with one line naming the flag
(test_train.py runs a few of them as a user would, in a subprocess)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minknn.lab import bench
import evaluate
from minknn import MinknnError
from minknn.lab import runner
from minknn.lab import flags as runner_flags
from minknn.tools import checks, cli, options
from helpers import DATA
from minknn.losses import BASE_LOSSES, LOSSES, loss_kind, need
from minknn.losses.decoupled import DecoupledTripletLoss
from minknn.model import Output


def refused(capsys, *flags):
    """The one-line error train.py's flags give (argparse's exit status 2)."""
    with pytest.raises(SystemExit) as exit:
        options.get_args(list(flags))
        pytest.fail(f"train.py {' '.join(flags)} was accepted (minknn/tools/checks.py check_args)")
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and "\n" not in err and err.startswith("error: "), err
    return err[len("error: "):]


def test_defaults_follow_the_run():
    args = options.get_args(["--task", "sst"])
    assert (args.tasks, args.loss, args.lr, args.proxy_lr, args.lam) == (["sst"], "ce", 5e-5, 5e-3, None)
    assert options.get_args(["--task", "sst", "--option", "pretrain"]).lr == 1e-3
    assert options.get_args(["--task", "goemotions"]).loss == "bce"  # a multi-label task's base loss
    assert options.get_args(["--task", "sts"]).loss is None  # --sts_loss trains it
    assert options.get_args(["--task", "multitask"]).tasks == ["sst", "quora", "sts"]
    args = options.get_args(["--task", "rte", "--loss", "knnbert"])
    assert (args.memory, args.momentum, args.m_most, args.m_least) == ("queue", 0.999, 50, 100)
    assert options.get_args(["--task", "sst", "--out", "x"]).out == "x"
    assert options.get_args(["--task", "sts"]).out is None  # train.main names a fresh folder (test_runs.py)


def test_head_init_probe_is_pretrains_default_where_a_head_can_be_fit():
    """--option pretrain trains the head alone: it starts as the probe (the logistic regression on the frozen
    encoder), unless no task has a head on one vector; fine-tuning keeps the random head unless asked."""
    default = {" ".join(flags): options.get_args(flags).head_init for flags in (
        ["--task", "sst"], ["--task", "sst", "--option", "pretrain"], ["--task", "goemotions", "--option", "pretrain"],
        ["--task", "sts", "--option", "pretrain"], ["--task", "quora", "--pair_mode", "siamese", "--option", "pretrain"],
        ["--task", "multitask", "--option", "pretrain"])}
    assert default == {"--task sst": "random", "--task sst --option pretrain": "probe",
                       "--task goemotions --option pretrain": "probe", "--task sts --option pretrain": "random",
                       "--task quora --pair_mode siamese --option pretrain": "random",
                       "--task multitask --option pretrain": "probe"}, \
        f"--head_init's defaults (minknn/tools/checks.py check_head_init): {default}"
    assert options.get_args(["--option", "pretrain", "--head_init", "random"]).head_init == "random", \
        "--head_init random under --option pretrain must be kept"


def test_steps_and_mlcon_reduction_are_kept_and_filled():
    args = options.get_args(["--steps", "200", "--epochs", "10"])
    assert (args.steps, args.epochs, args.steps_per_epoch) == (200, 10, None), "--steps: kept as given"
    assert options.get_args(["--task", "reuters", "--loss", "mlcon"]).mlcon_reduction == "sum", \
        "--loss mlcon's reduction defaults to the paper's sum"
    assert options.get_args(["--task", "reuters", "--loss", "mlcon", "--mlcon_reduction", "mean"]).mlcon_reduction \
        == "mean"
    assert options.get_args(["--task", "reuters"]).mlcon_reduction is None, "bce has no --mlcon_reduction"


@pytest.mark.parametrize("flags, message", [
    (["--tasks", "sst,sts"], "--tasks is for --task multitask"),
    (["--task", "multitask", "--tasks", "sst,sts,sst"], "--tasks sst,sts,sst names a task twice"),
    (["--task", "sts", "--pcgrad"], "--pcgrad resolves conflicts between tasks' gradients; it needs --task "
                                    "multitask with two tasks or more"),
    (["--task", "multitask", "--pair_loss", "mnrl"], "--pair_loss compares the two texts' vectors: it needs "
                                                     "--pair_mode siamese and a paraphrase task"),
    (["--task", "rte", "--pair_mode", "siamese", "--pair_loss", "mnrl"], "and a paraphrase task"),  # RTE is not one
    (["--task", "multitask", "--loss", "knnbert"], "--loss knnbert is for runs of one classification task"),
    (["--task", "mrpc", "--pair_mode", "siamese", "--loss", "supcon"], "--loss supcon compares one vector per "
                                                                        "example, and with --pair_mode siamese"),
    (["--task", "sts", "--loss", "supcon"], "--loss supcon trains classification tasks, and sts has none"),
    (["--task", "reuters", "--loss", "ce"], "--loss ce trains classification tasks, and reuters has none"),
    (["--task", "sst", "--loss", "mlcon"], "--loss mlcon trains multi-label tasks, and sst has none"),
    (["--task", "goemotions", "--decoupled"], "--decoupled trains a retrieval head for a classification task, "
                                              "and goemotions has none"),
    (["--decoupled", "--loss", "supcon"], "--decoupled trains its own triplet loss on the retrieval head; use it "
                                          "with --loss ce, not supcon"),
    (["--task", "goemotions", "--loss", "bce", "--lam", "0.5"], "--lam weighs a metric-learning loss against the "
                                                                "base loss; --loss bce is the base loss alone"),
    (["--task", "sts", "--lam", "0.5"], "--loss mse is the base loss alone"),
    (["--loss", "supcon", "--lam", "1.5"], "--lam must be a finite number in [0, 1], got 1.5"),
    (["--warmup", "1.5"], "--warmup must be a finite number in [0, 1], got 1.5"),
    (["--lr", "-1"], "--lr must be a finite number >= 0, got -1.0"),
    (["--steps_per_epoch", "0"], "--steps_per_epoch must be at least 1, got 0"),
    (["--max_eval", "0"], "--max_eval must be at least 1, got 0"),
    (["--loss", "knnbert", "--queue_size", "0"], "--queue_size must be at least 1, got 0"),
    (["--m_most", "5"], "--m_most is a flag of --loss knnbert, not of --loss ce"),
    (["--loss", "moco", "--m_least", "5"], "--m_least is a flag of --loss knnbert, not of --loss moco"),
    (["--queue_size", "5", "--loss", "supcon"], "--queue_size is a flag of --loss knnbert and moco, not of --loss "
                                                "supcon"),
    (["--loss", "knnbert", "--memory", "bank", "--queue_size", "5"], "--queue_size and --momentum are for "
                                                                     "--memory queue"),
    (["--loss", "knnbert", "--m_most", "0", "--m_least", "0"], "must be >= 0 and select at least one positive"),
    (["--pooling", "sum"], "argument --pooling: invalid choice: 'sum'"),
    (["--steps", "10", "--epochs", "3"], "--steps must be a multiple of --epochs 3 (each epoch is N / --epochs "
                                         "steps), got 10"),
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--steps", "6", "--epochs", "3", "--steps_per_epoch", "2"], "--steps N makes each epoch N / --epochs steps; "
                                                                  "leave out --steps_per_epoch"),
    (["--task", "sts", "--head_init", "probe"], "--head_init probe fits a classification or multi-label head on one "
                                                "vector per example, and sts has none"),
    (["--task", "quora", "--pair_mode", "siamese", "--head_init", "probe"], "and quora has none (a similarity task, "
                                                                             "or a pair task under --pair_mode siamese)"),
    (["--task", "goemotions", "--mlcon_reduction", "mean"], "--mlcon_reduction is a flag of --loss mlcon, not of "
                                                             "--loss bce"),
    (["--task", "sst", "--loss", "supcon", "--mlcon_reduction", "sum"], "--mlcon_reduction is a flag of --loss "
                                                                          "mlcon, not of --loss supcon"),
    (["--task", "reuters", "--loss", "mlcon", "--mlcon_reduction", "max"], "--mlcon_reduction: invalid choice"),
    (["--setfit_iterations", "5"], "--setfit_iterations is a flag of --loss setfit, not of --loss ce"),
    (["--loss", "setfit", "--setfit_iterations", "0"], "--setfit_iterations must be at least 1, got 0"),
    (["--task", "multitask", "--tasks", "sst,cfimdb", "--loss", "setfit"], "--loss setfit trains one "
                                                                           "classification task"),
    (["--task", "sts", "--loss", "setfit"], "--loss setfit trains classification tasks, and sts has none"),
    (["--task", "mrpc", "--pair_mode", "siamese", "--loss", "setfit"], "--loss setfit compares one vector per "
                                                                        "example"),
    (["--loss", "setfit", "--option", "pretrain"], "--option pretrain freezes the encoder, all that --loss setfit's "
                                                   "term trains: the run would only fit a logistic regression"),
    (["--loss", "setfit", "--decoupled"], "use it with --loss ce, not setfit"),
])
def test_impossible_flags_are_one_line(capsys, flags, message):
    assert message in refused(capsys, *flags)


def test_setfit_defaults_and_torchrun(capsys, monkeypatch):
    assert options.get_args(["--loss", "setfit"]).setfit_iterations == 20, "SetFit's R: 20, the paper's"
    assert options.get_args(["--loss", "setfit", "--setfit_iterations", "3"]).setfit_iterations == 3
    assert options.get_args([]).setfit_iterations is None
    monkeypatch.setenv("RANK", "0")  # as torchrun starts a process
    assert "--loss setfit fits its head in one process" in refused(capsys, "--loss", "setfit")


def test_an_unknown_task_or_loss_is_named():
    with pytest.raises(MinknnError, match="unknown --task 'stss'; choose one of: sst, cfimdb, quora, sts"):
        options.get_args(["--task", "multitask", "--tasks", "sst,stss"])
    with pytest.raises(MinknnError, match="unknown --loss 'proxyanchr'; choose one of: ce, bce, triplet"):
        options.get_args(["--loss", "proxyanchr"])


@pytest.mark.parametrize("flags, loss", [([], "ce"), (["--task", "sts"], "mse"), (["--loss", "supcon"], "supcon"),
                                         (["--task", "rte", "--loss", "knnbert"], "knnbert")])
def test_proxy_lr_without_proxies_is_refused(capsys, flags, loss):
    """--proxy_lr sets the proxies' learning rate; with a loss that has none it would be silently ignored."""
    assert f"--proxy_lr is the learning rate of a proxy loss's proxies (softtriple, proxynca, proxyanchor); " \
           f"--loss {loss} has none" in refused(capsys, *flags, "--proxy_lr", "0.01")


@pytest.mark.parametrize("flags", [["--loss", "proxyanchor"], ["--loss", "softtriple"],
                                   ["--task", "multitask", "--tasks", "sst,sts", "--loss", "proxynca"]])
def test_proxy_lr_with_proxies_is_kept(flags):
    assert options.get_args([*flags, "--proxy_lr", "0.01"]).proxy_lr == 0.01, f"{flags}: --proxy_lr 0.01 not kept"


# each bound of the command line, and the value out of it: a run.json holding that value must be refused too
BOUNDS = [("epochs", 0, "at least 1"), ("batch_size", -3, "at least 1"), ("max_len", 4, "at least 8"),
          ("steps_per_epoch", 0, "at least 1"), ("max_eval", 0, "at least 1"), ("lr", -1e-4, "a finite number >= 0"),
          ("lr", 0, "positive"), ("proxy_lr", float("inf"), "a finite number >= 0"),
          ("weight_decay", -1, "a finite number >= 0"), ("warmup", 1.5, "a finite number in [0, 1]"),
          ("seed", 2 ** 32, "in [0, 2**32)"), ("seed", -1, "in [0, 2**32)"), ("steps", 0, "at least 1"),
          ("steps", 7, "a multiple of --epochs 3")]


@pytest.mark.parametrize("name, value, must", BOUNDS, ids=[f"{b[0]}={b[1]}" for b in BOUNDS])
def test_run_json_values_are_checked_as_the_command_line_is(capsys, name, value, must):
    """--resume takes its flags from run.json: checks.check_saved must hold them to the bounds checks.check_args
    holds the command line's to (both through checks.bad_values)."""
    assert f"--{name} " in refused(capsys, f"--{name}", str(value)), f"--{name} {value}: refused, not naming the flag"
    p = options.make_parser()
    saved = {k: v for k, v in vars(options.get_args([])).items() if k != "resume"}  # as train.py writes run.json
    checks.check_saved(p, "run.json", saved)  # a run.json as written passes
    with pytest.raises(MinknnError) as error:
        checks.check_saved(p, "run.json", {**saved, name: value})
        pytest.fail(f"run.json with {name} {value} was accepted (checks.check_saved)")
    assert str(error.value).startswith(f"run.json: {name} is ") and f"; it must be {must}" in str(error.value), \
        str(error.value)


def test_a_grid_passing_proxy_lr_to_a_ce_cell_is_refused(tmp_path):
    """The runner passes train.py's flags to every cell: a ce cell given --proxy_lr is refused before any training,
    naming the method (a proxy loss takes it in brackets: proxyanchor[proxy_lr=0.01])."""
    argv = ["--tasks", "mr", "--sizes", "6", "--out", str(tmp_path / "g"), "--data_dir", DATA]
    with pytest.raises(MinknnError, match=r"--methods ce: --proxy_lr is the learning rate of a proxy loss's proxies"):
        runner.main([*argv, "--methods", "ce,proxyanchor", "--proxy_lr", "0.01"])
    assert not (tmp_path / "g").exists(), "the refused grid wrote its folder"
    args, rest = runner.get_args([*argv, "--methods", "ce,proxyanchor[proxy_lr=0.01]"])
    runner.check_grid(args, rest, runner.cells_of(args.task_list, args.method_list, args.size_list,
                                                  args.seed_list))  # the bracket form passes


def parsers_of(module, monkeypatch, capsys):
    """The Parsers module.get_args (bench.py: main) builds, its subcommands' included, recorded as they are made."""
    built = []

    class Recording(cli.Parser):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            built.append(self)
    monkeypatch.setattr(module, "Parser", Recording)
    with pytest.raises(SystemExit):
        (module.get_args if hasattr(module, "get_args") else module.main)(["--help"])
    capsys.readouterr()
    return built


def test_every_flag_has_a_help_text_and_train_py_says_each_default(monkeypatch, capsys):
    """--help is where a student learns a flag: each flag of train.py, evaluate.py, the runner and every bench.py
    subcommand says what it does, and each of train.py's says its default (argparse's, which --help shows, or
    "(default: ...)" in the text; a switch is off)."""
    helps = {}
    for module in (options, evaluate, runner_flags, bench):
        parsers = parsers_of(module, monkeypatch, capsys)
        assert parsers, f"{module.__name__}: no Parser was built (does it still use minknn.tools.cli.Parser?)"
        for p in parsers:
            for a in p._actions:
                if a.dest in ("help", "command"):  # argparse's own, bench.py's subcommand
                    continue
                script = ("train.py" if module is options else "runner.py" if module is runner_flags
                          else f"{module.__name__.split('.')[-1]}.py")
                flag = " ".join([script, *p.prog.split()[1:], a.option_strings[0]])  # and bench.py's subcommand
                helps[flag] = a.help
                assert a.help and a.help.strip(), f"{flag} has no help text"
                if module is options:
                    assert a.default is not None or "default" in a.help, f"{flag}: --help shows no default"
    assert len([f for f in helps if f.startswith("bench.py ")]) > 30, "bench.py's subcommands were not all seen"
    assert "minknn/index.py" in helps["evaluate.py --index"], "evaluate.py --index: its flags live in minknn/index.py"



def test_proxy_init_help_names_classes_as_the_registry_does():
    """--proxy_init's help says what a class's name is: each example it gives (TASK's LABEL is 'NAME') is the
    registry's, and it calls no registered task's classes nameless (TREC's codes were once said to "describe
    nothing", while the registry names them)."""
    import re
    from minknn.tasks.registry import TASKS
    text = " ".join(next(a.help for a in options.make_parser()._actions if a.dest == "proxy_init").split())
    assert "describe nothing" not in text, f"--proxy_init's help says some classes have no names: {text}"
    examples = re.findall(r"(\w+)'s (\w+) is '([^']+)', (\w+) '([^']+)'", text)
    assert examples, f"--proxy_init's help gives no class name read from a code (TASK's LABEL is 'NAME'): {text}"
    for task, *pairs in examples:
        t = TASKS[task.lower()]
        for label, name in zip(pairs[::2], pairs[1::2]):
            assert t.names[t.labels.index(label)] == name, \
                f"--proxy_init's help: {task}'s {label} is '{name}'; the registry names it {t.names[t.labels.index(label)]!r}"

# ---- the rule: a term the run adds to its base loss must have something to do (checks.check_terms) ----

def argv_of(name):
    """A run of loss `name` on a task of its kind (both accepted: test_every_loss_is_held_to_its_declared_needs)."""
    return ["--task", "goemotions" if loss_kind(name) == "multilabel" else "sst", "--loss", name]


def reach(name):
    """What loss `name`'s own term (or --decoupled's, name 'decoupled') sends gradient to: a backward of the term
    alone through a toy encoder, head and retrieval head, called as train.py calls it (pairs, triplets and the memory
    included). Returns the parts whose parameters got a nonzero gradient: encoder, head, retrieval, proxies (the
    loss's own parameters)."""
    torch.manual_seed(0)
    C, D = 3, 8
    loss = DecoupledTripletLoss() if name == "decoupled" else \
        LOSSES[name](C, D, **{flag: spec["default"] for flag, spec in need(name, "flags").items()})
    encoder, head, retrieval = nn.Linear(5, D), nn.Linear(D, C), nn.Linear(D, D)
    z = encoder(torch.randn(6, 5))  # 6: three pairs (setfit) or two triplets (ancsetfit)
    labels = torch.tensor([0, 1, 2, 1, 2, 0])
    if loss_kind(name) == "multilabel":
        labels = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 1, 1], [0, 0, 1], [1, 0, 1]])
    if name in BASE_LOSSES:
        value = loss(Output(logits=head(z), z=z), labels)
    elif name == "decoupled":
        value = loss(retrieval(z), labels)
    elif need(name, "uses_memory"):
        keys = F.normalize(torch.randn(12, D), dim=1)
        value = loss(z, labels, F.normalize(torch.randn(6, D), dim=1), keys, torch.arange(12) % C,
                     torch.arange(6) + 6, torch.arange(12))
    else:
        value = loss(z, labels)
    value.backward()
    parts = {"encoder": encoder, "head": head, "retrieval": retrieval, "proxies": loss}
    return {part for part, module in parts.items()
            if any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())}


@pytest.mark.parametrize("name", [*LOSSES, "decoupled"])
def test_each_loss_declares_what_its_term_trains(name):
    """A loss's `trains` (minknn/losses/__init__.py NEEDS) is what check_terms reads: it must be what the term's
    gradient reaches, so that a new loss with proxies of its own, declared as the default (the encoder alone), is
    caught here rather than refused under --option pretrain."""
    declared = set(DecoupledTripletLoss.trains if name == "decoupled" else need(name, "trains"))
    assert reach(name) == declared, (f"{name}'s term sends gradient to {sorted(reach(name))}, and its class declares "
                                     f"trains = {sorted(declared)}")


@pytest.mark.parametrize("name", LOSSES)
def test_every_loss_is_held_to_its_declared_needs(capsys, name):
    """Every registered loss, a new one included: a metric loss's term needs a weight above 0 (--lam 0 refused, 0.5
    taken) and something its gradient reaches left trainable (--option pretrain freezes the encoder: refused where
    `trains` holds nothing else, taken where it does); a base loss has no term for --lam to weigh."""
    options.get_args(argv_of(name))  # the run itself is accepted: the refusals below are the flags'
    if name in BASE_LOSSES:
        assert "is the base loss alone" in refused(capsys, *argv_of(name), "--lam", "0.5")
        options.get_args([*argv_of(name), "--option", "pretrain"])
        return
    assert refused(capsys, *argv_of(name), "--lam", "0").startswith(f"--lam 0 gives --loss {name}'s term no weight: "
                                                                    f"the run would train plain ")
    options.get_args([*argv_of(name), "--lam", "0.5"])
    pretrain = [*argv_of(name), "--lam", "0.5", "--option", "pretrain"]
    if set(need(name, "trains")) <= {"encoder"}:
        assert refused(capsys, *pretrain).startswith(f"--option pretrain freezes the encoder, all that --loss {name}'s "
                                                     f"term trains: the run would train plain ")
    else:
        options.get_args(pretrain)  # its own parameters still train on the frozen encoder's z


@pytest.mark.parametrize("flags, message", [
    (["--loss", "setfit", "--lam", "0"], "--lam 0 gives --loss setfit's term no weight: the run would train plain "
                                         "cross-entropy under its name; use --loss ce or give a --lam above 0"),
    (["--loss", "setfit", "--lam", "0.5", "--option", "pretrain"],
     "--option pretrain freezes the encoder, all that --loss setfit's term trains: the run would train plain "
     "cross-entropy on the frozen encoder; use --option finetune"),
    (["--loss", "setfit", "--option", "pretrain"], "the run would only fit a logistic regression on the frozen "
                                                   "encoder after each epoch; use --option finetune"),
    (["--loss", "ce", "--lam", "0.5"], "--lam weighs a metric-learning loss against the base loss; --loss ce is the "
                                       "base loss alone"),
    (["--loss", "supcon", "--lam", "0"], "--lam 0 gives --loss supcon's term no weight"),
    (["--task", "goemotions", "--loss", "mlcon", "--lam", "0"], "the run would train plain BCE under its name; use "
                                                                 "--loss bce or give a --lam above 0"),
    (["--loss", "knnbert", "--option", "pretrain"], "all that --loss knnbert's term trains"),
    (["--decoupled", "--lam", "0"], "--lam 0 gives --decoupled's term no weight: the run would train plain "
                                    "cross-entropy under its name; leave out --decoupled or give a --lam above 0"),
    (["--task", "quora", "--pair_mode", "siamese", "--pair_loss", "mnrl", "--lam", "0"],
     "--lam 0 gives --pair_loss mnrl's term no weight"),
    (["--task", "quora", "--pair_mode", "siamese", "--pair_loss", "contrastive", "--option", "pretrain"],
     "--option pretrain freezes the encoder, all that --pair_loss contrastive's term trains"),
    (["--task", "multitask", "--tasks", "sst,goemotions", "--loss", "supcon", "--option", "pretrain"],
     "all that --loss supcon's term trains"),
    (["--loss", "setfit", "--head_init", "probe"], "--head_init probe starts a head that trains; --loss setfit at --lam "
                                                   "1 fits its head by logistic regression after each epoch"),
    (["--loss", "ancsetfit", "--head_init", "probe"], "--loss ancsetfit at --lam 1 fits its head"),
    (["--task", "sts", "--pair_mode", "siamese", "--option", "pretrain"], "nothing to train: --option pretrain "
                                                                          "freezes BERT, and a siamese similarity "
                                                                          "task has no head"),
])
def test_flags_that_leave_the_named_loss_nothing_to_do_are_refused(capsys, flags, message):
    assert message in refused(capsys, *flags)


@pytest.mark.parametrize("flags", [
    ["--loss", "setfit", "--lam", "0.5"], ["--loss", "setfit", "--lam", "0.5", "--head_init", "probe"],
    ["--loss", "proxyanchor", "--lam", "1", "--option", "pretrain"],  # proxy inference on the frozen encoder
    ["--loss", "softtriple", "--option", "pretrain"], ["--decoupled", "--option", "pretrain"],  # the retrieval head
    ["--loss", "supcon", "--lam", "1"],  # the metric loss alone: the DML paper's ablation
    ["--task", "multitask", "--tasks", "sst,goemotions", "--loss", "supcon", "--lam", "0.5"],
], ids=" ".join)
def test_a_term_with_something_to_do_is_taken(flags):
    options.get_args(flags)
