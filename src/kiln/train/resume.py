"""Resumable training states: sharded with torch.distributed.checkpoint, complete or ignored.

Every `train.checkpoint.every` steps each rank writes its shards of the model and optimizer
states with `torch.distributed.checkpoint` (DCP), so a state saved by N processes loads on M.
Beside them, rank 0 writes `train_state.json` (step, counters, sampler and mixture state: JSON,
never pickles) and every rank its RNG states (`rng-<rank>.json`). The folder is written as
`step-NNNNNNN.tmp` and renamed only after `complete.json`, the sha256 of every file in it, so a
half-written state is never loaded; a state is loaded only after those checksums match (DCP's
reader unpickles its metadata). After each save the last `keep_last` states stay, and every
`keep_every`-th step's.
A wsd run also saves, and keeps, a state at its last stable step, whatever `every` says: a
finished run is extended from there (kiln.train.extend).
With `train.checkpoint.async_save`, DCP copies the states to CPU memory and writes them from a
background thread while training goes on (on a process group of its own, so its collectives never
interleave with the loop's); rank 0 completes the folder once every rank's shards are written
(DCP's save finishes on the coordinator last). The next save, a rollback or the end of training
waits for it.
Not handled here: the consolidated safetensors checkpoint the stage outputs (kiln.train.checkpoint).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict

from kiln.core.errors import FatalError
from kiln.core.manifest import sha256_file
from kiln.train.mesh import Ranks

STATES = "checkpoints"  # beside metrics.jsonl in the train stage's folder
# subtle: optimizer states keyed by parameter name, group settings included. Unflattened, DCP keys
# each parameter group by its index and keeps one rank's copy, so pipeline stages (whose groups
# hold different parameters) would load another stage's group lists and lose their settings.
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
        "numpy": [str(v) if i == 0 else (v.tolist() if isinstance(v, np.ndarray) else v) for i, v in enumerate(np.random.get_state())],
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
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]])


def complete_states(root: Path) -> list[Path]:
    """Finished state folders, oldest first (a `.tmp` folder or one without complete.json is not one)."""
    return sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp") and (p / COMPLETE).is_file()) if root.is_dir() else []


def verify(folder: Path) -> None:
    recorded = json.loads((folder / COMPLETE).read_text())
    present = {p.name for p in folder.iterdir() if p.name != COMPLETE}
    if present != set(recorded) or any(sha256_file(folder / name) != digest for name, digest in recorded.items()):
        raise FatalError(f"{folder}: its files do not match the checksums in {COMPLETE}; it was changed or damaged. Move it away to resume from the one before, or pass --force to start over")


def set_aside_after(root: Path, step: int) -> list[Path]:
    """Move the states newer than `step` (a run resumed from an older one abandons them) into
    `superseded-<time>/` under root, where resuming never looks; returns their new paths."""
    newer = [p for p in root.glob("step-*") if p.is_dir() and state_step(p) > step] if root.is_dir() else []
    if not newer:
        return []
    aside = root / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    moved = [p.rename(aside / p.name) for p in sorted(newer)]
    log.warning("train: resuming after step %d; the %d newer state(s) moved to %s", step, len(moved), aside)
    return moved


class States:
    """The run's resumable states under `root`. Every rank makes one; save, wait and load are
    collectives (every rank calls them together), complete and settle are not."""

    def __init__(self, root: Path, ranks: Ranks, every: int | None, keep_last: int, keep_every: int | None, async_save: bool = False, keep_steps: frozenset[int] = frozenset()):
        self.root, self.ranks, self.every, self.keep_last, self.keep_every, self.async_save = root, ranks, every, keep_last, keep_every, async_save
        self.keep_steps = keep_steps  # saved whatever `every` says, and never pruned (a wsd run's last stable step)
        self.pending: threading.Thread | None = None
        self.failure: BaseException | None = None
        # Async saves run collectives from a thread: on a group of their own (a CPU backend, as DCP needs).
        self.group = dist.new_group(backend="gloo") if async_save and ranks.world > 1 else None

    def complete(self) -> list[Path]:
        return complete_states(self.root)

    def due(self, step: int) -> bool:
        """Whether a state is saved after `step`: every `every` steps, and at each of keep_steps."""
        return bool(self.every and step % self.every == 0) or step in self.keep_steps

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, train_state: dict[str, Any], wait: bool = False) -> None:
        """Write the state after `step`; async unless `wait` or the config says otherwise (returns once
        the states are copied to CPU memory)."""
        self.wait()
        final, tmp = self.root / step_name(step), self.root / (step_name(step) + ".tmp")
        if self.ranks.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # a save cut short earlier
            tmp.mkdir(parents=True)
        self.ranks.barrier()
        (tmp / f"rng-{self.ranks.rank}.json").write_text(json.dumps(rng_state()))
        if self.ranks.is_main:
            (tmp / TRAIN_STATE_JSON).write_text(json.dumps({**train_state, "step": step, "processes": self.ranks.world}))
        state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer, options=FLAT)}
        if not self.async_save or wait:
            dcp.save(state, checkpoint_id=str(tmp))
            self.ranks.barrier()  # every rank's rng file and shards are written
            if self.ranks.is_main:
                self._finish(tmp, final)
            self.ranks.barrier()
            return
        upload = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self.group)
        self.pending = threading.Thread(target=self._finish_async, args=(upload, tmp, final), name=f"kiln-save-{step}", daemon=True)
        self.pending.start()

    def _finish_async(self, upload: Any, tmp: Path, final: Path) -> None:
        try:
            upload.result()  # on rank 0 this returns after every rank's shards are written
            if self.ranks.is_main:
                self._finish(tmp, final)
        except BaseException as e:  # raised on the training thread by wait()
            self.failure = e

    def _finish(self, tmp: Path, final: Path) -> None:
        (tmp / COMPLETE).write_text(json.dumps({p.name: sha256_file(p) for p in sorted(tmp.iterdir())}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self._prune()

    def wait(self) -> None:
        """Let a pending async save finish (raising its error, if it failed)."""
        if self.pending is not None:
            self.pending.join()
            self.pending = None
            self.ranks.barrier()  # rank 0 has completed the folder
            if self.failure is not None:
                failure, self.failure = self.failure, None
                raise FatalError(f"train: an asynchronous save under {self.root} failed: {failure}") from failure

    def settle(self) -> None:
        """After a failure: let a pending async save finish on this rank (no collective: other
        ranks may be gone). Rank 0 completes the folder only if every rank's shards were written."""
        if self.pending is not None:
            self.pending.join()
            self.pending = None

    def _prune(self) -> None:
        for old in self.complete()[:-self.keep_last]:
            if not (self.keep_every and state_step(old) % self.keep_every == 0) and state_step(old) not in self.keep_steps:
                shutil.rmtree(old)

    def load(self, folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Load a verified state into model and optimizer (any number of ranks); rank-local RNGs where the rank saved one.

        Returns train_state.json. A state saved by fewer ranks gives the extra ranks rank 0's RNGs:
        kiln draws its data from seeded generators, not from these.
        """
        self.wait()
        if self.ranks.is_main:
            verify(folder)
        self.ranks.barrier()
        state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer, options=FLAT)}
        dcp.load(state, checkpoint_id=str(folder))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=FLAT)
        rng = folder / f"rng-{self.ranks.rank}.json"
        set_rng_state(json.loads((rng if rng.is_file() else folder / "rng-0.json").read_text()))
        return json.loads((folder / TRAIN_STATE_JSON).read_text())
