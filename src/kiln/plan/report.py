"""Rendering a planner result as a two-column table with explicit units.

Every `kiln plan` subcommand returns a plain dict (its `--json` object); this module turns
labelled rows of it into aligned text, with notes and warnings (the dict's `warnings` list) after. Not handled here:
computing anything, or JSON output
(the CLI dumps the dict as it is).
"""

from __future__ import annotations

from collections.abc import Sequence


def sci(x: float | None, digits: int = 3) -> str:
    """3.150e+23 style for FLOPs and token counts too large for commas to help."""
    return "n/a" if x is None else f"{x:.{digits}e}"


def count(x: float | None) -> str:
    """A count with thousands separators, and its short form (e.g. '6,738,415,616 (6.74B)')."""
    if x is None:
        return "n/a"
    return f"{round(x):,} ({short(x)})"


def short(x: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def fixed(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def table(
    rows: Sequence[tuple[str, str]], notes: Sequence[str] = (), label: str = "note", warnings: Sequence[str] = ()
) -> str:
    """Rows of (label with unit, value), aligned; notes follow, one line each, after `label:`, then warnings after
    `warning:`."""
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.extend(f"{label}: {n}" for n in notes)
    lines.extend(f"warning: {w}" for w in warnings)
    return "\n".join(lines)
