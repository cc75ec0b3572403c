"""WARC (.warc, .warc.gz): web pages from crawl archives, parsed with fastwarc.

Documents are `response` records with a 2xx HTTP status and an HTML content type, and
`resource` records with an HTML content type (both go through main-text extraction), and
`conversion` records of text/plain (already extracted text, as in Common Crawl WET files).
Every other record (requests, metadata, warcinfo, redirects, images, PDFs) is not a document:
it is skipped without entering the balance, and responses and resources skipped for their
status or type are counted as `read:warc_skipped`.

Ids are `<source>/<relpath>@<position>`, unique in a file and stable:
- .warc: the record's byte offset;
- .warc.gz written the usual way, one gzip member per record: the member's byte offset in the
  compressed file;
- .warc.gz with several records in one member (`gzip -c crawl.warc` makes a single member):
  `<member offset>+<offset of the record inside the decompressed member>`, e.g. `@0+3042`; the
  first record of a member keeps the plain `@<member offset>`.
`meta["offset"]` is the record's (or its member's) byte offset, plus `meta["offset_in_member"]`
for a record that does not start its member. .warc.gz files are decompressed member by member
in Python (gzmembers.py) and fed to fastwarc, because fastwarc's own positions are only exact
at member starts (fastwarc 2.0.1 gives every later record of a member one buffer position).

A record read whole whose document cannot be built (an error the page code did not quarantine
itself) is quarantined at its own position, and reading goes on with the next record. A
malformed record is quarantined with its position and the reader resynchronises: it scans for
the next record start (`WARC/1.` uncompressed, the next gzip member compressed) and goes on; in
a .warc.gz the rest of the damaged record's member is part of that quarantine entry. A truncated
or corrupt member is quarantined as one entry at its offset; in a single-member file the records
fastwarc had already handed over before the damage (up to its 64 KB read-ahead) are kept. An
uncompressed record cut inside its body (its Content-Length reaches past the file's end) is
quarantined, not read as a shorter page.
Not handled here: WARC files compressed with zstd.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from kiln.core.document import Document
from kiln.core.storage import open_read
from kiln.curate.readers.config import InputConfig
from kiln.curate.readers.decode import decode_utf8
from kiln.curate.readers.gzmembers import GzipMembers
from kiln.curate.readers.intake import Intake
from kiln.curate.readers.page import flush_pages, submit_page
from kiln.curate.readers.task import ReadUnit

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
SCAN_BYTES = 1 << 20
# A WARC header block fits in this; a record whose header and Content-Length could reach past the
# file's end within it gets its end checked (fastwarc passes a truncated last record off as whole).
HEADER_BYTES = 1 << 16
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Place:
    """Where a record is: its byte offset (or its gzip member's) and its offset inside the member."""

    offset: int
    in_member: int = 0

    @property
    def position(self) -> int | str:
        return self.offset if not self.in_member else f"{self.offset}+{self.in_member}"

    def doc_id(self, unit: ReadUnit) -> str:
        return f"{unit.name}@{self.position}"

    def describe(self) -> str:
        return (
            f"byte {self.offset}"
            if not self.in_member
            else f"byte {self.in_member} of the gzip member at byte {self.offset}"
        )


def read_warc(unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Iterator[Document]:
    if unit.path.lower().endswith(".gz"):
        return _read_gzipped(unit, cfg, intake)
    return _read_plain(unit, cfg, intake)


def _read_plain(unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Iterator[Document]:
    from fastwarc.warc import ArchiveIterator

    last = -1  # offset of the last record seen (any type); records at or before it are never read twice
    start: int | None = 0
    size = unit.size
    with (
        open_read(unit.path) as f,
        open_read(unit.path) as probe,
    ):  # probe: reads headers without moving fastwarc's stream
        while start is not None:
            f.seek(start)
            resume_after = None
            try:
                # every record type, not just documents: the end of the last record seen is
                # where an unreadable tail would start
                for record in ArchiveIterator(f, parse_http=True, auto_decode="all"):
                    offset = record.stream_pos  # absolute: fastwarc starts counting at the file's position
                    if offset <= last:
                        continue
                    if unit.max_bytes is not None and offset >= unit.max_bytes:
                        return  # the input cap's budget: a prefix of the file
                    last = offset
                    place = Place(offset)
                    if _is_junk(record):
                        _quarantine_junk(unit, intake, place, gz=False)
                        resume_after = offset
                        break
                    # subtle: fastwarc hands over a record cut inside its body as if it were whole;
                    # its Content-Length says where it must end.
                    if (
                        offset + record.content_length + HEADER_BYTES > size
                        and (end := record_end(probe, offset, HEADER_BYTES)) is not None
                        and end - 4 > size
                    ):
                        intake.quarantine(
                            place.doc_id(unit),
                            unit.source,
                            (
                                f"read:bad_record: WARC record at byte {offset} is truncated: its Content-Length "
                                f"reaches byte {end - 4}, the file ends at byte {size}"
                            ),
                            place.position,
                        )
                        return
                    try:
                        found = _payload(record, place, unit, intake)
                    except Exception as e:  # noqa: BLE001 - its payload could not be read: this record is broken
                        _quarantine_unreadable(unit, intake, place, e, gz=False)
                        resume_after = offset
                        break
                    if found is not None:
                        yield from _record_documents(found, place, unit, cfg, intake)
                else:
                    # subtle: fastwarc ends quietly on a truncated record (measured with fastwarc
                    # 2.0.1), so a clean end must also be the file's end.
                    end = record_end(f, last) if last >= start else start
                    if end is not None and not _only_padding(f, end):
                        intake.quarantine(
                            f"{unit.name}@{end}",
                            unit.source,
                            f"read:bad_record: unreadable data at byte {end} (truncated or corrupt record)",
                            end,
                        )
                        resume_after = end
            except Exception as e:  # noqa: BLE001 - what follows the last good record does not parse
                end = record_end(f, last) if last >= start else start
                bad = end if end is not None else last + 1
                intake.quarantine(
                    f"{unit.name}@{bad}",
                    unit.source,
                    f"read:bad_record: no valid WARC record at byte {bad}: {type(e).__name__}: {e}",
                    bad,
                )
                resume_after = bad
            start = None if resume_after is None else next_record_start(f, resume_after + 1, gz=False)


def _read_gzipped(unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Iterator[Document]:
    from fastwarc.warc import ArchiveIterator

    start: int | None = 0
    with open_read(unit.path) as f:
        while start is not None:
            stream = GzipMembers(f, start)
            resume_after = None  # a member offset: go on at the next member after it
            last: Place | None = None
            try:
                for record in ArchiveIterator(stream, parse_http=True, auto_decode="all"):
                    upos = record.stream_pos  # decompressed offset in this stream
                    if stream.error is not None and upos >= stream.error_upos:
                        break  # from the damaged member: its quarantine entry, below, covers it
                    place = Place(*stream.member_at(upos))
                    stream.forget_before(upos)
                    disk = place.offset if not place.in_member else stream.compressed_at(upos)
                    if unit.max_bytes is not None and disk >= unit.max_bytes:
                        return  # the input cap's budget: a prefix of the file
                    last = place
                    if _is_junk(record):
                        _quarantine_junk(unit, intake, place, gz=True)
                        resume_after = place.offset
                        break
                    try:
                        found = _payload(record, place, unit, intake)
                    except Exception as e:  # noqa: BLE001 - its payload could not be read: this record is broken
                        _quarantine_unreadable(unit, intake, place, e, gz=True)
                        resume_after = place.offset
                        break
                    if stream.error is not None and upos >= stream.error_upos:
                        break  # reading the payload ran into the damage: the record is cut short
                    if found is not None:
                        yield from _record_documents(found, place, unit, cfg, intake)
            except Exception as e:  # noqa: BLE001 - fastwarc refused the decompressed bytes
                if stream.error is None:
                    bad = _after(last, stream, start)
                    intake.quarantine(
                        bad.doc_id(unit),
                        unit.source,
                        f"read:bad_record: no valid WARC record at {bad.describe()}: {type(e).__name__}: {e}",
                        bad.position,
                    )
                    resume_after = bad.offset
            if resume_after is None and stream.error is not None:
                bad = Place(stream.error_offset)
                intake.quarantine(
                    bad.doc_id(unit),
                    unit.source,
                    (
                        f"read:bad_record: unreadable data at byte {bad.offset}: {stream.error} (truncated or corrupt "
                        "record)"
                    ),
                    bad.position,
                )
                resume_after = bad.offset
            elif resume_after is None and not stream.finished:
                # subtle: fastwarc stopped before the end of the decompressed data (garbage it
                # does not take for a record); never let the rest of the file go unaccounted.
                bad = _after(last, stream, start)
                intake.quarantine(
                    bad.doc_id(unit),
                    unit.source,
                    f"read:bad_record: unreadable data at {bad.describe()} (not a WARC record)",
                    bad.position,
                )
                resume_after = bad.offset
            start = None if resume_after is None else next_record_start(f, resume_after + 1, gz=True)


def _after(last: Place | None, stream: GzipMembers, start: int) -> Place:
    """Where unreadable data begins in a gzipped stream: the member after the last good record's."""
    if last is None:
        return Place(start)
    later = [c for c in stream.member_c if c > last.offset]
    if later:
        return Place(later[0])
    return Place(last.offset, stream.tell() - stream.member_u[-1] if stream.member_u else 0)


def _is_junk(record) -> bool:
    # fastwarc passes a header block of junk off as a record; both headers are mandatory
    return record.headers.get("WARC-Type") is None or record.headers.get("Content-Length") is None


def _quarantine_junk(unit: ReadUnit, intake: Intake, place: Place, gz: bool) -> None:
    rest = "; the rest of its gzip member is not read" if gz else ""
    intake.quarantine(
        place.doc_id(unit),
        unit.source,
        f"read:bad_record: WARC record at {place.describe()} lacks WARC-Type or Content-Length{rest}",
        place.position,
    )


def _quarantine_unreadable(unit: ReadUnit, intake: Intake, place: Place, e: Exception, gz: bool) -> None:
    rest = "; the rest of its gzip member is not read" if gz else ""
    intake.quarantine(
        place.doc_id(unit),
        unit.source,
        f"read:bad_record: WARC record at {place.describe()}: {type(e).__name__}: {e}{rest}",
        place.position,
    )


def _only_padding(f: BinaryIO, pos: int) -> bool:
    """Whether nothing but line breaks follows `pos` (records are separated by CRLF CRLF)."""
    f.seek(pos)
    while chunk := f.read(SCAN_BYTES):
        if chunk.strip(b"\r\n"):
            return False
    return True


@dataclass
class Payload:
    body: bytes
    plain: bool  # already text (a conversion record), else HTML
    charset: str | None
    content_length: int  # the record's, for the ledger when the payload is too large
    meta: dict[str, Any]


def _payload(record, place: Place, unit: ReadUnit, intake: Intake) -> Payload | None:
    """A document record's payload (at most the cap, plus one byte); None when it is not a document."""
    from fastwarc.warc import WarcRecordType

    if record.record_type not in (WarcRecordType.response, WarcRecordType.resource, WarcRecordType.conversion):
        return None
    headers = record.headers
    if record.record_type == WarcRecordType.response:
        http = record.http_headers
        status = http.status_code if http is not None else None
        html, charset = (record.http_content_type or "").lower() in HTML_TYPES, record.http_charset
        if status is None or not 200 <= status < 300 or not html:
            intake.ledger.count(unit.source, "read:warc_skipped")
            return None
        plain = False
    else:
        content_type = (headers.get("Content-Type") or "").lower()
        mime = content_type.split(";")[0].strip()
        plain = record.record_type == WarcRecordType.conversion
        if (plain and mime != "text/plain") or (not plain and mime not in HTML_TYPES):
            intake.ledger.count(unit.source, "read:warc_skipped")
            return None
        charset = content_type.partition("charset=")[2].strip(" \"'") or None
    cap = intake.limits.max_doc_bytes if plain else intake.limits.html_bytes
    body = record.reader.read(cap + 1)  # never more than the cap, whatever the record's length
    meta = {
        "path": unit.shown_path,
        "offset": place.offset,
        **({"offset_in_member": place.in_member} if place.in_member else {}),
    }
    meta |= {
        "url": headers.get("WARC-Target-URI"),
        "warc_date": headers.get("WARC-Date"),
        "warc_record_id": record.record_id,
    }
    return Payload(body, plain, charset, record.content_length, meta)


def _record_documents(found: Payload, place: Place, unit: ReadUnit, cfg: InputConfig, intake: Intake) -> list[Document]:
    """`_documents`, with an error while building them quarantined under this record's own place.

    subtle: the record itself was read whole, so the reader goes on with the next record; left to
    the reader's handler, the error would be blamed on the data after this record (the next gzip
    member) and this record would never be counted. The documents are gathered in a list (this
    record's, and those of at most IN_FLIGHT_PAGES earlier pages now done), so those already
    built before the error are still yielded, and none is yielded before the error is known.
    """
    docs: list[Document] = []
    try:
        docs.extend(_documents(found, place, unit, cfg, intake))
    except Exception as e:  # noqa: BLE001 - this record's failure, never the file's
        intake.quarantine(
            place.doc_id(unit),
            unit.source,
            f"read:bad_record: WARC record at {place.describe()}: {type(e).__name__}: {e}",
            place.position,
            found.content_length,
        )
    return docs


def _documents(found: Payload, place: Place, unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Iterator[Document]:
    """The record's Document, and those of earlier pages whose extraction finished (page.py)."""
    doc_id, position = place.doc_id(unit), place.position
    cap = intake.limits.max_doc_bytes if found.plain else intake.limits.html_bytes
    if len(found.body) > cap:
        intake.quarantine(
            doc_id,
            unit.source,
            (
                f"read:too_large: WARC record at {place.describe()} is over {cap} bytes "
                f"({'text' if found.plain else 'HTML'})"
            ),
            position,
            found.content_length,
        )
        return
    if found.plain:
        yield from flush_pages(intake.pages)  # pages before it come first
        text, replaced = decode_utf8(found.body)
        doc = intake.accept(doc_id, text, unit.source, found.meta, position, "read:invalid_utf8" if replaced else None)
        if doc is not None:
            yield doc
        return
    yield from submit_page(intake, doc_id, unit.source, found.body, found.charset, found.meta, position, cfg.extractor)


def record_end(f: BinaryIO, offset: int, scan: int = SCAN_BYTES) -> int | None:
    """Where the uncompressed record at `offset` ends, from its Content-Length (its header block
    within `scan` bytes); None when unknown."""
    try:
        f.seek(offset)
        head = f.read(scan)
        header_end = head.find(b"\r\n\r\n")
        found = _CONTENT_LENGTH.search(head, 0, header_end + 2) if header_end >= 0 else None
        return offset + header_end + 4 + int(found.group(1)) + 4 if found else None
    except OSError:
        return None


def next_record_start(f: BinaryIO, pos: int, gz: bool) -> int | None:
    """The first plausible record start at or after `pos`, or None at the end of the file."""
    marker = b"\x1f\x8b\x08" if gz else b"WARC/1."
    f.seek(pos)
    carry = b""
    while True:
        chunk = f.read(SCAN_BYTES)
        if not chunk:
            return None
        window = carry + chunk
        base = pos - len(carry)
        i = window.find(marker)
        while i >= 0:
            # a gzip header's flag byte has its top three bits clear; this weeds out most
            # accidental matches of the 3-byte magic inside compressed data
            if not gz or (i + 3 < len(window) and window[i + 3] & 0xE0 == 0):
                return base + i
            i = window.find(marker, i + 1)
        carry = window[-(len(marker) + 1) :]
        pos += len(chunk)
