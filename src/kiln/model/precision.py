"""One device and precision policy for every stage that runs the model: train, eval, generate.

Each of those sections has a `precision` sub-section (kiln.model.config.PrecisionConfig, declared
there so that validating a recipe imports no torch). `auto` device means cuda when one is
visible; `auto` dtype means bf16 autocast on cuda and plain fp32 on the CPU (bf16 matmuls on a CPU
are slow and gain nothing). Weights stay fp32 and the model's logits come out fp32 in every case;
autocast changes only the dtype matmuls run in. The trainer's fp8 is bf16 autocast plus float8
matmuls in the blocks' linear layers, which kiln.train.float8 swaps in; here it is only checked
that the device has FP8 matmuls (compute capability 8.9 or newer: Ada, Hopper, Blackwell).
Not handled here: the loss scaling fp16 training needs (kiln.train.loop), sharding (kiln.train).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal

import torch

from kiln.core.errors import FatalError
from kiln.model.config import PrecisionConfig, TrainPrecisionConfig


def autocast(device: torch.device, amp_dtype: torch.dtype | None) -> AbstractContextManager[None]:
    """The context a model's forward runs in on `device`: autocast to amp_dtype, or nothing for None (fp32)."""
    return torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None)


@dataclass(frozen=True)
class Precision:
    device: torch.device
    amp_dtype: torch.dtype | None  # the autocast dtype; None: plain fp32
    float8: Literal["tensorwise", "rowwise"] | None = None  # fp8: the blocks' linear layers' scaling; None: no fp8

    def autocast(self) -> AbstractContextManager[None]:
        return autocast(self.device, self.amp_dtype)


def dtype_on(dtype: str, device_type: str) -> str:
    """The dtype a precision setting means on a device: `auto` is bf16 autocast on CUDA, fp32 elsewhere."""
    return dtype if dtype != "auto" else ("bf16" if device_type == "cuda" else "fp32")


def resolve_precision(cfg: PrecisionConfig, section: str) -> Precision:
    """The device and autocast dtype `cfg` asks for; `section` (e.g. "train") names it in errors."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise FatalError(
            f"{section}.precision.device is cuda but no CUDA device is visible; use "
            f"{section}.precision.device=auto or cpu"
        )
    device = torch.device(
        "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    if isinstance(cfg, TrainPrecisionConfig) and cfg.dtype == "fp8":
        check_fp8(device, section)
        return Precision(device, torch.bfloat16, cfg.fp8_scaling or "tensorwise")
    return Precision(device, {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype_on(cfg.dtype, device.type)))


# The first compute capability with FP8 tensor-core matmuls (torch._scaled_mm): Ada Lovelace.
FP8_CAPABILITY = (8, 9)


def check_fp8(device: torch.device, section: str) -> None:
    """A FatalError naming `section`'s dtype unless `device` is a GPU with FP8 matmuls."""
    fix = f"use {section}.precision.dtype=bf16"
    if device.type != "cuda":
        raise FatalError(
            f"{section}.precision.dtype=fp8 needs a CUDA GPU with FP8 matmuls (compute capability "
            f"{'.'.join(map(str, FP8_CAPABILITY))} or newer) and this run's device is {device.type}; {fix}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_CAPABILITY:
        raise FatalError(
            f"{section}.precision.dtype=fp8 needs a GPU with FP8 matmuls (compute capability "
            f"{'.'.join(map(str, FP8_CAPABILITY))} or newer: Ada, Hopper, Blackwell); "
            f"{torch.cuda.get_device_name(device)} has {'.'.join(map(str, capability))}; {fix}"
        )
