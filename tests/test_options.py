"""minknn/options.py, through train.py's get_args: the defaults that depend on other flags, and
each combination that cannot work refused with one line naming the flag (test_train.py runs a few
of them as a user would, in a subprocess)."""
import pytest

import train
from minknn import MinknnError


def refused(capsys, *flags):
    """The one-line error train.py's flags give (argparse's exit status 2)."""
    with pytest.raises(SystemExit) as exit:
        train.get_args(list(flags))
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and "\n" not in err and err.startswith("error: "), err
    return err[len("error: "):]


def test_defaults_follow_the_run():
    args = train.get_args(["--task", "sst"])
    assert (args.tasks, args.loss, args.lr, args.proxy_lr, args.lam) == (["sst"], "ce", 5e-5, 5e-3, None)
    assert train.get_args(["--task", "sst", "--option", "pretrain"]).lr == 1e-3
    assert train.get_args(["--task", "goemotions"]).loss == "bce"  # a multi-label task's base loss
    assert train.get_args(["--task", "sts"]).loss is None  # --sts_loss trains it
    assert train.get_args(["--task", "multitask"]).tasks == ["sst", "quora", "sts"]
    args = train.get_args(["--task", "rte", "--loss", "knnbert"])
    assert (args.memory, args.momentum, args.m_most, args.m_least) == ("queue", 0.999, 50, 100)
    assert train.get_args(["--task", "sst", "--out", "x"]).out == "x"
    assert train.get_args(["--task", "sts"]).out is None  # train.main names a fresh folder (test_runs.py)


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
])
def test_impossible_flags_are_one_line(capsys, flags, message):
    assert message in refused(capsys, *flags)


def test_an_unknown_task_or_loss_is_named():
    with pytest.raises(MinknnError, match="unknown --task 'stss'; choose one of: sst, cfimdb, quora, sts"):
        train.get_args(["--task", "multitask", "--tasks", "sst,stss"])
    with pytest.raises(MinknnError, match="unknown --loss 'proxyanchr'; choose one of: ce, bce, triplet"):
        train.get_args(["--loss", "proxyanchr"])
