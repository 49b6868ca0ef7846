"""The loss registry: --loss NAME picks LOSSES[NAME]. Adding a loss is one new file here and one
line below; train.py needs no change.

Every loss is an nn.Module built as Loss(num_classes, dim) and called as loss(output, labels),
where output is the model's Output (logits (B, C) and pooled embeddings (B, dim)). A loss may own
parameters (class proxies, say); they are trained and saved in the checkpoint with the model.
"""
from minknn import MinknnError
from minknn.losses.ce import CrossEntropy

LOSSES = {
    "ce": CrossEntropy,
}


def get_loss_class(name):
    if name not in LOSSES:
        raise MinknnError(f"unknown --loss '{name}'; choose one of: {', '.join(LOSSES)}")
    return LOSSES[name]


def build_loss(name, num_classes, dim):
    return get_loss_class(name)(num_classes, dim)
