"""Per-step metrics: one JSON line each to metrics.jsonl, and a progress bar with tokens/s and ETA.

The loop calls `log_step` after every optimizer step and `log_eval` after each validation. Each
step line: step, loss, loss per source drawn in that step, lr, grad_norm, tokens (the step's;
batch-size warmup and sequence-length phases change it), seq_len, tokens_per_s, mfu, data_wait_s
(host time drawing the step's batches), peak_memory_mb (CUDA's high-water mark in the step; None
on a CPU), rollbacks (so far, kiln.train.rollback), elapsed_s. A rollback writes a line of kind
`rollback` (the step it went back to, the faulting step, the reason, its rows and sources) after
the file is cut back to that step. A resumed run cuts it back the same way (`truncate_metrics`),
dropping a last line torn by a write cut short (a full disk, a crash) with a warning; a write that
fails stops the run with the file and the reason.
The same curves go to TensorBoard event files in `tensorboard/` beside it (`tensorboard --logdir
runs/<name>/train`). `MixtureWindows` adds, per window of steps, the tokens each source actually gave against the
intended weights (the realized mixture). MFU is achieved model FLOP/s over the device's dense bf16 peak; it is reported
only
where the peak is known (listed GPUs), never guessed for a CPU. Only rank 0 writes or draws a
bar (kiln.core.ranks).
Not handled here: sinks other than metrics.jsonl and TensorBoard.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from kiln.core.errors import FatalError
from kiln.core.hardware import peak_flops_of
from kiln.core.ranks import is_main_process

TENSORBOARD = "tensorboard"  # the event files' folder beside metrics.jsonl

log = logging.getLogger("kiln.train")


def device_peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak from kiln.core.hardware (the planner's table); None for a CPU or an unknown GPU."""
    return peak_flops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def reset_peak_rss() -> None:
    """Start this process's resident-memory high-water mark (VmHWM) over: what training alone
    needs, not what stages before it in the same process (kiln demo) touched. Linux only."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS (Linux 4.0+, proc(5))
    except OSError:
        pass  # not Linux, or not allowed: the peak then covers the process's life


def peak_rss_mb() -> float | None:
    """The resident-memory high-water mark since reset_peak_rss (MiB); all a CPU can tell of memory."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return None


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records of steps up to `step` (a resumed run writes the later ones again): the file is
    cut before its first later record. A last line that is not a record (a write cut short: a full
    disk, a crash) is dropped with a warning, and blank lines are passed over; any other line that is
    not a record stops the run, naming it."""
    if not path.is_file():
        return
    data = path.read_bytes()
    lines = data.split(b"\n")
    last = max((n for n, line in enumerate(lines) if line.strip()), default=-1)
    cut, start = None, 0  # cut: bytes kept
    for n, line in enumerate(lines):
        if line.strip():
            try:
                record = json.loads(line)
                if not (isinstance(record, dict) and type(record.get("step")) is int):
                    raise ValueError("a record of the trainer is a JSON object with an integer step")
            except ValueError as e:
                if n < last:
                    raise FatalError(
                        f"{path}: line {n + 1} is not a metrics record ({e}); remove that line "
                        "(or the file, losing the curves so far) and run again"
                    ) from None
                log.warning(
                    (
                        "train: %s: its last line (line %d, %d bytes) is not a whole record, as a write cut short "
                        "leaves it: dropped"
                    ),
                    path,
                    n + 1,
                    len(line),
                )
                cut = start if cut is None else cut
            else:
                if record["step"] > step and cut is None:
                    cut = start
        start += len(line) + 1
    cut = len(data) if cut is None else cut
    # subtle: cut in place, not replaced: a rollback cuts the file while the Monitor appends to it.
    with open(path, "r+b") as f:
        f.truncate(cut)
        if cut and data[cut - 1 : cut] != b"\n":  # a whole last record without its newline
            f.seek(cut)
            f.write(b"\n")


@dataclass(frozen=True)
class StepLog:
    """What the loop knows of a finished step, for its metrics line."""

    step: int
    loss: float  # the step's training loss (nats per token: each row's mean, rows alike)
    loss_by_source: dict[str, float]  # the same over each source's rows in the step
    lr: float
    grad_norm: float  # before clipping
    tokens: int  # the step's, over every data rank
    seq_len: int
    flops_per_token: int  # at this seq_len (MFU's numerator)
    data_wait_s: float = 0.0  # host time drawing the step's batches
    rollbacks: int = 0  # so far
    bubble: float | None = None  # pipeline parallelism: the slowest stage's idle share of the step


class Monitor:
    def __init__(self, path: Path, total_steps: int, device: torch.device, world: int = 1):
        self.writes, self.path = is_main_process(), path
        self.file = open(path, "a", encoding="utf-8") if self.writes else None
        self.board = None
        if self.writes:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(str(path.parent / TENSORBOARD))
        self.total_steps = total_steps
        self.device = device
        # Tokens/s are counted over every rank, so the peak is too (one device per rank).
        self.peak = None if (one := device_peak_flops(device)) is None else one * world
        self.bar: tqdm | None = None
        self.t0 = self.t_last = time.perf_counter()

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            try:
                self.file.write(json.dumps(record) + "\n")
                self.file.flush()
            except OSError as e:  # the disk is full: the line may be torn, which the resumed run drops
                file, self.file = self.file, None
                with suppress(OSError):
                    file.close()  # the unwritten rest goes with it, not in a second error at exit
                fix = (
                    "free space on that disk"
                    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
                    else "make it writable"
                )
                raise FatalError(
                    f"cannot write {self.path}: {e.strerror}; {fix} and run the same command again: "
                    "finished work is kept (training resumes from its newest complete state)"
                ) from e

    def log_eval(self, step: int, results: dict[str, Any], kind: str) -> None:
        """kind: start (before step 1), periodic (every train.eval_every steps), adaptive (for the mixture) or final."""
        self.write({"step": step, "kind": kind, "eval": results})
        if self.board is not None:
            for source, r in {**results["sources"], "all": results["all"]}.items():
                self.board.add_scalar(f"val_loss/{source}", r["loss"], step)
            for lang, r in results.get("languages", {}).items():  # bits per byte: comparable across languages
                self.board.add_scalar(f"val_bpb_language/{lang}", r["bpb"], step)
            if "objective" in results:
                self.board.add_scalar("val_loss/objective", results["objective"]["loss"], step)

    def log_probe(self, step: int, results: dict[str, Any]) -> None:
        """The probe set's losses per document and its continuations (kiln.evaluate.probe)."""
        self.write({"step": step, "kind": "probe", "probe": results})
        if self.board is not None:
            for name, r in results["documents"].items():
                self.board.add_scalar(f"probe_loss/{name}", r["loss"], step)
            text = "\n\n".join(f"**{g['prompt']!r}** -> {g['completion']!r}" for g in results["generations"])
            self.board.add_text("probe/generations", text, step)

    def start(self, step: int) -> None:
        # The clock starts here, so the step-0 evaluation does not count against step 1's tokens/s.
        if self.writes:
            self.bar = tqdm(total=self.total_steps, initial=step, unit="step", desc="train", dynamic_ncols=True)
        self.t0 = self.t_last = time.perf_counter()

    def rewind(self, step: int) -> None:
        """Back to `step` (a rollback): the bar shows it, and the next step's rate starts now."""
        if self.bar is not None:
            self.bar.n = step
            self.bar.refresh()
        self.t_last = time.perf_counter()

    def log_step(self, s: StepLog) -> None:
        now = time.perf_counter()
        tokens_per_s = s.tokens / max(now - self.t_last, 1e-9)
        peak_memory = None
        if self.device.type == "cuda":  # the step's high-water mark of allocated memory, then reset
            peak_memory = round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.t_last = now
        self.write(
            {
                "step": s.step,
                "loss": round(s.loss, 5),
                "loss_by_source": {source: round(v, 5) for source, v in s.loss_by_source.items()},
                "lr": s.lr,
                "grad_norm": round(s.grad_norm, 5),
                "tokens": s.tokens,
                "seq_len": s.seq_len,
                "tokens_per_s": round(tokens_per_s, 1),
                "mfu": round(tokens_per_s * s.flops_per_token / self.peak, 4) if self.peak else None,
                "data_wait_s": round(s.data_wait_s, 4),
                "peak_memory_mb": peak_memory,
                "rollbacks": s.rollbacks,
                "elapsed_s": round(now - self.t0, 3),
                **({"pipeline_bubble": round(s.bubble, 4)} if s.bubble is not None else {}),
            }
        )
        if self.board is not None:
            curves = (
                ("loss", s.loss),
                ("lr", s.lr),
                ("grad_norm", s.grad_norm),
                ("tokens_per_s", tokens_per_s),
                ("data_wait_s", s.data_wait_s),
            )
            for name, value in curves:
                self.board.add_scalar(f"train/{name}", value, s.step)
            for source, value in s.loss_by_source.items():
                self.board.add_scalar(f"train_loss/{source}", value, s.step)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{s.loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
            self.bar.update(1)
            if s.step == self.total_steps:
                self.bar.close()

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()


class MixtureWindows:
    """Tokens per source against the intended weights, summed over windows of steps."""

    def __init__(self, sources: Sequence[str], steps: int, windows: int):
        self.sources, self.steps = list(sources), steps
        self.size = max(1, math.ceil(steps / windows))
        self.first_step = 1
        self.start_tokens = np.zeros(len(self.sources))
        self.intended = np.zeros(len(self.sources))
        self.records: list[dict[str, Any]] = []

    def add(
        self, step: int, tokens_so_far: dict[str, int], weights: np.ndarray, step_tokens: int
    ) -> dict[str, Any] | None:
        """Record one step; at a window's last step, the window's record (also kept in `records`)."""
        self.intended += weights * step_tokens  # what the recipe asked of this step
        if step % self.size and step != self.steps:
            return None
        now = np.array([tokens_so_far[s] for s in self.sources], dtype=np.float64)
        tokens = now - self.start_tokens
        record = {
            "steps": [self.first_step, step],
            "tokens": {s: int(t) for s, t in zip(self.sources, tokens, strict=True)},
            "share": {s: round(float(t / max(tokens.sum(), 1)), 4) for s, t in zip(self.sources, tokens, strict=True)},
            "intended": {
                s: round(float(i / max(self.intended.sum(), 1e-12)), 4)
                for s, i in zip(self.sources, self.intended, strict=True)
            },
        }
        self.first_step, self.start_tokens, self.intended = step + 1, now, np.zeros(len(self.sources))
        self.records.append(record)
        return record

    def state_dict(self) -> dict[str, Any]:
        return {
            "first_step": self.first_step,
            "start_tokens": self.start_tokens.tolist(),
            "intended": self.intended.tolist(),
            "records": self.records,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first_step, self.records = state["first_step"], list(state["records"])
        self.start_tokens, self.intended = np.array(state["start_tokens"]), np.array(state["intended"])
