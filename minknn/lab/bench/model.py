"""`model`: the hand-written encoder (BERT, RoBERTa, DistilBERT, MPNet), fused and explicit
attention, against Hugging Face's model of the same folder, step for step on random tokens:
examples/s and MFU (the measured peak matmul its denominator), a train and an inference row per
length.
"""
import json
import os
import tempfile

import torch
import torch.nn as nn

from minknn import MinknnError
from minknn import backbones
from minknn.backbones import read_config
from minknn.bert import BertConfig, BertModel
from minknn.lab.bench.shared import (NO_REFERENCE, Table, check_transformers, device_name,
                                     flops_per_token, peak_matmul_flops, precision_of)
from minknn.model import Model
from minknn.tasks.registry import TASKS
from minknn.tools.engine import autocast, to_device
from minknn.tools.weights import resolve_model_path, save_safetensors


class Reference(nn.Module):
    """Hugging Face's model of the folder's architecture (BertModel, RobertaModel,
    DistilBertModel or MPNetModel) behind the same call signature as ours."""

    def __init__(self, transformers, path):
        super().__init__()
        self.config = read_config(path)  # ours: Model reads its hidden size and dropout
        kind = self.config.model_type
        name = {"bert": "BertModel", "roberta": "RobertaModel", "distilbert": "DistilBertModel",
                "mpnet": "MPNetModel"}
        pooler = {} if kind == "distilbert" else {"add_pooling_layer": False}  # minknn has none
        self.hf = getattr(transformers, name[kind]).from_pretrained(path, **pooler)
        self.types = kind not in ("distilbert", "mpnet")  # they take no token types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        types = {"token_type_ids": token_type_ids} if self.types else {}
        return self.hf(input_ids=input_ids, attention_mask=attention_mask,
                       **types).last_hidden_state


