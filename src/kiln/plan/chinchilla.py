"""Compute-optimal model size and token count for a FLOP budget, a dollar budget or a fixed size.

Two ways to split compute C = 6ND between parameters N and tokens D:
  rule20    D = 20 N (Hoffmann et al. 2022, Table 3 and the Chinchilla model itself: 70B
            parameters on 1.4T tokens), so N = sqrt(C / 120);
  hoffmann, epoch
            the minimum of the parametric loss on 6ND = C (kiln.plan.scaling), which also
            predicts the loss reached.
A dollar budget becomes FLOPs through GPU-hours: C = USD / (USD per GPU-hour) * 3600 * peak
FLOP/s * MFU. Worked example (tests/plan/test_chinchilla.py): $500,000 at $3/GPU-hour on H100s
taken as 1000 TFLOP/s at 35% MFU is 2.1e23 FLOPs: 41.8B parameters on 837B tokens, 54 days on
128 GPUs.
Not handled here: inference cost (kiln.plan.inference), repeated data, or the memory the
chosen size needs (kiln.plan.memory).
"""

from __future__ import annotations

import math
from typing import Any

from kiln.core.errors import ConfigError
from kiln.plan.checks import require_choice, require_positive
from kiln.plan.hardware import Gpu, cost_summary, flops_for_gpu_hours
from kiln.plan.report import count, fixed, sci, table
from kiln.plan.scaling import TOKENS_PER_PARAM, extrapolation_warnings, get_law

FITS = ("rule20", "hoffmann", "epoch")


def size_for_budget(
    fit: str,
    gpu: Gpu,
    mfu: float,
    gpus: int = 1,
    flops: float | None = None,
    usd: float | None = None,
    params: float | None = None,
    usd_per_gpu_hour: float | None = None,
) -> dict[str, Any]:
    """Parameters, tokens, loss, GPU-hours, days and cost for exactly one of flops, usd, params."""
    require_choice("fit", fit, FITS)
    given = {k: v for k, v in (("flops", flops), ("usd", usd), ("params", params)) if v is not None}
    if len(given) != 1:
        raise ConfigError(
            "give exactly one budget: flops (--flops C), usd (--usd DOLLARS) or params (--params N); got "
            f"{', '.join(given) or 'none'}"
        )
    ((kind, value),) = given.items()
    require_positive(
        kind,
        value,
        {
            "flops": "training FLOPs, e.g. 5.76e23",
            "usd": "dollars to spend on GPU time",
            "params": "model parameters, e.g. 7e9",
        }[kind],
    )
    if kind == "params" and value < 1:
        raise ConfigError(f"params = {value:g} is less than one parameter; give the model's size, e.g. 7e9")
    law = None if fit == "rule20" else get_law(fit)

    if kind == "usd":
        if usd_per_gpu_hour is None:
            raise ConfigError(
                "a dollar budget needs usd_per_gpu_hour (--usd-per-gpu-hour PRICE), the price of one GPU for one hour"
            )
        require_positive("usd_per_gpu_hour", usd_per_gpu_hour, "the price of one GPU for one hour in USD")
        flops = flops_for_gpu_hours(value / usd_per_gpu_hour, gpu, mfu)
    if kind == "params":
        n = value
        d = TOKENS_PER_PARAM * n if law is None else law.optimal_tokens(n)
        flops = 6 * n * d
    else:
        assert flops is not None
        if law is None:
            n = math.sqrt(flops / (6 * TOKENS_PER_PARAM))
            d = TOKENS_PER_PARAM * n
        else:
            n, d = law.optimal(flops)
    return {
        "fit": fit,
        "budget": kind,
        "flops": flops,
        "params": n,
        "tokens": d,
        "tokens_per_param": d / n,
        "loss": None if law is None else law.loss(n, d),
        "coefficients": None if law is None else law.coefficients(),
        **cost_summary(flops, gpu, mfu, gpus, usd_per_gpu_hour),
        "warnings": [] if law is None else extrapolation_warnings(n, d),
    }


def format_size(r: dict[str, Any]) -> str:
    how = "20 tokens per parameter" if r["fit"] == "rule20" else f"parametric loss, {r['fit']} coefficients"
    rows = [
        ("split", how),
        ("training FLOPs", sci(r["flops"])),
        ("parameters", count(r["params"])),
        ("tokens", count(r["tokens"])),
        ("tokens per parameter", fixed(r["tokens_per_param"], 1)),
        (
            "predicted loss (nats/token)",
            "n/a for rule20; use --fit hoffmann or epoch" if r["loss"] is None else f"{r['loss']:.4f}",
        ),
        ("GPU", f"{r['gpu']} ({r['peak_tflops']:g} TFLOP/s peak) at MFU {r['mfu']:g}"),
        ("GPU-hours", fixed(r["gpu_hours"], 0)),
        (f"days on {r['gpus']} GPU{'s' if r['gpus'] != 1 else ''}", fixed(r["days"], 1)),
        ("cost (USD)", "n/a (give --usd-per-gpu-hour)" if r["cost_usd"] is None else fixed(r["cost_usd"], 0)),
    ]
    return table(rows, warnings=r["warnings"])
