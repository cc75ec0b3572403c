"""Validation loss, perplexity and bits per byte, per source and over all sources.

Each source's validation split is cut into non-overlapping windows of seq_len + 1 tokens
(from the start, up to max_tokens_per_source scored tokens). Bits per byte counts the exact
UTF-8 bytes of the scored target tokens (special tokens count 0 bytes), so it compares across
tokenizers: bpb = total nats / ln 2 / total bytes.
Not handled here: a fixed probe set and downstream benchmarks (the evaluation issue).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kiln.core.errors import FatalError
from kiln.core.layout import RunLayout
from kiln.core.tokenshards import TokenShard, open_split
from kiln.model.transformer import Transformer, lm_loss
from kiln.text.tokenizer import KilnTokenizer


def _scores(nats: float, tokens: int, nbytes: int) -> dict[str, float]:
    loss = nats / tokens
    return {"loss": round(loss, 5), "perplexity": round(math.exp(loss), 3), "bpb": round(nats / math.log(2) / nbytes, 5) if nbytes else float("nan"), "tokens": tokens, "bytes": nbytes}


@torch.no_grad()
def evaluate_model(model: Transformer, shards: Mapping[str, TokenShard], token_bytes: np.ndarray, seq_len: int, max_tokens_per_source: int, batch_size: int) -> dict[str, Any]:
    """{"sources": {source: scores}, "all": scores}; scores are loss (nats/token), perplexity, bpb, tokens, bytes."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sources, totals = {}, [0.0, 0, 0]
    for source, shard in sorted(shards.items()):
        tokens = shard.tokens[: max_tokens_per_source + 1]
        T = min(seq_len, len(tokens) - 1)
        if T < 1:
            continue
        n_windows = (len(tokens) - 1) // T
        windows = np.lib.stride_tricks.sliding_window_view(np.asarray(tokens[: n_windows * T + 1], dtype=np.int64), T + 1)[::T]
        nats, n_tokens, n_bytes = 0.0, 0, 0
        for start in range(0, n_windows, batch_size):
            batch = np.array(windows[start : start + batch_size])  # a copy: the view is read-only
            n_bytes += int(token_bytes[batch[:, 1:]].sum())
            batch_BT1 = torch.from_numpy(batch).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logits = model(batch_BT1[:, :-1])
            nats += lm_loss(logits, batch_BT1[:, 1:], reduction="sum").item()  # host sync per batch
            n_tokens += batch.shape[0] * T
        sources[source] = _scores(nats, n_tokens, n_bytes)
        totals[0] += nats
        totals[1] += n_tokens
        totals[2] += n_bytes
    model.train(was_training)
    if not sources:
        raise FatalError("eval: no validation split has two tokens to score; raise tokenize.val_fraction")
    return {"sources": sources, "all": _scores(*totals)}


def validation_scorer(run_dir: Path, seq_len: int, max_tokens_per_source: int, batch_size: int) -> Callable[[Transformer], dict[str, Any]]:
    """`model -> results` over a run's validation split (checksums verified) with its tokenizer's byte counts.

    The trainer's monitoring and the eval stage both score through this, so their numbers agree.
    """
    return partial(
        evaluate_model,
        shards=open_split(RunLayout(run_dir).token_shards, "val", verify=True),
        token_bytes=KilnTokenizer.load(RunLayout(run_dir).tokenizer_json).token_bytes(),
        seq_len=seq_len,
        max_tokens_per_source=max_tokens_per_source,
        batch_size=batch_size,
    )


def format_results(results: Mapping[str, Any]) -> str:
    lines = [f"{'source':<10} {'loss':>8} {'ppl':>10} {'bpb':>7} {'tokens':>9}"]
    rows = [*results["sources"].items(), ("all", results["all"])]
    lines += [f"{s:<10} {r['loss']:>8.4f} {r['perplexity']:>10.2f} {r['bpb']:>7.4f} {r['tokens']:>9}" for s, r in rows]
    return "\n".join(lines)
