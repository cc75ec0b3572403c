"""The planned mixture of a training run: tokens and epochs per source, phase by phase.

A phase is a stretch of steps between two points where something the recipe schedules
changes: a weight schedule's breakpoint, the end of a curriculum, a sequence-length phase, the
end of batch-size warmup. `kiln train --dry-run` prints the table before any compute; the train
stage computes the same plan at start (stopping or warning on sources planned beyond
mix.max_epochs) and records it in its manifest beside the realized mixture.
With an adaptive mixture the plan is the recipe's weights; the realized mixture says what the
adaptation did. Where the sources' languages are known (the tokenize manifest counts tokens per
language) and there are several, the plan also gives each language's natural share (of the train
tokens), its weighted share (of the tokens read: what mix.language_alpha, or the source weights,
make of it) and the epochs that implies; a source of several languages counts in each by its share.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    planned = {"phases": phases, "total": total, "tokens": int(tokens.sum())}
    if languages := plan_languages(total, rows.languages):
        planned["languages"] = languages
    return planned


def plan_languages(
    total: Mapping[str, Mapping[str, Any]], languages: Mapping[str, Mapping[str, int]] | None
) -> dict[str, dict[str, Any]] | None:
    """Per language, most train tokens first: its train tokens and natural share, the tokens the plan reads of it,
    their share and the epochs; None unless the sources hold two languages or more, one identified by curation.

    total: the plan's tokens per source; languages: each source's train tokens per language.
    """
    if not languages:
        return None
    natural: dict[str, int] = {}
    read: dict[str, float] = {}
    for source, counts in languages.items():
        of_source = max(sum(counts.values()), 1)
        for lang, n in counts.items():
            natural[lang] = natural.get(lang, 0) + n
            read[lang] = read.get(lang, 0.0) + total[source]["tokens"] * n / of_source
    if len(natural) < 2 or not set(natural) - {"und", "code"}:  # no language identified: the sources say it all
        return None
    all_natural, all_read = sum(natural.values()), max(sum(read.values()), 1.0)
    return {
        lang: {
            "train_tokens": natural[lang],
            "natural_share": round(natural[lang] / all_natural, 4),
            "tokens": int(round(read[lang])),
            "share": round(read[lang] / all_read, 4),
            "epochs": round(read[lang] / max(natural[lang], 1), 3),
        }
        for lang in sorted(natural, key=lambda k: (-natural[k], k))
    }


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
    if languages := plan.get("languages"):
        lines.append("\nlanguages: natural share of the train tokens, weighted share of the tokens read")
        lines.append(f"  {'language':<12} {'natural':>9} {'weighted':>9} {'tokens read':>14} {'epochs':>8}")
        lines += [
            f"  {lang:<12} {v['natural_share']:>9.3f} {v['share']:>9.3f} {v['tokens']:>14,} {v['epochs']:>8.3f}"
            for lang, v in languages.items()
        ]
    return "\n".join(lines)
