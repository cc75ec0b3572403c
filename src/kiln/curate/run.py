"""The curate stage: plan inputs, run shard tasks, deduplicate globally, write the audit.

Phase 1 (parallel, one task per shard): load, normalize, filter, write the shard, hash kept
texts. Phase 2 (here): choose exact duplicates across all shards. Phase 3 (parallel): rewrite
only the shards that lost documents. Shards are cut from the sorted input list by raw bytes,
so their names and contents do not depend on the number of workers.
Not handled yet: resuming half-finished shard tasks (a crashed stage is redone whole).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kiln.core.document import Document
from kiln.core.errors import DocumentError, FatalError
from kiln.core.manifest import Stage
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.dedup.exact import REASON as DEDUP_REASON
from kiln.curate.dedup.exact import find_duplicates, text_hash
from kiln.curate.executors.local import LocalExecutor
from kiln.curate.readers import InputUnit, load_unit, plan_inputs
from kiln.curate.shards import SUFFIX, ShardWriter, read_shard
from kiln.curate.steps import build_steps, run_steps

log = logging.getLogger("kiln.curate")
MB = 1_000_000


@dataclass(frozen=True)
class ShardTask:
    name: str
    units: tuple[InputUnit, ...]
    out_path: Path
    cfg: CurateConfig


@dataclass
class ShardResult:
    name: str
    bytes_read: int
    ledger: Ledger
    hashes: list[tuple[str, str]] = field(default_factory=list)  # (text hash, doc id) of kept docs


def cut_shards(units: list[InputUnit], shard_bytes: int) -> list[list[InputUnit]]:
    """Consecutive runs of one source's units, each up to shard_bytes (a bigger unit stands alone)."""
    shards: list[list[InputUnit]] = []
    size = 0
    for unit in units:
        if not shards or shards[-1][0].source != unit.source or size + unit.size > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(unit)
        size += unit.size
    return shards


def curate_shard(task: ShardTask) -> ShardResult:
    ledger, steps = Ledger(), build_steps(task.cfg)
    result = ShardResult(task.name, sum(u.size for u in task.units), ledger)
    max_bytes = int(task.cfg.max_file_mb * MB)
    with ShardWriter(task.out_path) as writer:
        for unit in task.units:
            try:
                text, replaced = load_unit(unit, max_bytes)
            except Exception as e:  # DocumentError says why; anything else is quarantined the same way
                ledger.seen(unit.source, unit.size)
                ledger.quarantine(unit.doc_id, unit.source, str(e) if isinstance(e, DocumentError) else f"read:error: {unit.path}: {type(e).__name__}: {e}")
                continue
            ledger.seen(unit.source, len(text.encode("utf-8")))
            if replaced:
                ledger.tally(unit.source).invalid_utf8_docs += 1
            doc = Document(unit.doc_id, text, unit.source, {"path": unit.path} if unit.key is None else {"path": unit.path, "topic": unit.key})
            try:
                kept = list(run_steps([doc], steps, ledger))
            except Exception as e:  # a step that raises on one document quarantines it, never the run
                ledger.quarantine(doc.id, doc.source, f"{type(e).__name__}: {e}")
                continue
            for out in kept:
                writer.write(out)
                ledger.kept(out)
                result.hashes.append((text_hash(out.text), out.id))
    return result


def drop_from_shard(job: tuple[Path, dict[str, str]]) -> Ledger:
    """Rewrite one shard without the given ids ({removed id: kept id}); returns the ledger change."""
    path, removed = job
    delta = Ledger()
    with ShardWriter(path) as writer:  # the writer's temp name lets us read the old shard meanwhile
        for doc in read_shard(path):
            if doc.id in removed:
                delta.unkeep(doc)
                delta.remove(doc.id, doc.source, DEDUP_REASON, kept_id=removed[doc.id])
            else:
                writer.write(doc)
    return delta


