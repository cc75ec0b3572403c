"""Validation loss, perplexity and bits per byte, per source and over all sources.

Each source's validation split is cut into non-overlapping windows of seq_len + 1 tokens
(from the start, up to max_tokens_per_source scored tokens). Bits per byte counts the exact
UTF-8 bytes of the scored target tokens (special tokens count 0 bytes), so it compares across
tokenizers: bpb = total nats / ln 2 / total bytes. `ScoringConfig` (kiln.model.config) holds these
settings: the trainer's monitoring evaluations take it as it is, and the `eval` section extends it
(kiln.evaluate.config), so both score the same windows the same way.
Per language (`languages`, where the tokenize manifest counts the split's tokens per language and
curation identified one): each language sums the nats, tokens and bytes of its sources, so its bits per byte
is their byte-weighted combination; a source of several languages is split between them by its
validation tokens' shares, all three figures alike (its own loss and bpb in each: an estimate).
Not handled here: a fixed probe set and downstream benchmarks (the evaluation issue).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kiln.core.errors import FatalError
from kiln.core.layout import RunLayout
from kiln.core.tokenshards import TokenShard, open_split, split_languages
from kiln.model.config import ScoringConfig
from kiln.model.precision import autocast
from kiln.model.transformer import Transformer
from kiln.text.load import load_tokenizer


def _scores(nats: float, tokens: float, nbytes: float) -> dict[str, float]:
    loss = nats / tokens
    return {
        "loss": round(loss, 5),
        "perplexity": round(math.exp(loss), 3),
        "bpb": round(nats / math.log(2) / nbytes, 5) if nbytes else float("nan"),
        "tokens": tokens,
        "bytes": nbytes,
    }


@torch.no_grad()
def evaluate_model(
    model: Transformer,
    shards: Mapping[str, TokenShard],
    token_bytes: np.ndarray,
    seq_len: int,
    max_tokens_per_source: int,
    batch_size: int,
    amp_dtype: torch.dtype | None = None,
    languages: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """{"sources": {source: scores}, "all": scores}; scores are loss (nats/token), perplexity, bpb, tokens, bytes.

    amp_dtype is the autocast dtype of the caller's precision policy (kiln.model.precision); None is plain fp32.
    languages: source -> {language: tokens of its split}; with it, "languages": {language: scores + sources}.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sources, totals, summed = {}, [0.0, 0, 0], {}
    for source, shard in sorted(shards.items()):
        tokens = shard.tokens[: max_tokens_per_source + 1]
        T = min(seq_len, len(tokens) - 1)
        if T < 1:
            continue
        n_windows = (len(tokens) - 1) // T
        windows = np.lib.stride_tricks.sliding_window_view(
            np.asarray(tokens[: n_windows * T + 1], dtype=np.int64), T + 1
        )[::T]
        nats, n_tokens, n_bytes = 0.0, 0, 0
        for start in range(0, n_windows, batch_size):
            batch = np.array(windows[start : start + batch_size])  # a copy: the view is read-only
            n_bytes += int(token_bytes[batch[:, 1:]].sum())
            batch_BT1 = torch.from_numpy(batch).to(device)
            with autocast(device, amp_dtype):
                logits_BTV = model(batch_BT1[:, :-1])
            # Every window is whole, so each target counts: a plain cross-entropy sum, in nats.
            nats += F.cross_entropy(
                logits_BTV.flatten(0, 1), batch_BT1[:, 1:].flatten(), reduction="sum"
            ).item()  # host sync per batch
            n_tokens += batch.shape[0] * T
        sources[source] = _scores(nats, n_tokens, n_bytes)
        summed[source] = (nats, n_tokens, n_bytes)
        totals[0] += nats
        totals[1] += n_tokens
        totals[2] += n_bytes
    model.train(was_training)
    if not sources:
        raise FatalError("eval: no validation split has two tokens to score; raise tokenize.val_fraction")
    results = {"sources": sources, "all": _scores(*totals)}
    if languages and (by_language := language_scores(summed, languages)):
        results["languages"] = by_language
    return results


