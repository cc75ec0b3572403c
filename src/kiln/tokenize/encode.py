"""The tokenize stage: curated shards -> per-source token shards, train and validation.

Every document is encoded whole and followed by `<|endoftext|>`; a document goes to
validation when its id hash falls under tokenize.val_fraction (the same rule the tokenizer
used for its held-out text). Encoding uses the tokenizer's own batch encoder, which runs on
all cores. Output: `tokenize/<source>/{train,val}.{bin,idx}`.
Not handled here: a process pool or Ray across shards, per-shard resume (the tokenizer issue).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kiln.core.document import Document
from kiln.core.manifest import Stage, read_manifest
from kiln.core.split import is_heldout
from kiln.curate.shards import list_shards, read_shard, shard_source
from kiln.tokenize.config import TokenizeConfig
from kiln.tokenize.shards import TokenShardWriter
from kiln.tokenize.tokenizer import KilnTokenizer

log = logging.getLogger("kiln.tokenize")
SPLITS = ("train", "val")


def _flush(batch: list[Document], tokenizer: KilnTokenizer, writers: dict[str, TokenShardWriter], cfg: TokenizeConfig, stats: dict[str, dict[str, int]]) -> None:
    for doc, ids in zip(batch, tokenizer.encode_batch([d.text for d in batch]), strict=True):
        split = "val" if is_heldout(doc.id, cfg.val_fraction) else "train"
        writers[split].add(ids + [tokenizer.eot_id])
        stats[split]["docs"] += 1
        stats[split]["tokens"] += len(ids) + 1
        stats[split]["bytes"] += len(doc.text.encode("utf-8"))


def run(cfg: TokenizeConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    curated = read_manifest(run_dir / "curate")
    shards = list_shards(run_dir / "curate" / "shards")
    tok_path = run_dir / "tokenizer" / "tokenizer.json"
    stage = Stage(run_dir, "tokenize", {"tokenize": cfg}, inputs=[*shards, tok_path], upstream=["curate", "tokenizer"])
    if not force and (done := stage.current_manifest()):
        log.info("tokenize: up to date (%d train tokens); nothing to do. Use --force to redo.", done["counts"]["train_tokens"])
        return done
    stage.begin()
    tokenizer = KilnTokenizer.load(tok_path)
    per_source: dict[str, dict[str, dict[str, int]]] = {}
    outputs: list[Path] = []
    total_bytes = sum(t["bytes_out"] for t in curated["counts"]["per_source"].values())
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenize", dynamic_ncols=True) as bar:
        for source in sorted({shard_source(s) for s in shards}):
            (stage.dir / source).mkdir()
            writers = {split: TokenShardWriter(stage.dir / source / split, tokenizer.vocab_size) for split in SPLITS}
            stats = {split: {"docs": 0, "tokens": 0, "bytes": 0} for split in SPLITS}
            batch: list[Document] = []
            for shard in (s for s in shards if shard_source(s) == source):
                for doc in read_shard(shard):
                    batch.append(doc)
                    if len(batch) >= cfg.batch_docs:
                        _flush(batch, tokenizer, writers, cfg, stats)
                        bar.update(sum(len(d.text.encode("utf-8")) for d in batch))
                        batch = []
            if batch:
                _flush(batch, tokenizer, writers, cfg, stats)
                bar.update(sum(len(d.text.encode("utf-8")) for d in batch))
            for split, writer in writers.items():
                writer.close()
                outputs += [writer.prefix.with_suffix(".bin"), writer.prefix.with_suffix(".idx")]
            per_source[source] = stats
    counts = {
        "train_tokens": sum(s["train"]["tokens"] for s in per_source.values()),
        "val_tokens": sum(s["val"]["tokens"] for s in per_source.values()),
        "train_docs": sum(s["train"]["docs"] for s in per_source.values()),
        "val_docs": sum(s["val"]["docs"] for s in per_source.values()),
        "vocab_size": tokenizer.vocab_size,
        "dtype": str(writers["train"].dtype),
        "per_source": per_source,
    }
    lines = [f"{counts['train_tokens']:,} train and {counts['val_tokens']:,} validation tokens ({counts['dtype']})"]
    lines += [f"  {s:<10} train {v['train']['tokens']:>12,} tokens / {v['train']['docs']:>6} docs   val {v['val']['tokens']:>10,} tokens / {v['val']['docs']:>5} docs" for s, v in per_source.items()]
    return stage.finish(outputs, counts, "\n".join(lines))
