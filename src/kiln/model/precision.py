"""One device and precision policy for every stage that runs the model: train, eval, generate.

Each of those sections has a `precision` sub-section (kiln.model.config.PrecisionConfig, declared
there so that validating a recipe imports no torch). `auto` device means cuda when one is
visible; `auto` dtype means bf16 autocast on cuda and plain fp32 on the CPU (bf16 matmuls on a CPU
are slow and gain nothing). Weights stay fp32 and the model's logits come out fp32 in every case;
autocast changes only the dtype matmuls run in.
Not handled here: the loss scaling fp16 training needs (kiln.train.loop), fp8, sharding (kiln.train).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from kiln.core.errors import FatalError
from kiln.model.config import PrecisionConfig


def autocast(device: torch.device, amp_dtype: torch.dtype | None) -> AbstractContextManager[None]:
    """The context a model's forward runs in on `device`: autocast to amp_dtype, or nothing for None (fp32)."""
    return torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None)


@dataclass(frozen=True)
class Precision:
    device: torch.device
    amp_dtype: torch.dtype | None  # the autocast dtype; None: plain fp32

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
    return Precision(device, {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype_on(cfg.dtype, device.type)))
