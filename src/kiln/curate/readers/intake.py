"""Where a decoded record becomes a Document or a ledger entry: the one accounting rule.

Every reader hands each record it finds to an `Intake`, which applies the same checks in the
same order for every format: too large (quarantined), empty (removed), invalid bytes replaced
(counted), else yielded. Accounting: a quarantined or removed record is counted as seen here
(Ledger.quarantine does it; a removal calls Ledger.seen first); a yielded document is not, so
the caller calls `Ledger.seen` once for each document it receives, as the stage always has.
Not handled here: parsing or decoding (the format modules do that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.readers.extract import PageExtractor


@dataclass(frozen=True)
class ReadLimits:
    max_doc_bytes: int = (
        1_000_000  # text bytes; bigger documents are quarantined ("read:too_large"), never loaded whole
    )
    extract_timeout_s: float = (
        5.0  # per HTML page; a page not done by then has its extractor process killed ("extract:timeout")
    )
    max_html_bytes: int | None = None  # raw HTML bytes read for one page; None: 10 x max_doc_bytes

    @property
    def html_bytes(self) -> int:
        # Markup is typically 3-10x the text it carries; a page past 10x cannot yield a document
        # under the text cap often enough to be worth parsing.
        return self.max_html_bytes if self.max_html_bytes is not None else 10 * self.max_doc_bytes


def utf8_len(text: str) -> int:
    # isascii() is O(1) in CPython (a flag on the string), so most documents skip the encode.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@dataclass
class Intake:
    """The ledger, limits and file of one unit being read; positions and ids come per record."""

    ledger: Ledger
    limits: ReadLimits
    file: str
    pages: PageExtractor | None = (
        None  # the task's HTML extractor process (read.py); None: extract in-process, no time limit
    )

    def quarantine(
        self, doc_id: str, source: str, error: str, position: str | int | None = None, nbytes: int = 0
    ) -> None:
        self.ledger.quarantine(doc_id, source, error, file=self.file, position=position, nbytes=nbytes)

    def too_large(
        self,
        doc_id: str,
        source: str,
        nbytes: int,
        position: str | int | None = None,
        what: str = "document",
        limit: str | None = None,
    ) -> None:
        limit = limit or f"the cap of {self.limits.max_doc_bytes} text bytes"
        self.quarantine(doc_id, source, f"read:too_large: {what} of {nbytes} bytes is over {limit}", position, nbytes)

    def accept(
        self,
        doc_id: str,
        text: str,
        source: str,
        meta: dict[str, Any],
        position: str | int | None = None,
        replaced: str | None = None,
        empty_reason: tuple[str, str] = ("read", "empty"),
    ) -> Document | None:
        """The Document to yield, or None when the record went to the ledger instead.

        `replaced` names the counter to bump (`read:invalid_utf8`) when decoding replaced bytes;
        `empty_reason` is the (step, rule) under which an empty text is removed.
        """
        nbytes = utf8_len(text)
        if nbytes > self.limits.max_doc_bytes:
            self.too_large(doc_id, source, nbytes, position)
            return None
        if replaced:
            self.ledger.count(source, replaced)
        doc = Document(doc_id, text, source, meta)
        if not text:
            # Not malformed input, just nothing to keep: removed with a reason, like a filter
            # would. Ledger.remove does not count the document in, so seen comes first.
            self.ledger.seen(source, 0)
            self.ledger.remove(doc, *empty_reason)
            return None
        return doc
