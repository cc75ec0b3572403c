"""kiln.model.safetensors_stream: a file written tensor by tensor, in any order, is byte for byte the
file safetensors' save_file writes; a header worked by hand; shards cut in order; damaged files named."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from kiln.core.errors import FatalError
from kiln.model.safetensors_stream import (
    SafetensorsWriter,
    TensorSpec,
    header_bytes,
    header_specs,
    open_safetensors,
    shard_groups,
)


def spec(name: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, t.dtype, tuple(t.shape))


def test_a_file_written_in_any_order_is_safetensors_own_file(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "norm": torch.randn(5, generator=g).to(torch.bfloat16),  # an odd byte count before wider dtypes
        "w.b": torch.randn(3, 4, generator=g),
        "w.a": torch.randn(2, 3, generator=g).to(torch.float16),
        "scalar": torch.tensor(1.5, dtype=torch.float64),
        "empty": torch.zeros(0, 7),
    }
    save_file(tensors, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    with SafetensorsWriter(
        tmp_path / "ours.safetensors", [spec(k, t) for k, t in tensors.items()], {"format": "pt"}
    ) as w:
        for name in ["w.a", "empty", "norm", "scalar", "w.b"]:
            w.write(name, tensors[name])
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    back = load_file(tmp_path / "ours.safetensors")
    assert all(torch.equal(back[k], t) and back[k].dtype == t.dtype for k, t in tensors.items())


def test_the_header_worked_by_hand() -> None:
    # fp32 first (wider), then bf16: b takes bytes 0-8 of the data, a bytes 8-14.
    header, offsets = header_bytes(
        [TensorSpec("b", torch.float32, (2,)), TensorSpec("a", torch.bfloat16, (3,))], {"k": "v"}
    )
    text = (
        '{"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"a":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}}'
    )
    assert len(text) == 134  # padded to 136 so the data starts at 8 + 136, a multiple of 8
    assert header == struct.pack("<Q", 136) + text.encode() + b"  "
    assert offsets == {"b": 0, "a": 8}
    assert json.loads(header[8:]) == json.loads(text)


def test_a_tensor_never_written_is_caught_at_close(tmp_path: Path) -> None:
    writer = SafetensorsWriter(tmp_path / "x.safetensors", [TensorSpec("a", torch.float32, (2,))])
    with pytest.raises(AssertionError, match="never written"):
        writer.close()


def test_shards_are_cut_in_order_and_a_large_tensor_gets_its_own() -> None:
    sizes = {"a": 1, "b": 1, "c": 3, "d": 1, "e": 1}  # fp32 elements: 4, 4, 12, 4, 4 bytes
    specs = [TensorSpec(n, torch.float32, (k,)) for n, k in sizes.items()]
    groups = shard_groups(specs, max_bytes=8)
    assert [[s.name for s in g] for g in groups] == [["a", "b"], ["c"], ["d", "e"]]


def test_a_truncated_file_and_an_integer_tensor_are_named(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(4), "ids": torch.arange(3)}, str(path))
    with open_safetensors(path, "fix it") as f, pytest.raises(FatalError, match=r"w.safetensors: ids is I64; kiln"):
        header_specs(f, path)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(FatalError, match=r"w.safetensors: cannot be read as safetensors \(.*\); fix it"):
        with open_safetensors(path, "fix it"):
            pass
