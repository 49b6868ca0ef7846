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
import time

import torch

from minknn import MinknnError
from minknn.assignment.parts import require_written
from minknn.datastore import Datastore, knn_index, knn_settings, run_datastore, run_training_set
from minknn.kinds import kind_of, overall, score
from minknn.knn import KNN_DEFAULTS, SWEEP_KS, check_k, interpolate, settings
from minknn.losses import PROXY_LOSSES
from minknn.probe import fit_logistic
from minknn.proxy import has_proxies, proxy_cosines, proxy_logits
from minknn.tasks.data import Example, eval_subset, labelled, load_split
from minknn.tools.checkpoint import data_dir_of, rebuild
from minknn.tools.engine import pick_device, predict
from minknn.tools.files import make_folder
from minknn.tools.options import rule_settings
from minknn.tools.run import run_checkpoint

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


def rule_answers(model, tokenizer, task, examples, args, device, loss, rules, datastore=None,
                 exclude=None, z_too=False, progress=None):
    """Each rule of `rules` (RULES) on the examples, as evaluate.py scores them and predict prints
    them (one computation for both): ({rule: probabilities (N, C), or a similarity task's scores
    (N,)}, the queries, z, {"encode": seconds, "knn": seconds}). One prediction pass gives the
    head's outputs and the pooled z, or, with a datastore, the queries in its key's
    representation; a second gives z where the proxies need it (the proxy rule, or z_too: their
    cosines) and kNN's key is not the pooling (z is None where nothing needs it). args: the
    settings (batch_size, precision, knn_key, proxy_alpha, k, phi, vote, temperature). exclude:
    (N,) each query's own datastore row, left out (queries from the training set)."""
    key = model.knn_key(args.knn_key) if datastore is not None else None
    start = time.time()
    outputs, queries = predict(model, tokenizer, task, examples, args.batch_size, device,
                               progress=progress, key=key, precision=args.precision)
    seconds = {"encode": time.time() - start}
    z = queries if key in (None, model.pooling) else None
    if z is None and ("proxy" in rules or z_too):  # the proxies compare the pooled z
        z = predict(model, tokenizer, task, examples, args.batch_size, device,
                    progress=progress and f"{progress} z", precision=args.precision)[1]
    found = {"model": rule_probabilities("model", task, outputs)}
    if "proxy" in rules:
        found["proxy"] = rule_probabilities("proxy", task, outputs, z, loss, args.proxy_alpha)
    if "knn" in rules or "knn-only" in rules:
        s = knn_settings(args, task)
        start = time.time()
        found["knn-only"] = knn_probabilities(datastore, queries, s, exclude)
        seconds["knn"] = time.time() - start
        found["knn"] = rule_probabilities("knn", task, outputs, knn=found["knn-only"], phi=s.phi)
    return {rule: found[rule] for rule in rules}, queries, z, seconds


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
    if not own_files_only(ckpt):  # a root for the registry's tasks; your files need none
        args.data_dir = data_dir_of(ckpt, args.data_dir)
    model, losses, tokenizer = rebuilt(ckpt, args.attention, device)
    tasks = list(model.tasks.values())
    if proxy:
        check_proxies(ckpt, losses, tasks)
    return ckpt, model, losses, tokenizer, tasks, knn_tasks(args, model, tasks) if knn else [], \
        device


def own_files_only(ckpt):
    """Whether every task of the checkpoint's run is one of your own files
    (minknn/tasks/own_task.py)."""
    return all("own" in t for t in ckpt.get("tasks", {}).values())


def rebuilt(ckpt, attention, device):
    """(model, losses, tokenizer) of the checkpoint, the model on device with --attention's."""
    model, losses, tokenizer = rebuild(ckpt)
    model.bert.set_attention(attention)
    return model.to(device), losses, tokenizer


def check_proxies(ckpt, losses, tasks):
    """--proxy: one task at least has proxies."""
    if not any(has_proxies(losses[t.name]) for t in tasks):
        loss = ckpt["args"]["loss"]
        raise MinknnError(f"--proxy: this checkpoint was trained with --loss {loss}, which has no "
                          f"proxies; proxy inference needs one of: {', '.join(PROXY_LOSSES)}")


