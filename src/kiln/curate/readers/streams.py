"""Opening an input file as a buffered stream of decompressed bytes (.gz and .zst by suffix).

The stream supports `readline(limit)` and `read(n)`, so every reader can bound what it holds in
memory whatever the file's size; `raw` is the file on disk, whose position says how far the
compressed input has been read (the input cap's budget counts bytes on disk). Not handled here:
compressed formats other than gzip and zstd, or compression detected from content.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

from kiln.core.storage import open_read

BUFFER_BYTES = 1 << 20  # large reads: the decompressors and json both go faster per call
# What reading a damaged file raises: truncated or corrupt gzip/zstd data, or the disk itself.
STREAM_ERRORS = (OSError, EOFError, zlib.error, zstandard.ZstdError)


@dataclass
class Opened:
    stream: BinaryIO  # decompressed bytes
    raw: BinaryIO  # the file on disk


@contextmanager
def open_decompressed(path: str) -> Generator[Opened, None, None]:
    with open_read(path, BUFFER_BYTES) as raw:  # a local file, or an object of a store read in ranges
        lower = path.lower()
        if lower.endswith(".gz"):
            yield Opened(gzip.GzipFile(fileobj=raw, mode="rb"), raw)
        elif lower.endswith(".zst"):
            # read_across_frames: files written as several zstd frames (concatenated, or by
            # parallel compressors) must read to the end, not stop after the first frame.
            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_size=BUFFER_BYTES, read_across_frames=True)
            yield Opened(io.BufferedReader(_CheckedEnd(reader, path), BUFFER_BYTES), raw)
        else:
            yield Opened(raw, raw)


class _CheckedEnd(io.RawIOBase):
    """A zstd stream that raises EOFError at its end when the file's last frame is incomplete.

    subtle: python-zstandard's stream_reader ends quietly on a truncated file (measured with
    zstandard 0.25: a frame cut short reads as fewer bytes, no error), so a half-copied .zst
    would silently lose its tail. Walking the frame headers at the end costs one seek per block.
    """

    def __init__(self, reader: BinaryIO, path: str):
        self.reader, self.path, self.checked = reader, path, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.reader.readinto(buffer)
        if n == 0 and not self.checked:
            self.checked = True
            check_zstd_frames(self.path)
        return n


def check_zstd_frames(path: str) -> None:
    """Raise EOFError naming the offset when the file does not end on a complete zstd frame."""
    with open_read(path) as f:
        size = f.seek(0, io.SEEK_END)
        pos = 0
        while pos < size:
            f.seek(pos)
            magic = int.from_bytes(f.read(4), "little")
            if 0x184D2A50 <= magic <= 0x184D2A5F:  # a skippable frame: 4-byte length, then data
                pos += 8 + int.from_bytes(f.read(4), "little")
                continue
            if magic != 0xFD2FB528:
                raise EOFError(f"not a zstd frame at byte {pos} of {path}")
            descriptor = f.read(1)[0]
            fcs_flag, single_segment, has_checksum, dict_flag = (
                descriptor >> 6,
                (descriptor >> 5) & 1,
                (descriptor >> 2) & 1,
                descriptor & 3,
            )
            header = (
                1
                + (0 if single_segment else 1)
                + (0, 1, 2, 4)[dict_flag]
                + ((1 if single_segment else 0), 2, 4, 8)[fcs_flag]
            )
            block = pos + 4 + header
            while True:
                f.seek(block)
                raw_header = f.read(3)
                if len(raw_header) < 3:
                    raise EOFError(f"truncated zstd frame starting at byte {pos} of {path}")
                bits = int.from_bytes(raw_header, "little")
                block_type, block_size = (bits >> 1) & 3, bits >> 3
                block += 3 + (1 if block_type == 1 else block_size)  # an RLE block stores one byte
                if bits & 1:
                    break
            pos = block + (4 if has_checksum else 0)
        if pos > size:
            raise EOFError(f"truncated zstd frame at the end of {path} ({size} bytes, {pos} expected)")


def read_prefix(path: str, limit: int) -> bytes:
    """At most `limit` decompressed bytes from the start of the file."""
    with open_decompressed(path) as opened:
        return opened.stream.read(limit)
