"""How often to checkpoint: the Young and Daly optimal intervals and the time they lose.

With checkpoint write time d and mean time between failures M (same units; minutes here),
the compute time between checkpoints that minimises expected lost time is
  Young 1974 ("A first order approximation to the optimum checkpoint interval", CACM 17(9)):
      t = sqrt(2 d M)
  Daly 2006 ("A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3)):
      t = sqrt(2 d M) * (1 + sqrt(d / 2M) / 3 + (d / 2M) / 9) - d   for d < 2M, else t = M.
Expected lost fraction uses Daly's model of exponentially distributed failures with restart
time R: wall time / useful time = M e^(R/M) (e^((t + d)/M) - 1) / t, so the fraction of wall
time not spent on useful work is 1 - t / (M e^(R/M) (e^((t + d)/M) - 1)).
A cluster of G GPUs that each fail at r per day (independently) has M = 1440 / (G r) minutes.
Worked example (tests/plan/test_checkpoint_interval.py): d = 5, M = 1440 gives Young 120.0
and Daly 116.7 minutes.
Not handled here: asynchronous checkpoints whose write overlaps compute (use the blocking part
as d), correlated failures, or storage bandwidth (measure d on the real cluster).
"""

from __future__ import annotations

import math
from typing import Any

from kiln.core.errors import ConfigError
from kiln.plan.checks import require_at_least, require_positive
from kiln.plan.report import fixed, table

MINUTES_PER_DAY = 1440.0


def young_interval(write: float, mtbf: float) -> float:
    return math.sqrt(2 * write * mtbf)


def daly_interval(write: float, mtbf: float) -> float:
    if write >= 2 * mtbf:
        return mtbf  # checkpoints cost more than failures: Daly's cap
    x = write / (2 * mtbf)
    return math.sqrt(2 * write * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - write


def lost_fraction(interval: float, write: float, mtbf: float, restart: float = 0.0) -> float:
    """Expected share of wall time not spent on useful work (writing, rework after failures, restarts)."""
    return 1 - interval / (mtbf * math.exp(restart / mtbf) * math.expm1((interval + write) / mtbf))


def plan_interval(
    write_minutes: float,
    mtbf_minutes: float | None = None,
    gpus: int | None = None,
    failures_per_gpu_day: float | None = None,
    restart_minutes: float = 0.0,
) -> dict[str, Any]:
    """Young's and Daly's intervals (minutes) and the time each loses, from an MTBF or a cluster's failure rate."""
    require_positive("write_minutes", write_minutes, "the time one checkpoint blocks training")
    if restart_minutes < 0:
        raise ConfigError(
            f"restart_minutes = {restart_minutes:g} must be 0 or more (time to restart and reload after a failure)"
        )
    cluster = gpus is not None or failures_per_gpu_day is not None
    if (mtbf_minutes is None) == (not cluster) or (cluster and (gpus is None or failures_per_gpu_day is None)):
        raise ConfigError(
            "give either mtbf_minutes (--mtbf-minutes M) or both gpus (--gpus G) and failures_per_gpu_day "
            "(--failures-per-gpu-day R)"
        )
    if cluster:
        assert gpus is not None and failures_per_gpu_day is not None
        require_at_least("gpus", gpus, 1, "GPUs in the job")
        require_positive("failures_per_gpu_day", failures_per_gpu_day, "e.g. 5.5e-4: one failure per GPU per 5 years")
        mtbf_minutes = MINUTES_PER_DAY / (gpus * failures_per_gpu_day)
    assert mtbf_minutes is not None
    require_positive("mtbf_minutes", mtbf_minutes, "mean time between failures of the whole job")
    if write_minutes >= mtbf_minutes:
        raise ConfigError(
            f"write_minutes = {write_minutes:g} is not shorter than the mean time between failures "
            f"({mtbf_minutes:g} min): the job would fail about once per checkpoint and make no progress; make a "
            "checkpoint faster (sharded, async: train.checkpoint.async_save) or the job less likely to fail"
        )
    young = young_interval(write_minutes, mtbf_minutes)
    daly = daly_interval(write_minutes, mtbf_minutes)
    return {
        "write_min": write_minutes,
        "mtbf_min": mtbf_minutes,
        "restart_min": restart_minutes,
        "gpus": gpus,
        "failures_per_gpu_day": failures_per_gpu_day,
        "young_min": young,
        "daly_min": daly,
        "lost_fraction_young": lost_fraction(young, write_minutes, mtbf_minutes, restart_minutes),
        "lost_fraction_daly": lost_fraction(daly, write_minutes, mtbf_minutes, restart_minutes),
        "checkpoints_per_day": MINUTES_PER_DAY / (daly + write_minutes),
    }


def format_interval(r: dict[str, Any]) -> str:
    rows = [
        ("checkpoint write (minutes)", fixed(r["write_min"])),
        (
            "mean time between failures (minutes)",
            fixed(r["mtbf_min"])
            + (
                ""
                if r["gpus"] is None
                else f" ({r['gpus']} GPUs at {r['failures_per_gpu_day']:g} failures per GPU-day)"
            ),
        ),
        ("restart after a failure (minutes)", fixed(r["restart_min"])),
        ("Young interval (minutes of compute)", fixed(r["young_min"])),
        ("Daly interval (minutes of compute)", fixed(r["daly_min"])),
        ("time lost at Young's interval", f"{r['lost_fraction_young']:.2%}"),
        ("time lost at Daly's interval", f"{r['lost_fraction_daly']:.2%}"),
        ("checkpoints per day (Daly)", fixed(r["checkpoints_per_day"], 1)),
    ]
    return table(rows)
