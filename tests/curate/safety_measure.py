"""The harmful-content measurement shared by tests/curate/test_safety_filters.py and
benchmarks/safety_filters.py: clean text found on this machine plus planted unsafe documents
(tests/curate/safety_corpus.py), curated by the default URL and bad-words steps and a classifier trained on
labels of another seed's planted documents and other clean documents.

1. Clean documents: this machine's /usr/share/doc files, pydoc topics and translated program messages
   (en, fr, de, es), read by `kiln curate` with every filter off; split in two by a hash of the id.
2. `kiln quality train-labels` on seed 1's planted documents (unsafe) and one half (safe).
3. `kiln curate` of seed 2's planted documents and the other half, with the language step annotating (every
   language kept), the URL filter and bad words at their defaults, the classifier removing at P(unsafe) >= 0.5,
   and every other filter off, so each removal is one of these steps'.
Not handled here: the default pipeline's throughput (the benchmark times it).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml
from safety_corpus import clean_pages, labelled, planted, write_jsonl

from kiln.cli import main
from kiln.core.docshards import list_shards, read_shard
from kiln.core.split import is_heldout

CLEAN_INPUTS = [
    {"source": "docs", "format": "usr_share_doc"},
    {"source": "prose", "format": "pydoc_topics"},
    {"source": "messages", "format": "gettext_messages", "locales": ["en", "fr", "de", "es"]},
]
# Steps that are not about unsafe content: off, so every removal below is the safety steps'.
OTHER_FILTERS = (
    "line_dedup",
    "gopher_repetition",
    "gopher_quality",
    "c4",
    "fineweb",
    "code_quality",
    "pii",
    "length",
    "exact_dedup",
    "minhash_dedup",
)
SAFETY_REASONS = ("url_filter:", "bad_words:", "classifiers:")


def curate(root: Path, name: str, curate_section: dict[str, Any]) -> Path:
    """Curate with this section (every filter but the safety steps off); the stage folder."""
    off = {step: {"enabled": False} for step in OTHER_FILTERS}
    recipe = {"name": name, "runs_dir": str(root / "runs"), "curate": {**off, **curate_section}}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True), encoding="utf-8")
    assert main(["curate", "--recipe", str(path)]) == 0
    return root / "runs" / name / "curate"


def clean_documents(root: Path, max_mb: float) -> list[dict[str, str]]:
    """Clean text of this machine, read with every filter (and the safety steps) off."""
    everything_off = {"language": {"enabled": False}, "url_filter": {"enabled": False}, "bad_words": {"enabled": False}}
    stage = curate(root, "clean", {"inputs": CLEAN_INPUTS, "max_total_mb": max_mb, **everything_off})
    return [{"id": d.id, "text": d.text} for p in list_shards(stage / "shards") for d in read_shard(p)]


def measure(root: Path, per_kind: int, clean_mb: float) -> dict[str, Any]:
    """Train on seed 1, curate seed 2 and the held-out clean half; the removal figures."""
    clean = clean_documents(root, clean_mb)
    train_clean = [d["text"] for d in clean if not is_heldout(d["id"], 0.5)]
    held_clean = [d["text"] for d in clean if is_heldout(d["id"], 0.5)]
    labels = write_jsonl(root / "labels.jsonl", labelled(1, per_kind, train_clean))
    quality = {"quality": {"labels": {"unsafe": {"path": str(labels)}}}}
    recipe = root / "labels.yaml"
    recipe.write_text(yaml.safe_dump({"name": "held", "runs_dir": str(root / "runs"), **quality}), encoding="utf-8")
    assert main(["quality", "train-labels", "--recipe", str(recipe)]) == 0
    report = json.loads((root / "runs" / "held" / "quality" / "labels" / "unsafe" / "report.json").read_text())

    unsafe = planted(2, per_kind)
    pages = unsafe + clean_pages(held_clean, 2)
    corpus = write_jsonl(root / "held.jsonl", [{k: p[k] for k in ("id", "text", "url")} for p in pages])
    section = {
        "inputs": [{"source": "web", "format": "jsonl", "path": str(corpus)}],
        "language": {"languages": None},
        "classifiers": {
            "models": {
                "unsafe": {
                    "model": str(root / "runs" / "held" / "quality" / "labels" / "unsafe"),
                    "remove_above": {"unsafe": 0.5},
                }
            }
        },
    }
    stage = curate(root, "held", section)
    removed = {r["id"]: r["reason"] for r in pq.read_table(stage / "removed.parquet").to_pylist()}
    assert all(reason.startswith(SAFETY_REASONS) for reason in removed.values()), Counter(removed.values())
    manifest = json.loads((stage / "manifest.json").read_text())
    gone = [p for p in unsafe if p["id"] in removed]
    clean_gone = [p for p in pages if p["kind"] == "clean" and p["id"] in removed]
    return {
        "planted": len(unsafe),
        "planted_removed": len(gone),
        "clean": len(held_clean),
        "clean_removed": len(clean_gone),
        "by_kind": {k: sum(p["kind"] == k for p in gone) / sum(p["kind"] == k for p in unsafe) for k in _kinds(unsafe)},
        "by_language": {
            lang: sum(p["language"] == lang for p in gone) / sum(p["language"] == lang for p in unsafe)
            for lang in sorted({p["language"] for p in unsafe})
        },
        "by_reason": dict(Counter(removed[p["id"]] for p in gone)),
        "clean_reasons": dict(Counter(removed[p["id"]] for p in clean_gone)),
        "classifier_heldout": report["heldout"]["labels"]["unsafe"],
        "stage": stage,
        "manifest": manifest,
    }


def _kinds(records: list[dict[str, str]]) -> list[str]:
    return sorted({r["kind"] for r in records})