def knn_tasks(args, model, tasks):
    """The tasks --knn votes on (a classification or multi-label task of one vector an example),
    the kNN flags checked against the run: one line where they cannot work."""
    if args.knn_key == "decoupled" and model.retrieval is None:
        raise MinknnError("--knn_key decoupled: this checkpoint has no retrieval head (train it "
                          "with --decoupled)")
    voting = [t for t in tasks if t.kind in KNN_DEFAULTS and not model.siamese(t)]
    if not voting:
        raise MinknnError("--knn votes with the training set's labels: it needs a classification "
                          "or multi-label task with one vector per example (not a similarity task, "
                          "not --pair_mode siamese)")
    if args.temperature is not None and any(knn_settings(args, t).vote == "cosine"
                                            for t in voting):
        raise MinknnError("--temperature sets the distance and euclidean votes' T; the cosine vote "
                          "has none (add --vote distance or euclidean)")
    return voting


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


# ---------------------------------------------------------------------------------------------
# a trained run asked about your own texts: the Python API, and predict's command over it
# (minknn/tools/predict.py)

def load(run, **settings):
    """A trained run, ready for your texts. run: a folder train.py wrote, or its checkpoint.pt.

        from minknn.tools.inference import load
        run = load("runs/sst-proxyanchor")
        run.predict(["a gripping film"])                  # ['positive']: the head's class
        run.predict_proba(["a gripping film"], "proxy")   # (N, C): rule model, proxy, knn, knn-only
        run.encode(["a gripping film"])                   # z, (N, H)
        run.neighbours(["a gripping film"], k=3)          # the training examples kNN votes with

    settings: evaluate.py's flags by name (device, batch_size, precision, attention, data_dir,
    proxy_alpha, k, phi, vote, temperature, knn_key, datastore, index, nlist, ...), each at
    evaluate.py's default where not given, so the answers are evaluate.py's. Only the run's
    checkpoint is read here; kNN reads its training set and datastore when first asked."""
    args = rule_settings(**settings)
    require_written(["embeddings", "layer", "pooling"] + ["attention"] * (args.attention ==
                                                                            "explicit"))
    device = pick_device(args.device)
    ckpt = run_checkpoint(run, "RUN", "predicting with")
    return Trained(ckpt, *rebuilt(ckpt, args.attention, device), device, args)


def texts_examples(texts, task):
    """Examples of your texts: each a string, or for a pair task a pair of strings."""
    if isinstance(texts, str):
        raise MinknnError("give a list of texts, not one string (['a gripping film'])")
    if not len(texts):
        raise MinknnError("no texts to answer: give a list of one text at least")
    examples = []
    for i, text in enumerate(texts):
        pair = isinstance(text, (tuple, list))
        if pair != task.pair or (pair and len(text) != 2) or not all(
                isinstance(t, str) and t.strip() for t in (text if pair else [text])):
            want = "a pair of non-empty texts (a, b)" if task.pair else "a non-empty text"
            raise MinknnError(f"text {i + 1}: {text!r} is not {want}, which {task.name} "
                              f"takes")
        a, b = text if pair else (text, None)
        examples.append(Example(text=a.strip(), text_b=b and b.strip(), id=str(i + 1)))
    return examples


