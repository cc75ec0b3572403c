"""`kiln sweep`: a grid of small training runs (model sizes x step counts) to feed `kiln plan fit`.

The data stages run once, in the base recipe's own run directory (the stages kiln.verbs orders
before training: curate, train-tokenizer, tokenize; each skipped when current). Each grid point is a run directory under
`<base run>/sweep/<point>/` whose `tokenizer/` and `tokenize/` are symbolic links to the base
run's, so every point reads the same tokens and the same manifests (its train manifest records
the base tokenize stage's fingerprint). Each point then runs only the train stage, with
`--set`-style overrides of the model shape and step count; its final validation loss, params
and tokens land in its train/manifest.json, which kiln.plan.fit reads.
A point is named d<d_model>-l<n_layers>-s<steps>; finished points are skipped unless forced.
On the demo corpus and 2 CPU cores the default grid (4 sizes x 3 step counts) takes about
20 minutes: `kiln sweep --recipe demo` then
`kiln plan fit --runs runs/demo/sweep --plot runs/demo/sweep/fit.png`.
Not handled here: learning-rate tuning per size (the recipe's train.optim.lr is used for every point),
launching on a cluster, or running points in parallel.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kiln.core.errors import ConfigError
from kiln.core.layout import TOKENIZE, TOKENIZER, TRAIN, RunLayout
from kiln.model.config import count_params, flops_per_token
from kiln.plan.report import count, sci
from kiln.recipe import Recipe, load_recipe
from kiln.stages import run_stage
from kiln.verbs import stage_verb, stages_before

log = logging.getLogger("kiln.sweep")

DEFAULT_SIZES = "64x2,128x2,192x3,256x4"  # d_model x n_layers
DEFAULT_STEPS = "100,200,400"
SHARED_STAGES = (TOKENIZER, TOKENIZE)  # what the train stage reads from a run directory


@dataclass(frozen=True)
class SweepPoint:
    name: str
    d_model: int
    n_layers: int
    n_heads: int
    steps: int
    params: int  # every parameter, embeddings included
    params_non_embedding: int  # what `kiln plan fit` counts as N by default
    tokens: int
    train_flops: int
    overrides: tuple[str, ...]


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """'64x2,128x4' -> [(64, 2), (128, 4)]: d_model x n_layers."""
    sizes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        d, sep, layers = item.lower().partition("x")
        if not sep or not d.isdigit() or not layers.isdigit() or int(d) < 8 or int(layers) < 1:
            raise ConfigError(f"sizes: {item!r} is not D x L (d_model x n_layers, d_model at least 8), e.g. 128x2")
        sizes.append((int(d), int(layers)))
    if not sizes:
        raise ConfigError("sizes: give at least one D x L size, e.g. --sizes 64x2,128x2")
    return sizes


def parse_steps(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"steps: {text!r} must be comma-separated integers, e.g. 100,200,400") from None
    if not steps or min(steps) < 2:
        raise ConfigError(f"steps: {text!r} must list step counts of at least 2 (warmup takes a tenth of them)")
    return steps


def plan_sweep(
    recipe: str, overrides: list[str], sizes: list[tuple[int, int]], steps: list[int], head_dim: int = 32
) -> tuple[Recipe, list[SweepPoint]]:
    """The base recipe and one validated point per (size, steps); nothing is run or written."""
    base = load_recipe(recipe, overrides)
    vocab = base.model.vocab_size or base.tokenizer.vocab_size
    points = []
    for d, layers in sizes:
        # Plain multi-head attention (n_kv_heads = n_heads) so any head count is valid.
        if head_dim < 2 or head_dim % 2 or d % head_dim:
            raise ConfigError(
                f"sizes: d_model {d} with head_dim {head_dim}: d_model must be a multiple of head_dim "
                "(--head-dim), and head_dim even (RoPE rotates pairs); e.g. --head-dim 32 with d_model 64, 96, "
                "128"
            )
        heads = d // head_dim
        for s in steps:
            point_overrides = (
                f"model.d_model={d}",
                f"model.n_layers={layers}",
                f"model.n_heads={heads}",
                f"model.n_kv_heads={heads}",
                f"train.steps={s}",
                f"train.schedule.warmup_steps={max(1, s // 10)}",
                "train.schedule.warmup_fraction=null",
                "train.eval_at_start=false",
            )
            r = load_recipe(recipe, [*overrides, *point_overrides])  # validates the point before any work
            cfg = r.model.resolved(vocab)
            tokens = s * r.train.tokens_per_step
            points.append(
                SweepPoint(
                    f"d{d}-l{layers}-s{s}",
                    d,
                    layers,
                    heads,
                    s,
                    count_params(cfg),
                    count_params(cfg, include_embeddings=False),
                    tokens,
                    flops_per_token(cfg, r.train.seq_len) * tokens,
                    point_overrides,
                )
            )
    return base, points


def sweep_dir(base: Recipe) -> Path:
    return RunLayout(base.run_dir).sweep


def link_shared_stages(base_run: Path, point_run: Path) -> None:
    """Point a grid run's tokenizer/ and tokenize/ at the base run's (relative symlinks)."""
    point_run.mkdir(parents=True, exist_ok=True)
    for stage in SHARED_STAGES:
        link, target = point_run / stage, (base_run / stage).resolve()
        if link.is_symlink() or link.exists():
            if link.resolve() == target:
                continue
            raise ConfigError(
                f"{link} exists and is not a link to {target}; remove it or choose another run name (--set name=...)"
            )
        os.symlink(os.path.relpath(target, point_run.resolve()), link, target_is_directory=True)


def run_sweep(
    base: Recipe, recipe: str, overrides: list[str], points: list[SweepPoint], force: bool = False
) -> list[dict[str, Any]]:
    """Run the data stages once and the train stage per point; return one result row per point.

    base is plan_sweep's base recipe (`recipe` with `overrides`); each point reloads `recipe`
    with its own overrides added, so every point is validated the same way as the base.
    """
    for verb in stages_before(TRAIN):
        run_stage(verb, base, force=False)  # shared data is never redone by a sweep's --force
    rows = []
    for i, p in enumerate(points, 1):
        # json.dumps quotes the path, so a ':' or '#' in it stays part of the YAML string.
        r = load_recipe(
            recipe, [*overrides, *p.overrides, f"name={p.name}", f"runs_dir={json.dumps(str(sweep_dir(base)))}"]
        )
        link_shared_stages(base.run_dir, r.run_dir)
        log.info(
            "sweep: point %d/%d %s (%s params, %s tokens)", i, len(points), p.name, f"{p.params:,}", f"{p.tokens:,}"
        )
        manifest = run_stage(stage_verb(TRAIN), r, force)
        rows.append(
            {**point_row(p), "run_dir": str(r.run_dir), "val_loss": manifest["counts"]["val_after"]["all"]["loss"]}
        )
    return rows


def point_row(p: SweepPoint) -> dict[str, Any]:
    row = asdict(p)
    row["overrides"] = list(p.overrides)
    return row


def format_sweep(rows: list[dict[str, Any]], where: Path, ran: bool) -> str:
    """One line per point: N (non-embedding, as `kiln plan fit` counts it), all parameters, tokens, tokens per N,
    FLOPs."""
    header = (
        f"{'run':<16} {'N (non-embedding)':>18} {'all params':>18} {'tokens':>18} {'tokens/N':>9} {'train FLOPs':>11}"
        + ("  val loss (nats/token)" if ran else "")
    )
    lines = [header]
    for r in rows:
        n = r["params_non_embedding"]
        line = (
            f"{r['name']:<16} {count(n):>18} {count(r['params']):>18} {count(r['tokens']):>18} "
            f"{r['tokens'] / n:>9.1f} {sci(r['train_flops'], 2):>11}"
        )
        lines.append(line + (f"  {r['val_loss']:.4f}" if ran else ""))
    total = sum(r["train_flops"] for r in rows)
    lines.append(f"{len(rows)} runs, {sci(total, 2)} training FLOPs in all, under {where}")
    share = max(1 - r["params_non_embedding"] / r["params"] for r in rows)
    lines.append(
        f"note: embeddings are up to {share:.0%} of all parameters here; `kiln plan fit` counts N without them "
        "unless --param-count total"
    )
    lines.append(
        f"fit with: kiln plan fit --runs {where} --plot {where / 'fit.png'}"
        if ran
        else "dry run: nothing trained; drop --dry-run to train these"
    )
    return "\n".join(lines)


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"Model sizes as d_model x n_layers, comma-separated (default {DEFAULT_SIZES}).",
    )
    p.add_argument(
        "--steps", default=DEFAULT_STEPS, help=f"Training steps per size, comma-separated (default {DEFAULT_STEPS})."
    )
    p.add_argument(
        "--head-dim", type=int, default=32, help="Attention head width; heads = d_model / head_dim (default 32)."
    )
    p.add_argument("--dry-run", action="store_true", help="List the grid (params, tokens, FLOPs) without training.")
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of the table.")


# ---- running ----


def run_verb(args: argparse.Namespace) -> int:
    """`kiln sweep`: list the grid (--dry-run) or train it, then print the table or JSON."""
    recipe = args.recipe or "demo"
    base, points = plan_sweep(recipe, args.overrides, parse_sizes(args.sizes), parse_steps(args.steps), args.head_dim)
    if args.dry_run:
        rows = [point_row(p) for p in points]
    else:
        rows = run_sweep(base, recipe, args.overrides, points, args.force)
    where = sweep_dir(base)
    print(
        json.dumps({"sweep_dir": str(where), "dry_run": args.dry_run, "runs": rows})
        if args.json
        else format_sweep(rows, where, ran=not args.dry_run)
    )
    return 0
