"""The train-tokenizer stage: learn BPE merges on curated text, report compression.

The sample is drawn from curated shards in shard order, each source contributing in
proportion to its curated bytes, skipping held-out documents; the held-out documents give
bytes per token per source. Same shards and config give the same tokenizer.json.
Not handled here: per-language fertility, sweeps (the tokenizer issue).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiln.core.errors import FatalError
from kiln.core.manifest import Stage, read_manifest
from kiln.core.split import is_heldout
from kiln.curate.shards import list_shards, read_shard, shard_source
from kiln.tokenize.config import TokenizerConfig
from kiln.tokenize.tokenizer import KilnTokenizer, train_bpe

log = logging.getLogger("kiln.tokenizer")
MB = 1_000_000


def sample_texts(shards: list[Path], quota: dict[str, int], heldout_fraction: float, heldout: bool) -> Iterator[str]:
    """Texts from the shards, per source until its byte quota is used; held-out docs or the rest."""
    used = dict.fromkeys(quota, 0)
    for shard in shards:
        source = shard_source(shard)
        if used.get(source, 0) >= quota.get(source, 0):
            continue
        for doc in read_shard(shard):
            if is_heldout(doc.id, heldout_fraction) != heldout:
                continue
            used[source] += len(doc.text.encode("utf-8"))
            yield doc.text
            if used[source] >= quota[source]:
                break


def source_quotas(curated_bytes: dict[str, int], total: int) -> dict[str, int]:
    all_bytes = sum(curated_bytes.values()) or 1
    return {s: int(total * b / all_bytes) + 1 for s, b in curated_bytes.items()}


def bytes_per_token(tokenizer: KilnTokenizer, shards: list[Path], cfg: TokenizerConfig, curated_bytes: dict[str, int]) -> dict[str, dict[str, float]]:
    report = {}
    for source in sorted(curated_bytes):
        texts = list(sample_texts([s for s in shards if shard_source(s) == source], {source: int(cfg.heldout_mb * MB)}, cfg.heldout_fraction, heldout=True))
        if not texts:
            continue
        nbytes = sum(len(t.encode("utf-8")) for t in texts)
        ntokens = sum(len(ids) for ids in tokenizer.encode_batch(texts))
        report[source] = {"docs": len(texts), "bytes": nbytes, "tokens": ntokens, "bytes_per_token": round(nbytes / max(ntokens, 1), 4)}
    return report


def run(cfg: TokenizerConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    curate_dir = Path(run_dir) / "curate"
    curated = read_manifest(curate_dir)
    shards = list_shards(curate_dir / "shards")
    stage = Stage(run_dir, "tokenizer", {"tokenizer": cfg}, inputs=shards, upstream=["curate"])
    if not force and (done := stage.current_manifest()):
        log.info("tokenizer: up to date (vocab %d); nothing to do. Use --force to redo.", done["counts"]["vocab_size"])
        return done
    stage.begin()
    curated_bytes = {s: t["bytes_out"] for s, t in curated["counts"]["per_source"].items() if t["bytes_out"] > 0}
    quota = source_quotas(curated_bytes, int(cfg.sample_mb * MB))
    texts = list(sample_texts(shards, quota, cfg.heldout_fraction, heldout=False))
    sample_bytes = sum(len(t.encode("utf-8")) for t in texts)
    # BPE needs enough text to find vocab_size - 258 merges; far less and the vocabulary stays short.
    if sample_bytes < 4 * cfg.vocab_size:
        raise FatalError(f"tokenizer: the training sample has {sample_bytes} bytes, too little for vocab_size {cfg.vocab_size}; curate more text or lower tokenizer.vocab_size")
    log.info("tokenizer: training byte-level BPE, vocab %d, on %d docs (%.1f MB)", cfg.vocab_size, len(texts), sample_bytes / MB)
    tokenizer = train_bpe(texts, cfg.vocab_size, cfg.min_frequency)
    out = stage.dir / "tokenizer.json"
    tokenizer.save(out)
    heldout = bytes_per_token(tokenizer, shards, cfg, curated_bytes)
    total_bytes = sum(r["bytes"] for r in heldout.values())
    total_tokens = sum(r["tokens"] for r in heldout.values())
    counts = {
        "vocab_size": tokenizer.vocab_size,
        "sample_docs": len(texts),
        "sample_bytes": sample_bytes,
        # None when no document fell in the held-out fraction (tiny corpora): nothing was measured.
        "heldout_bytes_per_token": round(total_bytes / total_tokens, 4) if total_tokens else None,
        "per_source": heldout,
    }
    if not total_tokens:
        log.warning("tokenizer: no held-out documents at heldout_fraction %s; bytes per token not measured", cfg.heldout_fraction)
    lines = [f"vocab {tokenizer.vocab_size}, trained on {sample_bytes / MB:.1f} MB; held-out bytes/token {counts['heldout_bytes_per_token'] or 'not measured (no held-out documents)'}"]
    lines += [f"  {s:<10} {r['bytes_per_token']:>6.3f} bytes/token over {r['docs']} docs" for s, r in heldout.items()]
    return stage.finish([out], counts, "\n".join(lines))
