"""Report sections on the data: the funnel per source, removal reasons with examples, duplicate
clusters, the language mix and decontamination, from curate's manifest and audit files.

Examples of removed documents come from `audit/samples/` (a hash-chosen few per source and
reason). Their text is shown through the run's own PII redaction (a `Hooks.redact` the caller
gives), since a document removed before the pii step still holds what pii would have replaced,
and each shown id carries what `kiln curate --explain` prints for it (`Hooks.explain`). A document removed
as unsafe (URL lists, bad words, classifiers) is shown masked: each word's first character only.
Not handled here: reading documents beyond the audit samples and a bounded look into the shards.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.core.docshards import list_shards, read_shard
from kiln.core.layout import CURATE, SHARDS, audit_sample
from kiln.report.html import CHART_SOURCES, MB, Section, details, missing, para, pre, table
from kiln.report.run_files import Hooks, RunFiles
from kiln.report.svg import Bars, bar_chart

EXAMPLE_REASONS = 12  # reasons with examples shown, the most frequent first
# Steps that remove unsafe content (adult, abusive, spam): their examples are shown masked (`masked`).
UNSAFE_STEPS = ("url_filter", "bad_words", "classifiers")
_WORD_TAIL = re.compile(r"(\w)(\w+)")
EXAMPLES_PER_REASON = 3
EXAMPLE_CHARS = 400
LARGEST_CLUSTERS = 3
CLUSTER_MEMBERS = 10  # members shown per cluster (a boilerplate cluster can hold thousands)
DECONTAMINATION_ROWS = 20
HOLDERS_SHOWN = 5  # training documents shown per contaminated item
SHARD_LOOKUP_BYTES = 200 * 10**6  # how much of the curated shards the report reads to show kept copies


def curation_sections(run: RunFiles, hooks: Hooks) -> list[Section]:
    manifest = run.manifests.get(CURATE)
    if manifest is None:
        why = (
            "curation is running; its report appears when it finishes"
            if CURATE in run.running
            else "curation has not run in this run directory (kiln curate)"
        )
        return [
            Section(sid, missing(why)) for sid in ("funnel", "removals", "duplicates", "languages", "decontamination")
        ]
    stage = run.stage_dir(CURATE)
    examples = pick_examples(stage, manifest)
    try:
        sizes, clusters, unreadable = *largest_clusters(stage), ""
    except (OSError, pa.ArrowException) as e:  # the other sections do not need it
        sizes, clusters, unreadable = Counter(), {}, f"{stage / 'clusters.parquet'} could not be read: {e}"
    contamination = run.read_json(stage / "audit" / "decontamination.json")
    shown = [e["id"] for _, e in examples] + [m["id"] for members in clusters.values() for m in members]
    shown += [
        d["id"]
        for s in (contamination or {}).get("sets", {}).values()
        for docs in list(s.get("found", {}).values())[:DECONTAMINATION_ROWS]
        for d in docs[:HOLDERS_SHOWN]
    ]
    explained = explain_all(hooks, shown)
    return [
        funnel(manifest),
        removals(run, manifest, examples, explained, hooks),
        duplicates(stage, manifest, sizes, clusters, explained, hooks, run.name)
        if not unreadable
        else Section("duplicates", missing(unreadable)),
        languages(stage, manifest),
        decontamination(run.name, manifest, contamination, explained),
    ]


def explain_all(hooks: Hooks, doc_ids: list[str]) -> dict[str, str]:
    """What `kiln curate --explain` says of each id, asked once for all of them."""
    if hooks.explain is None or not doc_ids:
        return {}
    try:
        return hooks.explain(sorted(set(doc_ids)))
    except Exception as e:  # noqa: BLE001 - the page says what went wrong, beside each id
        return dict.fromkeys(doc_ids, f"explain failed: {e}")


def funnel(manifest: dict[str, Any]) -> Section:
    counts = manifest["counts"]
    per_source = counts["per_source"]
    largest = sorted(per_source, key=lambda s: -per_source[s]["docs_in"])[:CHART_SOURCES]
    steps: list[str] = []
    for s in largest:
        steps += [step for step in per_source[s].get("funnel", {}) if step not in steps]
    docs, mbytes = Bars(["input", *steps]), Bars(["input", *steps])
    for s in largest:
        t = per_source[s]
        d: list[float | None] = [float(t["docs_in"])]
        b: list[float | None] = [t["bytes_in"] / MB]
        for step in steps:  # no bar for a step the source does not pass through (another branch's)
            after = t.get("funnel", {}).get(step)
            d.append(float(after["docs"]) if after else None)
            b.append(after["bytes"] / MB if after else None)
        docs.values[s], mbytes.values[s] = d, b
    rows = []
    for s, t in sorted(per_source.items(), key=lambda kv: -kv[1]["docs_in"]):
        top = max(t["removed"].items(), key=lambda kv: kv[1], default=("", 0))
        rows.append(
            [
                s,
                t["docs_in"],
                t["docs_out"],
                f"{t['docs_out'] / max(t['docs_in'], 1):.1%}",
                round(t["bytes_in"] / MB, 2),
                round(t["bytes_out"] / MB, 2),
                t["quarantined"],
                f"{top[0]} ({top[1]:,})" if top[1] else "",
            ]
        )
    body = (
        para(
            f"{counts['docs_in']:,} documents in ({counts['bytes_in'] / MB:,.1f} MB), {counts['docs_out']:,} kept "
            f"({counts['bytes_out'] / MB:,.1f} MB), {sum(counts['removed'].values()):,} removed, "
            f"{counts['quarantined']:,} quarantined."
        )
        + bar_chart("Documents after each step", docs, "documents")
        + bar_chart("MB after each step", mbytes, "MB (UTF-8)")
        + (
            para(
                f"The charts show the {CHART_SOURCES} largest of {len(per_source)} sources; the table lists all.",
                "note",
            )
            if len(per_source) > CHART_SOURCES
            else ""
        )
        + table(
            ["source", "docs in", "docs kept", "kept", "MB in", "MB kept", "quarantined", "top removal reason"], rows
        )
    )
    return Section("funnel", body)


def pick_examples(stage: Path, manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(reason, audit sample) for up to EXAMPLES_PER_REASON samples of each of the EXAMPLE_REASONS largest reasons."""
    picked = []
    for reason, _ in Counter(manifest["counts"]["removed"]).most_common(EXAMPLE_REASONS):
        entries = []
        for source, t in manifest["counts"]["per_source"].items():
            path = audit_sample(stage, source, reason)
            if reason in t["removed"] and path.is_file():
                entries += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        picked += [(reason, e) for e in sorted(entries, key=lambda e: e["id"])[:EXAMPLES_PER_REASON]]
    return picked


