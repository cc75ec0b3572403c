"""The tokenize stage: curated shards -> per-source token shards, train and validation.

Every document is encoded whole and followed by `<|endoftext|>`; a document goes to
validation when its id hash falls under tokenize.val_fraction (the same rule the tokenizer
used for its held-out text). Encoding uses the tokenizer's own batch encoder, which runs on
all cores. Output: `tokenize/<source>/{train,val}.{bin,idx}` and `val_ids.txt`, the ids of
the validation documents in shard order.
Not handled here: a process pool or Ray across shards, per-shard resume (the tokenizer issue).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.core.manifest import Stage, read_manifest
from kiln.core.split import is_heldout
from kiln.curate.shards import list_shards, read_shard, shard_source
from kiln.tokenize.config import TokenizeConfig
from kiln.tokenize.shards import TokenShardWriter, dtype_for
from kiln.tokenize.tokenizer import KilnTokenizer

log = logging.getLogger("kiln.tokenize")
SPLITS = ("train", "val")


class SourceEncoder:
    """Encodes one source's documents into its train/val shard pairs and val_ids.txt."""

    def __init__(self, folder: Path, tokenizer: KilnTokenizer, val_fraction: float):
        folder.mkdir()
        self.folder, self.tokenizer, self.val_fraction = folder, tokenizer, val_fraction
        self.writers = {split: TokenShardWriter(folder / split, tokenizer.vocab_size) for split in SPLITS}
        self.stats = {split: {"docs": 0, "tokens": 0, "bytes": 0} for split in SPLITS}
        self.val_ids: list[str] = []

    def add(self, batch: list[Document]) -> int:
        """Encode and append a batch; returns its UTF-8 bytes (for the progress bar)."""
        added = 0
        for doc, ids in zip(batch, self.tokenizer.encode_batch([d.text for d in batch]), strict=True):
            split = "val" if is_heldout(doc.id, self.val_fraction) else "train"
            if split == "val":
                self.val_ids.append(doc.id)
            self.writers[split].add(ids + [self.tokenizer.eot_id])
            self.stats[split]["docs"] += 1
            self.stats[split]["tokens"] += len(ids) + 1
            nbytes = len(doc.text.encode("utf-8"))
            self.stats[split]["bytes"] += nbytes
            added += nbytes
        return added

    def close(self) -> list[Path]:
        outputs = []
        for writer in self.writers.values():
            writer.close()
            outputs += [writer.prefix.with_suffix(".bin"), writer.prefix.with_suffix(".idx")]
        ids_path = self.folder / "val_ids.txt"  # which whole documents validation holds, in order
        ids_path.write_text("".join(f"{i}\n" for i in self.val_ids), encoding="utf-8")
        return outputs + [ids_path]


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
            encoder = SourceEncoder(stage.dir / source, tokenizer, cfg.val_fraction)
            batch: list[Document] = []
            for doc in (d for shard in shards if shard_source(shard) == source for d in read_shard(shard)):
                batch.append(doc)
                if len(batch) >= cfg.batch_docs:
                    bar.update(encoder.add(batch))
                    batch = []
            bar.update(encoder.add(batch))
            outputs += encoder.close()
            per_source[source] = encoder.stats
    for source, stats in per_source.items():
        if not stats["val"]["docs"]:
            log.warning("tokenize: source %s has no validation documents at val_fraction %s; it will have no validation loss", source, cfg.val_fraction)
    if not any(stats["val"]["docs"] for stats in per_source.values()):
        raise FatalError(f"tokenize: no document fell in the validation split at tokenize.val_fraction={cfg.val_fraction} ({sum(s['train']['docs'] for s in per_source.values())} documents in all); raise it or curate more documents")
    counts = {
        "train_tokens": sum(s["train"]["tokens"] for s in per_source.values()),
        "val_tokens": sum(s["val"]["tokens"] for s in per_source.values()),
        "train_docs": sum(s["train"]["docs"] for s in per_source.values()),
        "val_docs": sum(s["val"]["docs"] for s in per_source.values()),
        "vocab_size": tokenizer.vocab_size,
        "dtype": str(dtype_for(tokenizer.vocab_size)),
        "per_source": per_source,
    }
    lines = [f"{counts['train_tokens']:,} train and {counts['val_tokens']:,} validation tokens ({counts['dtype']})"]
    lines += [f"  {s:<10} train {v['train']['tokens']:>12,} tokens / {v['train']['docs']:>6} docs   val {v['val']['tokens']:>10,} tokens / {v['val']['docs']:>5} docs" for s, v in per_source.items()]
    return stage.finish(outputs, counts, "\n".join(lines))
