"""The eval stage: score the trained checkpoint on every source's validation split."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from kiln.core.manifest import Stage, read_manifest
from kiln.evaluate.config import EvalConfig
from kiln.evaluate.perplexity import combined, evaluate_model, val_bytes_per_token
from kiln.tokenize.shards import open_split
from kiln.train.checkpoint import load_trained_model

log = logging.getLogger("kiln.eval")


def run(cfg: EvalConfig, train_seq_len: int, run_dir: Path, force: bool = False) -> dict[str, Any]:
    """`train_seq_len` is the window used when eval.seq_len is None."""
    run_dir = Path(run_dir)
    ckpt = run_dir / "train" / "checkpoint"
    tokenized = read_manifest(run_dir / "tokenize")
    inputs = [ckpt / "model.safetensors", ckpt / "config.json", *sorted((run_dir / "tokenize").glob("*/val.*"))]
    stage = Stage(run_dir, "eval", {"eval": cfg}, inputs, upstream=["tokenize", "train"])
    if not force and (done := stage.current_manifest()):
        log.info("eval: up to date (val bpb %.3f); nothing to do. Use --force to redo.", done["counts"]["all"]["bpb"])
        return done
    stage.begin()
    model = load_trained_model(ckpt, "cuda" if torch.cuda.is_available() else "cpu")
    results = evaluate_model(
        model,
        open_split(run_dir / "tokenize", "val", verify=True),
        val_bytes_per_token(tokenized["counts"]),
        seq_len=cfg.seq_len or train_seq_len,
        max_tokens_per_source=cfg.max_tokens_per_source,
        batch_size=cfg.batch_size,
    )
    results["all"] = combined(results)
    lines = [f"{'source':<10} {'loss':>8} {'ppl':>10} {'bpb':>7} {'tokens':>9}"]
    lines += [f"{s:<10} {r['loss']:>8.4f} {r['perplexity']:>10.2f} {r['bpb']:>7.4f} {r['tokens']:>9}" for s, r in results.items()]
    return stage.finish([], results, "\n".join(lines))
