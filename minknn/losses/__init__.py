"""The loss registry: --loss NAME picks one of the losses below. Adding a loss is one new file here
and one line in METRIC_LOSSES; train.py needs no change. tests/losses/test_objective.py then asks
for two things more, by name: the loss's oracle, a literal transcription of its formula
(tests/losses/oracles.py), and its test file, tests/losses/test_NAME.py, which runs the checks
every loss goes through (tests/losses/checks.py).

Every metric-learning loss is an nn.Module built as Loss(num_classes, dim) and called as
loss(z, labels), with z the pooled representation (B, dim) and labels the batch's targets: class
indices (B,), or multi-hot rows (B, C) for a multi-label loss. Each file normalises z itself where
its formula says so. A loss may own parameters (the proxies of the proxy losses); they are
trained with their own learning rate (--proxy_lr) and saved in the checkpoint. A loss's `kind`
says which tasks it trains: classify (the default) or multilabel (mlcon).

Each task of a run gets its kind's loss (task_loss below): for a classification task the
combined objective of the DML paper (eq. 8) and KNN-BERT (eq. 6),

    L = (1 - lam) CE(F(z), y) + lam L_metric(z, y)

and for a multi-label task Su et al.'s L = BCE + lam L_con (the BCE keeps weight 1, as in their
paper); --loss ce (classify) and --loss bce (multilabel) are the base losses alone. A similarity
task is trained by MSE or L1 (--sts_loss, regression.py). F is the linear head.
--lam sets lam; by default each loss's own `lam` class attribute: 0.1 for the in-batch and memory
losses (KNN-BERT's weight for its contrastive term, eq. 6) and mlcon (Su et al.'s gamma on AAPD),
0.5 for the proxy losses, whose proxies only learn through their term. --lam 0 would be the base
loss alone, and train.py refuses it (--loss ce is that); --lam 1 trains a classification metric
loss alone, and the untrained linear head's predictions are then meaningless (use proxy
inference, evaluate.py --proxy, for the proxy losses). What each term trains (its `trains`)
decides which flags would leave it nothing to do: minknn/tools/checks.py check_terms.
SetFit's pair loss (setfit.py) is by default the whole objective (its lam is 1) and trains no
head (its `trains_head` is False): train.py fits the head by logistic regression after each
epoch, and feeds it pair batches (the B first texts, then the B second ones). With --lam below 1
the cross-entropy on the pair batch's texts trains the head beside it, and nothing is refit.
With --decoupled the metric term is Liang et al.'s triplet loss on the retrieval head's output r
instead of z (minknn/losses/decoupled.py; lam is their beta, 0.5); with --pair_loss, on a siamese
pair task, it is a pair loss on the two texts' vectors (pairs.py).

The memory losses (knnbert, moco) also see the MoCo memory (minknn/memory.py): they are called as
loss(z, labels, batch_keys, memory_keys, memory_labels, rows, memory_rows), batch_keys being the
key encoder's encoding of the same batch, rows the batch's training-set rows and memory_rows the
rows of the keys' examples (a query's own older keys are left out). A loss built with train.py
flags lists them in its `flags` attribute. Every metric loss runs outside autocast, in fp32: a bf16
q.k / 0.07 would be off by a few percent. Under torchrun (DDP) every loss sees the global batch, as
one process would: the ranks' outputs are gathered with their gradients before the loss
(minknn/tools/distributed.py says why that gives one process's gradients); the memory losses see the
keys of every rank too (minknn/memory.py).
"""
import torch
import torch.nn as nn

from minknn import MinknnError
from minknn.kinds import kind_of
from minknn.losses.ancsetfit import AncSetFitLoss
from minknn.losses.bce import BinaryCrossEntropy
from minknn.losses.ce import CrossEntropy
from minknn.losses.contrastive import ContrastiveLoss
from minknn.losses.decoupled import DecoupledTripletLoss
from minknn.losses.knnbert import KNNBertLoss
from minknn.losses.mlcon import MultiLabelContrastiveLoss
from minknn.losses.mnrl import MNRLoss
from minknn.losses.moco import MoCoLoss
from minknn.losses.npairs import NPairsLoss
from minknn.losses.pairs import PairLoss
from minknn.losses.proxyanchor import ProxyAnchorLoss
from minknn.losses.proxynca import ProxyNCALoss
from minknn.losses.regression import Regression
from minknn.losses.setfit import SetFitLoss
from minknn.losses.softtriple import SoftTripleLoss
from minknn.losses.supcon import SupConLoss
from minknn.losses.triplet import TripletLoss

