"""The inference rules: how a trained model's outputs on some examples become predictions. One
implementation, read by evaluate.py, the attack, the runner's cells and each epoch's dev score.

    model      the linear head: P(q) = softmax(F(z)), or each class's sigmoid (multi-label)
    proxy      proxy inference (minknn/proxy.py): softmax((1 - alpha) F(z) + alpha s cos(z, P_c))
    knn        the head mixed with the kNN vote (minknn/knn.py): (1 - phi) P(q) + phi KNN(q)
    knn-only   the kNN vote alone (phi = 1)
    probe      (the runner's) a logistic regression fit on the training set's z in place of the
               head (minknn/probe.py)

One prediction pass (engine.predict) gives what the rules read: the outputs, and the pooled z or
the kNN key's vectors; a datastore of the training set (minknn/datastore.py) gives the votes.
KnnSweep gives the vote at every K and phi from one search at the largest K (evaluate.py --sweep,
the runner's kNN grids); knn_scores, its scores on every split over a training set's datastore
(the runner's cells, the setfit package's among them). Each rule's probabilities are read as the
model's are (kinds.py: the arg max, or each class above 0.5).

evaluate.py and the attack load a run with load_run (its checkpoint rebuilt, the rules asked for
checked against it) and read_task_data (each task's examples and kNN training set), before any
encoding.
"""
import os

from minknn import MinknnError
from minknn.checkpoint import data_dir_of, rebuild
from minknn.data import eval_subset, labelled, load_split
from minknn.datastore import Datastore, knn_index, knn_settings, run_training_set
from minknn.engine import pick_device, predict
from minknn.kinds import kind_of, overall, score
from minknn.knn import KNN_DEFAULTS, SWEEP_KS, check_k, interpolate, settings
from minknn.losses import PROXY_LOSSES
from minknn.parts import require_written
from minknn.probe import fit_logistic
from minknn.proxy import has_proxies, proxy_logits
from minknn.runs import make_folder
from minknn.status import run_checkpoint

RULES = ("model", "proxy", "knn", "knn-only")


def rule_probabilities(rule, task, outputs, z=None, loss=None, alpha=None, knn=None, phi=None):
    """The probabilities (N, C) one rule gives: outputs (N, C) the head's logits; proxy: z (N, H)
    and the task's loss (its proxies) at alpha; knn and knn-only: knn (N, C), the kNN vote, mixed
    at phi."""
    kind = kind_of(task)
    if rule == "model":
        return kind.probabilities(outputs)
    if rule == "proxy":
        return kind.probabilities(proxy_logits(loss, outputs, z, alpha))
    if rule == "knn-only":
        return knn
    if rule == "knn":
        return interpolate(kind.probabilities(outputs), knn, phi)
    raise ValueError(f"unknown rule '{rule}'; choose one of: {', '.join(RULES)}")


def knn_probabilities(datastore, queries, settings, exclude=None):
    """KNN(q) (Q, C) of the queries (Q, d): the settings' K nearest keys (knn.Settings), their
    vote. exclude: (Q,) each query's own datastore row, left out (queries from the training set)."""
    scores, rows = datastore.search(queries, settings.k, settings.vote, exclude)
    return datastore.vote(scores, rows, settings.vote, settings.temperature)


class KnnSweep:
    """The kNN vote at any K up to k_most (capped at what the datastore holds) from one search at
    the largest K: each query's nearest keys are the first ones of a longer search."""

    def __init__(self, datastore, queries, settings, k_most=max(SWEEP_KS), exclude=None):
        self.datastore, self.settings = datastore, settings
        self.most = len(datastore) - (exclude is not None)
        self.scores, self.rows = datastore.search(queries, min(k_most, self.most), settings.vote,
                                                  exclude)
        self.votes = {}

    def ks(self, ks=SWEEP_KS):
        """The K values to sweep, capped at the datastore's size."""
        return sorted({min(k, self.most) for k in ks})

    def vote(self, k):
        """KNN(q) over each query's k nearest keys."""
        k = min(k, self.most)
        if k not in self.votes:
            self.votes[k] = self.datastore.vote(self.scores[:, :k], self.rows[:, :k],
                                                self.settings.vote, self.settings.temperature)
        return self.votes[k]

    def mixed(self, probabilities, k, phi):
        """(1 - phi) P(q) + phi KNN(q) at K = k."""
        return interpolate(probabilities, self.vote(k), phi)


def knn_scores(task, train_set, keys, queries, probabilities, gold, k_most):
    """The kNN rule's scores at any (K <= k_most, phi) from one search per split, over a datastore
    of the training set's keys (N, d): queries, probabilities (P, the model's) and gold map each
    split to its own. Returns (at, sweeps): at(k, phi) -> each split's scores of
    (1 - phi) P(q) + phi KNN(q), and each split's KnnSweep."""
    kind = kind_of(task)
    datastore = Datastore(keys, kind.targets(task, train_set, "cpu"), [e.id for e in train_set],
                          len(task.labels))
    sweeps = {s: KnnSweep(datastore, q, settings(task.kind), k_most) for s, q in queries.items()}

    def at(k, phi):
        return {s: scores_of(task, sweeps[s].mixed(probabilities[s], k, phi), gold[s])
                for s in queries}
    return at, sweeps


