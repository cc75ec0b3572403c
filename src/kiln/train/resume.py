"""Resumable training states: sharded with torch.distributed.checkpoint, complete or ignored.

Every `train.checkpoint.every` steps each rank writes its shards of the model and optimizer
states with `torch.distributed.checkpoint` (DCP), so a state saved by N processes loads on M.
Beside them, rank 0 writes `train_state.json` (step, counters, sampler and mixture state: JSON,
never pickles) and every rank its RNG states (`rng-<rank>.json`). The folder is written as
`step-NNNNNNN.tmp` and renamed only after `complete.json`, the sha256 of every file in it, so a
half-written state is never loaded; a state is loaded only after those checksums match and
kiln.train.state_files has read every file back: DCP's metadata as JSON (never a pickle: a folder
holding DCP's pickled `.metadata`, as kiln wrote before, is refused unread), train_state.json and
the RNG files against their schemas, the rows the data stream drew against the run's steps. The
optimizer's group settings (lr, betas, ...) are not saved: they come from the recipe, which a
resumed run shares. A save that cannot write (a full disk) removes its `.tmp` folder and stops
with the file and the reason; the states before it stay. After each save the last `keep_last`
states stay, and every `keep_every`-th step's.
A wsd run also saves, and keeps, a state at its last stable step, whatever `every` says: a
finished run is extended from there (kiln.train.extend).
With `train.checkpoint.async_save`, DCP copies the states to CPU memory and writes them from a
background thread while training goes on (on a process group of its own, so its collectives never
interleave with the loop's); rank 0 completes the folder once every rank's shards are written
(DCP's save finishes on the coordinator last). The next save, a rollback or the end of training
waits for it.
A run on a store (kiln.core.mirror) keeps each complete state there as well and removes the pruned
ones: every rank stores the files it wrote (its shards, its RNG file), rank 0 gathers their checksums
and stores complete.json last, so ranks on machines that share no disk write one state; a state is
fetched into each machine's mirror before it is loaded, and a resumed run fetches the store's states
first (kiln.train.run.pick_state). Asynchronous saves of such a run across machines are refused.
Not handled here: the consolidated safetensors checkpoint the stage outputs (kiln.train.checkpoint).
"""

from __future__ import annotations

import base64
import errno
import json
import logging
import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pydantic import RootModel
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from kiln.core.errors import FatalError
from kiln.core.manifest import sha256_file
from kiln.core.mirror import clear, move, pull, push_files, put, shown, url_of
from kiln.train.mesh import Ranks
from kiln.train.state_files import (
    METADATA,
    NOT_LOADED,
    PICKLED_METADATA,
    Reader,
    Writer,
    check_rng_state,
    check_train_state,
    read_json,
    read_metadata,
    write_text,
)

if TYPE_CHECKING:
    from kiln.train.config import CheckpointConfig, TrainConfig

STATES = "checkpoints"  # beside metrics.jsonl in the train stage's folder
# subtle: optimizer states keyed by parameter name. Unflattened, DCP keys each parameter group by
# its index and keeps one rank's copy, so pipeline stages (whose groups hold different parameters)
# would load another stage's group lists and lose their settings.
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
TRAIN_STATE_JSON, COMPLETE = "train_state.json", "complete.json"

log = logging.getLogger("kiln.train")


def step_name(step: int) -> str:
    return f"step-{step:07d}"


def state_step(folder: Path) -> int:
    """The step of `step-NNNNNNN` (or of its `.tmp`)."""
    return int(folder.name.removeprefix("step-").removesuffix(".tmp"))


def rng_state() -> dict[str, Any]:
    """This process's random states as JSON: Python, numpy's global generator, torch CPU and CUDA."""
    state = {
        "python": json.loads(json.dumps(random.getstate())),
        "numpy": [
            str(v) if i == 0 else (v.tolist() if isinstance(v, np.ndarray) else v)
            for i, v in enumerate(np.random.get_state())
        ],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]]
        )


def complete_states(root: Path) -> list[Path]:
    """Finished state folders, oldest first (a `.tmp` folder or one without complete.json is not one)."""
    return (
        sorted(
            p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp") and (p / COMPLETE).is_file()
        )
        if root.is_dir()
        else []
    )


class Checksums(RootModel[dict[str, str]]):
    """complete.json: file name -> sha256."""


