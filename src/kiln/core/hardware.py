"""The one table of GPUs kiln knows: dense bf16 peak FLOP/s and memory, from NVIDIA's datasheets;
and the host memory this machine has free, which stages check a model against before building it.

The planner prices runs against these peaks (kiln.plan.hardware) and the trainer's monitor divides
measured model FLOP/s by the same number for MFU, so a planned MFU and a measured one share their
denominator. Plain data with no torch import, so `kiln --help` and `kiln plan` stay light.
Not handled here: prices (always the user's input), interconnect speed, sparsity peaks (2:4
sparsity doubles the datasheet figure; kiln never counts it), GPUs from other vendors, GPU memory
(torch.cuda.mem_get_info, asked where torch is loaded), swap (never counted as available).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kiln.core.errors import FatalError

GB = 1e9  # bytes, as memory sizes are printed


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_gb: float  # GB = 1e9 bytes, as the datasheets count them
    match: str = ""  # a substring of torch.cuda.get_device_name() that identifies this GPU


# NVIDIA datasheets: A100 312 TFLOP/s dense bf16 (40 and 80 GB SXM), H100 SXM 989 TFLOP/s dense
# bf16 (1979 with 2:4 sparsity) and 80 GB, H200 the same compute with 141 GB; L40S 362 (48 GB),
# A10G 125 (24 GB), L4 121 (24 GB). Order matters for matching: L40S before L4.
GPUS: dict[str, Gpu] = {
    "a100-40gb": Gpu("A100 SXM 40GB", 312e12, 40.0, "A100"),
    "a100": Gpu("A100 SXM 80GB", 312e12, 80.0, "A100"),
    "h100": Gpu("H100 SXM 80GB", 989e12, 80.0, "H100"),
    "h200": Gpu("H200 SXM 141GB", 989e12, 141.0, "H200"),
    "l40s": Gpu("L40S 48GB", 362e12, 48.0, "L40S"),
    "a10g": Gpu("A10G 24GB", 125e12, 24.0, "A10G"),
    "l4": Gpu("L4 24GB", 121e12, 24.0, "L4"),
}


def peak_flops_of(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named as torch names it ("NVIDIA H100 80GB HBM3"); None if unknown."""
    upper = device_name.upper()
    return next((g.peak_flops for g in GPUS.values() if g.match and g.match in upper), None)


def available_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes of host memory this process can still take: Linux's MemAvailable (what the kernel can
    hand out without swapping), less where a cgroup v2 limit (a container's) leaves less; elsewhere
    the free physical pages; None when the system tells neither."""
    found = None
    try:
        found = next(
            int(line.split()[1]) * 1024 for line in meminfo.read_text().splitlines() if line.startswith("MemAvailable:")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):  # no such name on this system (macOS)
            pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            left = int(limit) - int((cgroup / "memory.current").read_text())
            found = left if found is None else min(found, left)
    except (OSError, ValueError):  # no cgroup v2 here
        pass
    return found


def check_memory(what: str, needed: float, available: float | None, where: str, fix: str) -> None:
    """FatalError when `what` needs more bytes than `where` has available (None: unknown, not checked)."""
    if available is not None and needed > available:
        raise FatalError(
            f"{what} needs {needed / GB:,.1f} GB of memory and {where} has {available / GB:,.1f} GB available; {fix}"
        )
