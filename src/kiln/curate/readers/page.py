"""One web page (raw HTML bytes) to a Document: decode, extract the main text, account for it.

Shared by HTML files and WARC responses so both treat pages alike: a page over the HTML byte
cap is quarantined unread (`read:too_large`), a page the extractor fails on (or whose extractor
process dies) or that hangs past the time limit is quarantined (`extract:error`,
`extract:timeout`), and a page with no main text is removed (`extract:no_text`): it is valid
input with nothing to keep, not a broken record.

Pages are pipelined through the task's extractor process (extract.PageExtractor): `submit_page`
sends one and yields the Documents of pages sent before it whose text is back; `flush_pages`
yields the rest. A reader calls `flush_pages` before yielding a document that is not a page, so
documents keep their order in the input; read_task flushes at the end of the task. Not handled
here: finding pages in files (textfile.py, warc.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kiln.core.document import Document
from kiln.curate.readers.config import Extractor
from kiln.curate.readers.decode import decode_html
from kiln.curate.readers.extract import ExtractFailed, ExtractTimeout, PageExtractor, extract_main_text
from kiln.curate.readers.intake import Intake


@dataclass(frozen=True)
class Page:
    """What accounting a page needs once its text is back."""

    intake: Intake
    doc_id: str
    source: str
    nbytes: int  # raw HTML bytes
    meta: dict[str, Any]
    position: str | int | None
    replaced: str | None
    extractor: Extractor

    def finish(self, outcome: str | Exception) -> Document | None:
        """The page's Document, or None when it went to the ledger (quarantined or removed)."""
        if isinstance(outcome, ExtractTimeout):
            self.intake.quarantine(
                self.doc_id, self.source, f"extract:timeout: {self.extractor}: {outcome}", self.position, self.nbytes
            )
            return None
        if isinstance(outcome, ExtractFailed):  # already "Type: message" from the helper
            self.intake.quarantine(
                self.doc_id, self.source, f"extract:error: {self.extractor}: {outcome}", self.position, self.nbytes
            )
            return None
        if isinstance(outcome, Exception):
            self.intake.quarantine(
                self.doc_id,
                self.source,
                f"extract:error: {self.extractor}: {type(outcome).__name__}: {outcome}",
                self.position,
                self.nbytes,
            )
            return None
        return self.intake.accept(
            self.doc_id,
            outcome,
            self.source,
            self.meta,
            self.position,
            self.replaced,
            empty_reason=("extract", "no_text"),
        )


def submit_page(
    intake: Intake,
    doc_id: str,
    source: str,
    body: bytes,
    charset: str | None,
    meta: dict[str, Any],
    position: str | int | None,
    extractor: Extractor,
) -> Iterator[Document]:
    """Send the page for extraction; yield the Documents of earlier pages now done."""
    html, replaced = decode_html(body, charset)
    page = Page(intake, doc_id, source, len(body), meta, position, replaced, extractor)
    if intake.pages is None:  # a caller without read_task's extractor process: in-process, no time limit
        try:
            outcome: str | Exception = extract_main_text(html, extractor)
        except Exception as e:  # noqa: BLE001 - any extractor failure is this page's, never the run's
            outcome = e
        yield from _finished([(page, outcome)])
        return
    yield from _finished(intake.pages.submit(html, page))


def flush_pages(pages: PageExtractor | None) -> Iterator[Document]:
    """The Documents of every page still being extracted, in the order they were sent."""
    if pages is not None:
        yield from _finished(pages.flush())


def _finished(done: Iterable[tuple[Page, str | Exception]]) -> Iterator[Document]:
    for page, outcome in done:
        doc = page.finish(outcome)
        if doc is not None:
            yield doc
