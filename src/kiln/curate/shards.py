"""Curated shards: JSON lines compressed with zstd (`<source>-<index>.jsonl.zst`).

Each line is one Document as `{"id", "text", "source", "meta"}`. Writers write to a temporary
name and rename on close, so a shard either exists whole or not at all. Not handled here:
Parquet output (a later option).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

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
        self._zst.write(json.dumps(doc.to_json(), ensure_ascii=False).encode("utf-8") + b"\n")
        self.docs += 1

    def close(self) -> None:
        self._zst.close()
        self._raw.close()
        os.replace(self._tmp, self.path)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:  # leave no half-written shard behind
            self._zst.close()
            self._raw.close()
            self._tmp.unlink(missing_ok=True)


def read_shard(path: Path) -> Iterator[Document]:
    with open(path, "rb") as raw:
        text = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), encoding="utf-8")
        for lineno, line in enumerate(text, 1):
            try:
                yield Document.from_json(json.loads(line))
            except (json.JSONDecodeError, KeyError) as e:
                raise FatalError(f"{path}:{lineno}: not a kiln document line ({e}); the shard is corrupt, redo curate with --force") from None


def list_shards(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*" + SUFFIX))


def shard_source(path: Path) -> str:
    """`code-00003.jsonl.zst` -> `code`."""
    return Path(path).name.removesuffix(SUFFIX).rsplit("-", 1)[0]
