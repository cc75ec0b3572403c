"""GPU presets (peak dense bf16 FLOP/s and memory) and turning FLOPs into GPU-hours, days and USD.

The presets are kiln.core.hardware's table, the one the trainer's monitor computes MFU with, so
a planned MFU and a measured one use the same denominator. A user may
override the peak (`--peak-tflops`), e.g. the round 1000 TFLOP/s often quoted for the H100.
Not handled here: prices (always the user's input; they change too fast to ship), interconnect
speed, or the MFU a given layout will reach (an input, typically 0.3 to 0.6).
"""

from __future__ import annotations

from kiln.core.errors import ConfigError
from kiln.core.hardware import GPUS, Gpu
from kiln.plan.checks import require_at_least, require_positive

SECONDS_PER_HOUR = 3600.0


def resolve_gpu(name: str | None, peak_tflops: float | None = None, memory_gb: float | None = None) -> Gpu:
    """A preset by name with optional overrides, or a custom GPU from a peak (and memory) alone."""
    if name is None and peak_tflops is None:
        name = "h100"
    if name is not None and name not in GPUS:
        raise ConfigError(
            f"gpu {name!r} is unknown; choose one of {', '.join(GPUS)}, or give peak_tflops (--peak-tflops) for "
            "another GPU"
        )
    base = GPUS[name] if name is not None else Gpu("custom", 0.0, 0.0)
    if peak_tflops is not None:
        require_positive("peak_tflops", peak_tflops, "the GPU's dense bf16 peak in TFLOP/s, e.g. 989 for an H100")
    if memory_gb is not None:
        require_positive("gpu_memory_gb", memory_gb, "the memory of one GPU in GB, e.g. 80")
    return Gpu(
        base.name,
        base.peak_flops if peak_tflops is None else peak_tflops * 1e12,
        base.memory_gb if memory_gb is None else memory_gb,
    )


DEFAULT_MFU = 0.4  # what planning assumes when not told: a well-tuned dense run (kiln plan --mfu)


def check_mfu(mfu: float) -> None:
    if not 0 < mfu <= 1:
        raise ConfigError(
            f"mfu = {mfu:g} must be in (0, 1]: it is the fraction of the GPU's peak FLOP/s the run achieves (0.3 "
            "to 0.6 is typical for large dense training)"
        )


def gpu_hours(flops: float, gpu: Gpu, mfu: float) -> float:
    """Hours of one GPU to do `flops` at `mfu` of its peak."""
    check_mfu(mfu)
    return flops / (gpu.peak_flops * mfu) / SECONDS_PER_HOUR


def flops_for_gpu_hours(hours: float, gpu: Gpu, mfu: float) -> float:
    check_mfu(mfu)
    return hours * SECONDS_PER_HOUR * gpu.peak_flops * mfu


def cost_summary(
    flops: float, gpu: Gpu, mfu: float, gpus: int, usd_per_gpu_hour: float | None
) -> dict[str, float | int | str | None]:
    """GPU-hours, wall-clock days on `gpus` GPUs and USD for a training run of `flops`."""
    require_at_least("gpus", gpus, 1, "the number of GPUs training in parallel")
    if usd_per_gpu_hour is not None:
        require_positive("usd_per_gpu_hour", usd_per_gpu_hour, "the price of one GPU for one hour in USD")
    hours = gpu_hours(flops, gpu, mfu)
    return {
        "gpu": gpu.name,
        "peak_tflops": gpu.peak_flops / 1e12,
        "mfu": mfu,
        "gpus": gpus,
        "gpu_hours": hours,
        "days": hours / gpus / 24,
        "usd_per_gpu_hour": usd_per_gpu_hour,
        "cost_usd": None if usd_per_gpu_hour is None else hours * usd_per_gpu_hour,
    }