def removals(
    run: RunFiles,
    manifest: dict[str, Any],
    examples: list[tuple[str, dict[str, Any]]],
    explained: dict[str, str],
    hooks: Hooks,
) -> Section:
    bytes_by_reason: Counter[str] = Counter()
    for t in manifest["counts"]["per_source"].values():  # the manifest totals documents per reason, not bytes
        bytes_by_reason.update(t.get("removed_bytes", {}))
    ranked = Counter(manifest["counts"]["removed"]).most_common()
    total = max(sum(n for _, n in ranked), 1)
    rows = [[reason, n, f"{n / total:.1%}", round(bytes_by_reason[reason] / MB, 3)] for reason, n in ranked]
    chart = bar_chart(
        "Documents removed per reason",
        Bars([r for r, _ in ranked[:20]], {"documents": [float(n) for _, n in ranked[:20]]}),
        "documents",
    )
    shown = []
    for reason, entry in examples:
        measured = (
            ""
            if entry.get("value") is None
            else f"{entry['value']:.4g}"
            + ("" if entry.get("threshold") is None else f" (limit {entry['threshold']:.4g})")
        )
        text = hooks.redact(entry.get("text", ""))[:EXAMPLE_CHARS]
        unsafe = reason.split(":")[0] in UNSAFE_STEPS
        shown.append(
            [
                reason,
                entry["id"],
                entry["source"],
                measured or entry.get("note") or "",
                details("text (masked: removed as unsafe)", pre(masked(text)))
                if unsafe
                else details("text (PII redacted)", pre(text)),
                explain_html(explained, entry["id"], run.name),
            ]
        )
    body = (
        (
            chart + table(["reason", "documents", "share of removed", "MB"], rows)
            if ranked
            else para("No document was removed.")
        )
        + "<h3>Examples</h3>"
        + (
            table(["reason", "id", "source", "measured", "text", "explain"], shown, raw=(4, 5))
            if shown
            else para("No removed document was sampled (curate.sample_size is 0, or nothing was removed).", "note")
        )
    )
    return Section("removals", body)