def probe_probabilities(task, train_set, z_train, z):
    """Each split's probabilities (z: split -> its (N, H) z) from a logistic regression (C = 1)
    fit on the training set's z (z_train), in place of the trained head."""
    kind = kind_of(task)
    W, b = fit_logistic(z_train, kind.targets(task, train_set, "cpu"), len(task.labels),
                        multilabel=task.kind == "multilabel")
    return {s: kind.probabilities(z[s] @ W.T + b) for s in z}


def dev_scores(model, losses, tokenizer, tasks, dev, args, device):
    """Each task's dev scores and the overall score (an epoch's). A proxy loss at --lam 1 leaves
    the linear head untrained: its task is scored by the nearest proxy (proxy inference, alpha =
    1)."""
    scores = {}
    for t in tasks:
        outputs, z = predict(model, tokenizer, t, dev[t.name], 2 * args.batch_size, device,
                             progress=f"{t.name} dev", precision=args.precision)
        loss = losses[t.name]
        rule = "proxy" if getattr(loss, "lam", 0) == 1 and has_proxies(loss) else "model"
        if rule == "proxy":  # the proxies are on the device
            outputs, z = outputs.to(device), z.to(device)
        probabilities = rule_probabilities(rule, t, outputs, z, loss, alpha=1.0).cpu()
        scores[t.name] = scores_of(t, probabilities, kind_of(t).gold(t, dev[t.name]))
    return {**scores, "overall": overall(tasks, scores)}


def scores_of(task, probabilities, gold):
    """A rule's scores (kinds.score) on examples with gold answers."""
    return score(task, kind_of(task).decide(probabilities), gold)


# ---------------------------------------------------------------------------------------------
# a run loaded for its rules, as evaluate.py's flags (and the attack's) ask for it

def load_run(args, proxy, knn, out):
    """The checkpoint's run, rebuilt on --device, once the parts it runs are written (a student
    edition), the folder of out (its files less .csv) takes files and the rules asked for (proxy,
    knn) can run: (checkpoint, model, losses, tokenizer, tasks, the tasks kNN votes on, device)."""
    require_written(["embeddings", "layer", "pooling"] + ["attention"] * (args.attention ==
                    "explicit") + ["proxy-inference"] * proxy + ["knn"] * knn)
    device = pick_device(args.device)
    ckpt = run_checkpoint(args.checkpoint)  # ckpt["file"]: the checkpoint file's path
    make_folder(os.path.dirname(out(ckpt)) or ".",  # before anything is encoded
                "--out's folder" if args.out else "the run folder")
    args.data_dir = data_dir_of(ckpt, args.data_dir)
    model, losses, tokenizer = rebuild(ckpt)
    model.bert.set_attention(args.attention)
    model.to(device)
    tasks = list(model.tasks.values())
    if proxy and not any(has_proxies(losses[t.name]) for t in tasks):
        loss = ckpt["args"]["loss"]
        raise MinknnError(f"--proxy: this checkpoint was trained with --loss {loss}, which has no "
                          f"proxies; proxy inference needs one of: {', '.join(PROXY_LOSSES)}")
    if knn and args.knn_key == "decoupled" and model.retrieval is None:
        raise MinknnError("--knn_key decoupled: this checkpoint has no retrieval head (train it "
                          "with --decoupled)")
    knn_tasks = [t for t in tasks if knn and t.kind in KNN_DEFAULTS and not model.siamese(t)]
    if knn and not knn_tasks:
        raise MinknnError("--knn votes with the training set's labels: it needs a classification "
                          "or multi-label task with one vector per example (not a similarity task, "
                          "not --pair_mode siamese)")
    if args.temperature is not None and any(knn_settings(args, t).vote == "cosine"
                                            for t in knn_tasks):
        raise MinknnError("--temperature sets the distance and euclidean votes' T; the cosine vote "
                          "has none (add --vote distance or euclidean)")
    return ckpt, model, losses, tokenizer, tasks, knn_tasks, device


def read_task_data(args, ckpt, task, knn, n=None, flag="--max_eval"):
    """(examples to score: a fixed subset of n, a note saying so, the training set for kNN or
    None; knn: whether kNN votes on this task), read and checked before any encoding."""
    examples = load_split(task, args.split, args.data_dir)
    subset = f" (a {flag} subset of {len(examples)})" if n and n < len(examples) else ""
    examples = eval_subset(examples, n)
    if not knn:
        return examples, subset, None
    if getattr(args, "sweep", False) and not labelled(examples):
        raise MinknnError(f"--sweep scores each phi and K, but the {task.name} {args.split} split "
                          f"has no labels")
    train = run_training_set(args, ckpt, task)
    if not getattr(args, "sweep", False):  # the sweep caps K at the datastore's size
        check_k(knn_settings(args, task).k, len(train), excluding_self=args.split == "train")
    knn_index(args, len(train))  # --nlist beyond the training set stops here
    return examples, subset, train
