"""The curate stage's accounting and report, from the ledgers its tasks left in their markers.

`account` merges every task's ledgers and checks input = kept + removed + quarantined, per task
and then per source (the run fails with the numbers when that does not hold). `write_audit`
gathers the tasks' rows into `removed.parquet`, `quarantine.jsonl`, `clusters.parquet` and
`audit/` (reasons, samples; `decontamination.json` by `write_decontamination`). `totals` gives the
manifest's counts and `format_summary` the funnel per source for `summary.txt`.
Not handled here: running the phases or writing the per-task files (kiln.curate.phases), and
the ledger itself (kiln.curate.audit).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.core.layout import audit_sample
from kiln.curate.audit import Ledger, SourceTally
from kiln.curate.config import CurateConfig
from kiln.curate.jobs import WorkDir
from kiln.curate.languages import USED
from kiln.curate.phases import CLUSTERS_SCHEMA, LEDGER_PHASES, MB, REMOVED_SCHEMA
from kiln.curate.readers import ReadTask, task_paths
from kiln.curate.steps.chain import BRANCHES, enabled
from kiln.curate.steps.decontaminate import build_report
from kiln.curate.steps.pii import EXAMPLES_PER_KIND


def load_ledger(summary: dict[str, Any], sample_size: int) -> Ledger:
    """Counts and samples of a marker written by kiln.curate.phases.save_ledger (rows stay in
    their files; the audit streams them)."""
    ledger = Ledger(sample_size)
    ledger.sources = {s: SourceTally.from_json(t) for s, t in summary["sources"].items()}
    for key, entries in summary["samples"].items():
        source, reason = key.split("\x00")
        for entry in entries:
            ledger.offer_sample(source, reason, entry)
    return ledger


def account(cfg: CurateConfig, tasks: list[ReadTask], phases: list[dict[int, dict[str, Any]]]) -> Ledger:
    """Merge every task's ledgers, checking input = kept + removed + quarantined per task, then per source."""
    total = Ledger(cfg.sample_size)
    for task in tasks:
        ledger = Ledger(cfg.sample_size)
        for phase in phases:
            ledger.merge(load_ledger(phase[task.index], cfg.sample_size))
        ledger.check_balanced(
            f"shard task {task.index:05d} "
            f"({', '.join(str(p) for p in task_paths(task)[:3])}{' ...' if len(task_paths(task)) > 3 else ''})"
        )
        total.merge(ledger)
    total.check_balanced("the whole run")
    return total


def write_audit(
    ledger: Ledger, stage_dir: Path, phases: list[dict[int, dict[str, Any]]], tasks: list[ReadTask]
) -> tuple[list[Path], dict[str, list[dict[str, Any]]]]:
    """removed.parquet, quarantine.jsonl, clusters.parquet, and under audit/ the per-reason table
    and the samples. Returns the files and the steps' records by kind (for their reports)."""
    work = WorkDir(stage_dir)
    removed_path, quarantine_path = stage_dir / "removed.parquet", stage_dir / "quarantine.jsonl"
    with pq.ParquetWriter(removed_path, REMOVED_SCHEMA) as writer:
        for task in tasks:
            for phase in LEDGER_PHASES:
                writer.write_table(
                    pq.read_table(work.file(phase, task.index, ".removed.parquet"), schema=REMOVED_SCHEMA)
                )
    with open(quarantine_path, "w", encoding="utf-8") as out:
        for task in tasks:
            for phase in LEDGER_PHASES:
                out.write(work.file(phase, task.index, ".quarantine.jsonl").read_text(encoding="utf-8"))
    records: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        for phase in LEDGER_PHASES:
            with open(work.file(phase, task.index, ".records.jsonl"), encoding="utf-8") as f:
                for line in f:
                    entry = json.loads(line)
                    records.setdefault(entry["kind"], []).append(entry["row"])
    audit = stage_dir / "audit"
    audit.mkdir(exist_ok=True)
    reasons = {
        s: {r: {"docs": n, "bytes": t.removed_bytes[r]} for r, n in sorted(t.removed.items())}
        for s, t in sorted(ledger.sources.items())
    }
    (audit / "reasons.json").write_text(json.dumps(reasons, indent=2) + "\n")
    outputs = [removed_path, quarantine_path, audit / "reasons.json"]
    cluster_files = [work.file("write", task.index, ".clusters.parquet") for task in tasks]
    clusters = pa.concat_tables(
        [pq.read_table(f, schema=CLUSTERS_SCHEMA) for f in cluster_files]
    )  # empty with minhash_dedup off
    pq.write_table(
        clusters.sort_by([("cluster", "ascending"), ("kept", "descending"), ("id", "ascending")]),
        stage_dir / "clusters.parquet",
    )
    outputs.append(stage_dir / "clusters.parquet")
    for source, reason in sorted(ledger.samples):
        path = audit_sample(stage_dir, source, reason)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in ledger.sample(source, reason)), encoding="utf-8"
        )
        outputs.append(path)
    return outputs, records


def write_decontamination(
    index_summary: dict[str, Any], rows: list[dict[str, Any]], stage_dir: Path
) -> tuple[dict[str, Any], Path]:
    """audit/decontamination.json from the index's summary and the `contamination` records; returns
    the report and its path."""
    report = build_report(index_summary, rows)
    path = stage_dir / "audit" / "decontamination.json"
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return report, path