def bench_model(args, device, timer, out, peak_matmul_flops=peak_matmul_flops,
                check_transformers=check_transformers, weights="trained"):
    """The `model` table. main passes peak_matmul_flops and check_transformers as the package
    (minknn.lab.bench) has them when it runs, so that a test's stand-in there is the one called.
    With --random, a random BERT of those sizes, written to a temporary folder for both sides."""
    if args.random:
        with tempfile.TemporaryDirectory() as folder:
            random_bert(folder, *args.random, vocab_from=resolve_model_path(args.model))
            return bench_model(argparse_copy(args, model=folder, random=None), device, timer,
                               out, peak_matmul_flops, check_transformers, weights="random")
    path = resolve_model_path(args.model)
    positions = read_config(path).max_tokens
    if max(args.lengths) > positions:
        raise MinknnError(f"--lengths {max(args.lengths)}: longer than the model's {positions} "
                          f"positions")
    sst = [TASKS["sst"]]  # a 5-class head, as on SST
    torch.manual_seed(0)
    models = {"minknn": Model(backbones.from_pretrained(path), sst, "mean")}
    # --attention explicit, the student edition's default: attention() as written, same weights
    models["minknn explicit"] = Model(backbones.from_pretrained(path).set_attention("explicit"),
                                      sst, "mean")
    models["minknn explicit"].heads.load_state_dict(models["minknn"].heads.state_dict())
    if device.type == "cuda" and args.ragged:  # attention over the packed tokens against the
        # padded call (packed.packed_kernel: the CPU always runs the padded one)
        models["minknn packed"] = Model(backbones.from_pretrained(path).set_attention("packed"),
                                        sst, "mean")
        models["minknn packed"].heads.load_state_dict(models["minknn"].heads.state_dict())
    transformers = check_transformers()
    if transformers:
        models["transformers"] = Model(Reference(transformers, path), sst, "mean")
        models["transformers"].heads.load_state_dict(models["minknn"].heads.state_dict())
    for m in models.values():
        m.to(device)
    peak = peak_matmul_flops(device)
    config = models["minknn"].bert.config
    out.append(f"`python -m minknn.lab.bench model`: {device_name(device)}, "
               f"{precision_of(device)}; {config.model_type}, {config.num_hidden_layers} layers "
               f"{config.hidden_size} wide, {weights} weights; batch {args.batch_size} of random "
               f"tokens, "
               f"{'lengths from T/4 to T, padded to T' if args.ragged else 'no padding'}; "
               f"best of {args.rounds} alternating rounds of {args.steps} steps; measured peak "
               f"matmul {peak / 1e12:.3f} TFLOP/s"
               f"{'' if transformers else NO_REFERENCE}\n")
    print(out[-1])
    table = Table(out, "length", "step", *[f"{m} examples/s" for m in models],
                  *[f"{m} MFU" for m in models], "explicit / fused attention",
                  *(["packed / fused attention"] if "minknn packed" in models else []),
                  *(["minknn / transformers"] if transformers else []))
    for T in args.lengths:
        g = torch.Generator().manual_seed(T)
        low = 1000 if config.vocab_size > 2000 else 0  # past BERT's special and [unused] ids
        lengths = torch.full((args.batch_size,), T)
        if args.ragged:  # the longest is T, as in a batch padded to its longest
            lengths = torch.randint(T // 4, T + 1, (args.batch_size,), generator=g)
            lengths[0] = T
        mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        batch = {"input_ids": torch.randint(low, config.vocab_size, (args.batch_size, T),
                                            generator=g) * mask,
                 "attention_mask": mask,
                 "token_type_ids": torch.zeros(args.batch_size, T, dtype=torch.long)}
        batch = to_device(batch, device)
        labels = torch.randint(0, 5, (args.batch_size,), generator=g).to(device)
        for train in (True, False):
            steps = {name: model_step(m, batch, labels, device, train)
                     for name, m in models.items()}
            seconds = timer.best_of_rounds(steps, args.steps, warmup=2)
            flops = sum(n * flops_per_token(config, n) for n in lengths.tolist())  # real tokens
            flops *= 3 if train else 1
            ratio = [f"{seconds['transformers'] / seconds['minknn']:.2f}"] if transformers else []
            if "minknn packed" in seconds:
                ratio.insert(0, f"{seconds['minknn packed'] / seconds['minknn']:.2f}")
            table.row(T, "train" if train else "inference",
                      *[f"{args.batch_size / s:.1f}" for s in seconds.values()],
                      *[f"{flops / s / peak:.2f}" for s in seconds.values()],
                      f"{seconds['minknn explicit'] / seconds['minknn']:.2f}", *ratio)


def random_bert(folder, layers, hidden, vocab_from):
    """A BERT folder of random weights (BERT's init, seed 0): `layers` layers `hidden` wide, heads
    of 64 and a 4x feed-forward as BERT-base's (12, 768: BERT-base's 110M parameters), with the
    vocabulary size of the folder vocab_from: the cost of a base-size model where its weights are
    not at hand."""
    config = {"model_type": "bert", "vocab_size": read_config(vocab_from).vocab_size,
              "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": max(1, hidden // 64),
              "intermediate_size": 4 * hidden, "max_position_embeddings": 512}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    torch.manual_seed(0)
    model = BertModel(BertConfig(**config))
    save_safetensors({k: v.contiguous() for k, v in model.state_dict().items()},
                     os.path.join(folder, "model.safetensors"))


def argparse_copy(args, **changes):
    return type(args)(**{**vars(args), **changes})


def model_step(model, batch, labels, device, train):
    """One step of the classifier: forward, cross-entropy, backward, AdamW (train); or a forward
    under torch.inference_mode() (inference)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():
        model.train(train)
        if train:
            with autocast(device):
                loss = nn.functional.cross_entropy(model("sst", **batch).logits.float(), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        else:
            with torch.inference_mode(), autocast(device):
                model("sst", **batch)
    return step
