"""Per-step metrics: one JSON line each to metrics.jsonl, and a progress bar with tokens/s and ETA.

The loop calls `log_step` after every optimizer step and `log_eval` after each validation. Each
step line: step, loss, loss per source drawn in that step, lr, grad_norm, tokens_per_s, mfu,
elapsed_s. MFU is achieved model FLOP/s over the device's dense bf16 peak; it is reported only
where the peak is known (listed GPUs), never guessed for a CPU. Only rank 0 writes or draws a
bar (the rank from torch.distributed once a process group is up, else 0).
Not handled here: TensorBoard or other sinks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from kiln.core.hardware import peak_flops_of


def device_peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak from kiln.core.hardware (the planner's table); None for a CPU or an unknown GPU."""
    return peak_flops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def process_rank() -> int:
    """This process's rank in the default process group; 0 when there is none."""
    return torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0


class Monitor:
    def __init__(self, path: Path, total_steps: int, tokens_per_step: int, flops_per_token: int, device: torch.device):
        self.writes = process_rank() == 0
        self.file = open(path, "a", encoding="utf-8") if self.writes else None
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak = device_peak_flops(device)
        self.bar: tqdm | None = None
        self.t0 = self.t_last = time.perf_counter()

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def log_eval(self, step: int, results: dict[str, Any]) -> None:
        self.write({"step": step, "eval": results})

    def start(self, step: int) -> None:
        # The clock starts here, so the step-0 evaluation does not count against step 1's tokens/s.
        if self.writes:
            self.bar = tqdm(total=self.total_steps, initial=step, unit="step", desc="train", dynamic_ncols=True)
        self.t0 = self.t_last = time.perf_counter()

    def log_step(self, step: int, loss: float, loss_by_source: dict[str, float], lr: float, grad_norm: float) -> None:
        now = time.perf_counter()
        tokens_per_s = self.tokens_per_step / max(now - self.t_last, 1e-9)
        self.t_last = now
        self.write({
            "step": step,
            "loss": round(loss, 5),
            "loss_by_source": {s: round(v, 5) for s, v in loss_by_source.items()},
            "lr": lr,
            "grad_norm": round(grad_norm, 5),
            "tokens_per_s": round(tokens_per_s, 1),
            "mfu": round(tokens_per_s * self.flops_per_token / self.peak, 4) if self.peak else None,
            "elapsed_s": round(now - self.t0, 3),
        })
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
            self.bar.update(1)
            if step == self.total_steps:
                self.bar.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