BASE_LOSSES = {"ce": CrossEntropy, "bce": BinaryCrossEntropy}  # classify, multilabel
METRIC_LOSSES = {
    "triplet": TripletLoss,
    "npairs": NPairsLoss,
    "supcon": SupConLoss,
    "softtriple": SoftTripleLoss,
    "proxynca": ProxyNCALoss,
    "proxyanchor": ProxyAnchorLoss,
    "contrastive": ContrastiveLoss,
    "mnrl": MNRLoss,
    "knnbert": KNNBertLoss,
    "moco": MoCoLoss,
    "mlcon": MultiLabelContrastiveLoss,
    "setfit": SetFitLoss,
    "ancsetfit": AncSetFitLoss,
}
LOSSES = {**BASE_LOSSES, **METRIC_LOSSES}

# What a loss needs from the run, read from its class (NEEDS: the attribute, and its value when the
# class does not set it). The run reads these, never the loss's name:
NEEDS = {
    "kind": "classify",   # the tasks it trains: classify, or multilabel (bce, mlcon)
    "lam": 0.0,           # its weight against the base loss, unless --lam says otherwise
    "part": None,         # the assignment's part that writes it (minknn/assignment/parts.py)
    "uses_memory": False,  # a MoCo queue or memory bank (minknn/memory.py): one classification
                           # task, the memory's flags, called with the batch's keys and the memory
    "pairs": False,       # trained on pairs of examples it draws itself (its draw_pairs(labels,
                          # rng)): a batch holds the B first texts, then the B second ones; one task
                          # (or on triplets: the B first, the B second, the B third)
    "anchored": False,    # its tuples begin with a class's statement (AncSetFit: a row below 0,
                          # minknn/losses/ancsetfit.py), which needs the task's readable names
    "trains": ("encoder",),  # what its own term's gradient reaches: the encoder (through z), the
                             # proxies it owns (the proxy losses), the head (ce, bce, through the
                             # logits); minknn/tools/checks.py check_terms refuses --option
                             # pretrain, which freezes the encoder, for a term that reaches nothing
                             # else
    "trains_head": True,  # False: the loss is the whole objective at its lam of 1; the head is
                          # fit by logistic regression after each epoch, in one process
                          # (minknn/probe.py); --lam below 1 trains it by CE
    "one_proxy": False,   # one proxy a class, its `proxies` (C, dim): --proxy_init names can
                          # start each at its class's name (minknn/proxy.py start_at_names)
    "flags": {},          # its own train.py flags: name -> {"type" or "choices", "default",
                          # "help"}; minknn/tools/options.py adds them, minknn/tools/checks.py
                          # refuses them with other losses
}
# A loss with a class_logits method has proxies: --proxy_lr trains them, and proxy inference
# (minknn/proxy.py, evaluate.py --proxy) reads their logits.


def need(name, what):
    """What loss `name` (or a loss class: --decoupled's, a --pair_loss's) needs (NEEDS) from the
    run: its class's attribute, else the default (as for a run without a loss: a similarity
    task's, trained by --sts_loss)."""
    loss = LOSSES.get(name) if name is None or isinstance(name, str) else name
    return getattr(loss, what, NEEDS[what])


MEMORY_LOSSES = tuple(name for name in LOSSES if need(name, "uses_memory"))
PROXY_LOSSES = tuple(name for name, loss in LOSSES.items() if hasattr(loss, "class_logits"))
NAMED_PROXY_LOSSES = tuple(name for name in PROXY_LOSSES if need(name, "one_proxy"))
LOSS_FLAGS = {flag: spec for name in LOSSES for flag, spec in need(name, "flags").items()}