def masked(text: str) -> str:
    """A safe preview of a document removed as unsafe: its layout and each word's first character, the rest
    of every word masked (`Free h** v***** n**!`); the full text stays in the run's audit samples."""
    return _WORD_TAIL.sub(lambda m: m.group(1) + "*" * len(m.group(2)), text)


def explain_html(explained: dict[str, str], doc_id: str, run_name: str) -> str:
    command = f"kiln curate --run {run_name} --explain '{doc_id}'"
    return details("explain", pre(f"$ {command}\n{explained.get(doc_id, '')}".rstrip()))


def largest_clusters(stage: Path) -> tuple[Counter[int], dict[int, list[dict[str, Any]]]]:
    """Every near-duplicate cluster's size, and the LARGEST_CLUSTERS largest ones' first
    CLUSTER_MEMBERS members, keeper first."""
    path = stage / "clusters.parquet"
    if not path.is_file():
        return Counter(), {}
    clusters = pq.read_table(path)
    sizes = Counter(clusters["cluster"].to_pylist())
    return sizes, {
        c: clusters.filter(pc.equal(clusters["cluster"], c)).to_pylist()[:CLUSTER_MEMBERS]
        for c, _ in sizes.most_common(LARGEST_CLUSTERS)
    }


def duplicates(
    stage: Path,
    manifest: dict[str, Any],
    by_cluster: Counter[int],
    largest: dict[int, list[dict[str, Any]]],
    explained: dict[str, str],
    hooks: Hooks,
    run_name: str,
) -> Section:
    counts = manifest["counts"]
    exact = counts["removed"].get("exact_dedup:duplicate", 0)
    minhash = counts.get("minhash") or {}
    intro = para(
        f"Exact duplicates removed: {exact:,}. Near-duplicate (MinHash) clusters: {minhash.get('clusters', 0):,} "
        f"holding {minhash.get('clustered_docs', 0):,} documents; {minhash.get('candidates', 0):,} candidate "
        f"pairs, {minhash.get('verified', 0):,} verified, {minhash.get('rejected', 0):,} rejected by the Jaccard "
        "check."
    )
    if not largest:
        return Section("duplicates", intro + para("No near-duplicate cluster was found.", "note"))
    sizes = Counter(by_cluster.values())
    hist = bar_chart(
        "Clusters by size",
        Bars([f"{size} documents" for size in sorted(sizes)], {"clusters": [float(sizes[s]) for s in sorted(sizes)]}),
        "clusters",
    )
    texts = removed_texts(stage) | kept_texts(stage, {m["id"] for ms in largest.values() for m in ms if m["kept"]})
    columns = []
    for c, members in largest.items():
        cells = []
        for m in members:
            text = texts.get(m["id"])
            label = f"{'kept' if m['kept'] else 'removed'} {m['id']} (Jaccard to kept {m['jaccard_to_kept']:.3f})"
            cells.append(
                para(label)
                + (pre(hooks.redact(text)[:EXAMPLE_CHARS]) if text else para("text not in the audit samples", "note"))
                + explain_html(explained, m["id"], run_name)
            )
        columns.append(f"<div><h4>cluster {c}: {by_cluster[c]:,} documents</h4>{''.join(cells)}</div>")
    return Section(
        "duplicates",
        intro
        + hist
        + f"<h3>Largest clusters (up to {CLUSTER_MEMBERS} members each)</h3>"
        + f'<div class="side">{"".join(columns)}</div>',
    )


def removed_texts(stage: Path) -> dict[str, str]:
    texts = {}
    for sample_file in (stage / "audit" / "samples").glob("*/minhash_dedup__*.jsonl"):
        for line in sample_file.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            texts[entry["id"]] = entry.get("text", "")
    return texts


