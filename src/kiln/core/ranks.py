"""Which process of a torchrun launch this is: rank 0 writes run-level files and talks to the user.

torchrun sets RANK and WORLD_SIZE for every process it starts; without torchrun there is one
process, rank 0 of 1. Read from the environment so that the CLI can decide before any process
group exists (kiln.train.mesh builds the group and the mesh). Under Slurm's `srun` without torchrun,
`adopt_slurm_tasks` gives each task the variables torchrun would have (its rank among the job's tasks,
the first node of the job as the rendezvous), so one sbatch line runs kiln on several nodes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import MutableMapping

# The rendezvous port of a Slurm job: from its id, so two jobs sharing a node do not meet on one port.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 20000


def process_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Processes in this run (torchrun's WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return process_rank() == 0


def first_node_address(nodelist: str) -> str:
    """The address of the first node of a Slurm node list (`n[1-2]`, `gpu001,gpu002`): its NodeAddr as
    scontrol gives it, or its name when scontrol is not here to ask."""
    if shutil.which("scontrol") is None:
        return nodelist.split(",")[0].split("[")[0]
    names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True).stdout.split()
    first = names[0] if names else nodelist
    shown = subprocess.run(["scontrol", "show", "node", "-o", first], capture_output=True, text=True).stdout
    found = [field.split("=", 1)[1] for field in shown.split() if field.startswith("NodeAddr=")]
    return found[0] if found else first


def adopt_slurm_tasks(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Under `srun` (SLURM_PROCID set) and not under torchrun (no RANK): RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT from the Slurm task's own variables. Returns whether it set them."""
    if "RANK" in environ or "SLURM_PROCID" not in environ or "SLURM_NTASKS" not in environ:
        return False
    environ["RANK"] = environ["SLURM_PROCID"]
    environ["WORLD_SIZE"] = environ["SLURM_NTASKS"]
    environ["LOCAL_RANK"] = environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in environ:
        environ["MASTER_ADDR"] = first_node_address(environ.get("SLURM_JOB_NODELIST", "localhost"))
    if "MASTER_PORT" not in environ:
        environ["MASTER_PORT"] = str(SLURM_PORT_BASE + int(environ.get("SLURM_JOB_ID", "0")) % SLURM_PORT_SPAN)
    return True