def check_loss_name(name):
    if name not in LOSSES:
        raise MinknnError(f"unknown --loss '{name}'; choose one of: {', '.join(LOSSES)}")


def loss_kind(name):
    """The kind of task a loss trains: 'classify' or 'multilabel'."""
    return need(name, "kind")


def loss_flags(name, args):
    """The train.py flags (a dict of them) that loss `name` is built with, e.g. knnbert's
    --m_most. A flag a run or checkpoint does not hold (older than the flag) is left out, so the
    loss's own default builds it (mlcon's --mlcon_reduction: sum, as runs were before)."""
    return {flag: args[flag] for flag in need(name, "flags") if args.get(flag) is not None}


class Objective(nn.Module):
    """One classification or multi-label task's loss: the base loss (CE or BCE) and, with a
    metric loss, (1 - lam) base + lam metric (classify) or base + lam metric (multilabel).
    Called as objective(output, targets) with the model's Output, plus the batch's keys, the
    memory and the batch's training-set rows for a memory loss; returns the total and, for the
    progress bar, its terms."""

    def __init__(self, name, num_classes, dim, lam=None, decoupled=False, pair_loss=None,
                 positive=None, **flags):
        super().__init__()
        check_loss_name(name)
        self.kind = loss_kind(name)
        self.base_name = "bce" if self.kind == "multilabel" else "ce"
        self.base = BASE_LOSSES[self.base_name](num_classes, dim)
        self.decoupled = decoupled  # checks.check_loss allows it with --loss ce only
        if decoupled:
            self.metric = DecoupledTripletLoss()
        elif pair_loss:
            self.metric = PairLoss(pair_loss, positive)
        else:
            self.metric = (METRIC_LOSSES[name](num_classes, dim, **flags) if name in METRIC_LOSSES
                           else None)
        # 0 <= lam <= 1
        self.lam = 0.0 if self.metric is None else (self.metric.lam if lam is None else lam)
        # setfit's does not, unless --lam below 1 gives the cross-entropy a share
        self.trains_head = getattr(self.metric, "trains_head", True) or self.lam < 1

    @property
    def uses_memory(self):
        return getattr(self.metric, "uses_memory", False)

    def forward(self, output, labels, batch_keys=None, memory=None, rows=None):
        if self.metric is None:
            return self.base(output, labels), {}
        z = (output.retrieval if self.decoupled else output.z).float()
        with torch.autocast(z.device.type, enabled=False):
            if self.uses_memory:
                metric = self.metric(z, labels, batch_keys, memory.keys, memory.labels, rows,
                                     memory.ids)
            else:
                metric = self.metric(z, labels)
        if not self.trains_head:  # SetFit: the pair loss alone; the head is fit after each epoch
            return metric, {"metric": metric.detach()}
        # Su et al.: BCE + gamma L_con
        base = self.base(output, labels)
        base_weight = 1.0 if self.kind == "multilabel" else 1 - self.lam
        total = base_weight * base + self.lam * metric
        return total, {self.base_name: base.detach(), "metric": metric.detach()}


def metric_loss_for(task, args, siamese):
    """The name of the loss --loss gives this task: the named loss where it is of the task's
    kind and the task has one vector per example (not a siamese pair), else the kind's base loss."""
    name = args.get("loss")
    if name is None or loss_kind(name) != task.kind or siamese:
        return kind_of(task).default_loss
    return name


def task_loss(task, dim, args, siamese=False):
    """The loss of one task of a run, built from train.py's arguments (a dict)."""
    if task.kind == "similarity":
        return Regression(args.get("sts_loss") or "mse")
    name = metric_loss_for(task, args, siamese)
    pair_loss = args.get("pair_loss") if siamese and task.positive is not None else None
    return Objective(name, len(task.labels), dim, args.get("lam"), args.get("decoupled", False),
                     pair_loss, task.positive, **loss_flags(name, args))


def build_losses(model, args):
    """Every task's loss (task name -> module), built from train.py's arguments (a dict)."""
    H = model.bert.config.hidden_size
    return nn.ModuleDict({name: task_loss(t, H, args, model.siamese(t))
                          for name, t in model.tasks.items()})