def kept_texts(stage: Path, ids: set[str]) -> dict[str, str]:
    """The kept copies' text, looked up in the curated shards up to SHARD_LOOKUP_BYTES of them."""
    found: dict[str, str] = {}
    budget = SHARD_LOOKUP_BYTES
    for shard in list_shards(stage / SHARDS):
        if len(found) == len(ids) or budget <= 0:
            break
        budget -= shard.stat().st_size
        found |= {doc.id: doc.text for doc in read_shard(shard) if doc.id in ids}
    return found


def languages(stage: Path, manifest: dict[str, Any]) -> Section:
    per_source = manifest["counts"]["per_source"]
    rows, overall = [], Counter()
    for s, t in sorted(per_source.items()):
        found = {k.removeprefix("language:"): n for k, n in t.get("stats", {}).items() if k.startswith("language:")}
        overall.update(found)
        unknown = t["docs_out"] - sum(found.values())
        shown = ", ".join(f"{lang} {n:,}" for lang, n in sorted(found.items(), key=lambda kv: -kv[1]))
        rows.append([s, t["docs_out"], shown or "", unknown])
    removed: Counter[str] = Counter()
    path = stage / "removed.parquet"
    if path.is_file():
        table_ = pq.read_table(path, columns=["step", "note"])
        for note in table_.filter(pc.equal(table_["step"], "language"))["note"].to_pylist():
            removed[(note or "").removeprefix("detected ").split(";")[0] or "unknown"] += (
                1  # "detected fr; allowed en" -> fr
            )
    chart = bar_chart(
        "Kept documents per language",
        Bars(
            [lang for lang, _ in overall.most_common(20)], {"documents": [float(n) for _, n in overall.most_common(20)]}
        ),
        "documents",
    )
    body = (
        (
            chart
            if overall
            else para(
                "No kept document carries a language (the language step did not run on them, as for code).", "note"
            )
        )
        + table(
            ["source", "kept documents", "by language (lid.176)", "not identified (code, or language step off)"], rows
        )
        + (
            table(
                ["language detected in documents the language step removed", "documents"],
                [[k, n] for k, n in removed.most_common()],
            )
            if removed
            else para("The language step removed no document.", "note")
        )
    )
    return Section("languages", body)


def decontamination(
    run_name: str, manifest: dict[str, Any], report: dict[str, Any] | None, explained: dict[str, str]
) -> Section:
    cfg = manifest.get("config", {}).get("curate", {}).get("decontaminate", {})
    if report is None:
        why = (
            "no evaluation sets were given (curate.decontaminate.eval_sets, or --decontaminate FILE)"
            if cfg.get("enabled", True)
            else "the step is off (curate.decontaminate.enabled)"
        )
        return Section("decontamination", para(f"Not run: {why}."))
    rows, found_rows = [], []
    for name, s in report["sets"].items():
        rows.append(
            [
                name,
                s["items"],
                s["items_too_short"],
                "n/a (bloom)" if s["items_found"] is None else s["items_found"],
                s["documents_found"],
            ]
        )
        for item, docs in list(s.get("found", {}).items())[:DECONTAMINATION_ROWS]:
            holders = "".join(para(d["id"]) + explain_html(explained, d["id"], run_name) for d in docs[:HOLDERS_SHOWN])
            found_rows.append(
                [
                    name,
                    item,
                    holders
                    + (para(f"and {len(docs) - HOLDERS_SHOWN} more", "note") if len(docs) > HOLDERS_SHOWN else ""),
                ]
            )
    body = (
        para(
            f"{report['ngram']}-gram overlap, {report['mode']} mode; matching documents "
            f"{'removed' if report['action'] == 'remove' else 'flagged'}."
        )
        + table(["evaluation set", "items", "items too short", "items found", "training documents"], rows)
        + (
            table(["set", "item (line of the set)", "training documents holding it"], found_rows, raw=(2,))
            if found_rows
            else para("No evaluation item was found in the training data.", "note")
        )
    )
    return Section("decontamination", body)