def verify(folder: Path, cfg: TrainConfig) -> None:
    """Everything a rank will read from the state, checked before any rank reads it (on rank 0):
    FatalError naming the file, the key and what was found otherwise."""
    if (folder / PICKLED_METADATA).exists():
        raise FatalError(
            f"{folder / PICKLED_METADATA}: DCP's metadata as a pickle, which kiln wrote before it kept "
            "metadata.json. Unpickling runs whatever code "
            f"the file names, and its checksum in {COMPLETE} shows only that it is unchanged since it was summed, "
            "not who wrote it, so it is not "
            "loaded: resume from a state this kiln wrote with --from STEP, or pass --force to start over"
        )
    recorded = read_json(folder / COMPLETE, Checksums).root
    present = {p.name for p in folder.iterdir() if p.name != COMPLETE}
    if present != set(recorded) or any(sha256_file(folder / name) != digest for name, digest in recorded.items()):
        earlier = [state_step(p) for p in complete_states(folder.parent) if state_step(p) < state_step(folder)]
        fix = (
            f"Resume from the state before it with --from {earlier[-1]} (this one is then moved aside, kept), or "
            "pass --force to start over"
            if earlier
            else "There is no earlier state: pass --force to start over"
        )
        raise FatalError(
            f"{shown(folder)}: its files do not match the checksums in {COMPLETE}; it was changed or damaged. {fix}"
        )
    read_metadata(folder)
    check_train_state(folder / TRAIN_STATE_JSON, state_step(folder), cfg)
    for rng in sorted(folder.glob("rng-*.json")):
        check_rng_state(rng, set_rng_state)
    if not (folder / "rng-0.json").is_file():
        raise FatalError(f"{folder}: no rng-0.json, the random states of rank 0; {NOT_LOADED}")


def disk_error(failure: BaseException) -> OSError | None:
    """The OSError behind a failed save: the failure itself, one that DCP's CheckpointException holds
    (one per failed rank), or one it was raised from; None for any other failure."""
    seen, todo = set(), [failure]
    while todo:
        e = todo.pop()
        if isinstance(e, OSError):
            return e
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, CheckpointException):
            todo += [exc for exc, _ in e.failures.values()]
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return None


