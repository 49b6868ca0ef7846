import json
import struct

import pytest
import torch

from minknn.tools.weights import WeightsError, load_safetensors, save_safetensors


def test_round_trip(tmp_path):
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5), "c": torch.randn(2, dtype=torch.float64),
               "d": torch.randn(2, 2).to(torch.bfloat16), "e": torch.tensor(3.0)}
    save_safetensors(tensors, tmp_path / "w.safetensors")
    back = load_safetensors(tmp_path / "w.safetensors")
    assert set(back) == set(tensors)
    for k in tensors:
        assert back[k].dtype == tensors[k].dtype and torch.equal(back[k], tensors[k])


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "w.safetensors"
    save_safetensors({"w": torch.randn(10, 10)}, path)
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    with pytest.raises(WeightsError, match="truncated"):
        load_safetensors(path)
    path.write_bytes(data[:20])  # cut inside the header
    with pytest.raises(WeightsError, match="header says"):
        load_safetensors(path)
    path.write_bytes(data[:3])
    with pytest.raises(WeightsError, match="only 3 bytes"):
        load_safetensors(path)


def test_malformed_header_is_a_clear_error(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(WeightsError, match="not valid JSON"):
        load_safetensors(path)
    header = json.dumps({"w": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(WeightsError, match="tensor 'w' has a malformed entry"):
        load_safetensors(path)
