"""The `train.rollback` section and the loop's guard against NaN, Inf and loss spikes.

After each step the guard looks at the step's loss and pre-clip gradient norm: a NaN or Inf in
either (with fp16 the gradient norm is left to the loss scaler, which skips overflowing steps on
its own), or a loss above `spike_factor` x the median of the last `spike_window` good steps, is a
fault. The loop then rolls back to the newest complete resumable state (kiln.train.resume),
replays the data stream from there, discards the offending step's rows when it reaches that step
again (drawing the next rows instead), optionally trains at `lr_factor` x the scheduled lr until
`lr_steps` steps past the offending one, and goes on; after `max_rollbacks` rollbacks a fault
stops the run. With no state to go back to (train.checkpoint.every unset, or none saved yet), a
NaN or Inf stops the run and a spike is logged and trained through. Rows are skipped by their place in
the global stream: a replay that draws differently (an adaptive mixture after a lowered lr,
non-deterministic GPU kernels) skips the rows at the same places, which may hold other data. Rollbacks, skips and the
lowered-lr window outlive the rollback itself (and are
part of every resumable state); the loss history is the state's own.
Not handled here: finding the state and reloading it (kiln.train.loop, kiln.train.resume).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from pydantic import Field

from kiln.core.config import Section


class RollbackConfig(Section):
    max_rollbacks: int = Field(
        default=5,
        ge=0,
        description="Rollbacks allowed over the run; the next fault stops it (0: the first fault stops it).",
    )
    spike_factor: float | None = Field(
        default=2.0,
        gt=1,
        description=(
            "A step's loss above this many times the median of the last spike_window steps is a spike; None: no spike "
            "detection."
        ),
    )
    spike_window: int = Field(
        default=50, ge=2, description="Steps in the running median (spikes are looked for once this many have passed)."
    )
    lr_factor: float = Field(default=1.0, gt=0, le=1, description="After a rollback, multiply the lr by this ...")
    lr_steps: int = Field(
        default=0, ge=0, description="... until this many steps past the offending step (0: the lr is not lowered)."
    )


class Guard:
    def __init__(self, cfg: RollbackConfig, check_grad_norm: bool = True):
        self.cfg, self.check_grad_norm = cfg, check_grad_norm
        self.history: deque[float] = deque(maxlen=cfg.spike_window)
        self.rollbacks = 0
        self.skips: dict[int, int] = {}  # step -> how many of its draws to discard (one per rollback it caused)
        self.low_lr_until = 0

    def check(self, loss: float, grad_norm: float) -> str | None:
        """Why this step is a fault, or None (then its loss joins the history)."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if self.check_grad_norm and not math.isfinite(grad_norm):
            return f"gradient norm is {grad_norm}"
        if self.cfg.spike_factor and len(self.history) == self.cfg.spike_window:
            median = statistics.median(self.history)
            if loss > self.cfg.spike_factor * median:
                return (
                    f"loss spike: {loss:.4f} > {self.cfg.spike_factor:g} x {median:.4f}, the median of the last "
                    f"{self.cfg.spike_window} steps"
                )
        self.history.append(loss)
        return None

    @staticmethod
    def fatal(reason: str) -> bool:
        """NaN or Inf: the weights cannot go on from this step (a spike can)."""
        return not reason.startswith("loss spike")

    def rolled_back(self, step: int) -> None:
        """Count a rollback caused by `step`: its rows are skipped on the way back, the lr lowered if asked."""
        self.rollbacks += 1
        self.skips[step] = self.skips.get(step, 0) + 1
        if self.cfg.lr_steps:
            self.low_lr_until = max(self.low_lr_until, step + self.cfg.lr_steps)

    def lr_scale(self, step: int) -> float:
        return self.cfg.lr_factor if step <= self.low_lr_until else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": list(self.history),
            "rollbacks": self.rollbacks,
            "skips": {str(s): n for s, n in self.skips.items()},
            "low_lr_until": self.low_lr_until,
        }

    def load_state_dict(self, state: dict[str, Any], history_only: bool = False) -> None:
        """Restore a saved guard; history_only (a rollback): keep the rollbacks, skips and lr window known now."""
        self.history = deque(state["history"], maxlen=self.cfg.spike_window)
        if not history_only:
            self.rollbacks, self.low_lr_until = state["rollbacks"], state["low_lr_until"]
            self.skips = {int(s): n for s, n in state["skips"].items()}