class Trained:
    """A trained run loaded for your texts (load): every answer comes from this file's rules,
    computed as evaluate.py computes them, and kNN from the same datastore."""

    def __init__(self, ckpt, model, losses, tokenizer, device, args):
        self.ckpt, self.model, self.losses, self.tokenizer = ckpt, model, losses, tokenizer
        self.device, self.args = device, args
        self.tasks = list(model.tasks.values())
        self._root_read, self._train, self._datastores = False, {}, {}

    @property
    def labels(self):
        """The class names of the run's task, in the order of predict_proba's columns."""
        return list(self.task().labels)

    def task(self, name=None):
        """The run's task (name: one of a multi-task run's)."""
        if name is None and len(self.tasks) == 1:
            return self.tasks[0]
        found = [t for t in self.tasks if t.name == name]
        if not found:
            raise MinknnError(f"this run has the tasks {', '.join(t.name for t in self.tasks)}"
                              f"; name one (task=..., predict --task)")
        return found[0]

    def training_set(self, task):
        """The examples the run trained on (kNN's datastore, the neighbours' texts), read once."""
        if not self._root_read and not task.own:  # a registered task's: from the run's root
            self.args.data_dir = data_dir_of(self.ckpt, self.args.data_dir)
            self._root_read = True
        if task.name not in self._train:
            self._train[task.name] = run_training_set(self.args, self.ckpt, task)
        return self._train[task.name]

    def knn_settings(self, task):
        """K, phi, the vote and its temperature for the task (evaluate.py's defaults)."""
        return knn_settings(self.args, task)

    def datastore(self, task):
        """The run's kNN datastore of the task, as evaluate.py --knn builds (or loads) it."""
        knn_tasks(self.args, self.model, [task])
        if task.name not in self._datastores:
            train = self.training_set(task)
            knn_index(self.args, len(train))
            self._datastores[task.name] = run_datastore(
                self.args, self.ckpt, self.model, self.tokenizer, task, train,
                self.model.knn_key(self.args.knn_key), self.device, len(self.tasks) > 1)[0]
        return self._datastores[task.name]

    @torch.inference_mode()
    def answers(self, texts, rules=("model",), task=None, explain=0, progress=None):
        """Each rule's probabilities (N, C) (a similarity task: scores (N,)) of your texts, as
        evaluate.py computes them: "model", "proxy" (at proxy_alpha), "knn" (mixed at phi) and
        "knn-only"; explain N: also "neighbours", each text's N nearest training examples (the
        datastore kNN votes from) and "proxies", each class proxy's cosine. Computed by
        rule_answers, as evaluate.py computes them."""
        task = self.task(task)
        examples = texts_examples(texts, task)
        unknown = [r for r in rules if r not in RULES]
        if unknown:
            raise MinknnError(f"unknown rule '{unknown[0]}'; choose one of: {', '.join(RULES)}")
        if not isinstance(explain, int) or isinstance(explain, bool) or explain < 0:
            raise MinknnError(f"explain={explain!r}: the number of neighbours to show, 1 or more "
                              f"(0: none)")
        voting = any(r.startswith("knn") for r in rules)
        loss = self.losses[task.name]
        require_written(["proxy-inference"] * ("proxy" in rules) + ["knn"] * voting)
        if "proxy" in rules:
            check_proxies(self.ckpt, self.losses, [task])
        datastore = self.datastore(task) if voting or explain else None
        if voting:  # the vote's K (--explain shows its own N)
            check_k(knn_settings(self.args, task).k, len(datastore))
        cosines = explain > 0 and has_proxies(loss)
        answers, queries, z, _ = rule_answers(self.model, self.tokenizer, task, examples,
                                              self.args, self.device, loss, rules, datastore,
                                              z_too=cosines, progress=progress)
        if explain:
            answers["neighbours"] = self.nearest(task, datastore, queries, explain)
            if cosines:
                answers["proxies"] = proxy_cosines(loss, z)
        return answers

    def nearest(self, task, datastore, queries, n):
        """Each query's n nearest training examples: [{"id", "text", "text_b", "label",
        "score"}], the score a cosine similarity (the cosine vote) or a squared distance."""
        vote = knn_settings(self.args, task).vote
        scores, rows = datastore.search(queries, min(n, len(datastore)), vote)
        train = {e.id: e for e in self.training_set(task)}
        kind = kind_of(task)
        return [[{"id": datastore.ids[r], "text": train[datastore.ids[r]].text,
                  "text_b": train[datastore.ids[r]].text_b, "score": float(s),
                  "label": kind.answer(task, kind.gold(task, [train[datastore.ids[r]]])[0])}
                 for s, r in zip(row_scores.tolist(), row_rows.tolist())]
                for row_scores, row_rows in zip(scores, rows)]

    def predict_proba(self, texts, rule="model", task=None):
        """(N, C) probabilities by the rule (a similarity task: (N,) scores), a numpy array."""
        return self.answers(texts, (rule,), task)[rule].numpy()

    def predict(self, texts, rule="model", task=None):
        """Each text's answer by the rule: its class's name; a multi-label task's list of names;
        a similarity task's score."""
        task = self.task(task)
        kind = kind_of(task)
        decided = kind.decide(self.answers(texts, (rule,), task.name)[rule])
        return [kind.answer(task, d) for d in decided]

    def encode(self, texts, task=None):
        """z, (N, H): the pooled representations the run's losses and proxies see (kNN's too but
        with --decoupled, whose datastore holds the retrieval head's r), a numpy array."""
        task = self.task(task)
        if self.model.siamese(task):
            raise MinknnError(f"{task.name} encodes each text of a pair alone (--pair_mode "
                              f"siamese): it has no one vector a pair")
        return predict(self.model, self.tokenizer, task, texts_examples(texts, task),
                       self.args.batch_size, self.device, precision=self.args.precision)[1].numpy()

    def neighbours(self, texts, k=5, task=None):
        """Each text's k nearest training examples in the run's datastore (kNN's key and vote)."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise MinknnError(f"k={k!r}: the number of neighbours, 1 or more")
        return self.answers(texts, ("model",), task, explain=k)["neighbours"]