def write_pii_examples(
    rows: list[dict[str, Any]], stage_dir: Path
) -> tuple[dict[str, dict[str, list[dict[str, str]]]], Path]:
    """audit/pii_examples.json: per source and kind, the first EXAMPLES_PER_KIND redactions (by
    document id) in their redacted form; returns them and the path."""
    examples: dict[str, dict[str, list[dict[str, str]]]] = {}
    for row in sorted(rows, key=lambda r: (r["source"], r["kind"], r["id"])):
        shown = examples.setdefault(row["source"], {}).setdefault(row["kind"], [])
        if len(shown) < EXAMPLES_PER_KIND:
            shown.append({"id": row["id"], "text": row["text"]})
    path = stage_dir / "audit" / "pii_examples.json"
    path.write_text(json.dumps(examples, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return examples, path


def format_pii(counts: dict[str, Any], examples: dict[str, dict[str, list[dict[str, str]]]]) -> str:
    """Redactions per source and kind, each with its examples (what a user sees the pii step changed)."""
    lines = ["pii redactions (audit/pii_examples.json has the document ids):"]
    for source, t in counts["per_source"].items():
        for key, n in sorted(t["stats"].items()):
            if key.startswith("pii:"):
                kind = key.removeprefix("pii:")
                lines.append(f"  {source} {kind}: {n:,}")
                lines += [f"    ...{e['text']}..." for e in examples.get(source, {}).get(kind, [])]
    return "\n".join(lines) if len(lines) > 1 else ""


def totals(ledger: Ledger) -> dict[str, Any]:
    """The manifest's counts: documents and bytes in and out, removals by reason, counters, per source."""
    per_source = {s: t.to_json() for s, t in sorted(ledger.sources.items())}
    removed: Counter[str] = Counter()
    stats: Counter[str] = Counter()
    for t in ledger.sources.values():
        removed.update(t.removed)
        stats.update(t.stats)
    return {
        "docs_in": sum(t["docs_in"] for t in per_source.values()),
        "docs_out": sum(t["docs_out"] for t in per_source.values()),
        "bytes_in": sum(t["bytes_in"] for t in per_source.values()),
        "bytes_out": sum(t["bytes_out"] for t in per_source.values()),
        "removed": dict(sorted(removed.items())),
        "quarantined": sum(t["quarantined"] for t in per_source.values()),
        "stats": dict(sorted(stats.items())),
        "per_source": per_source,
    }


def format_summary(counts: dict[str, Any], rows: list[str], cfg: CurateConfig, top_reasons: int = 5) -> str:
    """The funnel per source (documents and MB after each step, in chain order, zeros shown),
    the settings the source has of its own, and its top removal reasons. A branch (prose or code
    rules) is shown when documents entered it, a step's row when the source runs that step."""
    lines = []
    for source, t in counts["per_source"].items():
        raw = ", quarantined ones at their raw size" if t["quarantined"] else ""
        lines.append(
            f"source {source}: {t['docs_in']:,} documents in ({t['bytes_in'] / MB:.1f} MB of text{raw}), "
            f"{t['docs_out']:,} kept ({t['bytes_out'] / MB:.1f} MB), {t['quarantined']:,} quarantined"
        )
        if settings := cfg.source_settings(source):
            lines.append("  its own settings (curate.sources): " + ", ".join(settings))
        lines.append(f"  {'after step':<24} {'docs':>10} {'MB':>9} {'docs %':>7}")
        funnel = t["funnel"]
        own = cfg.for_source(source)
        for row in rows:
            branch = row.split("/")[0] if row in BRANCHES or "/" in row else None
            if branch is not None and branch not in funnel:
                continue  # no document of this source took that branch
            if "/" in row and not enabled(own, [row.split("/")[1]]):
                continue  # a step this source's own settings turn off
            found = funnel.get(row, {"docs": 0, "bytes": 0})
            label = f"{row} rules, in" if row in BRANCHES else ("  " + row.split("/")[1] if "/" in row else row)
            lines.append(
                f"  {label:<24} {found['docs']:>10,} {found['bytes'] / MB:>9.2f} "
                f"{100 * found['docs'] / max(t['docs_in'], 1):>6.1f}%"
            )
        top = sorted(t["removed"].items(), key=lambda kv: (-kv[1], kv[0]))[:top_reasons]
        if top:
            lines.append("  top removal reasons: " + ", ".join(f"{r}={n:,}" for r, n in top))
    # the documents per language (below) and per language's own settings (the run's last line) are said apart
    counters = {k: v for k, v in counts["stats"].items() if not k.startswith(("language:", "script:", USED))}
    if counters:
        lines.append("counters: " + ", ".join(f"{k}={v:,}" for k, v in counters.items()))
    languages = sorted(
        ((k.removeprefix("language:"), v) for k, v in counts["stats"].items() if k.startswith("language:")),
        key=lambda kv: -kv[1],
    )
    if languages:  # up to 176 lid.176 labels: the ten largest here, all of them in the manifest
        lines.append(
            "kept documents by language: "
            + ", ".join(f"{lang}={n:,}" for lang, n in languages[:10])
            + (f" and {len(languages) - 10} more" if len(languages) > 10 else "")
        )
    scripts = sorted(
        ((k.removeprefix("script:"), v) for k, v in counts["stats"].items() if k.startswith("script:")),
        key=lambda kv: -kv[1],
    )
    if scripts:
        lines.append("kept documents by script: " + ", ".join(f"{script}={n:,}" for script, n in scripts))
    lines.append(
        f"total: {counts['docs_in']:,} in, {counts['docs_out']:,} kept, {sum(counts['removed'].values()):,} "
        f"removed, {counts['quarantined']:,} quarantined"
    )
    if counts["docs_out"] == 0:
        lines.append("warning: no document was kept; the top removal reasons above and quarantine.jsonl say why")
    return "\n".join(lines)
