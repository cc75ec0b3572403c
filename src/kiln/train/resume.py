"""Resumable training states: sharded with torch.distributed.checkpoint, complete or ignored.

Every `train.checkpoint.every` steps each rank writes its shards of the model and optimizer
states with `torch.distributed.checkpoint` (DCP), so a state saved by N processes loads on M.
Beside them, rank 0 writes `train_state.json` (step, counters, sampler and mixture state: JSON,
never pickles) and every rank its RNG states (`rng-<rank>.json`). The folder is written as
`step-NNNNNNN.tmp` and renamed only after `complete.json`, the sha256 of every file in it, so a
half-written state is never loaded; a state is loaded only after those checksums match (DCP's
reader unpickles its metadata). After each save the last `keep_last` states stay, and every
`keep_every`-th step's.
Not handled here: asynchronous saves, and the consolidated safetensors checkpoint the stage
outputs (kiln.train.checkpoint).
"""

from __future__ import annotations

import base64
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict

from kiln.core.errors import FatalError
from kiln.core.manifest import sha256_file
from kiln.train.distributed import DataParallel

STATES = "checkpoints"  # beside metrics.jsonl in the train stage's folder
TRAIN_STATE_JSON, COMPLETE = "train_state.json", "complete.json"


def step_name(step: int) -> str:
    return f"step-{step:07d}"


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


def save_state(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, dp: DataParallel, train_state: dict[str, Any], keep_last: int, keep_every: int | None) -> Path:
    """Write the resumable state after `step` (a collective: every rank calls it); returns its folder."""
    final, tmp = root / step_name(step), root / (step_name(step) + ".tmp")
    if dp.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # a save cut short earlier
        tmp.mkdir(parents=True)
    dp.barrier()
    dcp.save({"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(tmp))
    (tmp / f"rng-{dp.rank}.json").write_text(json.dumps(rng_state()))
    dp.barrier()
    if dp.is_main:
        (tmp / TRAIN_STATE_JSON).write_text(json.dumps({**train_state, "step": step, "processes": dp.world}))
        (tmp / COMPLETE).write_text(json.dumps({p.name: sha256_file(p) for p in sorted(tmp.iterdir())}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        prune(root, keep_last, keep_every)
    dp.barrier()
    return final


def complete_states(root: Path) -> list[Path]:
    """Finished state folders, oldest first (a `.tmp` folder or one without complete.json is not one)."""
    return sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp") and (p / COMPLETE).is_file()) if root.is_dir() else []


def prune(root: Path, keep_last: int, keep_every: int | None) -> None:
    states = complete_states(root)
    for old in states[:-keep_last]:
        if not (keep_every and int(old.name.split("-")[1]) % keep_every == 0):
            shutil.rmtree(old)


def verify(folder: Path) -> None:
    recorded = json.loads((folder / COMPLETE).read_text())
    present = {p.name for p in folder.iterdir() if p.name != COMPLETE}
    if present != set(recorded) or any(sha256_file(folder / name) != digest for name, digest in recorded.items()):
        raise FatalError(f"{folder}: its files do not match the checksums in {COMPLETE}; it was changed or damaged. Move it away to resume from the one before, or pass --force to start over")


def load_state(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, dp: DataParallel) -> dict[str, Any]:
    """Load a verified state into model and optimizer (any number of ranks); rank-local RNGs where the rank saved one.

    Returns train_state.json. A state saved by fewer ranks gives the extra ranks rank 0's RNGs:
    kiln draws its data from seeded generators, not from these.
    """
    if dp.is_main:
        verify(folder)
    dp.barrier()
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    rng = folder / f"rng-{dp.rank}.json"
    set_rng_state(json.loads((rng if rng.is_file() else folder / "rng-0.json").read_text()))
    return json.loads((folder / TRAIN_STATE_JSON).read_text())
