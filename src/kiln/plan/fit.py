"""Fitting L(N, D) = E + A / N^alpha + B / D^beta to the final losses of runs, as Hoffmann et al. did.

Hoffmann et al. 2022, Section 3.3 and Appendix D.2: minimise over (a, b, e, alpha, beta)
the sum over runs of Huber_delta(LSE(a - alpha log N, b - beta log D, e) - log L) with
delta = 1e-3, L-BFGS, from a grid of initialisations; A = e^a, B = e^b, E = e^e. Working in
log-loss keeps every run's weight comparable, the Huber loss limits outliers, and the exp
parametrisation keeps E, A, B positive. Following Besiroglu et al. 2024, the objective is a
plain sum (not a mean, whose tiny gradients stopped Hoffmann's optimiser early) and L-BFGS
runs to tight tolerances. Intervals come from a bootstrap over runs (percentiles).
subtle: log N and log D are centred before fitting (a' = a - alpha * mean log N, likewise b').
Uncentred, a change in alpha is offset by a change in a about 20x larger, a narrow valley in
which L-BFGS stopped at different points from different starts (objective differing in the
third digit); centred, all starts agree to 1e-6 in about 100 evaluations.
Optimiser: torch.optim.LBFGS in float64 with strong-Wolfe line search. torch is already a
dependency and its autograd gives exact gradients of the log-sum-exp/Huber objective, so no
SciPy and no hand-derived gradients.
Inputs: a CSV with columns params, tokens, loss (others ignored), or kiln run directories
(train/manifest.json gives params and tokens_trained; the loss is eval/manifest.json's
after.all.loss when present, else the train stage's final validation loss).
N for kiln runs is the non-embedding count by default (param_count="total" for all of them).
At sweep scale the embeddings are most of the model (83% at `kiln sweep`'s 64x2 size), so total
N barely changes across sizes and the two counts give different exponents; Pearce & Song 2024
("Reconciling Kaplan and Chinchilla Scaling Laws") trace the Kaplan/Chinchilla gap to exactly
this choice at small scale. The published coefficients kiln ships (kiln.plan.scaling) count
total parameters, so compare a fit with them only on the same count.
The result carries `warnings`: an exponent outside (0, 1) (published fits give 0.28 to 0.37), a
bootstrap interval of E, alpha or beta wider than its estimate, or a prediction more than 10x
outside the runs' sizes or token counts. Any of these means the runs do not pin the law down.
Not handled here: choosing which runs to fit (all given are used), learning-rate schedule
effects (each run's loss is taken as final), plotting (kiln.plan.fit_plot).
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln.core.errors import ConfigError, FatalError
from kiln.core.layout import EVAL, MANIFEST, TRAIN
from kiln.plan.checks import require_choice, require_positive
from kiln.plan.report import count, table
from kiln.plan.scaling import LossLaw, extrapolation_warnings

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, Appendix D.2
# Hoffmann's initialisation grid (Appendix D.2): alpha, beta in {0, 0.5, ..., 2}, e in
# {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25}: 4,500 starts. All are scored; L-BFGS runs
# from the best few, which finds the same optimum far faster than running all 4,500.
GRID_ALPHA = [0.0, 0.5, 1.0, 1.5, 2.0]
GRID_E = [-1.0, -0.5, 0.0, 0.5, 1.0]
GRID_AB = [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
PARAM_NAMES = ("E", "A", "B", "alpha", "beta")
PARAM_COUNTS = ("non_embedding", "total")


@dataclass(frozen=True)
class Run:
    name: str
    params: float
    tokens: float
    loss: float


def read_csv(path: Path) -> list[Run]:
    """Runs from a CSV with a header naming params, tokens and loss; a `name` column is optional."""
    path = Path(path)
    if not path.is_file():
        raise FatalError(f"{path}: no such CSV file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a spreadsheet's byte-order mark is not part of the header
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte {e.start}: {e.object[e.start : e.start + 1]!r}); save the CSV "
            "as UTF-8"
        ) from None
    with io.StringIO(text, newline="") as f:
        reader = csv.DictReader(f)
        fields = {(h or "").strip().lower(): h for h in reader.fieldnames or []}
        missing = [c for c in ("params", "tokens", "loss") if c not in fields]
        if missing:
            raise ConfigError(
                f"{path}: the header must name columns params, tokens and loss; missing {', '.join(missing)} "
                f"(found {', '.join(fields) or 'no header'})"
            )
        runs = []
        for i, row in enumerate(reader, start=2):
            try:
                values = [float(row[fields[c]]) for c in ("params", "tokens", "loss")]
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{path}:{i}: params, tokens and loss must be numbers; got "
                    f"{[row.get(fields[c]) for c in ('params', 'tokens', 'loss')]}"
                ) from None
            name = row.get(fields["name"]) if "name" in fields else None
            runs.append(_checked(Run(name or f"row{i}", *values), f"{path}:{i}"))
    return runs


def _checked(run: Run, where: str) -> Run:
    for field in ("params", "tokens", "loss"):
        value = getattr(run, field)
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{where}: {field} = {value} must be a finite number above 0")
    return run


def read_runs(paths: list[Path], param_count: str = "non_embedding") -> list[Run]:
    """Final losses of finished kiln runs; each path is a run directory or a folder of them.

    param_count: non_embedding (Kaplan et al.'s N; the default, see the module docstring) or
    total (every parameter, as Hoffmann et al. count).
    """
    require_choice("param_count", param_count, PARAM_COUNTS)
    run_dirs: list[Path] = []
    for p in map(Path, paths):
        if (p / TRAIN / MANIFEST).is_file():
            run_dirs.append(p)
        elif p.is_dir():
            found = sorted(d for d in p.iterdir() if (d / TRAIN / MANIFEST).is_file())
            if not found:
                raise FatalError(
                    f"{p}: neither a finished run (no train/manifest.json) nor a folder of them; train first "
                    "(e.g. `kiln sweep`)"
                )
            run_dirs.extend(found)
        else:
            raise FatalError(f"{p}: no such run directory")
    runs = []
    for d in run_dirs:
        counts = json.loads((d / TRAIN / MANIFEST).read_text())["counts"]
        eval_manifest = d / EVAL / MANIFEST
        loss = (
            json.loads(eval_manifest.read_text())["counts"]["after"]["all"]["loss"]
            if eval_manifest.is_file()
            else counts["val_after"]["all"]["loss"]
        )
        params = counts["params"] if param_count == "total" else counts["params_non_embedding"]
        runs.append(_checked(Run(d.name, float(params), float(counts["tokens_trained"]), float(loss)), str(d)))
    return runs


def _objective(
    theta_K5: torch.Tensor,
    log_n: torch.Tensor,
    log_d: torch.Tensor,
    log_l: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Summed Huber loss of the log-loss residuals, one value per row of theta (a, b, e, alpha, beta)."""
    a, b, e, alpha, beta = theta_K5.unbind(-1)
    terms = torch.stack(
        [a[:, None] - alpha[:, None] * log_n, b[:, None] - beta[:, None] * log_d, e[:, None].expand(-1, log_n.numel())],
        dim=0,
    )
    residual = torch.logsumexp(terms, dim=0) - log_l
    huber = torch.nn.functional.huber_loss(residual, torch.zeros_like(residual), reduction="none", delta=HUBER_DELTA)
    return (huber if weight is None else huber * weight).sum(-1)


def _lbfgs(
    theta0: torch.Tensor, data: tuple[torch.Tensor, ...], weight: torch.Tensor | None = None, max_iter: int = 2000
) -> tuple[torch.Tensor, float]:
    theta = theta0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [theta],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = _objective(theta[None], *data, weight)[0]
        value.backward()
        return value

    opt.step(closure)
    with torch.no_grad():
        return theta.detach(), float(_objective(theta[None], *data, weight)[0])


def _grid() -> torch.Tensor:
    rows = [
        (a, b, e, al, be) for a in GRID_AB for b in GRID_AB for e in GRID_E for al in GRID_ALPHA for be in GRID_ALPHA
    ]
    return torch.tensor(rows, dtype=torch.float64)


def _centred(theta_K5: torch.Tensor, centre: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """(a, b, ...) for raw log N, log D -> (a', b', ...) for centred ones."""
    out = theta_K5.clone()
    out[:, 0] -= out[:, 3] * centre[0]
    out[:, 1] -= out[:, 4] * centre[1]
    return out


def _fit_once(
    data: tuple[torch.Tensor, ...], starts: torch.Tensor, weight: torch.Tensor | None = None, max_iter: int = 2000
) -> tuple[torch.Tensor, float]:
    best, best_value = starts[0], math.inf
    for theta0 in starts:
        theta, value = _lbfgs(theta0, data, weight, max_iter)
        if math.isfinite(value) and value < best_value:
            best, best_value = theta, value
    return best, best_value


def _law(theta: torch.Tensor, centre: tuple[torch.Tensor, torch.Tensor]) -> LossLaw:
    a, b, e, alpha, beta = theta.tolist()
    a, b = a + alpha * float(centre[0]), b + beta * float(centre[1])
    return LossLaw(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=alpha, beta=beta)


def fit_runs(
    runs: list[Run],
    starts: int = 8,
    bootstrap: int = 100,
    seed: int = 0,
    target_params: float | None = None,
    target_tokens: float | None = None,
) -> dict[str, Any]:
    """Coefficients, bootstrap 95% intervals and (optionally) the predicted loss at a target N, D."""
    if len(runs) < 5:
        raise ConfigError(
            f"a fit of five coefficients needs at least 5 runs; got {len(runs)} (add runs, e.g. with `kiln sweep`)"
        )
    if len({r.params for r in runs}) < 2 or len({r.tokens for r in runs}) < 2:
        raise ConfigError(
            "the runs must vary both params and tokens (at least 2 distinct values of each); otherwise alpha or "
            "beta is not identifiable"
        )
    if starts < 1 or bootstrap < 0:
        raise ConfigError(f"starts = {starts} must be at least 1 and bootstrap = {bootstrap} at least 0")
    if (target_params is None) != (target_tokens is None):
        raise ConfigError(
            "give both target_params (--target-params N) and target_tokens (--target-tokens D), or neither"
        )
    for name, value in (("target_params", target_params), ("target_tokens", target_tokens)):
        if value is not None:
            require_positive(name, value, "where to predict the loss, in the runs' own parameter count and tokens")
    log_n, log_d, log_l = (
        torch.tensor([math.log(getattr(r, k)) for r in runs], dtype=torch.float64) for k in ("params", "tokens", "loss")
    )
    centre = (log_n.mean(), log_d.mean())
    data = (log_n - centre[0], log_d - centre[1], log_l)
    grid = _centred(_grid(), centre)
    with torch.no_grad():
        order = torch.argsort(_objective(grid, *data))
    theta, value = _fit_once(data, grid[order[:starts]])
    law = _law(theta, centre)

    # Bootstrap: refit on runs resampled with replacement (as per-run weights), warm-started
    # from the full fit: on synthetic data restarts from the grid found the same optima to 1e-6.
    # A well-posed resample converges in under 100 evaluations; a degenerate one (few distinct
    # sizes drawn) drifts along a flat valley, so the iteration cap keeps it from costing
    # seconds (measured on a 6-run demo sweep, 100 resamples: 26 s uncapped, 8 s capped at 300).
    rng = random.Random(seed)
    samples, predictions = [], []
    for _ in range(bootstrap):
        weight = torch.zeros(len(runs), dtype=torch.float64)
        for _ in runs:
            weight[rng.randrange(len(runs))] += 1
        th, _ = _fit_once(data, theta[None], weight[None], max_iter=300)
        b = _law(th, centre)
        samples.append([b.E, b.A, b.B, b.alpha, b.beta])
        if target_params is not None:
            predictions.append(b.loss(target_params, target_tokens))  # type: ignore[arg-type]
    intervals = {name: _percentiles([s[i] for s in samples]) for i, name in enumerate(PARAM_NAMES)} if samples else None

    residuals = [math.log(law.loss(r.params, r.tokens)) - math.log(r.loss) for r in runs]
    warnings = fit_warnings(law, intervals)
    if target_params is not None:
        assert target_tokens is not None
        sizes, tokens = [r.params for r in runs], [r.tokens for r in runs]
        warnings += extrapolation_warnings(
            target_params,
            target_tokens,
            (min(sizes), max(sizes)),
            (min(tokens), max(tokens)),
            "the fitted runs",
            max_tokens_per_param=None,
        )
    return {
        "coefficients": law.coefficients(),
        "intervals": intervals,
        "n_runs": len(runs),
        "huber_delta": HUBER_DELTA,
        "objective": value,
        "rms_log_residual": math.sqrt(sum(x * x for x in residuals) / len(residuals)),
        "starts": starts,
        "bootstrap": bootstrap,
        "target_params": target_params,
        "target_tokens": target_tokens,
        # type: ignore[arg-type]
        "predicted_loss": None if target_params is None else law.loss(target_params, target_tokens),
        "predicted_loss_interval": _percentiles(predictions) if predictions else None,
        "runs": [
            {
                "name": r.name,
                "params": r.params,
                "tokens": r.tokens,
                "loss": r.loss,
                "predicted": law.loss(r.params, r.tokens),
            }
            for r in runs
        ],
        "warnings": warnings,
    }


def fit_warnings(law: LossLaw, intervals: dict[str, list[float]] | None) -> list[str]:
    """What makes a fit untrustworthy: exponents outside (0, 1), intervals of E, alpha or beta wider than the
    estimate."""
    out = []
    for name, value in (("alpha", law.alpha), ("beta", law.beta)):
        if not 0 < value < 1:
            spread = "model sizes" if name == "alpha" else "token counts"
            out.append(
                f"{name} = {value:.3g} is outside (0, 1), where published fits lie (0.28 to 0.37; Hoffmann et al. "
                "2022, Besiroglu et al. 2024): the runs do not pin it down; add runs over a wider range of "
                f"{spread}"
            )
    # subtle: only E and the exponents. A and B trade off against alpha and beta along a ridge, so
    # their marginal intervals are wide even for a fit that predicts well (measured: A's spans
    # 176 .. 1587 on tests/plan/test_fit.py's 0.5%-noise grid, whose 7B prediction is within 0.5%).
    for name, (lo, hi) in (intervals or {}).items():
        if name in ("A", "B"):
            continue
        estimate = law.coefficients()[name]
        if hi - lo > abs(estimate):
            out.append(
                f"the 95% bootstrap interval of {name}, {lo:.4g} .. {hi:.4g}, is wider than the estimate "
                f"{estimate:.4g}: the runs do not determine it"
            )
    return out


def _percentiles(values: list[float], lo: float = 2.5, hi: float = 97.5) -> list[float]:
    xs = sorted(values)

    def at(q: float) -> float:
        pos = q / 100 * (len(xs) - 1)
        i = int(pos)
        return xs[i] if i + 1 >= len(xs) else xs[i] + (xs[i + 1] - xs[i]) * (pos - i)

    return [at(lo), at(hi)]


def law_of(result: dict[str, Any]) -> LossLaw:
    return LossLaw(**result["coefficients"], source="fitted")


def format_fit(r: dict[str, Any]) -> str:
    def interval(name: str) -> str:
        return (
            ""
            if r["intervals"] is None
            else f"  (95% bootstrap: {r['intervals'][name][0]:.4g} .. {r['intervals'][name][1]:.4g})"
        )

    c = r["coefficients"]
    counted = {"non_embedding": "non-embedding parameters", "total": "all parameters"}.get(
        r.get("param_count") or "", "the params given"
    )
    rows = [
        ("runs fitted", f"{r['n_runs']} (N = {counted})"),
        ("E (nats/token)", f"{c['E']:.4g}{interval('E')}"),
        ("A", f"{c['A']:.4g}{interval('A')}"),
        ("B", f"{c['B']:.4g}{interval('B')}"),
        ("alpha", f"{c['alpha']:.4g}{interval('alpha')}"),
        ("beta", f"{c['beta']:.4g}{interval('beta')}"),
        ("rms residual of log loss", f"{r['rms_log_residual']:.4g}"),
    ]
    if r["predicted_loss"] is not None:
        band = (
            ""
            if r["predicted_loss_interval"] is None
            else f" (95% bootstrap: {r['predicted_loss_interval'][0]:.4f} .. {r['predicted_loss_interval'][1]:.4f})"
        )
        rows.append(
            (
                f"predicted loss at N={count(r['target_params'])}, D={count(r['target_tokens'])}",
                f"{r['predicted_loss']:.4f}{band}",
            )
        )
    return table(
        rows,
        [
            (
                f"{r['bootstrap']} bootstrap resamples, L-BFGS from the best {r['starts']} of 4,500 grid starts, "
                f"Huber delta {r['huber_delta']:g}"
            )
        ],
        warnings=r["warnings"],
    )
