"""The ledger: where every input document ends up, per source, and why.

input = kept + removed (by reason) + quarantined, exactly, per shard task and per source; the
run fails with the numbers when that does not hold. Alongside the counts a ledger keeps the
funnel (documents and bytes after each step), named counters (`pii:email`, `read:invalid_utf8`),
every removed id with its reason, measured value and threshold, every quarantined document with
its file, position and error, and a sample of removed documents per reason. Ledgers from shard
tasks merge by addition. The sample keeps, per (source, reason), the documents with the smallest
xxh64 of their id: the same sample whatever the number of workers or the merge order.
Not handled here: writing the audit files (kiln.curate.report does).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import xxhash

from kiln.core.document import Document
from kiln.core.errors import FatalError


def printable(name: str) -> str:
    """A file name as text that can be written anywhere: each byte that is not UTF-8 (which Python
    keeps as a lone surrogate) becomes the four characters `\\xHH`; the UTF-8 of the result with
    each `\\xHH` turned back into its byte is the name on disk. Valid names are unchanged."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        try:
            return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no file name byte makes (a \ud800 escape in a message)
            return name.encode("utf-8", "backslashreplace").decode("utf-8")


SAMPLE_TEXT_CHARS = 20_000  # a sampled removed document keeps at most this much text


@dataclass
class SourceTally:
    docs_in: int = 0
    bytes_in: int = 0  # decoded UTF-8 bytes; bytes on disk (or of the raw record) for a document that could not be read
    docs_out: int = 0
    bytes_out: int = 0
    removed: Counter[str] = field(default_factory=Counter)  # reason -> documents
    removed_bytes: Counter[str] = field(default_factory=Counter)  # reason -> UTF-8 bytes of those documents
    quarantined: int = 0
    stats: Counter[str] = field(default_factory=Counter)  # named counters: pii:email, read:invalid_utf8, ...
    funnel: dict[str, list[int]] = field(default_factory=dict)  # step -> [documents, bytes] it passed on

    def add(self, other: SourceTally) -> None:
        self.docs_in += other.docs_in
        self.bytes_in += other.bytes_in
        self.docs_out += other.docs_out
        self.bytes_out += other.bytes_out
        self.removed.update(other.removed)
        self.removed_bytes.update(other.removed_bytes)
        self.quarantined += other.quarantined
        self.stats.update(other.stats)
        for step, (docs, nbytes) in other.funnel.items():
            mine = self.funnel.setdefault(step, [0, 0])
            mine[0] += docs
            mine[1] += nbytes

    def to_json(self) -> dict[str, Any]:
        return {
            "docs_in": self.docs_in,
            "docs_out": self.docs_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "removed": dict(sorted(self.removed.items())),
            "removed_bytes": dict(sorted(self.removed_bytes.items())),
            "quarantined": self.quarantined,
            "stats": dict(sorted(self.stats.items())),
            "funnel": {step: {"docs": d, "bytes": b} for step, (d, b) in self.funnel.items()},
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SourceTally:
        return cls(
            obj["docs_in"],
            obj["bytes_in"],
            obj["docs_out"],
            obj["bytes_out"],
            Counter(obj["removed"]),
            Counter(obj["removed_bytes"]),
            obj["quarantined"],
            Counter(obj["stats"]),
            {s: [v["docs"], v["bytes"]] for s, v in obj["funnel"].items()},
        )


def sample_key(doc_id: str) -> int:
    return xxhash.xxh64_intdigest(doc_id.encode("utf-8", "surrogatepass"))


@dataclass
class Ledger:
    sample_size: int = 20
    sources: dict[str, SourceTally] = field(default_factory=dict)
    removed: list[dict[str, Any]] = field(
        default_factory=list
    )  # id, source, step, reason, value, threshold, note, kept_id
    quarantined: list[dict[str, Any]] = field(default_factory=list)  # id, source, file, position, error
    # (source, reason) -> max-heap (negated key) of the sample_size removed documents with the smallest id hash
    samples: dict[tuple[str, str], list[tuple[int, str, dict[str, Any]]]] = field(default_factory=dict)
    records: dict[str, list[dict[str, Any]]] = field(
        default_factory=dict
    )  # kind (`contamination`) -> rows a step reports

    def tally(self, source: str) -> SourceTally:
        found = self.sources.get(source)
        if found is None:
            found = self.sources[source] = SourceTally()
        return found

    def seen(self, source: str, nbytes: int) -> None:
        t = self.tally(source)
        t.docs_in += 1
        t.bytes_in += nbytes

    def passed(self, step: str, doc: Document) -> None:
        """`doc` came out of `step`: one more document (and its bytes) on that row of the funnel."""
        row = self.tally(doc.source).funnel.setdefault(step, [0, 0])
        row[0] += 1
        row[1] += len(doc.text.encode("utf-8", "surrogatepass"))

    def kept(self, doc: Document) -> None:
        t = self.tally(doc.source)
        t.docs_out += 1
        t.bytes_out += len(doc.text.encode("utf-8", "surrogatepass"))
        if (language := doc.meta.get("language")) is not None:
            t.stats[f"language:{language}"] += 1  # the kept documents' language mix, per source
        if (script := doc.meta.get("script")) is not None:
            t.stats[f"script:{script}"] += 1  # and their scripts (zh's Hans and Hant apart)

    def count(self, source: str, key: str, n: int = 1) -> None:
        """A named counter (`pii:email`, `read:invalid_utf8`); reported in the stats, never in the balance."""
        self.tally(source).stats[key] += n

    def remove(
        self,
        doc: Document,
        step: str,
        rule: str,
        value: float | None = None,
        threshold: float | None = None,
        note: str | None = None,
        kept_id: str | None = None,
    ) -> None:
        """Record a removal: `value` is what the rule measured, `threshold` its limit, `note` what
        numbers cannot say (a matched block-list entry, a detected language), `kept_id` the copy a
        duplicate lost to."""
        reason = f"{step}:{rule}"
        t = self.tally(doc.source)
        t.removed[reason] += 1
        t.removed_bytes[reason] += len(doc.text.encode("utf-8", "surrogatepass"))
        row = {
            "id": doc.id,
            "source": doc.source,
            "step": step,
            "reason": reason,
            "value": None if value is None else float(value),
            "threshold": None if threshold is None else float(threshold),
            "note": note,
            "kept_id": kept_id,
        }
        self.removed.append(row)
        self.offer_sample(doc.source, reason, {**row, "text": doc.text[:SAMPLE_TEXT_CHARS]})

    def record(self, kind: str, row: dict[str, Any]) -> None:
        """Append a row to the step-specific records of `kind` (`contamination`), kept for that step's report."""
        self.records.setdefault(kind, []).append(row)

    def offer_sample(self, source: str, reason: str, entry: dict[str, Any]) -> None:
        """Keep `entry` (a removed row with its text) if its id hash is among the sample_size smallest."""
        if self.sample_size == 0:
            return
        heap = self.samples.setdefault((source, reason), [])
        if any(held[1] == entry["id"] for held in heap):  # one id offered twice (a merge, or ids repeated in the input)
            return
        item = (-sample_key(entry["id"]), entry["id"], entry)
        if len(heap) < self.sample_size:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:  # smaller key than the largest kept one
            heapq.heapreplace(heap, item)

    def quarantine(
        self,
        doc_id: str,
        source: str,
        error: str,
        file: str | None = None,
        position: str | int | None = None,
        nbytes: int = 0,
        counted: bool = False,
    ) -> None:
        """A document that could not be read or processed. It counts as seen here, unless `counted`
        says it already was (a step raised on a document the reader had delivered)."""
        t = self.tally(source)
        if not counted:
            t.docs_in += 1
            t.bytes_in += nbytes
        t.quarantined += 1
        t.stats[f"quarantined:{error.split(': ', 1)[0]}"] += (
            1  # by kind: read:bad_json, extract:timeout, <step> that raised
        )
        # A message or path may carry a file name's undecodable bytes (lone surrogates): written as \xHH.
        self.quarantined.append(
            {
                "id": printable(doc_id),
                "source": source,
                "file": None if file is None else printable(file),
                "position": None if position is None else str(position),
                "error": printable(error),
            }
        )

    def merge(self, other: Ledger) -> None:
        for source, t in other.sources.items():
            self.tally(source).add(t)
        self.removed.extend(other.removed)
        self.quarantined.extend(other.quarantined)
        for kind, rows in other.records.items():
            self.records.setdefault(kind, []).extend(rows)
        for (source, reason), heap in other.samples.items():
            for _, _, entry in heap:
                self.offer_sample(source, reason, entry)

    def sample(self, source: str, reason: str) -> list[dict[str, Any]]:
        """The sampled removed documents of one reason, in a fixed order (by id hash)."""
        return [
            entry
            for _, _, entry in sorted(self.samples.get((source, reason), []), key=lambda item: (-item[0], item[1]))
        ]

    def check_balanced(self, where: str) -> None:
        """input = kept + removed + quarantined for every source, or FatalError with the numbers."""
        for source, t in sorted(self.sources.items()):
            removed = sum(t.removed.values())
            if t.docs_out + removed + t.quarantined != t.docs_in:
                raise FatalError(
                    f"curate: accounting mismatch in {where}, source {source}: {t.docs_in} documents in, but "
                    f"{t.docs_out} kept + {removed} removed + {t.quarantined} quarantined = "
                    f"{t.docs_out + removed + t.quarantined}; this is a kiln bug, please report it with the run's "
                    "manifest"
                )
