"""safetensors files read and written one tensor at a time, so memory holds one tensor, not the file.

The format is safetensors' own: an 8-byte little-endian header length, a JSON header
(`{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}`,
padded with spaces so the data starts 8-byte aligned), then the tensors' raw bytes back to back in
header order. SafetensorsWriter writes the header first, from names, dtypes and shapes alone; each
tensor then goes to its offset, in any order, and closing checks that every one came. Tensors are
laid out as safetensors lays them out (wider dtypes first, then by name), so each starts aligned to
its element size and the file reads back with safetensors' own readers. Reading is safetensors'
lazy `safe_open`: the header gives names, dtypes and shapes before any data is read, and
read_tensor opens the file for each tensor, so its mapped pages never add up to the file.
Not handled here: big-endian hosts, integer or quantized dtypes, what the names mean
(kiln.model.weights, kiln.evaluate.import_hf, kiln.evaluate.export).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from kiln.core.errors import FatalError

CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
DTYPES = {code: dtype for dtype, code in CODES.items()}


@dataclass(frozen=True)
class TensorSpec:
    """What a header says of a tensor: enough to place it in a file before its data exists."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def header_bytes(specs: list[TensorSpec], metadata: dict[str, str] | None) -> tuple[bytes, dict[str, int]]:
    """The length-prefixed, padded header of `specs` in their order, and each tensor's offset into the data."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offsets, offset = {}, 0
    for spec in specs:
        header[spec.name] = {
            "dtype": CODES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offsets[spec.name], offset = offset, offset + spec.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the 8-byte length prefix keeps the data 8-byte aligned
    return struct.pack("<Q", len(text)) + text, offsets


class SafetensorsWriter:
    """One safetensors file written tensor by tensor: `write(name, tensor)` for every spec, then close."""

    def __init__(self, path: Path, specs: Iterable[TensorSpec], metadata: dict[str, str] | None = None) -> None:
        assert sys.byteorder == "little", "safetensors stores little-endian bytes"
        # safetensors' own order: every tensor starts at a multiple of its element size.
        ordered = sorted(specs, key=lambda s: (-s.dtype.itemsize, s.name))
        assert len({s.name for s in ordered}) == len(ordered), "tensor names are unique in a file"
        header, self._offsets = header_bytes(ordered, metadata)
        self._pending = {s.name: s for s in ordered}
        self._start = len(header)
        self.path = path
        self._file = open(path, "wb")
        self._file.write(header)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """The tensor's bytes at its place; its dtype and shape must be the spec's."""
        spec = self._pending.pop(name)
        assert tensor.dtype == spec.dtype and tuple(tensor.shape) == spec.shape, f"{name}: not as its spec says"
        self._file.seek(self._start + self._offsets[name])
        # A byte view of the tensor's own memory: no copy unless it is not contiguous.
        self._file.write(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())

    def close(self) -> None:
        self._file.close()
        assert not self._pending, f"{self.path}: never written: {sorted(self._pending)[:5]}"

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.close()
        else:  # the caller's error is the one to see; the half-written file is the caller's to remove
            self._file.close()


def shard_groups(specs: list[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """`specs` in order, cut into files of at most max_bytes each (a larger tensor gets a file of its own)."""
    groups: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if groups[-1] and size + spec.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(spec)
        size += spec.nbytes
    return groups


@contextmanager
def open_safetensors(path: Path, fix: str) -> Iterator[Any]:
    """safetensors' lazy reader of `path` (a tensor is read when asked for, by name); a file that is
    not safetensors, is truncated (shorter than its header says), or fails while read stops with
    one FatalError naming it, followed by `fix`."""

    def fatal(e: Exception) -> FatalError:
        return FatalError(f"{path}: cannot be read as safetensors ({type(e).__name__}: {e}); {fix}")

    try:
        handle = safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, ValueError) as e:
        raise fatal(e) from None
    with handle:
        try:
            yield handle
        except SafetensorError as e:  # only the reader's: the caller's own errors pass unchanged
            raise fatal(e) from None


def read_tensor(path: Path, name: str, fix: str) -> torch.Tensor:
    """One tensor of a file, the file opened for it alone: safe_open maps the file, and the pages a
    read touches count as this process's memory until it closes, so a whole file read through one
    handle ends up resident. Measured (benchmarks/import_export_memory.py, 1B params in bf16): the
    export's peak RSS was 2,349 MB through one handle, 505 MB opened per tensor (an idle kiln
    process: 463 to 528 MB). Opening per tensor costs a header parse (kilobytes)."""
    with open_safetensors(path, fix) as f:
        return f.get_tensor(name)


def header_specs(handle: Any, path: Path) -> dict[str, TensorSpec]:
    """Every tensor of an open file, from its header alone; FatalError naming a tensor of a dtype kiln does not read."""
    specs = {}
    for name in handle.keys():
        view = handle.get_slice(name)
        code = view.get_dtype()
        if code not in DTYPES:
            raise FatalError(
                f"{path}: {name} is {code}; kiln reads floating-point weights only ({', '.join(DTYPES)}): give "
                "unquantized weights"
            )
        specs[name] = TensorSpec(name, DTYPES[code], tuple(view.get_shape()))
    return specs
