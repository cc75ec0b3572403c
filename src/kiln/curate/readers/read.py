"""Reading one planned task: each unit through its format's reader, every record accounted for.

`read_task` yields Documents and puts every other record in the ledger: quarantined (with file,
position and error) or removed (empty text, no main text), both counted as seen. The caller
counts each yielded document with `Ledger.seen` (its bytes are known only to the caller once
steps may edit it). It never raises for bad data: an
error no reader anticipated quarantines the unit's file under `<source>/<relpath>` and the task
goes on with the next unit. HTML pages (files and WARC records) are extracted by one helper
process per task, started on its first page (extract.py), and pipelined (page.py): documents
still come out in input order. Not handled here: planning (plan.py) or running steps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.readers.extract import PageExtractor
from kiln.curate.readers.gettext import read_gettext_unit
from kiln.curate.readers.intake import Intake, ReadLimits
from kiln.curate.readers.jsonl import read_jsonl
from kiln.curate.readers.page import flush_pages
from kiln.curate.readers.parquet import read_parquet
from kiln.curate.readers.task import ReadTask, ReadUnit
from kiln.curate.readers.textfile import read_html_file, read_text_file
from kiln.curate.readers.warc import read_warc

log = logging.getLogger("kiln.curate")


def read_task(task: ReadTask, limits: ReadLimits, ledger: Ledger) -> Iterator[Document]:
    # One extractor process for the task's HTML pages, started on the first page (extract.py);
    # closed when the task's documents are all read, or when the caller closes the generator.
    with PageExtractor(task.input.extractor, limits.extract_timeout_s) as pages:
        for unit in task.units:
            intake = Intake(ledger, limits, unit.shown_path, pages)
            try:
                yield from _read_unit(unit, task, intake)
            except Exception as e:  # noqa: BLE001 - an unreadable file is quarantined, never the run
                log.warning(
                    "input %s: cannot read %s: %s: %s; quarantined", unit.source, unit.path, type(e).__name__, e
                )
                kind = "read:io_error" if isinstance(e, OSError) else "read:bad_file"
                intake.quarantine(
                    unit.name, unit.source, f"{kind}: {unit.path}: {type(e).__name__}: {e}", nbytes=unit.size
                )
        yield from flush_pages(pages)  # the pages still out carry their own intakes


def _read_unit(unit: ReadUnit, task: ReadTask, intake: Intake) -> Iterator[Document]:
    if unit.format == "jsonl":
        return read_jsonl(unit, task.input, intake)
    if unit.format == "parquet":
        return read_parquet(unit, task.input, intake)
    if unit.format == "warc":
        return read_warc(unit, task.input, intake)
    if unit.format == "html":
        return read_html_file(unit, task.input, intake)
    if unit.format == "gettext_messages":
        return read_gettext_unit(unit, task.input, intake)
    return read_text_file(unit, intake)  # text, and the built-in corpus
