"""The assignment's parts: what a student writes, where, and the command that grades it.

The code students write is marked in the source as solution blocks, whole lines between two
comments at the same indent:

        # BEGIN part pooling
        ...                   (the solution: removed from the student edition)
        # END part pooling

PARTS below lists the parts in the order to do them, each with its number, a one-line statement,
the equation it implements and the command that grades it. A part may have several blocks (the
transformer layer's add-and-norm and its feed-forward) but lives in one file.

In a student edition (minknn/assignment/edition.py writes it) a block is its stub, one line raising
`NotImplementedError("part 2 attention: ...")`; train.py and evaluate.py first check that the
parts they run are written (require_written: a block that is only its stub's raise line is not),
and stop with one line naming the first one in the handout's order and its test command.
"""
import os
import re
import shlex
import sys
from dataclasses import dataclass

from minknn import MinknnError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the clone
MARKER = re.compile(r"^(?P<indent>[ \t]*)# (?P<end>BEGIN|END) part (?P<name>[a-z0-9-]+)\s*$")

@dataclass(frozen=True)
class Part:
    name: str       # the markers' name
    file: str       # the file holding its blocks
    test: str       # the command that grades it, run from the repository's root
    statement: str  # what to write, in one line
    source: str     # the equation it implements


def pytest(file, k=None):
    return f"python -m pytest -q {file}" + (f" -k {k}" if k else "")


