"""The files of a resumable state, written and read back so that none can run code or crash a resume.

torch.distributed.checkpoint's FileSystemWriter pickles the checkpoint's Metadata into `.metadata`
and its reader unpickles it, so a state folder could run any code on resume, whatever checksums
sit beside it (complete.json shows a file is unchanged since it was summed, not who wrote it).
`Writer` writes the same Metadata as `metadata.json` (format `kiln-dcp-metadata v1`); `Reader`
builds it back from that file alone, checking every field's type and that every entry is a tensor
chunk stored inside one of the folder's `.distcp` files. DCP reads tensors with
torch.load(weights_only=True), which only rebuilds tensors and plain containers (the one unpickling
left); it loads any other value with torch.load(weights_only=False), so kiln saves tensors only
and the reader refuses a non-tensor entry. A write that fails (a full disk) raises the OSError of
the file it was writing: torch.save's zip writer swallows it and raises a RuntimeError of its own.
train_state.json and rng-<rank>.json are read against their schemas (`TrainState`, `RngState`),
the data stream's rows and the tokens trained against the run's geometry (`drawn_by`), the random
states by the generators themselves. Every refusal is a FatalError naming the file and the key.
Not handled here: which states exist and when they are saved (kiln.train.resume); whether a
stream's positions fit its documents (kiln.mix.streams); layouts other than dense, contiguous
tensors (kiln saves no others).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, FileSystem, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.storage import WriteResult

from kiln.core.errors import FatalError
from kiln.train.geometry import StepGeometry, step_geometry

if TYPE_CHECKING:
    from kiln.train.config import TrainConfig

METADATA, PICKLED_METADATA = "metadata.json", ".metadata"
FORMAT = "kiln-dcp-metadata v1"
# What to do about a state that is refused: every message about one ends with this.
NOT_LOADED = (
    "the state was damaged or edited, so it is not loaded: resume from an older state with --from STEP, "
    "or pass --force to start over"
)
# The files DCP's writer names (`__<rank>_<n>.distcp`): a bare name, so an entry never points outside its folder.
SHARD_NAME = re.compile(r"__\d+_\d+\.distcp")
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}

M = TypeVar("M", bound=BaseModel)


class Record(BaseModel):
    """A JSON record kiln wrote: exact types (no 1.0 for 1, no true for 1), no unknown keys."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def read_json(path: Path, schema: type[M]) -> M:
    """`path` parsed and checked against `schema`; FatalError naming the file and the first wrong key otherwise."""
    try:
        return schema.model_validate_json(path.read_bytes())
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"])) or "the file"
        found = "" if first["type"] in ("missing", "json_invalid") else f" (found {json.dumps(first['input'])[:80]})"
        raise FatalError(f"{path}: {where}: {first['msg']}{found}; {NOT_LOADED}") from None


