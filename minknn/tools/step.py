"""A training step's batch and forward, before its losses: what happens at every step to the run's
parts that minknn/tools/trainer.py builds once. train.py's train_step calls forward() and computes
each task's loss on what it returns; its loop draws the rows and calls batch().

    batches = batch(trainer, {name: next(stream) for name, stream in trainer.streams.items()})
    outputs, keys = forward(trainer, batches)      # train_step's forward, gathered under torchrun

batches: task -> (inputs, targets, rows), the rows being indices into the task's training
examples (AncSetFit's statements below 0: statements()). trainer: minknn/tools/trainer.py's Trainer.

Under torchrun (minknn/tools/distributed.py) every rank builds the same Trainer from the same seed
and draws the same batches' rows; batch() encodes only the rank's slice of each batch, and forward()
gathers the slices' outputs, so that every loss sees the whole batch. Forward puts every task's
forward in one call, as DistributedDataParallel needs (trainer.build wraps the model in it).
"""
import torch
import torch.nn as nn

from minknn.kinds import kind_of
from minknn.model import Output
from minknn.tasks.data import Example, class_statements
from minknn.tools.distributed import gather_output, rank, sizes, slice_of, world
from minknn.tools.engine import autocast, encode_batch, to_device


def batch(trainer, rows):
    """One step's batch, task -> (inputs, targets, rows), of the rows each task's stream drew
    (rows: task -> row indices into its training examples). Under torchrun the inputs are this
    rank's slice of the batch (distributed.slice_of), the targets and rows the whole batch's."""
    batches = {}
    for t in trainer.tasks:
        anchors = statements(t) if min(rows[t.name]) < 0 else None  # AncSetFit's rows below 0
        examples = [trainer.train[t.name][i] if i >= 0 else anchors[-1 - i] for i in rows[t.name]]
        start, stop = slice_of(len(examples), rank(), world())
        # a rank with no rows (a last batch smaller than the ranks) still runs its forward, as
        # DDP needs, on one example that forward() then drops
        mine = examples[start:stop] or examples[-1:]
        inputs = encode_batch(trainer.tokenizer, mine, trainer.model.siamese(t))
        batches[t.name] = (to_device(inputs, trainer.device),
                           kind_of(t).targets(t, examples, trainer.device),
                           torch.tensor(rows[t.name], device=trainer.device))
    return batches


def statements(task):
    """AncSetFit's anchors, one example a class: its statement (minknn/tasks/data.py
    class_statements), labelled with its class; a batch's row -1 - c stands for class c's."""
    return [Example(text=s, label=c) for c, s in enumerate(class_statements(task))]


class Forward(nn.Module):
    """Every task's forward of a step in one call, task -> Output: DistributedDataParallel
    expects one forward per backward, and a multi-task step has one per task."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs):
        return {name: self.model(name, **x) for name, x in inputs.items()}


def forward(trainer, batches):
    """A step's forward, under --precision: (task -> its Output, a memory loss's keys of the
    batch or None). Under torchrun the outputs are the whole batch's: DistributedDataParallel (or,
    for a PCGrad step, its module, which leaves DDP's averaging out: minknn/pcgrad.py) encodes
    this rank's slices, and their outputs are gathered from every rank with their gradients
    (distributed.gather_output); so are the keys (memory.MoCo.batch_keys)."""
    model, moco, ddp = trainer.model, trainer.moco, trainer.ddp
    device = next(iter(batches.values()))[1].device
    with autocast(device, trainer.args.precision):
        keys = None
        if moco:  # a run of one task; the key encoder's momentum step comes first
            (inputs, _, rows), = batches.values()
            keys = moco.batch_keys(model, inputs, rows)
        if ddp is None:
            return {name: model(name, **inputs) for name, (inputs, _, _) in batches.items()}, keys
        outputs = (ddp.module if trainer.pcgrad else ddp)(
            {name: inputs for name, (inputs, _, _) in batches.items()})
    gathered = {}
    for name, (_, _, rows) in batches.items():
        n, output = sizes(len(rows), world()), outputs[name]
        if n[rank()] == 0:  # batch()'s stand-in example: no rows of this rank's
            output = Output(output.logits[:0], output.z[:0], retrieval=None
                            if output.retrieval is None else output.retrieval[:0])
        gathered[name] = gather_output(output, n, model.siamese(model.tasks[name]))
    return gathered, keys