def run(cfg: CurateConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    units = plan_inputs(cfg.inputs, int(cfg.max_total_mb * MB))
    if not units:
        raise FatalError("curate: no input documents found; check curate.inputs (paths and globs) in the recipe")
    # A file this process cannot read is no stage input to hash; its shard task quarantines it.
    stage = Stage(run_dir, "curate", {"curate": cfg}, inputs={Path(u.path) for u in units if os.access(u.path, os.R_OK)})
    if not force and (done := stage.current_manifest()):
        log.info("curate: up to date (%s docs kept); nothing to do. Use --force to redo.", done["counts"]["docs_out"])
        return done
    stage.begin()
    shard_dir = stage.dir / "shards"
    shard_dir.mkdir()
    shards = cut_shards(units, int(cfg.shard_mb * MB))
    index: Counter[str] = Counter()
    tasks = []
    for group in shards:
        name = f"{group[0].source}-{index[group[0].source]:05d}"
        index[group[0].source] += 1
        tasks.append(ShardTask(name, tuple(group), shard_dir / (name + SUFFIX), cfg))
    executor = LocalExecutor(cfg.workers)
    log.info("curate: %d documents (%.1f MB) from %d sources in %d shards, %d workers", len(units), sum(u.size for u in units) / MB, len(index), len(tasks), executor.workers)

    ledger, hashes = Ledger(), []
    with tqdm(total=sum(u.size for u in units), unit="B", unit_scale=True, desc="curate", dynamic_ncols=True) as bar:
        for result in executor.map(curate_shard, tasks):
            ledger.merge(result.ledger)
            hashes.extend(result.hashes)
            bar.update(result.bytes_read)

    if cfg.exact_dedup:
        duplicates = find_duplicates(hashes)
        by_shard: dict[Path, dict[str, str]] = {}
        shard_of = {doc_id: task.out_path for task in tasks for doc_id in (u.doc_id for u in task.units)}
        for removed_id, kept_id in duplicates.items():
            by_shard.setdefault(shard_of[removed_id], {})[removed_id] = kept_id
        for delta in executor.map(drop_from_shard, sorted(by_shard.items())):
            ledger.merge(delta)
        log.info("curate: exact dedup removed %d documents", len(duplicates))

    ledger.check_balanced()
    audit_paths = write_audit(ledger, stage.dir / "audit")
    counts = totals(ledger)
    outputs = sorted(shard_dir.glob("*" + SUFFIX)) + audit_paths
    return stage.finish(outputs, counts, format_summary(counts))


def write_audit(ledger: Ledger, folder: Path) -> list[Path]:
    """Every removed id with its reason, and every quarantined id with its error."""
    folder.mkdir()
    paths = []
    for name, rows in (("removed", ledger.removed), ("quarantined", ledger.quarantined)):
        path = folder / f"{name}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for row in sorted(rows, key=lambda r: r["id"]):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths


def totals(ledger: Ledger) -> dict[str, Any]:
    per_source = {s: t.to_json() for s, t in sorted(ledger.sources.items())}
    removed: Counter[str] = Counter()
    for t in ledger.sources.values():
        removed.update(t.removed)
    return {
        "docs_in": sum(t["docs_in"] for t in per_source.values()),
        "docs_out": sum(t["docs_out"] for t in per_source.values()),
        "bytes_in": sum(t["bytes_in"] for t in per_source.values()),
        "bytes_out": sum(t["bytes_out"] for t in per_source.values()),
        "removed": dict(sorted(removed.items())),
        "quarantined": sum(t["quarantined"] for t in per_source.values()),
        "per_source": per_source,
    }


def format_summary(counts: dict[str, Any]) -> str:
    lines = [f"{'source':<10} {'docs in':>9} {'kept':>9} {'removed':>9} {'quar.':>6} {'MB in':>8} {'MB out':>8}"]
    for source, t in counts["per_source"].items():
        lines.append(f"{source:<10} {t['docs_in']:>9} {t['docs_out']:>9} {sum(t['removed'].values()):>9} {t['quarantined']:>6} {t['bytes_in'] / MB:>8.1f} {t['bytes_out'] / MB:>8.1f}")
    lines.append("removed by reason: " + (", ".join(f"{r}={n}" for r, n in counts["removed"].items()) or "none"))
    return "\n".join(lines)
