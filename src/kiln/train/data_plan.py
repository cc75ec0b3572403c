"""The planned mixture of a training run: tokens and epochs per source, phase by phase.

A phase is a stretch of steps between two points where something the recipe schedules
changes: a weight schedule's breakpoint, the end of a curriculum, a sequence-length phase, the
end of batch-size warmup. `kiln train --dry-run` prints the table before any compute; the train
stage computes the same plan at start (stopping or warning on sources planned beyond
mix.max_epochs) and records it in its manifest beside the realized mixture.
With an adaptive mixture the plan is the recipe's weights; the realized mixture says what the
adaptation did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.model.batch import RowSource
from kiln.train.config import TrainConfig
from kiln.train.objectives import window_length


def plan_data(cfg: TrainConfig, rows: RowSource) -> dict[str, Any]:
    """Per phase and in total: steps, sequence lengths, tokens, and per source the weights, tokens and cumulative
    epochs."""
    shapes = [cfg.geometry(step) for step in range(1, cfg.steps + 1)]
    progress = np.array([g.progress for g in shapes])
    tokens = np.array([g.tokens(cfg.data_ranks) for g in shapes])  # positions trained
    # What the rows read from the sources: each row's window, by the objectives' weights.
    weights = cfg.objectives
    window = {
        length: sum(w * window_length(o, length, cfg.span_corruption) for o, w in weights.items())
        / sum(weights.values())
        for length in {g.seq_len for g in shapes}
    }
    read = np.array([g.rows_per_rank * cfg.data_ranks * window[g.seq_len] for g in shapes])
    edges = {0.0, *rows.breakpoints(), *(p.start for p in cfg.seq_len_schedule or [])}
    if cfg.batch_warmup is not None:
        edges.add(min(cfg.batch_warmup.steps, cfg.steps) / cfg.steps)
    edges_sorted = sorted(e for e in edges if 0 <= e < 1)
    phases = []
    cumulative = dict.fromkeys(rows.sources, 0)
    for a, b in zip(edges_sorted, [*edges_sorted[1:], 1.01], strict=True):
        picked = np.flatnonzero((progress >= a) & (progress < b))
        if not len(picked):
            continue
        per_source = rows.plan(read[picked].tolist(), progress[picked].tolist())
        first, last = rows.weights_at(progress[picked[0]]), rows.weights_at(progress[picked[-1]])
        for s in rows.sources:
            cumulative[s] += per_source[s]["tokens"]
        phases.append(
            {
                "steps": [int(picked[0]) + 1, int(picked[-1]) + 1],
                "progress": [round(float(a), 4), round(float(min(b, 1.0)), 4)],
                "seq_len": sorted({shapes[i].seq_len for i in picked}),
                "tokens": int(tokens[picked].sum()),
                "sources": {
                    s: {
                        "weight": [round(float(first[k]), 4), round(float(last[k]), 4)],
                        "tokens": per_source[s]["tokens"],
                        "epochs_so_far": round(cumulative[s] / per_source[s]["train_tokens"], 3),
                    }
                    for k, s in enumerate(rows.sources)
                },
            }
        )
    total = rows.plan(read.tolist(), progress.tolist(), check=True)  # warns or stops on over-repeated sources
    return {"phases": phases, "total": total, "tokens": int(tokens.sum())}


def format_plan(plan: dict[str, Any]) -> str:
    lines = [
        (
            f"planned mixture: {plan['tokens']:,} tokens trained in {len(plan['phases'])} phase(s); tokens read per "
            "source include each row's window (T + 1 for clm)"
        )
    ]
    for p in plan["phases"]:
        lines.append(
            f"\nsteps {p['steps'][0]}-{p['steps'][1]} (progress {p['progress'][0]:.0%}-{p['progress'][1]:.0%}), "
            f"seq_len {'/'.join(map(str, p['seq_len']))}, {p['tokens']:,} tokens trained"
        )
        lines.append(f"  {'source':<12} {'weight':>15} {'tokens read':>14} {'epochs so far':>14}")
        for s, v in p["sources"].items():
            w0, w1 = v["weight"]
            weight = f"{w0:.3f}" if abs(w0 - w1) < 5e-4 else f"{w0:.3f} -> {w1:.3f}"
            lines.append(f"  {s:<12} {weight:>15} {v['tokens']:>14,} {v['epochs_so_far']:>14.3f}")
    lines.append("\ntotal")
    lines += [
        f"  {s:<12} {v['tokens']:>14,} tokens read, {v['epochs']:.3f} epochs of {v['train_tokens']:,}"
        for s, v in plan["total"].items()
    ]
    return "\n".join(lines)