def write_text(path: Path, text: str) -> None:
    """Write a small file; a failed write raises an OSError naming the path (a failed write() alone does not)."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e


class _Chunk(Record):
    offsets: list[int] = Field(description="Where the chunk starts in the whole tensor, per dimension.")
    sizes: list[int] = Field(description="The chunk's size per dimension.")


class _Tensor(Record):
    dtype: str
    size: list[int] = Field(description="The whole tensor's size (over every rank's chunks).")
    requires_grad: bool
    pin_memory: bool
    chunks: list[_Chunk]


class _Stored(Record):
    fqn: str
    offset: list[int] = Field(description="The chunk's offsets: which chunk of `fqn` this is.")
    index: int | None = Field(ge=0, description="DCP's hint: the chunk's place in the tensor's list.")
    file: str
    start: int = Field(ge=0, description="Byte offset of the chunk's torch.save record in `file`.")
    length: int = Field(ge=0, description="Bytes of that record.")


class _MetadataFile(Record):
    format: Literal["kiln-dcp-metadata v1"]
    version: str = Field(description="DCP's metadata version at save time.")
    tensors: dict[str, _Tensor]
    storage: list[_Stored]
    planner_data: dict[str, list[str | int]] = Field(description="Flattened key -> its path in the nested state dict.")
    checkpoint_id: str | None
    save_id: str | None
    modules: list[str]


def encode(metadata: Metadata) -> dict[str, Any]:
    tensors = {}
    for fqn, md in metadata.state_dict_metadata.items():
        assert isinstance(md, TensorStorageMetadata), (
            f"{fqn}: kiln saves tensors only, DCP would pickle a {type(md).__name__}"
        )
        p = md.properties
        assert p.layout == torch.strided and p.memory_format == torch.contiguous_format, (
            f"{fqn}: {p.layout}, {p.memory_format}"
        )
        chunks = [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in md.chunks]
        tensors[fqn] = {
            "dtype": str(p.dtype).removeprefix("torch."),
            "size": list(md.size),
            "requires_grad": p.requires_grad,
            "pin_memory": p.pin_memory,
            "chunks": chunks,
        }
    storage = [
        {
            "fqn": i.fqn,
            "offset": list(i.offset or ()),
            "index": i.index,
            "file": s.relative_path,
            "start": s.offset,
            "length": s.length,
        }
        for i, s in metadata.storage_data.items()
    ]
    meta = metadata.storage_meta or StorageMeta()
    return {
        "format": FORMAT,
        "version": metadata.version,
        "tensors": tensors,
        "storage": storage,
        "planner_data": {k: list(v) for k, v in (metadata.planner_data or {}).items()},
        "checkpoint_id": None if meta.checkpoint_id is None else str(meta.checkpoint_id),
        "save_id": meta.save_id,
        "modules": list(meta.modules),
    }


def read_metadata(folder: Path) -> Metadata:
    """The DCP Metadata of a state folder, from its metadata.json alone; FatalError naming the file otherwise."""
    path = folder / METADATA
    if not path.is_file():
        raise FatalError(f"{folder}: no {METADATA}, the description of its model and optimizer shards; {NOT_LOADED}")
    md = read_json(path, _MetadataFile)

    def refuse(problem: str) -> FatalError:
        return FatalError(f"{path}: {problem}; {NOT_LOADED}")

    tensors, wanted = {}, set()
    for fqn, t in md.tensors.items():
        if t.dtype not in DTYPES:
            raise refuse(f"tensors.{fqn}.dtype: {t.dtype!r} is not one of {sorted(DTYPES)}")
        for i, c in enumerate(t.chunks):
            dims = len(c.offsets) == len(c.sizes) == len(t.size)
            if (
                not dims
                or any(n < 0 for n in t.size)
                or not all(0 <= o and 0 <= s and o + s <= n for o, s, n in zip(c.offsets, c.sizes, t.size))
            ):
                raise refuse(
                    f"tensors.{fqn}.chunks.{i}: offsets {c.offsets} and sizes {c.sizes} do not lie inside its "
                    f"size {t.size}"
                )
            wanted.add((fqn, tuple(c.offsets)))
        properties = TensorProperties(dtype=DTYPES[t.dtype], requires_grad=t.requires_grad, pin_memory=t.pin_memory)
        chunks = [ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in t.chunks]
        tensors[fqn] = TensorStorageMetadata(properties, torch.Size(t.size), chunks)
    storage = {}
    for i, s in enumerate(md.storage):
        if not SHARD_NAME.fullmatch(s.file) or not (folder / s.file).is_file():
            raise refuse(f"storage.{i}.file: {s.file!r} is not one of the folder's __<rank>_<n>.distcp files")
        if s.start + s.length > (folder / s.file).stat().st_size:
            raise refuse(f"storage.{i}: bytes {s.start}..{s.start + s.length} lie past the end of {s.file}")
        if (s.fqn, tuple(s.offset)) not in wanted:
            raise refuse(f"storage.{i}: {s.fqn} at {s.offset} is no chunk of a tensor listed under tensors")
        storage[MetadataIndex(s.fqn, s.offset, s.index)] = _StorageInfo(s.file, s.start, s.length)
    if missing := wanted - {(i.fqn, tuple(i.offset or ())) for i in storage}:
        fqn, offsets = sorted(missing)[0]
        raise refuse(f"tensors.{fqn}: the chunk at {list(offsets)} is stored nowhere ({len(missing)} chunk(s) so)")
    planner_data = {k: tuple(v) for k, v in md.planner_data.items()}
    return Metadata(
        tensors, planner_data, storage, StorageMeta(md.checkpoint_id, md.save_id, None, md.modules), md.version
    )


class _KeepsError(io.BufferedWriter):
    """A shard file that keeps the first OSError of its writes (torch.save's zip writer swallows it)."""

    failure: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return super().write(data)
        except OSError as e:
            self.failure = self.failure or e
            raise

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as e:
            self.failure = self.failure or e
            raise


class _Disk(FileSystem):
    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[io.IOBase]:
        assert mode == "wb", f"the writer's files are written, not opened {mode}"
        stream = _KeepsError(io.FileIO(path, mode))
        try:
            yield stream
            stream.close()
        except BaseException as e:
            with suppress(OSError):
                stream.close()  # closes the file even when the final flush fails again
            if stream.failure is None:
                raise
            raise OSError(stream.failure.errno, stream.failure.strerror, str(path)) from e


class Writer(FileSystemWriter):
    """DCP's file writer with kiln's metadata.json in place of the pickled `.metadata` (sync and async saves)."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.fs = _Disk()

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator, once every rank's shards are written: what FileSystemWriter.finish records, as JSON."""
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        metadata.storage_meta = self.storage_meta()
        write_text(Path(self.path) / METADATA, json.dumps(encode(metadata)))


class Reader(FileSystemReader):
    """DCP's file reader that takes the Metadata from metadata.json and never opens a pickled `.metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self.path))
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


# train_state.json and rng-<rank>.json: what kiln.train.loop, kiln.mix's sampler, the guard, the
# mixture windows and kiln.train.resume write, field for field.
Count = Annotated[int, Field(ge=0)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Stream(Record):
    epoch: Count
    turn: Count
    position: list[Count]
    offset: list[Count]
    switched_at: list[Count]


class _Sampler(Record):
    sources: list[str]
    rows_drawn: Count
    drawn: list[Count]
    streams: list[_Stream]
    factors: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]]
    last_val: dict[str, Finite]


class _Batches(Record):
    rows: _Sampler
    seen: list[Count]


class _Mixture(Record):
    first_step: Annotated[int, Field(ge=1)]
    start_tokens: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]]
    intended: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]]
    records: list[dict[str, Any]]


class _Guard(Record):
    history: list[Finite]
    rollbacks: Count
    skips: dict[Annotated[str, Field(pattern=r"^[1-9][0-9]*$")], Annotated[int, Field(ge=1)]]
    low_lr_until: Count


class _Scaler(Record):
    scale: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    growth_factor: Finite
    backoff_factor: Finite
    growth_interval: Annotated[int, Field(ge=1)]
    growth_tracker: Count = Field(alias="_growth_tracker")


class _NoScaler(Record):
    """A disabled GradScaler's state: nothing."""


class _Scores(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    loss: Finite


class _Validation(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    sources: dict[str, _Scores]
    all: _Scores
    objective: _Scores | None = None


class TrainState(Record):
    step: Annotated[int, Field(ge=1)]
    processes: Annotated[int, Field(ge=1)]
    # (first step, data-parallel ranks) of each stretch of steps drawn with that many ranks.
    data_ranks: list[tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]]]
    batches: _Batches
    mixture: _Mixture
    tokens_trained: Count
    train_flops: Count
    val_before: _Validation | None
    guard: _Guard
    scaler: _Scaler | _NoScaler


class RngState(Record):
    python: tuple[Literal[3], list[int], float | None]
    numpy: tuple[Literal["MT19937"], list[int], int, int, float]
    torch: str
    cuda: list[str] = []


def drawn_by(cfg: TrainConfig, step: int, data_ranks: list[tuple[int, int]], skips: dict[int, int]) -> tuple[int, int]:
    """(rows of the global stream drawn, tokens trained on) after `step` of this run: each step draws its
    rows (kiln.train.geometry, at the data ranks of its stretch) once, and once more per rollback it caused."""

    def world_at(s: int) -> int:
        return [world for first, world in data_ranks if first <= s][-1]

    def shape(s: int) -> StepGeometry:
        world = world_at(s)
        return step_geometry(s, cfg, world)

    # A step's shape changes only at a stretch's first step, a phase's first step and during batch-size
    # warmup: between those cuts it is the first step's, so a million steps take milliseconds.
    cuts = {1, step + 1, *(first for first, _ in data_ranks)}
    cuts |= set(range(1, (cfg.batch_warmup.steps if cfg.batch_warmup else 0) + 2))
    for phase in cfg.seq_len_schedule or []:
        first = math.ceil(phase.start * cfg.steps) + 1
        cuts |= {first - 1, first, first + 1}  # either side of the rounding of (first - 1) / steps
    bounds = sorted(c for c in cuts if 1 <= c <= step + 1)
    rows = tokens = 0
    for a, b in itertools.pairwise(bounds):
        g, world = shape(a), world_at(a)
        rows += g.rows_per_rank * world * (b - a)
        tokens += g.tokens(world) * (b - a)
    rows += sum(shape(s).rows_per_rank * world_at(s) * n for s, n in skips.items() if s <= step)
    return rows, tokens


def check_train_state(path: Path, step: int, cfg: TrainConfig) -> None:
    """train_state.json of the state after `step`, checked against its schema and against this run:
    the rows its data stream drew and the tokens trained must be what `cfg` draws by that step."""
    state = read_json(path, TrainState)

    def refuse(problem: str) -> FatalError:
        return FatalError(f"{path}: {problem}; {NOT_LOADED}")

    if state.step != step:
        raise refuse(f"step: {state.step}, but the folder holds the state after step {step}")
    firsts = [first for first, _ in state.data_ranks]
    if not firsts or firsts[0] != 1 or firsts != sorted(set(firsts)) or firsts[-1] > step:
        raise refuse(f"data_ranks: {state.data_ranks} must start at step 1 and go forward, up to step {step}")
    sampler, mixture = state.batches.rows, state.mixture
    lengths = {
        "batches.rows.sources": len(sampler.sources),
        "batches.rows.drawn": len(sampler.drawn),
        "batches.rows.streams": len(sampler.streams),
        "batches.rows.factors": len(sampler.factors),
        "batches.seen": len(state.batches.seen),
        "mixture.start_tokens": len(mixture.start_tokens),
        "mixture.intended": len(mixture.intended),
    }
    if len(set(lengths.values())) > 1:
        raise refuse(
            "one entry per source is expected in each of " + ", ".join(f"{k} ({n})" for k, n in lengths.items())
        )
    for i, s in enumerate(sampler.streams):
        lanes = len(s.position)
        if not 0 < lanes == len(s.offset) or s.turn >= lanes or len(s.switched_at) not in (0, lanes):
            raise refuse(
                f"batches.rows.streams.{i}: position, offset (and switched_at, once set) hold one entry per lane, "
                "and turn is a lane"
            )
    if sum(sampler.drawn) != sampler.rows_drawn:
        raise refuse(
            f"batches.rows.rows_drawn: {sampler.rows_drawn}, but its rows per source (drawn) add up to "
            f"{sum(sampler.drawn)}"
        )
    if mixture.first_step > step + 1:
        raise refuse(f"mixture.first_step: {mixture.first_step} lies after step {step + 1}")
    skips = {int(s): n for s, n in state.guard.skips.items()}
    rows, tokens = drawn_by(cfg, step, list(state.data_ranks), skips)
    if sampler.rows_drawn != rows:
        skipped = sum(n for s, n in skips.items() if s <= step)
        raise refuse(
            f"batches.rows.rows_drawn: {sampler.rows_drawn}, but steps 1..{step} of this run draw {rows} rows "
            f"({skipped} rollback(s) "
            "skipping a step's rows included): the data would not go on where the weights left it"
        )
    if state.tokens_trained != tokens:
        raise refuse(
            f"tokens_trained: {state.tokens_trained}, but steps 1..{step} of this run train on {tokens} tokens"
        )


def check_rng_state(path: Path, apply: Callable[[dict[str, Any]], None]) -> None:
    """rng-<rank>.json, checked against its schema and by `apply`ing it (the generators refuse a
    state of the wrong size or range); every generator is as it was afterwards."""
    read_json(path, RngState)
    state = json.loads(path.read_bytes())
    python, numpy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if "cuda" in state else []):
            apply(state)
    except (ValueError, TypeError, LookupError, OverflowError, RuntimeError) as e:
        raise FatalError(f"{path}: a random generator refuses this state ({e}); {NOT_LOADED}") from None
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
