"""Which process of a torchrun launch this is: rank 0 writes run-level files and talks to the user.

torchrun sets RANK and WORLD_SIZE for every process it starts; without torchrun there is one
process, rank 0 of 1. Read from the environment so that the CLI can decide before any process
group exists (kiln.train.mesh builds the group and the mesh).
"""

from __future__ import annotations

import os


def process_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Processes in this run (torchrun's WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return process_rank() == 0
