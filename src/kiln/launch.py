"""`kiln train --nproc N`: check the launch on this machine, then start torchrun's launcher in this process.

Before any process starts: N is at most one process per visible GPU (on the CPU, one per core,
at least 8), and the recipe's parallel layout can be formed by N processes and can split the
model; a bad layout is told once, not by every rank. After a failed launch one line says which
process failed and how, unless rank 0 already printed its kiln error (each rank records its
error for the launcher, torch.distributed.elastic's error-file convention).
Not handled here: multi-node launches (start torchrun yourself), checks that need the data (the
tokenizer's vocabulary, the shards: the ranks run them).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.core.errors import ConfigError

if TYPE_CHECKING:
    from kiln.recipe import Recipe


def cpu_process_limit() -> int:
    """The most CPU processes `kiln train --nproc` starts: one per core this process may use, or 8
    where that is more. Processes beyond the cores only take turns on them (each also holds its own
    torch, about 0.3 GB), and a runaway N (99999) started hundreds before anything failed; 8 lets a
    small machine still lay out three degrees of 2 (dp 2 x tp 2 x pp 2) to try a recipe. torchrun
    started by hand has no such bound."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(8, cores)


def check_process_count(recipe: Recipe, nproc: int) -> None:
    """Stop `kiln train --nproc N` for an N beyond this machine: one process per visible GPU, or on
    the CPU cpu_process_limit."""
    import torch

    from kiln.model.precision import resolve_precision

    device = resolve_precision(recipe.train.precision, "train").device
    if device.type == "cuda" and nproc > (gpus := torch.cuda.device_count()):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise ConfigError(
            f"--nproc {nproc}: each process trains on a GPU of its own, and {gpus} are visible here{where};"
            f" use --nproc {gpus} or fewer, or train.precision.device=cpu"
        )
    if device.type == "cpu" and nproc > (limit := cpu_process_limit()):
        raise ConfigError(
            f"--nproc {nproc}: at most {limit} CPU processes here (one per core, at least 8; more only take turns"
            f" on the cores); use --nproc {limit} or fewer, or start torchrun yourself"
        )


def check_layout_for(recipe: Recipe, nproc: int) -> None:
    """Stop `kiln train --nproc N` before any process starts for a parallel layout N processes cannot
    form, or a model or training that layout cannot split (recipe: validated for N processes).
    Checks that need the data (the tokenizer's vocabulary, the shards) run on the ranks."""
    from kiln.model.precision import resolve_precision
    from kiln.train.mesh import MESH_DIMS, check_layout

    # One process trains alone whatever the parallel section says (kiln.train.mesh.init_ranks).
    degrees = recipe.parallel.degrees(nproc) if nproc > 1 else dict.fromkeys(MESH_DIMS, 1)
    check_layout(
        recipe.model,
        recipe.train,
        recipe.parallel,
        degrees,
        resolve_precision(recipe.train.precision, "train").amp_dtype,
    )


def launch_torchrun(argv: list[str], nproc: int) -> int:
    """Run the same command (without --nproc) on `nproc` local processes: torchrun's launcher, in this
    process, as `torchrun --standalone --nproc-per-node N -m kiln ...`; the exit status.

    A failure is told once. Rank 0 prints its own error, the other ranks hand theirs to the launcher
    (record_for_launcher); the ChildFailedError traceback and per-process log lines torchrun adds
    would only repeat it, so this prints one line where rank 0 has not already spoken."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    rest, skip = [], False
    for arg in argv:  # drop --nproc N / --nproc=N
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            rest.append(arg)
    # Its "failed (exitcode: 2)" and "Sending process ... closing signal SIGTERM" lines: said below.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        run(get_args_parser().parse_args(["--standalone", f"--nproc-per-node={nproc}", "-m", "kiln", *rest]))
    except ChildFailedError as e:
        return report_failed_launch(e.failures, nproc)
    except SignalException:  # SIGTERM or SIGINT to this launcher: passed on to every process, which report themselves
        return 130
    return 0


def report_failed_launch(failures: dict[int, Any], nproc: int) -> int:
    """One line for a launch of nproc processes where some failed (global rank -> torch.distributed.elastic
    ProcessFailure), unless rank 0 already printed its kiln error; the exit status."""
    # The ranks that stopped on a kiln error and recorded it (record_for_launcher; torchrun names a
    # missing error file <N/A>). subtle: not their exit status: torchrun may stop rank 0 with SIGTERM
    # between its message and its exit, once another rank has failed.
    told = sorted(rank for rank, f in failures.items() if f.error_file != "<N/A>")
    if 0 in told:
        return 2  # rank 0 printed it
    if told:
        print(f"kiln train: error: {failures[told[0]].message} (process {told[0]} of {nproc})", file=sys.stderr)
        return 2
    rank = min(failures, key=lambda r: failures[r].timestamp)  # the first to fail; the others were stopped
    first = failures[rank]
    how = f"was killed by {first.signal_name()}" if first.exitcode < 0 else f"exited with status {first.exitcode}"
    print(
        f"kiln train: error: process {rank} of {nproc} {how} (its messages are above); the others were stopped",
        file=sys.stderr,
    )
    return 1


def record_for_launcher(message: str) -> None:
    """Under torchrun, hand this rank's kiln error to the launcher (its error file, the convention of
    torch.distributed.elastic): `kiln train --nproc` then knows whether rank 0 printed it, and prints
    another rank's, which only records it; plain torchrun shows it in its summary."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        Path(path).write_text(json.dumps({"message": message, "timestamp": int(time.time())}), encoding="utf-8")
