"""Per-step metrics: one JSON line each to metrics.jsonl, and a progress bar with tokens/s and ETA.

A trainer hook. Each line: step, loss, loss per source drawn in that step, lr, grad_norm,
tokens_per_s, mfu, elapsed_s. MFU is achieved model FLOP/s over the device's dense bf16 peak;
it is reported only where the peak is known (listed GPUs), never guessed for a CPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from kiln.core.hardware import peak_flops_of
from kiln.train.hooks import StepState


def device_peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak from kiln.core.hardware (the planner's table); None for a CPU or an unknown GPU."""
    return peak_flops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


class Monitor:
    def __init__(self, path: Path, total_steps: int, flops_per_token: int, device: torch.device):
        self.file = open(path, "a", encoding="utf-8")
        self.total_steps = total_steps
        self.flops_per_token = flops_per_token
        self.peak = device_peak_flops(device)
        self.bar: tqdm | None = None
        self.t0 = self.t_last = time.perf_counter()

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def on_start(self, state: StepState) -> None:
        # The clock starts here, so the step-0 evaluation does not count against step 1's tokens/s.
        self.bar = tqdm(total=self.total_steps, initial=state.step, unit="step", desc="train", dynamic_ncols=True)
        self.t0 = self.t_last = time.perf_counter()

    def after_step(self, state: StepState) -> None:
        now = time.perf_counter()
        tokens_per_s = state.tokens / max(now - self.t_last, 1e-9)
        self.t_last = now
        self.write({
            "step": state.step,
            "loss": round(state.loss, 5),
            "loss_by_source": {s: round(v, 5) for s, v in state.loss_by_source.items()},
            "lr": state.lr,
            "grad_norm": round(state.grad_norm, 5),
            "tokens_per_s": round(tokens_per_s, 1),
            "mfu": round(tokens_per_s * self.flops_per_token / self.peak, 4) if self.peak else None,
            "elapsed_s": round(now - self.t0, 3),
        })
        assert self.bar is not None, "on_start runs before the first step"
        self.bar.set_postfix(loss=f"{state.loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
        self.bar.update(1)

    def on_end(self, state: StepState) -> None:
        if self.bar is not None:
            self.bar.close()

    def close(self) -> None:
        self.file.close()
