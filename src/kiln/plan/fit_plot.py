"""A PNG of a scaling-law fit: the runs' final losses against tokens, with the fitted curve per model size.

Left: loss against training tokens (log scale), one colour per parameter count, the fitted
L(N, D) drawn through each size's runs and past them. Right: predicted against observed loss,
where a good fit sits on the diagonal.
Not handled here: the fit itself (kiln.plan.fit), interactive plots, or other formats than PNG.
matplotlib is imported here only, with the Agg backend, so the rest of kiln never needs a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.core.errors import ConfigError, FatalError
from kiln.plan.fit import law_of
from kiln.plan.report import short
from kiln.plan.scaling import log_range


def check_plot_path(path: Path) -> Path:
    """A .png path whose folder exists or can be made; called before fitting, so a bad path fails fast."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ConfigError(
            f"plot = {str(path)!r} must end in .png (the plot is a PNG); e.g. --plot runs/demo/sweep/fit.png"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.open("xb").close()  # a trial write; removed at once so a failed fit leaves nothing
            path.unlink()
        elif not path.is_file():
            raise IsADirectoryError(21, "not a regular file")
        else:
            path.open("ab").close()
    except OSError as e:
        raise FatalError(
            f"{path}: cannot write the plot here ({e.strerror or e}); choose a writable --plot path"
        ) from None
    return path


def plot_fit(result: dict[str, Any], path: Path) -> Path:
    """Write the two-panel figure to `path` (PNG) and return it; an unwritable path is a FatalError naming it."""
    path = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    law = law_of(result)
    runs = result["runs"]
    sizes = sorted({r["params"] for r in runs})
    tokens = [r["tokens"] for r in runs]
    d_curve = log_range(min(tokens) / 2, max(tokens) * 4, 100)
    cmap = plt.get_cmap("viridis")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, n in enumerate(sizes):
        colour = cmap(i / max(1, len(sizes) - 1))
        mine = [r for r in runs if r["params"] == n]
        left.scatter(
            [r["tokens"] for r in mine], [r["loss"] for r in mine], color=colour, zorder=3, label=f"N = {short(n)}"
        )
        left.plot(d_curve, [law.loss(n, d) for d in d_curve], color=colour, lw=1.2)
    left.axhline(law.E, color="grey", ls=":", lw=1, label=f"E = {law.E:.3g}")
    left.set_xscale("log")
    left.set_xlabel("training tokens D")
    left.set_ylabel("final loss (nats/token)")
    c = result["coefficients"]
    left.set_title(f"L = {c['E']:.3g} + {c['A']:.3g}/N^{c['alpha']:.3g} + {c['B']:.3g}/D^{c['beta']:.3g}", fontsize=9)
    left.legend(fontsize=7)

    observed, predicted = [r["loss"] for r in runs], [r["predicted"] for r in runs]
    lo, hi = min(observed + predicted), max(observed + predicted)
    right.plot([lo, hi], [lo, hi], color="grey", lw=1)
    right.scatter(
        observed, predicted, color=[cmap(sizes.index(r["params"]) / max(1, len(sizes) - 1)) for r in runs], zorder=3
    )
    right.set_xlabel("observed loss")
    right.set_ylabel("fitted loss")
    right.set_title(f"{result['n_runs']} runs, rms log residual {result['rms_log_residual']:.3g}", fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100, format="png")
    except OSError as e:
        raise FatalError(f"{path}: cannot write the plot ({e.strerror or e}); choose a writable --plot path") from None
    finally:
        plt.close(fig)
    return path