def tensors_only(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """What DCP saves of the optimizer (FLAT): each parameter's state, every value a tensor (Muon's
    step counts become 0-d tensors), so DCP pickles nothing. Group settings are left out."""

    def tensor(key: str, value: Any) -> torch.Tensor:
        assert isinstance(value, torch.Tensor | int | float), f"{key}: an optimizer state of {type(value).__name__}"
        if isinstance(value, torch.Tensor):
            return value
        return torch.tensor(value, dtype=torch.int64 if isinstance(value, int) else torch.float64)

    return {k: tensor(k, v) for k, v in optimizer_state.items() if k.startswith("state.")}


def set_aside_after(root: Path, step: int) -> list[Path]:
    """Move the states newer than `step` (a run resumed from an older one abandons them) into
    `superseded-<time>/` under root, where resuming never looks; returns their new paths."""
    newer = [p for p in root.glob("step-*") if p.is_dir() and state_step(p) > step] if root.is_dir() else []
    if not newer:
        return []
    aside = root / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    moved = []
    for p in sorted(newer):
        moved.append(p.rename(aside / p.name))
        move(p, aside / p.name, COMPLETE)  # a run in a store: there too, complete.json first, so none resumes it
    log.warning("train: resuming after step %d; the %d newer state(s) moved to %s", step, len(moved), shown(aside))
    return moved


class States:
    """The run's resumable states under `root`, saved and kept as train.checkpoint (`cfg`) says, and
    at each of keep_steps. Every rank makes one; save, wait and load are collectives (every rank
    calls them together), complete and settle are not."""

    def __init__(self, root: Path, ranks: Ranks, cfg: CheckpointConfig, keep_steps: frozenset[int] = frozenset()):
        self.root, self.ranks = root, ranks
        self.every, self.keep_last, self.keep_every = cfg.every, cfg.keep_last, cfg.keep_every
        self.async_save = cfg.async_save
        self.keep_steps = keep_steps  # saved whatever `every` says, and never pruned (a wsd run's last stable step)
        self.pending: threading.Thread | None = None
        self.pending_step = 0  # the step the pending async save is of
        self.failure: BaseException | None = None
        # (first step, data-parallel ranks) of each stretch of steps: the rows a state's stream drew
        # (kiln.train.state_files).
        self.data_ranks: list[tuple[int, int]] = [(1, ranks.data_world)]
        # Async saves run collectives from a thread: on a group of their own (a CPU backend, as DCP needs).
        self.group = dist.new_group(backend="gloo") if cfg.async_save and ranks.world > 1 else None
        self.store = url_of(root)  # a run on a store: states go there too
        spread = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world)) != ranks.world  # ranks on several machines
        if self.store is not None and spread and cfg.async_save:
            raise FatalError(
                f"train.checkpoint.async_save: the run is on a store ({self.store}) and its ranks span several "
                "machines, whose states are stored rank by rank after each save; set train.checkpoint.async_save=false"
            )

    def complete(self) -> list[Path]:
        return complete_states(self.root)

    def due(self, step: int) -> bool:
        """Whether a state is saved after `step`: every `every` steps, and at each of keep_steps."""
        return bool(self.every and step % self.every == 0) or step in self.keep_steps

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        train_state: dict[str, Any],
        wait: bool = False,
    ) -> None:
        """Write the state after `step`; async unless `wait` or the config says otherwise (returns once
        the states are copied to CPU memory)."""
        self.wait()
        final, tmp = self.root / step_name(step), self.root / (step_name(step) + ".tmp")
        try:
            if self.ranks.is_main:
                shutil.rmtree(tmp, ignore_errors=True)  # a save cut short earlier
                tmp.mkdir(parents=True)
            self.ranks.barrier()
            write_text(tmp / f"rng-{self.ranks.rank}.json", json.dumps(rng_state()))
            if self.ranks.is_main:
                saved = {**train_state, "step": step, "processes": self.ranks.world, "data_ranks": self.data_ranks}
                write_text(tmp / TRAIN_STATE_JSON, json.dumps(saved))
            optimizer_state = tensors_only(get_optimizer_state_dict(model, optimizer, options=FLAT))
            state = {"model": get_model_state_dict(model), "optimizer": optimizer_state}
            if not self.async_save or wait:
                dcp.save(state, storage_writer=Writer(tmp))
                self.ranks.barrier()  # every rank's rng file and shards are written
                sums = self._store_own(tmp, final) if self.store is not None else None
                if self.ranks.is_main:
                    self._finish(tmp, final, sums)
                self.ranks.barrier()
                if sums is not None and os.environ.get("LOCAL_RANK", "0") == "0" and tmp.is_dir():
                    shutil.rmtree(tmp)  # a machine other than rank 0's: its part is on the store
                return
            upload = dcp.async_save(state, storage_writer=Writer(tmp), process_group=self.group)
        except (OSError, CheckpointException) as e:
            if (error := self.unsaved(step, e)) is e:
                raise
            raise error from e
        self.pending = threading.Thread(
            target=self._finish_async, args=(upload, tmp, final), name=f"kiln-save-{step}", daemon=True
        )
        self.pending_step = step
        self.pending.start()

    def unsaved(self, step: int, failure: BaseException) -> BaseException:
        """The error to stop with after the save of `step` failed: for a disk's error (a full disk, a
        folder that cannot be written), a FatalError naming the file and the reason, its `.tmp` folder
        removed (on rank 0); any other failure as it is."""
        if (disk := disk_error(failure)) is None:
            return failure
        if self.ranks.is_main:
            shutil.rmtree(self.root / (step_name(step) + ".tmp"), ignore_errors=True)
        kept = self.complete()
        where = (
            f"training resumes from {kept[-1]}"
            if kept
            else f"no state was saved before step {step}, so training starts over"
        )
        fix = (
            "free space on that disk" if disk.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "make it writable"
        )
        return FatalError(
            f"cannot write {disk.filename or self.root}: {disk.strerror}; {fix} and run the same command again: "
            f"finished work is kept ({where}; the state after step {step} was not saved)"
        )

    def _finish_async(self, upload: Any, tmp: Path, final: Path) -> None:
        try:
            upload.result()  # on rank 0 this returns after every rank's shards are written
            if self.ranks.is_main:
                self._finish(tmp, final)
        except BaseException as e:  # raised on the training thread by wait()
            self.failure = e

    def _store_own(self, tmp: Path, final: Path) -> dict[str, str]:
        """A run on a store: this rank's files of the state stored under the state's final name; returns every
        rank's files with their sha256 (a collective)."""
        rank = self.ranks.rank
        own = [tmp / f"rng-{rank}.json", *sorted(tmp.glob(f"__{rank}_*.distcp"))]  # DCP names shards __<rank>_<n>
        if self.ranks.is_main:
            own += [tmp / TRAIN_STATE_JSON, tmp / METADATA]
        sums = {p.name: sha256_file(p) for p in own}
        for p in own:
            put(p, f"{url_of(final)}/{p.name}")
        return {name: sha for found in self.ranks.gather(sums) for name, sha in found.items()}

    def _finish(self, tmp: Path, final: Path, sums: dict[str, str] | None = None) -> None:
        """complete.json, then the rename. `sums`: every rank's files, each already stored (a run on a store);
        without them, this machine's files, summed here (and stored here for a run on a store)."""
        found = sums or {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        write_text(tmp / COMPLETE, json.dumps(dict(sorted(found.items())), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        # A run on a store: the state goes there too, complete.json last, so a re-run on any machine resumes from it.
        rest = [] if sums else sorted(p for p in final.iterdir() if p.name != COMPLETE)
        push_files(self.root, [*rest, final / COMPLETE])
        self._prune()

    def wait(self) -> None:
        """Let a pending async save finish (raising its error, if it failed)."""
        if self.pending is not None:
            self.pending.join()
            self.pending = None
            self.ranks.barrier()  # rank 0 has completed the folder
            if self.failure is not None:
                failure, self.failure = self.failure, None
                error = self.unsaved(self.pending_step, failure)
                if error is failure:
                    raise FatalError(f"train: an asynchronous save under {self.root} failed: {failure}") from failure
                raise error from failure

    def settle(self) -> None:
        """After a failure: let a pending async save finish on this rank (no collective: other
        ranks may be gone). Rank 0 completes the folder only if every rank's shards were written."""
        if self.pending is not None:
            self.pending.join()
            self.pending = None
            if self.failure is not None and self.ranks.is_main:  # its partial folder goes; the failure is reported
                shutil.rmtree(self.root / (step_name(self.pending_step) + ".tmp"), ignore_errors=True)

    def _prune(self) -> None:
        for old in self.complete()[: -self.keep_last]:
            if (
                not (self.keep_every and state_step(old) % self.keep_every == 0)
                and state_step(old) not in self.keep_steps
            ):
                shutil.rmtree(old)
                clear(old, COMPLETE)  # and its copy on the store, for a run on one

    def load(
        self, folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig
    ) -> dict[str, Any]:
        """Load a state verified against this run (`cfg`) into model and optimizer (any number of ranks);
        rank-local RNGs where the rank saved one.

        Returns train_state.json. A state saved by fewer ranks gives the extra ranks rank 0's RNGs:
        kiln draws its data from seeded generators, not from these.
        """
        self.wait()
        if self.store is not None:  # each machine's mirror: the state's files, wherever its ranks saved them
            pull(folder, ["*"])
        self.ranks.barrier()
        if self.ranks.is_main:
            verify(folder, cfg)
        self.ranks.barrier()
        optimizer_state = get_optimizer_state_dict(
            model, optimizer, options=FLAT
        )  # the group settings of this run's recipe
        state = {"model": get_model_state_dict(model), "optimizer": tensors_only(optimizer_state)}
        try:
            dcp.load(state, storage_reader=Reader(folder))
        except (
            CheckpointException
        ) as e:  # a shard torch.load(weights_only=True) refuses, or that does not fit the model
            exc = next(iter(e.failures.values()))[0]
            first_line = (str(exc).splitlines() or [""])[0]
            raise FatalError(
                f"{folder}: its model and optimizer shards cannot be loaded ({type(exc).__name__}: {first_line}); "
                f"{NOT_LOADED}"
            ) from None
        # Muon's step counts were saved as tensors: back to the numbers the optimizer keeps.
        for key, value in state["optimizer"].items():
            if not isinstance(optimizer_state[key], torch.Tensor):
                optimizer_state[key] = type(optimizer_state[key])(value.item())
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=FLAT)
        rng = folder / f"rng-{self.ranks.rank}.json"
        set_rng_state(json.loads((rng if rng.is_file() else folder / "rng-0.json").read_text()))
        saved = json.loads((folder / TRAIN_STATE_JSON).read_text())
        stretches = [(first, world) for first, world in saved["data_ranks"]]
        # From the step after this state on, the stream is drawn by this run's data ranks.
        world = self.ranks.data_world
        self.data_ranks = stretches if stretches[-1][1] == world else [*stretches, (saved["step"] + 1, world)]
        return saved
