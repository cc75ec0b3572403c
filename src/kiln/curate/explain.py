"""`kiln curate --explain DOC_ID`: what happened to one document, from the run's audit files.

It looks the id up in `removed.parquet` (step, rule, measured value, threshold, and for a
duplicate the copy that was kept), then in `quarantine.jsonl` (file, position, error), then in
the curated shards. Not handled here: documents of a run whose curate stage has not finished.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.core.errors import FatalError
from kiln.curate.shards import list_shards, read_shard


def explain(stage_dir: Path, doc_id: str) -> str:
    removed_path = stage_dir / "removed.parquet"
    if not removed_path.is_file():
        raise FatalError(f"{stage_dir}: no removed.parquet; run `kiln curate` for this run first")
    table = pq.read_table(removed_path)
    rows = table.filter(pc.equal(table["id"], doc_id)).to_pylist()
    lines = []
    for row in rows:
        lines.append(f"{doc_id} (source {row['source']}) was removed by step {row['step']}: {row['reason']}")
        if row["value"] is not None:
            lines.append(f"  measured {_num(row['value'])}" + (f", threshold {_num(row['threshold'])}" if row["threshold"] is not None else ""))
        if row["kept_id"]:
            lines.append(f"  kept instead: {row['kept_id']}")
        elif row["note"]:
            lines.append(f"  note: {row['note']}")
    with open(stage_dir / "quarantine.jsonl", encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if q["id"] == doc_id:
                where = ":".join(str(x) for x in (q["file"], q["position"]) if x is not None)
                lines.append(f"{doc_id} (source {q['source']}) was quarantined{f' at {where}' if where else ''}: {q['error']}")
    if lines:
        return "\n".join(lines)
    for shard in list_shards(stage_dir / "shards"):
        if any(doc.id == doc_id for doc in read_shard(shard)):
            return f"{doc_id} was kept: it is in {shard.name}"
    raise FatalError(f"{doc_id}: no such document in this run (not removed, quarantined or kept); ids look like those in {stage_dir / 'removed.parquet'}")


def _num(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.4g}"
