"""Inference-aware sizing: the model that reaches a loss with the fewest training plus inference FLOPs.

Sardana, Portes, Doubov and Frankle 2023, "Beyond Chinchilla-Optimal: Accounting for Inference
in Language Model Scaling Laws": for a target loss l and lifetime inference demand I tokens,
minimise 6 N D + 2 N I subject to L(N, D) = l (training costs 6 FLOPs per parameter per token,
inference 2). Along the constraint D(N) = (B / (l - E - A N^-alpha))^(1/beta) is defined
for N above the size where A N^-alpha alone uses up l - E; the total is unimodal in log N,
large near that size (D blows up) and growing past the Chinchilla point (N grows), so a
log-spaced scan then a golden-section refinement finds the minimum. With I = 0 the answer is
the Chinchilla-optimal model for that loss. At the optimum the Lagrange condition reads
(1 + I / (3 D)) * beta * B / D^beta = alpha * A / N^alpha (I = 0 gives Hoffmann's frontier),
which the tests check. The Chinchilla-optimal model for the same loss has a closed form
(LossLaw.optimal_params_for_loss). Example: the quality of a law-optimal 13B model (Hoffmann coefficients,
992B tokens) with 2T inference tokens is reached most cheaply by 8.0B parameters on 1.75T
tokens, 10% fewer total FLOPs. (Sardana et al.'s Figure 1 illustrates the same trade with a
13B -> 7B, 17% example; their exact inputs are not given in the figure, so it is not a test.)
Results more than 10x outside the sizes and token counts the law was fitted on, or past 10,000
tokens per parameter, carry a warning (kiln.plan.scaling.extrapolation_warnings).
Not handled here: dollar costs of inference hardware (the paper's second analysis), or
prompt versus generated tokens (all counted at 2N FLOPs).
"""

from __future__ import annotations

import math
from typing import Any

from kiln.core.errors import ConfigError
from kiln.plan.checks import require_positive
from kiln.plan.report import count, fixed, sci, table
from kiln.plan.scaling import LossLaw, extrapolation_warnings, min_params_for_loss

INFERENCE_FLOPS_PER_PARAM = 2  # forward pass only
TRAIN_FLOPS_PER_PARAM = 6


def lifetime_flops(law: LossLaw, params: float, loss: float, inference_tokens: float) -> float:
    tokens = law.tokens_for_loss(params, loss)
    if tokens is None:
        return math.inf
    return TRAIN_FLOPS_PER_PARAM * params * tokens + INFERENCE_FLOPS_PER_PARAM * params * inference_tokens


def best_params(law: LossLaw, loss: float, inference_tokens: float) -> float:
    """The size minimising training plus inference FLOPs at `loss`."""
    if inference_tokens == 0:
        return law.optimal_params_for_loss(loss)
    lo = math.log(min_params_for_loss(law, loss))
    # Past about 1e5 times the minimum size A/N^alpha is negligible and D stops falling, so the
    # optimum lies inside; the scan's 400 points put each within 3% of N of a sample.
    hi = lo + math.log(1e5)

    def f(u: float) -> float:  # total FLOPs at N = e^u
        return lifetime_flops(law, math.exp(u), loss, inference_tokens)

    us = [lo + (hi - lo) * (i + 1) / 400 for i in range(400)]
    k = min(range(len(us)), key=lambda i: f(us[i]))
    a, b = us[max(k - 1, 0)] if k else lo, us[min(k + 1, len(us) - 1)]
    # Golden-section on the bracket around the best sample.
    r = (math.sqrt(5) - 1) / 2
    c, d = b - r * (b - a), a + r * (b - a)
    for _ in range(100):
        if f(c) < f(d):
            b, d = d, c
            c = b - r * (b - a)
        else:
            a, c = c, d
            d = a + r * (b - a)
    return math.exp((a + b) / 2)


def inference_aware(
    law: LossLaw,
    inference_tokens: float,
    loss: float | None = None,
    flops: float | None = None,
    params: float | None = None,
) -> dict[str, Any]:
    """The inference-aware and the Chinchilla-optimal model for one target loss.

    The target is `loss`, or the loss of the compute-optimal model for `flops`, or of the
    Chinchilla-optimal model with `params` parameters (exactly one of the three).
    """
    if inference_tokens < 0:
        raise ConfigError(
            f"inference_tokens = {inference_tokens:g} must be 0 or more (lifetime tokens processed at inference, "
            "e.g. 2e12)"
        )
    given = [k for k, v in (("loss", loss), ("flops", flops), ("params", params)) if v is not None]
    if len(given) != 1:
        raise ConfigError(
            "give exactly one target: loss (--loss L), flops (--flops C, the loss of the compute-optimal model "
            "for C) or params (--params N, the loss of the Chinchilla-optimal N); got "
            f"{', '.join(given) or 'none'}"
        )
    if flops is not None:
        require_positive("flops", flops, "a training budget, e.g. 1e23")
        loss = law.loss(*law.optimal(flops))
    elif params is not None:
        require_positive("params", params, "model parameters, e.g. 13e9")
        loss = law.loss(params, law.optimal_tokens(params))
    assert loss is not None
    min_params_for_loss(law, loss)  # rejects a loss at or below E

    def describe(n: float) -> dict[str, float]:
        d = law.tokens_for_loss(n, loss)
        assert d is not None
        train, infer = TRAIN_FLOPS_PER_PARAM * n * d, INFERENCE_FLOPS_PER_PARAM * n * inference_tokens
        return {
            "params": n,
            "tokens": d,
            "tokens_per_param": d / n,
            "train_flops": train,
            "inference_flops": infer,
            "total_flops": train + infer,
        }

    best = describe(best_params(law, loss, inference_tokens))
    chin = describe(law.optimal_params_for_loss(loss))
    return {
        "fit": law.source,
        "loss": loss,
        "inference_tokens": inference_tokens,
        **best,
        **{f"chinchilla_{k}": v for k, v in chin.items()},
        "flops_saved": chin["total_flops"] - best["total_flops"],
        "saved_fraction": 1 - best["total_flops"] / chin["total_flops"],
        "warnings": extrapolation_warnings(best["params"], best["tokens"]),
    }


def format_inference(r: dict[str, Any]) -> str:
    rows = [
        ("target loss (nats/token)", f"{r['loss']:.4f} ({r['fit']})"),
        ("inference demand (tokens)", count(r["inference_tokens"])),
        ("", "inference-aware  |  Chinchilla-optimal"),
        ("parameters", f"{count(r['params'])}  |  {count(r['chinchilla_params'])}"),
        ("training tokens", f"{count(r['tokens'])}  |  {count(r['chinchilla_tokens'])}"),
        ("tokens per parameter", f"{fixed(r['tokens_per_param'], 1)}  |  {fixed(r['chinchilla_tokens_per_param'], 1)}"),
        ("training FLOPs", f"{sci(r['train_flops'])}  |  {sci(r['chinchilla_train_flops'])}"),
        ("inference FLOPs", f"{sci(r['inference_flops'])}  |  {sci(r['chinchilla_inference_flops'])}"),
        ("total FLOPs", f"{sci(r['total_flops'])}  |  {sci(r['chinchilla_total_flops'])}"),
        ("FLOPs saved", f"{sci(r['flops_saved'])} ({100 * r['saved_fraction']:.1f}%)"),
    ]
    return table(rows, warnings=r["warnings"])
