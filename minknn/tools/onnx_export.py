"""python -m minknn.tools.export RUN OUT --onnx: the run as two ONNX graphs, in OUT/onnx/.

    model.onnx       the encoder: input_ids, attention_mask (and BERT's token_type_ids), each
                     (batch, sequence) int64, to last_hidden_state (batch, sequence, H), zeros at
                     the padding. sentence-transformers' layout: SentenceTransformer(OUT,
                     backend="onnx") runs it (through optimum's ORTModelForFeatureExtraction), then
                     the folder's own pooling, and gives the run's z.
    classifier.onnx  the whole classifier of a one-task run, the same inputs to `probabilities`
                     (batch, C), as evaluate.py's head rule computes them: encoder, the run's
                     --pooling, the head, the softmax (each class's sigmoid for a multi-label
                     task; a similarity task's score, as is). A run of a proxy loss adds
                     `proxy_probabilities`, proxy inference at --proxy_alpha 0.5 (minknn/proxy.py).
                     onnxruntime alone runs it: the tokenizer's ids in, the probabilities out.

Both have dynamic batch and sequence axes (up to the run's --max_len), and take a batch of
mixed lengths as minknn does: padding on the right, attention_mask 0 there. torch.onnx.export
traces the model (dynamo=True, which needs the onnx and onnxscript packages: the `onnx` extra,
pip install -e '.[onnx]'), and the graph is fixed once traced, so minknn/bert.py runs unpacked
here (BertModel's pack=False, packed.py): minknn skips the padding by gathering the real tokens,
a shape that depends on the mask's values, which no traced graph can hold; unpacked, every
position goes through the layers, the padding keys masked, as transformers computes it. The
attention is the written-out one (--attention explicit: plain matmuls and a softmax, which every
ONNX runtime has). tests/test_export.py holds each against minknn, on every backbone and
pooling: within 1e-5.

A siamese pair task (--pair_mode siamese) encodes its two texts alone and a multi-task run has a
head each: their classifiers are not written (OUT/README.md says so); model.onnx is.
"""
import os

import torch
import torch.nn as nn

from minknn import MinknnError
from minknn.kinds import kind_of
from minknn.model import pool
from minknn.proxy import has_proxies, proxy_logits

PROXY_ALPHA = 0.5  # evaluate.py's --proxy_alpha default: what classifier.onnx mixes at


def onnx_inputs(model_type):
    """The graphs' input names: what transformers' tokenizer of that architecture returns (only
    BERT's has token types: RoBERTa's table has one row, DistilBERT and MPNet none)."""
    return ["input_ids", "attention_mask"] + ["token_type_ids"] * (model_type == "bert")


class Encoder(nn.Module):
    """model.onnx: the last hidden states, zeros at the padding (minknn's, sentence-transformers'
    Transformer module's)."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        h = self.bert(input_ids, attention_mask, token_type_ids, pack=False)
        return h * attention_mask.unsqueeze(-1).to(h.dtype)


class Classifier(nn.Module):
    """classifier.onnx: the task's probabilities by its head, and by proxy inference where its
    loss trained proxies (minknn/tools/inference.py's model and proxy rules)."""

    def __init__(self, model, task, loss):
        super().__init__()
        self.encoder, self.head, self.loss = Encoder(model.bert), model.heads[task.name], loss
        self.pooling, self.kind = model.pooling, kind_of(task)
        self.similarity = task.kind == "similarity"
        self.proxies = has_proxies(loss)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        z = pool(self.encoder(input_ids, attention_mask, token_type_ids), attention_mask,
                 self.pooling)
        logits = self.head(z)
        if self.similarity:
            logits = logits.squeeze(-1)  # a similarity score (B,), as Model.forward gives it
        found = [self.kind.probabilities(logits)]
        if self.proxies:
            found.append(self.kind.probabilities(proxy_logits(self.loss, logits, z, PROXY_ALPHA)))
        return tuple(p.float() for p in found)


def classifier_outputs(loss):
    """classifier.onnx's output names."""
    return ["probabilities"] + ["proxy_probabilities"] * has_proxies(loss)


def check_onnx():
    """--onnx's packages, before any slow work: torch.onnx.export(dynamo=True) needs both."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise MinknnError(f"--onnx needs the onnx and onnxscript packages ({e.name} is missing): "
                          f"pip install -e '.[onnx]'") from None


def write_graph(module, path, inputs, outputs, max_len):
    """Traces module on a padded batch of two and writes it to path, batch and sequence dynamic."""
    T = min(8, max_len)
    example = {"input_ids": torch.full((2, T), 5),
               "attention_mask": torch.ones(2, T, dtype=torch.long),
               "token_type_ids": torch.zeros(2, T, dtype=torch.long)}
    example["attention_mask"][1, T // 2:] = 0  # the second row padded
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence", min=2, max=max_len)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module.eval(), tuple(example[name] for name in inputs), path,
                          input_names=inputs, output_names=outputs, dynamo=True, verbose=False,
                          dynamic_shapes={name: {0: batch, 1: sequence} for name in inputs},
                          external_data=False)


def write_onnx(model, losses, max_len, out):
    """OUT/onnx/model.onnx, and classifier.onnx for a one-task run with a head on one vector.
    Returns the files written, relative to out."""
    model = model.eval()
    model.bert.set_attention("explicit")
    inputs = onnx_inputs(model.bert.config.model_type)
    write_graph(Encoder(model.bert), os.path.join(out, "onnx", "model.onnx"), inputs,
                ["last_hidden_state"], max_len)
    written = ["onnx/model.onnx"]
    task = classifier_task(model)
    if task is not None:
        write_graph(Classifier(model, task, losses[task.name]),
                    os.path.join(out, "onnx", "classifier.onnx"), inputs,
                    classifier_outputs(losses[task.name]), max_len)
        written.append("onnx/classifier.onnx")
    return written


def classifier_task(model):
    """The task classifier.onnx computes: a one-task run's, whose head reads one vector (not a
    siamese pair's); else None."""
    if len(model.tasks) != 1:
        return None
    task = next(iter(model.tasks.values()))
    return None if model.siamese(task) or task.name not in model.heads else task
