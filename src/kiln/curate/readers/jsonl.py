"""JSONL (plain, .gz, .zst): one JSON object per line, streamed in bounded memory.

Lines are read with `readline(limit)`, so a line longer than the limit is detected after
reading only the limit, then skipped to the next newline in 1 MB pieces and quarantined
(`read:too_large`, with its line number): a 100 MB line never exists in memory. The limit is
4x the text cap, room for JSON escaping (`\\uXXXX` for non-ASCII text: twice the UTF-8 bytes of
CJK, three times those of an astral character, six times those of a control character) and
metadata; a record at the cap whose escaped line is longer still is quarantined as too large,
with its line number, like any other over-long line. A line under the limit whose text is over
the cap is quarantined after parsing. Line numbers start at
1 and count blank lines, which are skipped (they are not records). Which fields become the
document's meta (a top-level `url`, a `meta` object, kiln's `path` and `line`): records.py.
Not handled here: JSON
arrays (`.json` files holding one array are read line by line and mostly quarantined).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import BinaryIO

from kiln.core.document import Document
from kiln.curate.readers.config import InputConfig
from kiln.curate.readers.decode import decode_utf8, scrub_surrogates, scrub_value
from kiln.curate.readers.intake import Intake
from kiln.curate.readers.records import MISSING, record_document
from kiln.curate.readers.streams import STREAM_ERRORS, open_decompressed
from kiln.curate.readers.task import ReadUnit

JSON_BYTES_PER_TEXT_BYTE = (
    4  # line limit = this x max_doc_bytes; \uXXXX escaping doubles CJK, triples astral characters
)
SKIP_CHUNK_BYTES = 1 << 20
# Only a line with a \uD800-\uDFFF escape can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def read_jsonl(unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Iterator[Document]:
    line_limit = JSON_BYTES_PER_TEXT_BYTE * intake.limits.max_doc_bytes
    lineno = 0
    with open_decompressed(unit.path) as opened:
        try:
            while unit.max_bytes is None or opened.raw.tell() < unit.max_bytes:
                line = opened.stream.readline(line_limit + 1)
                if not line:
                    break
                lineno += 1
                if lineno == 1 and line.startswith(codecs.BOM_UTF8):
                    line = line[
                        len(codecs.BOM_UTF8) :
                    ]  # a byte-order mark some editors write: not part of the first record
                if len(line) > line_limit and not line.endswith(b"\n"):
                    nbytes = len(line) + _skip_rest_of_line(opened.stream)
                    limit = f"the line limit of {line_limit} bytes ({JSON_BYTES_PER_TEXT_BYTE} x the text cap)"
                    intake.too_large(
                        f"{unit.name}:{lineno}", unit.source, nbytes, lineno, what=f"line {lineno}", limit=limit
                    )
                    continue
                doc = parse_line(line, lineno, unit, cfg, intake)
                if doc is not None:
                    yield doc
        except STREAM_ERRORS as e:  # truncated or corrupt compressed data: what was read stands
            intake.quarantine(
                f"{unit.name}:{lineno + 1}",
                unit.source,
                f"read:io_error: {unit.path} after line {lineno}: {type(e).__name__}: {e}",
                lineno + 1,
            )


def _skip_rest_of_line(stream: BinaryIO) -> int:
    skipped = 0
    while True:
        piece = stream.readline(SKIP_CHUNK_BYTES)
        skipped += len(piece)
        if not piece or piece.endswith(b"\n"):
            return skipped


def parse_line(line: bytes, lineno: int, unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Document | None:
    """One line's Document, or None (blank, or accounted for in the ledger). Never raises on bad data."""
    if not line.strip():
        return None
    text_line, replaced = decode_utf8(line)
    try:
        record = json.loads(text_line)
    except ValueError as e:  # JSONDecodeError
        intake.quarantine(f"{unit.name}:{lineno}", unit.source, f"read:bad_json: line {lineno}: {e}", lineno, len(line))
        return None
    except RecursionError:  # `[[[[...` thousands deep exhausts the C scanner's recursion limit
        intake.quarantine(
            f"{unit.name}:{lineno}", unit.source, f"read:bad_json: line {lineno}: nested too deeply", lineno, len(line)
        )
        return None
    if not isinstance(record, dict):
        intake.quarantine(
            f"{unit.name}:{lineno}",
            unit.source,
            f"read:bad_record: line {lineno} is a JSON {type(record).__name__}, not an object",
            lineno,
            len(line),
        )
        return None
    text, id_value, meta, url = (
        record.get(cfg.text_field, MISSING),
        record.get(cfg.id_field),
        record.get("meta", record.get("metadata")),
        record.get("url"),
    )
    source_value = record.get(cfg.source_field)
    if _SURROGATE_ESCAPE.search(text_line):
        if isinstance(text, str):
            text, had = scrub_surrogates(text)
            replaced = replaced or had
        # meta is scrubbed with the rest of its conversion to JSON-safe values (records.json_value)
        id_value, url, source_value = scrub_value(id_value), scrub_value(url), scrub_value(source_value)
    return record_document(intake, unit, cfg, "line", lineno, text, id_value, source_value, meta, replaced, url)