PARTS = (
    Part("embeddings", "minknn/bert.py", pytest("tests/test_bert.py", "embeddings"),
         "BertEmbeddings.forward: sum the word, position and token-type embeddings, then "
         "LayerNorm and dropout",
         "Devlin et al. 2019, sec. 3 and Figure 2"),
    Part("attention", "minknn/bert.py", pytest("tests/test_bert.py", "attention"),
         "attention(): softmax(Q K^T / sqrt(hs) + mask) V, with dropout on the attention weights",
         "Vaswani et al. 2017, eq. 1"),
    Part("layer", "minknn/bert.py", pytest("tests/test_bert.py", "layer"),
         "the transformer layer: dropout, residual add and LayerNorm (post-LN), and the GELU "
         "feed-forward",
         "Vaswani et al. 2017, sec. 3.1 and eq. 2; BERT's GELU"),
    Part("pooling", "minknn/model.py", pytest("tests/test_model.py"),
         "pool(): the [CLS] vector, the mean over real tokens, or the max over real tokens",
         "Reimers and Gurevych 2019, sec. 3 (CLS, MEAN and MAX pooling)"),
    Part("training", "train.py", pytest("tests/test_training_step.py"),
         "the training step and the optimiser: AdamW without decay on biases and LayerNorm, "
         "warm-up then linear decay, zero_grad, backward, clipping to norm 1, step",
         "Devlin et al. 2019, appendix A.2; Loshchilov and Hutter 2019 (AdamW)"),
    Part("triplet", "minknn/losses/triplet.py", pytest("tests/losses/test_triplet.py"),
         "the batch-all triplet loss on L2-normalised vectors",
         "Schroff et al. 2015 (FaceNet), the triplet loss"),
    Part("npairs", "minknn/losses/npairs.py", pytest("tests/losses/test_npairs.py"),
         "the N-pairs loss with its L2 penalty", "Sohn 2016, the multi-class N-pair loss"),
    Part("supcon", "minknn/losses/supcon.py", pytest("tests/losses/test_supcon.py"),
         "the supervised contrastive loss over the batch", "Khosla et al. 2020, eq. 2"),
    Part("contrastive", "minknn/losses/contrastive.py",
         pytest("tests/losses/test_contrastive.py"),
         "the pairwise contrastive loss with a margin",
         "Hadsell, Chopra and LeCun 2006, the contrastive loss"),
    Part("mnrl", "minknn/losses/mnrl.py", pytest("tests/losses/test_mnrl.py"),
         "the multiple negatives ranking loss over in-batch negatives",
         "Henderson et al. 2017, the multiple negatives ranking loss"),
    Part("softtriple", "minknn/losses/softtriple.py",
         pytest("tests/losses/test_softtriple.py"),
         "SoftTriple: the relaxed class similarity over K centres and its smoothed softmax loss",
         "Qian et al. 2019, the SoftTriple loss and its regulariser"),
    Part("proxynca", "minknn/losses/proxynca.py", pytest("tests/losses/test_proxynca.py"),
         "ProxyNCA: softmax over negative scaled distances to the class proxies",
         "Movshovitz-Attias et al. 2017, the proxy NCA loss"),
    Part("proxyanchor", "minknn/losses/proxyanchor.py",
         pytest("tests/losses/test_proxyanchor.py"),
         "Proxy Anchor: each proxy pulls its class and pushes the rest, by log-sum-exp",
         "Kim et al. 2020, the Proxy Anchor loss"),
    Part("proxy-inference", "minknn/proxy.py", pytest("tests/test_proxy.py"),
         "proxy inference: mix the linear head's logits with the proxies' scaled cosines",
         "the DML paper (Revisiting Distance Metric Learning for Few-Shot NLC), eq. 10"),
    Part("knnbert", "minknn/losses/knnbert.py", pytest("tests/losses/test_knnbert.py"),
         "KNN-BERT's supervised contrastive loss over the labelled memory",
         "Li et al. (KNN-BERT), eq. 3"),
    Part("moco-loss", "minknn/losses/moco.py", pytest("tests/losses/test_moco.py"),
         "the MoCo contrastive loss: one positive key against the memory's negatives",
         "He et al. 2020, eq. 1"),
    Part("memory", "minknn/memory.py", pytest("tests/test_memory.py"),
         "the MoCo memory: the key encoder's momentum update and the batch's keys after it, the "
         "queue's enqueue, the memory bank's update",
         "He et al. 2020, eq. 2 and Algorithm 1; Wu et al. 2018 (memory bank)"),
    Part("knn", "minknn/knn.py", pytest("tests/test_knn.py"),
         "the kNN vote (cosine, distance, euclidean weights) and its mix with the model",
         "Li et al. (KNN-BERT), eq. 1; Liang et al., eqs. 2 and 3; Su et al., eq. 1"),
    Part("mlcon", "minknn/losses/mlcon.py", pytest("tests/losses/test_mlcon.py"),
         "the multi-label contrastive loss, each pair weighted by the labels it shares",
         "Su et al. 2022, eqs. 2 and 3"),
    Part("pcgrad", "minknn/pcgrad.py", pytest("tests/test_pcgrad.py"),
         "PCGrad: project each task's gradient off the gradients it conflicts with, Algorithm 1 "
         "on the coefficients of the gradients' Gram matrix",
         "Yu et al. 2020, Algorithm 1"),
    Part("setfit", "minknn/losses/setfit.py", pytest("tests/losses/test_setfit.py"),
         "SetFit's pair loss: the cosine of each pair's two vectors regressed onto 1 for a pair of "
         "one class, 0 for two",
         "Tunstall et al. 2022 (SetFit), sec. 3.1; sentence-transformers' CosineSimilarityLoss"),
)
# The earlier parts whose code a part's tests run (the rest are graded on stand-ins of their own);
# tests/test_assignment.py checks that a part passes with only these written.
TRAINS = ("embeddings", "attention", "layer", "pooling", "training")  # what train.py runs
NEEDS = {"pooling": TRAINS[:3],  # a tiny BERT
         "proxy-inference": ("softtriple", "proxynca", "proxyanchor"),
         "memory": (*TRAINS, "knnbert", "moco-loss")}  # tiny training runs of the memory losses
NUMBER = {p.name: i + 1 for i, p in enumerate(PARTS)}
BY_NAME = {p.name: p for p in PARTS}
PART_FILES = sorted({p.file for p in PARTS})


def label(name):
    """'part 2 attention': how tests and stubs name a part."""
    return f"part {NUMBER[name]} {name}"


