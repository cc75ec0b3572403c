"""Curated shards: JSON lines compressed with zstd (`<source>-<index>.jsonl.zst`).

Each line is one Document as `{"id", "text", "source", "meta"}`. Writers write to a temporary
name and rename on close, so a shard either exists whole or not at all. The three strings are
encoded by orjson (3x faster than json.dumps on long texts); meta goes through json.dumps, so
its values (NaN, integers past 64 bits) round-trip exactly as the json module reads them. A
document whose line is copied unchanged (the write phase drops documents, it never edits them)
is written from its bytes as read. Not handled here: Parquet output (a later option).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import orjson
import zstandard

from kiln.core.document import Document
from kiln.core.errors import FatalError

SUFFIX = ".jsonl.zst"


class ShardWriter:
    def __init__(self, path: Path, level: int = 3):
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._raw = open(self._tmp, "wb")
        self._zst = zstandard.ZstdCompressor(level=level).stream_writer(self._raw, closefd=False)
        self.docs = 0

    def write(self, doc: Document) -> None:
        self.write_line(encode_line(doc))

    def write_line(self, line: bytes) -> None:
        """One document's line as read_shard_lines gave it (ending in a newline)."""
        self._zst.write(line)
        self.docs += 1

    def close(self) -> None:
        self._zst.close()
        self._raw.close()
        os.replace(self._tmp, self.path)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # leave no half-written shard behind
            self._zst.close()
            self._raw.close()
            self._tmp.unlink(missing_ok=True)


def encode_line(doc: Document) -> bytes:
    meta = json.dumps(doc.meta, ensure_ascii=False).encode("utf-8")
    return (
        b'{"id":'
        + orjson.dumps(doc.id)
        + b',"text":'
        + orjson.dumps(doc.text)
        + b',"source":'
        + orjson.dumps(doc.source)
        + b',"meta":'
        + meta
        + b"}\n"
    )


def read_shard(path: Path) -> Iterator[Document]:
    for doc, _ in read_shard_lines(path):
        yield doc


def read_shard_lines(path: Path) -> Iterator[tuple[Document, bytes]]:
    """Each document of a shard with its line's bytes."""
    with open(path, "rb") as raw:
        lines = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))
        for lineno, line in enumerate(lines, 1):
            try:
                yield Document.from_json(json.loads(line)), line
            except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                raise FatalError(
                    f"{path}:{lineno}: not a kiln document line ({e}); the shard is corrupt, redo curate with --force"
                ) from None


def list_shards(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*" + SUFFIX))


def shard_source(path: Path) -> str:
    """`code-00003.jsonl.zst` -> `code`."""
    return Path(path).name.removesuffix(SUFFIX).rsplit("-", 1)[0]
