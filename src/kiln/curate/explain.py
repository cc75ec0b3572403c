"""`kiln curate --explain DOC_ID`: what happened to one document, from the run's audit files.

It looks the id up in `removed.parquet` (step, rule, measured value, the threshold that applied
to it, the source's own settings of that step where curate.sources gives some, and for a
duplicate the copy that was kept; for a near-duplicate also its cluster from `clusters.parquet`),
then in `quarantine.jsonl` (file, position, error), then in the curated shards. `explain_many`
answers for many ids at once from the audit files alone (the run report's). Not handled here:
documents of a run whose curate stage has not finished.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.core.docshards import list_shards, read_shard
from kiln.core.errors import FatalError
from kiln.core.layout import SHARDS
from kiln.core.manifest import MANIFEST


def explain(stage_dir: Path, doc_id: str) -> str:
    if not doc_id.strip():
        raise FatalError(
            f"--explain needs a document id, got {doc_id!r} (an unset shell variable?); ids look like those in "
            f"{stage_dir / 'removed.parquet'}"
        )
    found = explain_many(stage_dir, [doc_id])
    if doc_id in found:
        return found[doc_id]
    for shard in list_shards(stage_dir / SHARDS):
        if any(doc.id == doc_id for doc in read_shard(shard)):
            return "\n".join([f"{doc_id} was kept: it is in {shard.name}", *cluster_lines(stage_dir, doc_id)])
    raise FatalError(
        f"{doc_id}: no such document in this run (not removed, quarantined or kept); ids look like those in "
        f"{stage_dir / 'removed.parquet'}"
    )


def explain_many(stage_dir: Path, doc_ids: list[str]) -> dict[str, str]:
    """What `explain` prints for each id the audit files know, each file read once: removed and
    quarantined documents, and the kept copy of a near-duplicate cluster (named as such: finding a
    kept document's shard means reading the shards, which `explain` alone does)."""
    removed_path = stage_dir / "removed.parquet"
    if not removed_path.is_file():
        raise FatalError(f"{stage_dir}: no removed.parquet; run `kiln curate` for this run first")
    wanted = set(doc_ids)
    table = pq.read_table(removed_path)
    lines: dict[str, list[str]] = {}
    own = source_settings(stage_dir)
    clusters = (
        pq.read_table(stage_dir / "clusters.parquet") if (stage_dir / "clusters.parquet").is_file() else None
    )  # None: a run from before near-dedup
    for row in table.filter(pc.is_in(table["id"], pa.array(sorted(wanted), pa.string()))).to_pylist():
        doc_id, out = row["id"], lines.setdefault(row["id"], [])
        out.append(f"{doc_id} (source {row['source']}) was removed by step {row['step']}: {row['reason']}")
        if row["value"] is not None:
            out.append(
                f"  measured {_num(row['value'])}"
                + (f", threshold {_num(row['threshold'])}" if row["threshold"] is not None else "")
            )
        if settings := own.get(row["source"], {}).get(row["step"]):
            out.append(
                f"  source {row['source']} has its own {row['step']} settings (curate.sources): "
                + ", ".join(f"{k}={v}" for k, v in settings.items())
            )
        if row["kept_id"]:
            out.append(f"  kept instead: {row['kept_id']}")
            if row["step"] == "minhash_dedup":
                out += cluster_lines(stage_dir, doc_id, clusters=clusters)
        elif row["note"]:
            out.append(f"  note: {row['note']}")
    with open(stage_dir / "quarantine.jsonl", encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if q["id"] in wanted:
                where = ":".join(str(x) for x in (q["file"], q["position"]) if x is not None)
                lines.setdefault(q["id"], []).append(
                    f"{q['id']} (source {q['source']}) was quarantined{f' at {where}' if where else ''}: {q['error']}"
                )
    if clusters is not None:
        keepers = clusters.filter(
            pc.and_(clusters["kept"], pc.is_in(clusters["id"], pa.array(sorted(wanted - set(lines)), pa.string())))
        )
        for doc_id in keepers["id"].to_pylist():
            lines[doc_id] = [
                f"{doc_id} was kept: its near-duplicate cluster keeps it",
                *cluster_lines(stage_dir, doc_id, clusters=clusters),
            ]
    return {doc_id: "\n".join(found) for doc_id, found in lines.items()}


def source_settings(stage_dir: Path) -> dict[str, dict[str, dict[str, object]]]:
    """curate.sources as the run's manifest recorded it: source -> step -> settings."""
    manifest = stage_dir / MANIFEST
    if not manifest.is_file():
        return {}
    return json.loads(manifest.read_text(encoding="utf-8")).get("config", {}).get("curate", {}).get("sources", {})


def cluster_lines(stage_dir: Path, doc_id: str, shown: int = 10, clusters: pa.Table | None = None) -> list[str]:
    """The near-duplicate cluster holding `doc_id`: its size and members, keeper first (`clusters`:
    clusters.parquet already read)."""
    if clusters is None:
        if not (stage_dir / "clusters.parquet").is_file():
            return []  # a run from before near-dedup
        clusters = pq.read_table(stage_dir / "clusters.parquet")
    mine = clusters.filter(pc.equal(clusters["id"], doc_id))
    if mine.num_rows == 0:
        return []
    number = mine["cluster"][0].as_py()
    members = clusters.filter(pc.equal(clusters["cluster"], number)).to_pylist()  # keeper first, then by id
    lines = [f"  cluster {number}: {len(members)} documents (Jaccard of shingle sets to the kept one)"]
    for m in members[:shown]:
        lines.append(f"    {'kept   ' if m['kept'] else 'removed'} {m['id']}  {m['jaccard_to_kept']:.3f}")
    if len(members) > shown:
        lines.append(f"    ... {len(members) - shown} more in {stage_dir / 'clusters.parquet'}")
    return lines


def _num(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.4g}"