class AssignmentError(MinknnError):
    """A problem with the markers, an edition or a flag: one line, exit status 2 (minknn.run)."""


def find_blocks(lines, path):
    """The solution blocks of a file's lines: [(name, begin, end)], begin and end the markers'
    line indices. Unbalanced, nested or unknown markers are errors naming the file and line."""
    blocks, open_ = [], None
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        where = f"{path}:{i + 1}"
        name = m["name"]
        if name not in BY_NAME:
            raise AssignmentError(f"{where}: unknown part '{name}'; PARTS in "
                                  f"minknn/assignment/parts.py lists: {', '.join(BY_NAME)}")
        if BY_NAME[name].file != path:
            raise AssignmentError(f"{where}: part '{name}' lives in {BY_NAME[name].file} "
                                  f"(minknn/assignment/parts.py, PARTS)")
        if m["end"] == "BEGIN":
            if open_:
                raise AssignmentError(f"{where}: BEGIN part {name} inside part {open_[0]}")
            open_ = (name, i, m["indent"])
        else:
            if not open_ or open_[0] != name or open_[2] != m["indent"]:
                raise AssignmentError(f"{where}: END part {name} without a BEGIN part {name} "
                                      f"at the same indent")
            blocks.append((name, open_[1], i))
            open_ = None
    if open_:
        raise AssignmentError(f"{path}:{open_[1] + 1}: BEGIN part {open_[0]} is never ENDed")
    return blocks


def stub(name, indent):
    part = BY_NAME[name]
    message = f"{label(name)}: {part.statement} ({part.source}); see HANDOUT.md"
    return [f"{indent}raise NotImplementedError({message!r})\n"]


# the stub's raise line, as stub() writes it: the block of a part not written yet
STUB = re.compile(r"""^\s*raise NotImplementedError\(\s*['"]part \d+ (?P<name>[a-z0-9-]+)""")


def is_stub(name, body):
    """Whether a block's lines (between its markers) are part `name`'s stub: its raise line
    alone, blank lines and comments aside."""
    code = [line for line in body if line.strip() and not line.lstrip().startswith("#")]
    m = len(code) == 1 and STUB.match(code[0])
    return bool(m) and m["name"] == name


def stubbed_part(message):
    """The part whose stub raised a NotImplementedError with this message, or None."""
    m = re.match(r"part \d+ (?P<name>[a-z0-9-]+)", message)
    return m["name"] if m and m["name"] in BY_NAME and message.startswith(label(m["name"])) \
        else None


def not_written(name, why="is not written yet"):
    """One line for a part a run needs: where it lives and the command that tests it."""
    part = BY_NAME[name]
    return f"{label(name)} {why} ({part.file}); test it with: {part.test}"


def require_written(names, root=ROOT):
    """Stops a run (MinknnError) naming the first of the parts `names`, in the handout's order,
    with a block still a stub in root; train.py and evaluate.py call it before any slow work.
    Reads only those parts' files: a few ms. A file that is missing (minknn installed without
    its scripts) or whose markers are broken (--solve's business, not the run's) is skipped."""
    for name in sorted(set(names), key=NUMBER.__getitem__):
        try:
            lines = read_lines(os.path.join(root, BY_NAME[name].file))
            blocks = [lines[b + 1:e] for n, b, e in find_blocks(lines, BY_NAME[name].file)
                      if n == name]
        except (OSError, AssignmentError):
            continue
        stubs = sum(is_stub(name, body) for body in blocks)
        if blocks and stubs == len(blocks):
            raise MinknnError(not_written(name))
        if stubs:
            raise MinknnError(not_written(name, f"is not finished ({stubs} of its {len(blocks)} "
                                                f"blocks are still stubs)"))


def command_argv(command):
    """A handout command (Part.test) as an argv whose `python` is this interpreter: a virtual
    environment's python run by its path, not activated, is not the `python` on PATH."""
    argv = shlex.split(command)
    return [sys.executable, *argv[1:]] if argv[0] == "python" else argv


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.readlines()