def language_scores(
    summed: Mapping[str, tuple[float, int, int]], languages: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, Any]]:
    """Per language, most bytes first: the scores of its sources' summed (nats, tokens, bytes), and the sources.

    summed: source -> its scored nats, tokens and bytes; languages: source -> {language: tokens of its split}.
    A source split between languages gives each its share of all three (module docstring). Empty when no
    scored source has a language curation identified (only `und` and `code`): the per-source figures say it all.
    """
    parts: dict[str, list[float]] = {}
    holders: dict[str, list[str]] = {}
    for source, (nats, n_tokens, n_bytes) in summed.items():
        counts = {lang: n for lang, n in languages.get(source, {}).items() if n > 0}
        for lang, n in counts.items():
            share = n / sum(counts.values())
            into = parts.setdefault(lang, [0.0, 0.0, 0.0])
            for i, value in enumerate((nats, n_tokens, n_bytes)):
                into[i] += share * value  # share is exactly 1.0 for a source of one language
            holders.setdefault(lang, []).append(source)
    if not set(parts) - {"und", "code"}:
        return {}
    out = {}
    for lang in sorted(parts, key=lambda k: (-parts[k][2], k)):
        nats, n_tokens, n_bytes = parts[lang]
        scores = _scores(nats, n_tokens, n_bytes)  # apportioned counts may be fractional: rounded when shown
        out[lang] = {**scores, "tokens": round(n_tokens), "bytes": round(n_bytes), "sources": holders[lang]}
    return out


def validation_scorer(
    run_dir: Path, cfg: ScoringConfig, amp_dtype: torch.dtype | None, reference_runs: Sequence[Path] = ()
) -> Callable[[Transformer], dict[str, Any]]:
    """`model -> results` over a run's validation split (checksums verified) with its tokenizer's byte counts.

    The trainer's monitoring and the eval stage both score through this, so their numbers agree.
    cfg.seq_len must be resolved (not None) by the caller, who knows the training window.
    reference_runs (same tokenizer): their validation splits too, as sources `<run>/<source>`.
    """
    assert cfg.seq_len is not None, "resolve the scoring window (seq_len) first"
    shards = open_split(RunLayout(run_dir).token_shards, "val", verify=True)
    for run in reference_runs:
        shards |= {
            f"{Path(run).name}/{s}": shard
            for s, shard in open_split(RunLayout(Path(run)).token_shards, "val", verify=True).items()
        }
    return partial(
        evaluate_model,
        languages=split_languages(RunLayout(run_dir).token_shards, "val"),  # this run's sources only
        shards=shards,
        token_bytes=load_tokenizer(RunLayout(run_dir).tokenizer_json).token_bytes(),
        seq_len=cfg.seq_len,
        max_tokens_per_source=cfg.max_tokens_per_source,
        batch_size=cfg.batch_size,
        amp_dtype=amp_dtype,
    )


def format_results(results: Mapping[str, Any]) -> str:
    lines = [f"{'source':<10} {'loss':>8} {'ppl':>10} {'bpb':>7} {'tokens':>9}"]
    rows = [*results["sources"].items(), ("all", results["all"])]
    lines += [f"{s:<10} {r['loss']:>8.4f} {r['perplexity']:>10.2f} {r['bpb']:>7.4f} {r['tokens']:>9}" for s, r in rows]
    if languages := results.get("languages"):
        lines.append(f"{'language':<10} {'loss':>8} {'ppl':>10} {'bpb':>7} {'tokens':>9}  sources")
        lines += [
            f"{lang:<10} {r['loss']:>8.4f} {r['perplexity']:>10.2f} {r['bpb']:>7.4f} {r['tokens']:>9}  "
            + ", ".join(r["sources"])
            for lang, r in languages.items()
        ]
    return "\n".join(lines)
