"""Benchmark decontamination: remove (or flag) training documents that share a word n-gram with an evaluation item.

The test is GPT-3's (Brown et al. 2020, "Language Models are Few-Shot Learners", arXiv:2005.14165,
appendix C): any 13-gram of normalized words (lowercased, punctuation and whitespace as breaks)
shared between a training document and a benchmark item marks the document. Evaluation sets are
JSONL files, one item per line (the item's index is its 0-based line number). This module holds
the config, the step (each document looked up in the index, then removed or flagged) and the
report (`audit/decontamination.json`).
Not handled here: building and looking up the index, and the evaluation set's own settings
(EvalSetConfig; kiln.curate.dedup.ngram_index, which imports nothing from here); GPT-3's
cutting of the matched span (plus 200 characters) out of the document, since a document is
removed or flagged whole; n-grams common in ordinary prose that happen to occur in a benchmark
(licences, boilerplate) also match.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.curate.audit import Ledger
from kiln.curate.dedup.ngram_index import EvalSetConfig, Hit, load_index, set_name
from kiln.text.shingles import MAX_N

REPORT_FORMAT = "kiln-decontamination-report v1"
NOTE_CHARS = 300  # a removal note's length cap: the matched items, then one matching n-gram


class DecontaminateConfig(Section):
    enabled: bool = Field(
        True, description="Check documents against the evaluation sets (runs only when eval_sets is non-empty)."
    )
    eval_sets: tuple[EvalSetConfig, ...] = Field(
        (), description="Evaluation sets whose items must not occur in the training corpus."
    )
    ngram: int = Field(
        13,
        ge=1,
        le=MAX_N,
        description="Words in a shared n-gram that marks a document (normalized words; 13 is GPT-3's).",
    )
    action: Literal["remove", "flag"] = Field(
        "remove",
        description=(
            "remove drops a matching document; flag keeps it with meta.contamination listing the matched items."
        ),
    )
    mode: Literal["exact", "bloom"] = Field(
        "exact",
        description=(
            "exact: hash index with every hit confirmed by its words, items named; bloom: one Bloom filter per set, "
            "smaller, sets named only."
        ),
    )
    bloom_fp_rate: float = Field(
        1e-6, gt=0, lt=1, description="Bloom mode: target false-positive rate per n-gram looked up; sizes each filter."
    )
    fold_digits: bool = Field(
        False, description="Fold every digit to 0 before comparing (then '2+2=4' matches '3+3=6')."
    )

    @model_validator(mode="after")
    def _distinct_names(self) -> DecontaminateConfig:
        names = [set_name(s) for s in self.eval_sets]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"evaluation set names must differ, but {', '.join(repeated)} is used twice; give the sets "
                "distinct `name`s"
            )
        if "flagged" in names:  # its counter would collide with decontaminate:flagged
            raise ValueError("an evaluation set may not be named 'flagged'; set another `name`")
        return self


# --- the step -------------------------------------------------------------------------------------


class Decontaminate:
    """The `decontaminate` step: remove (or flag) documents sharing an n-gram with an evaluation item.

    Speed (one core, 5 KB chunks of /usr/share/doc prose, 10,000 items = 353k n-grams): exact 24-30
    MB/s on documents with no match, 15-17 MB/s when 23% of them match; bloom 17-22 and 14-17."""

    name = "decontaminate"

    def __init__(self, cfg: DecontaminateConfig, index_folder: Path):
        self.cfg, self.index_folder = cfg, Path(index_folder)
        self.index = load_index(self.index_folder)
        built = (self.index.mode, self.index.ngram, self.index.fold_digits, self.index.names)
        wanted = (cfg.mode, cfg.ngram, cfg.fold_digits, [set_name(s) for s in cfg.eval_sets])
        if built != wanted:
            raise FatalError(
                f"curate: the decontamination index at {index_folder} was built for (mode, ngram, fold_digits, "
                f"sets) = {built}, but the config asks for {wanted}; "
                "rebuild the index with build_index"
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to a worker as config and folder; the worker maps the index itself (never pickled arrays).
        return (Decontaminate, (self.cfg, self.index_folder))

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        index, action = self.index, self.cfg.action
        for doc in docs:
            hits, doc_words = index.hits(doc.text)
            if not hits:
                yield doc
                continue
            for hit in hits:
                ledger.record(
                    "contamination",
                    {
                        "id": doc.id,
                        "source": doc.source,
                        "set": index.names[hit.set],
                        "item": hit.item,
                        "action": action,
                    },
                )
            for s in sorted({hit.set for hit in hits}):
                ledger.count(doc.source, f"decontaminate:{index.names[s]}")
            if action == "remove":
                ledger.remove(
                    doc, self.name, "ngram_overlap", value=len(hits), threshold=1, note=self.note(hits, doc_words)
                )
            else:
                ledger.count(doc.source, "decontaminate:flagged")
                yield doc.with_meta(contamination=[{"set": index.names[hit.set], "item": hit.item} for hit in hits])

    def note(self, hits: list[Hit], doc_words: list[str]) -> str:
        """`mmlu:12, mmlu:40 (13-gram: 'the first words ...')`, at most NOTE_CHARS characters."""
        n, names = self.index.ngram, self.index.names
        matched = ", ".join(names[h.set] if h.item is None else f"{names[h.set]}:{h.item}" for h in hits)
        if len(matched) > 180:
            matched = matched[:180].rsplit(", ", 1)[0] + f", ... ({len(hits)} in all)"
        start = min(h.start for h in hits)
        gram = " ".join(doc_words[start : start + n])
        if len(gram) > 90:
            gram = gram[:87] + "..."
        return f"{matched} ({n}-gram: '{gram}')"[:NOTE_CHARS]


# --- the report -----------------------------------------------------------------------------------


def build_report(index_summary: dict[str, Any], rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """audit/decontamination.json: per set, the items found and the training documents holding them.

    `rows` are the ledger's `contamination` records. Exact mode: `found` maps each matched item
    (its index, as a string) to its documents. Bloom mode names no item: `found` is empty and
    `documents` lists the documents matching the set."""
    by_set: dict[str, dict[str, set[tuple[str, str]]]] = {s["name"]: {} for s in index_summary["sets"]}
    for row in rows:
        key = "" if row["item"] is None else str(row["item"])
        by_set[row["set"]].setdefault(key, set()).add((row["id"], row["source"]))
    bloom = index_summary["mode"] == "bloom"
    sets: dict[str, Any] = {}
    for s in index_summary["sets"]:
        found = by_set[s["name"]]
        docs = set().union(*found.values()) if found else set()
        entry: dict[str, Any] = {
            "items": s["items"],
            "items_too_short": s["items_too_short"],
            "ngrams": s["ngrams"],
            "items_found": None if bloom else len(found),
            "documents_found": len(docs),
        }
        if bloom:
            entry.update(
                fp_rate=s["fp_rate"], found={}, documents=[{"id": i, "source": src} for i, src in sorted(docs)]
            )
        else:
            entry["found"] = {
                item: [{"id": i, "source": src} for i, src in sorted(found[item])] for item in sorted(found, key=int)
            }
        sets[s["name"]] = entry
    return {
        "format": REPORT_FORMAT,
        "mode": index_summary["mode"],
        "ngram": index_summary["ngram"],
        "action": index_summary["action"],
        "fold_digits": index_summary["fold_digits"],
        "sets": sets,
    }


def format_report(report: dict[str, Any]) -> str:
    """A few lines for people: one per set, and what the numbers mean."""
    lines = [
        (
            f"decontamination: {report['ngram']}-gram overlap, {report['mode']} mode, matching documents "
            f"{'removed' if report['action'] == 'remove' else 'flagged'}"
        )
    ]
    for name, s in report["sets"].items():
        docs = f"{s['documents_found']:,} training document{'' if s['documents_found'] == 1 else 's'}"
        if s["items_found"] is None:
            line = (
                f"{name}: found in {docs} (bloom mode: items not identified; false-positive rate {s['fp_rate']:.1e} "
                "per n-gram)"
            )
        else:
            line = f"{name}: {s['items_found']:,} of {s['items']:,} items found in {docs}"
        if s["items_too_short"]:
            line += f" ({s['items_too_short']:,} item{'' if s['items_too_short'] == 1 else 's'} too short to check)"
        lines.append(line)
    return "\n".join(lines)
