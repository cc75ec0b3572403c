"""Validation loss, perplexity and bits per byte, per source.

Each source's validation split is cut into non-overlapping windows of seq_len + 1 tokens
(from the start, up to max_tokens_per_source scored tokens). Bits per byte converts the mean
loss with the split's own ratio of tokens to UTF-8 bytes, so it compares across tokenizers:
bpb = loss_nats / ln 2 * tokens / bytes.
Not handled here: a fixed probe set and downstream benchmarks (the evaluation issue).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from kiln.model.transformer import Transformer, lm_loss
from kiln.tokenize.shards import TokenShard


@torch.no_grad()
def evaluate_model(model: Transformer, shards: Mapping[str, TokenShard], bytes_per_token: Mapping[str, float], seq_len: int, max_tokens_per_source: int, batch_size: int) -> dict[str, dict[str, float]]:
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    results = {}
    for source, shard in sorted(shards.items()):
        tokens = shard.tokens[: max_tokens_per_source + 1]
        T = min(seq_len, len(tokens) - 1)
        if T < 1:
            continue
        n_windows = (len(tokens) - 1) // T
        windows = np.lib.stride_tricks.sliding_window_view(np.asarray(tokens[: n_windows * T + 1], dtype=np.int64), T + 1)[::T]
        total_nats, total_tokens = 0.0, 0
        for start in range(0, n_windows, batch_size):
            batch = torch.from_numpy(np.array(windows[start : start + batch_size])).to(device)  # a copy: the view is read-only
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logits = model(batch[:, :-1])
            total_nats += lm_loss(logits, batch[:, 1:], reduction="sum").item()  # host sync per batch
            total_tokens += batch[:, 1:].numel()
        loss = total_nats / total_tokens
        results[source] = {
            "loss": round(loss, 5),
            "perplexity": round(math.exp(loss), 3),
            "bpb": round(loss / math.log(2) / bytes_per_token[source], 5),
            "tokens": total_tokens,
            "bytes": round(total_tokens * bytes_per_token[source], 1),
        }
    model.train(was_training)
    return results


def combined(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Over all sources: token-weighted mean loss, and bpb as total bits over total bytes."""
    tokens = sum(r["tokens"] for r in results.values())
    nbytes = sum(r["bytes"] for r in results.values())
    nats = sum(r["loss"] * r["tokens"] for r in results.values())
    return {
        "loss": round(nats / tokens, 5),
        "perplexity": round(math.exp(nats / tokens), 3),
        "bpb": round(nats / math.log(2) / nbytes, 5),
        "tokens": tokens,
        "bytes": nbytes,
    }


def val_bytes_per_token(tokenize_counts: Mapping[str, Any]) -> dict[str, float]:
    """UTF-8 bytes per token of each source's validation split, from the tokenize manifest."""
    out = {}
    for source, splits in tokenize_counts["per_source"].items():
        val = splits["val"]
        out[source] = val["bytes"] / val["tokens"] if val["tokens"] else float("nan")
    return out
