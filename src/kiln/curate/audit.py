"""The ledger: where every input document ends up, per source.

input = kept + removed (by reason) + quarantined, exactly, per shard and in total. Removed and
quarantined ids are kept in full so the audit trail can list them; ledgers from shard tasks
merge by addition. Not handled here: writing the audit files (kiln.curate.run does).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kiln.core.document import Document


@dataclass
class SourceTally:
    docs_in: int = 0
    bytes_in: int = 0  # decoded UTF-8 bytes; bytes on disk for a document that could not be read
    docs_out: int = 0
    bytes_out: int = 0
    invalid_utf8_docs: int = 0
    removed: Counter[str] = field(default_factory=Counter)
    quarantined: int = 0

    def add(self, other: SourceTally) -> None:
        self.docs_in += other.docs_in
        self.bytes_in += other.bytes_in
        self.docs_out += other.docs_out
        self.bytes_out += other.bytes_out
        self.invalid_utf8_docs += other.invalid_utf8_docs
        self.removed.update(other.removed)
        self.quarantined += other.quarantined

    def to_json(self) -> dict[str, Any]:
        return {
            "docs_in": self.docs_in,
            "docs_out": self.docs_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "invalid_utf8_docs": self.invalid_utf8_docs,
            "removed": dict(sorted(self.removed.items())),
            "quarantined": self.quarantined,
        }


@dataclass
class Ledger:
    sources: dict[str, SourceTally] = field(default_factory=dict)
    removed: list[dict[str, str]] = field(default_factory=list)  # {"id", "source", "reason"}
    quarantined: list[dict[str, str]] = field(default_factory=list)  # {"id", "source", "error"}

    def tally(self, source: str) -> SourceTally:
        return self.sources.setdefault(source, SourceTally())

    def seen(self, source: str, nbytes: int) -> None:
        t = self.tally(source)
        t.docs_in += 1
        t.bytes_in += nbytes

    def kept(self, doc: Document) -> None:
        t = self.tally(doc.source)
        t.docs_out += 1
        t.bytes_out += len(doc.text.encode("utf-8"))

    def unkeep(self, doc: Document) -> None:
        """Take back a `kept` (a global step such as dedup removed the document afterwards)."""
        t = self.tally(doc.source)
        t.docs_out -= 1
        t.bytes_out -= len(doc.text.encode("utf-8"))

    def remove(self, doc_id: str, source: str, reason: str, **details: str) -> None:
        self.tally(source).removed[reason] += 1
        self.removed.append({"id": doc_id, "source": source, "reason": reason, **details})

    def quarantine(self, doc_id: str, source: str, error: str) -> None:
        self.tally(source).quarantined += 1
        self.quarantined.append({"id": doc_id, "source": source, "error": error})

    def merge(self, other: Ledger) -> None:
        for source, t in other.sources.items():
            self.tally(source).add(t)
        self.removed.extend(other.removed)
        self.quarantined.extend(other.quarantined)

    def check_balanced(self) -> None:
        for source, t in self.sources.items():
            accounted = t.docs_out + sum(t.removed.values()) + t.quarantined
            assert accounted == t.docs_in, f"ledger for {source}: {t.docs_in} in but {accounted} accounted for"
