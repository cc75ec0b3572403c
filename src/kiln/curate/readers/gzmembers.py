"""A gzip file read member by member, knowing where in the file each decompressed byte came from.

A .warc.gz is normally one gzip member per record, so a member's compressed offset names a record
and lets a reader skip a damaged member. Some tools (`gzip -c crawl.warc`) compress the whole file
as one member instead; then records share a member, and only a (member offset, offset inside the
decompressed member) pair names one. `GzipMembers` is a file-like stream of the decompressed bytes
(`read`, `tell`) that keeps that map, so a parser fed through it (fastwarc) reports uncompressed
positions that `member_at` turns into stable names, and `compressed_at` into bytes on disk.

It never raises on bad data: a corrupt or truncated member, or bytes that are not a gzip member,
end the stream (`read` returns b"") with `error` set and `error_offset` naming the member (or
the stray bytes) in the file, so the caller can account for it and resume at the next member.
Not handled here: multi-member streams of other codecs; finding the next member (warc.py scans).
"""

from __future__ import annotations

import bisect
import zlib
from typing import BinaryIO

CHUNK_BYTES = 1 << 16  # compressed bytes read at a time
DEFAULT_READ_BYTES = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
PADDING = b"\r\n\x00"  # what may follow the last member (WARC writers pad records with CRLF CRLF)


class GzipMembers:
    def __init__(self, raw: BinaryIO, start: int = 0):
        raw.seek(start)
        self.raw = raw
        self.cpos = start  # file offset of pending[0]: the next compressed byte not yet inflated
        self.upos = 0  # decompressed bytes produced so far (what tell() says)
        self.pending = b""
        self.inflater = None  # the open member's decompressor; None between members
        self.member_u: list[int] = []  # decompressed offset where each member starts (sorted)
        self.member_c: list[int] = []  # ... and its offset in the file
        self.check_u: list[int] = []  # after each inflate call: decompressed bytes produced so far
        self.check_c: list[int] = []  # ... and the file offset consumed by then
        self.finished = False  # no more bytes will come: a clean end or an error
        self.error: str | None = None
        self.error_offset: int | None = None  # file offset of the bad member (or stray bytes)
        self.error_upos: int | None = None  # decompressed offset from which bytes are not trustworthy

    def tell(self) -> int:
        return self.upos

    def read(self, n: int | None = -1) -> bytes:
        limit = DEFAULT_READ_BYTES if n is None or n < 0 else n
        out: list[bytes] = []
        got = 0
        while got < limit and not self.finished:
            if self.inflater is None and not self._open_member():
                break
            if not self.pending:
                self.pending = self.raw.read(CHUNK_BYTES)
                if not self.pending:
                    self._fail("truncated gzip member (the file ends inside it)")
                    break
            try:
                piece = self.inflater.decompress(self.pending, limit - got)
            except zlib.error as e:
                self._fail(f"corrupt gzip member: {e}")
                break
            rest = self.inflater.unused_data if self.inflater.eof else self.inflater.unconsumed_tail
            self.cpos += len(self.pending) - len(rest)
            self.pending = rest
            if piece:
                out.append(piece)
                got += len(piece)
                self.upos += len(piece)
                self.check_u.append(self.upos)
                self.check_c.append(self.cpos)
            if self.inflater.eof:
                self.inflater = None
        return b"".join(out)

    def member_at(self, upos: int) -> tuple[int, int]:
        """(file offset of the member holding decompressed byte `upos`, offset of `upos` inside it)."""
        i = bisect.bisect_right(self.member_u, upos) - 1
        assert i >= 0, f"decompressed offset {upos} precedes the first member"
        return self.member_c[i], upos - self.member_u[i]

    def compressed_at(self, upos: int) -> int:
        """About where in the file decompressed byte `upos` came from (at most one chunk late).

        Deterministic for a given file: it depends only on CHUNK_BYTES and the read sizes.
        """
        i = bisect.bisect_right(self.check_u, upos)
        return self.check_c[i] if i < len(self.check_c) else self.cpos

    def forget_before(self, upos: int) -> None:
        """Drop map entries no later position can need (keeps memory flat on million-record files)."""
        i = bisect.bisect_right(self.member_u, upos) - 1
        if i > 1024:
            del self.member_u[:i], self.member_c[:i]
        j = bisect.bisect_right(self.check_u, upos)
        if j > 1024:
            del self.check_u[:j], self.check_c[:j]

    def _open_member(self) -> bool:
        """Start the member at cpos; False at a clean end of file or after recording an error."""
        while len(self.pending) < len(GZIP_MAGIC):
            more = self.raw.read(CHUNK_BYTES)
            if not more:
                break
            self.pending += more
        if not self.pending:
            self.finished = True
            return False
        if not self.pending.startswith(GZIP_MAGIC):
            if self._only_padding_left():
                self.finished = True
                return False
            self._fail(f"no gzip member at byte {self.cpos}")
            return False
        self.inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # exactly one gzip member
        self.member_u.append(self.upos)
        self.member_c.append(self.cpos)
        return True

    def _only_padding_left(self) -> bool:
        data = self.pending
        while True:
            if data.strip(PADDING):
                return False
            data = self.raw.read(CHUNK_BYTES)
            if not data:
                return True

    def _fail(self, message: str) -> None:
        in_member = self.inflater is not None
        self.error = message
        self.error_offset = self.member_c[-1] if in_member else self.cpos
        self.error_upos = self.member_u[-1] if in_member else self.upos
        self.finished = True
        self.inflater = None
