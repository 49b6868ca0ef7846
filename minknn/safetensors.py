"""Read (and write) the safetensors weight format by hand.

The format (https://huggingface.co/docs/safetensors) is deliberately simple:

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
import struct

import torch

from minknn import MinknnError

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


def save_safetensors(tensors, path):
    """Writes {name: tensor} in the same format (used by the tests to make tiny models)."""
    names = {v: k for k, v in DTYPES.items()}
    header, chunks, offset = {}, [], 0
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
