"""One document per file: plain text (also the built-in corpus) and HTML files.

A file is read only up to the cap (`max_doc_bytes` of text, `html_bytes` of HTML), so a huge
file is quarantined as too large without being loaded; .gz and .zst files are decompressed
and the cap counts decompressed bytes. A text file with NUL bytes is quarantined as binary.
Not handled here: guessing the encoding of non-UTF-8 text files (their invalid bytes are
replaced and counted).
"""

from __future__ import annotations

from collections.abc import Iterator

from kiln.core.document import Document
from kiln.curate.readers.builtin import topic_text
from kiln.curate.readers.config import InputConfig
from kiln.curate.readers.decode import decode_utf8
from kiln.curate.readers.intake import Intake
from kiln.curate.readers.page import flush_pages, submit_page
from kiln.curate.readers.streams import STREAM_ERRORS, read_prefix
from kiln.curate.readers.task import ReadUnit


def read_text_file(unit: ReadUnit, intake: Intake) -> Iterator[Document]:
    if unit.key is not None:  # a pydoc topic: text held by a module, always valid
        doc = intake.accept(unit.name, topic_text(unit.key), unit.source, {"path": unit.shown_path, "topic": unit.key})
        if doc is not None:
            yield doc
        return
    cap = intake.limits.max_doc_bytes
    data = _read_capped(unit, intake, cap)
    if data is None:
        return
    if b"\x00" in data:
        intake.quarantine(
            unit.name, unit.source, f"read:binary: {unit.path} contains NUL bytes; not text", nbytes=unit.size
        )
        return
    text, replaced = decode_utf8(data)
    yield from flush_pages(intake.pages)  # HTML files of the same task before it come first
    doc = intake.accept(
        unit.name, text, unit.source, {"path": unit.shown_path}, replaced="read:invalid_utf8" if replaced else None
    )
    if doc is not None:
        yield doc


def read_html_file(unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Iterator[Document]:
    body = _read_capped(unit, intake, intake.limits.html_bytes)
    if body is None:
        return
    yield from submit_page(
        intake, unit.name, unit.source, body, None, {"path": unit.shown_path}, None, cfg.extractor
    )  # pipelined: read_task flushes


def _read_capped(unit: ReadUnit, intake: Intake, cap: int) -> bytes | None:
    """The file's (decompressed) bytes, or None after quarantining it as unreadable or too large."""
    try:
        data = read_prefix(unit.path, cap + 1)  # one byte over the cap tells "too large" without reading on
    except STREAM_ERRORS as e:
        intake.quarantine(unit.name, unit.source, f"read:io_error: {unit.path}: {e}", nbytes=unit.size)
        return None
    if len(data) > cap:
        intake.quarantine(unit.name, unit.source, f"read:too_large: {unit.path} is over {cap} bytes", nbytes=unit.size)
        return None
    return data
