"""Token shards: a flat `.bin` of token ids and an `.idx` of document boundaries.

`.bin` is raw little-endian uint16 (vocab <= 65536) or uint32, read with numpy.memmap.
`.idx` is a 48-byte header then n_docs + 1 uint64 offsets (in tokens) into the `.bin`:

    magic b"KILNIDX\\0" | version u32 | itemsize u32 | n_docs u64 | n_tokens u64 | xxh64 of .bin u64 | reserved u64

Each document's span ends with its end-of-document token. Opening checks the `.bin` length
against the header (and, with verify=True, the checksum), so a truncated or mismatched pair
fails loudly instead of being read as garbage.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import xxhash

from kiln.core.errors import FatalError

MAGIC = b"KILNIDX\x00"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQQ")


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class TokenShardWriter:
    """Append documents (already ending in end-of-document) and finalize the pair atomically."""

    def __init__(self, prefix: Path, vocab_size: int):
        self.prefix = Path(prefix)
        self.dtype = dtype_for(vocab_size)
        self.vocab_size = vocab_size
        self._bin_tmp = self.prefix.with_suffix(".bin.tmp")
        self._bin = open(self._bin_tmp, "wb")
        self._hash = xxhash.xxh64()
        self.offsets = [0]

    def add(self, ids: list[int]) -> None:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.max() >= self.vocab_size or arr.min() < 0):
            raise FatalError(f"{self.prefix}: token id {int(arr.max())} outside vocab of {self.vocab_size}; the tokenizer and the shard disagree")
        data = arr.astype(self.dtype).tobytes()
        self._bin.write(data)
        self._hash.update(data)
        self.offsets.append(self.offsets[-1] + arr.size)

    def close(self) -> None:
        self._bin.close()
        os.replace(self._bin_tmp, self.prefix.with_suffix(".bin"))
        header = HEADER.pack(MAGIC, VERSION, self.dtype.itemsize, len(self.offsets) - 1, self.offsets[-1], self._hash.intdigest(), 0)
        tmp = self.prefix.with_suffix(".idx.tmp")
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(np.asarray(self.offsets, dtype=np.uint64).tobytes())
        os.replace(tmp, self.prefix.with_suffix(".idx"))  # the .idx appears last: its presence means the pair is whole

    @property
    def n_tokens(self) -> int:
        return self.offsets[-1]


class TokenShard:
    """A read-only view: `tokens` is a memmap, `offsets[i]:offsets[i+1]` is document i."""

    def __init__(self, prefix: Path, verify: bool = False):
        self.prefix = Path(prefix)
        idx, bin_path = self.prefix.with_suffix(".idx"), self.prefix.with_suffix(".bin")
        if not idx.is_file() or not bin_path.is_file():
            raise FatalError(f"{self.prefix}: .bin/.idx pair incomplete; rerun `kiln tokenize --force`")
        raw = idx.read_bytes()
        if len(raw) < HEADER.size:
            raise FatalError(f"{idx}: shorter than its header; corrupt, rerun `kiln tokenize --force`")
        magic, version, itemsize, n_docs, n_tokens, checksum, _ = HEADER.unpack_from(raw)
        if magic != MAGIC or version != VERSION:
            raise FatalError(f"{idx}: not a kiln token index v{VERSION} (magic {magic!r}, version {version})")
        if len(raw) != HEADER.size + 8 * (n_docs + 1):
            raise FatalError(f"{idx}: holds {len(raw)} bytes, expected {HEADER.size + 8 * (n_docs + 1)} for {n_docs} documents; corrupt")
        if bin_path.stat().st_size != n_tokens * itemsize:
            raise FatalError(f"{bin_path}: {bin_path.stat().st_size} bytes, but its index says {n_tokens} tokens of {itemsize} bytes; the pair does not match")
        self.dtype = np.dtype(np.uint16 if itemsize == 2 else np.uint32)
        self.offsets = np.frombuffer(raw, dtype=np.uint64, offset=HEADER.size)
        self.n_docs, self.n_tokens, self.checksum = n_docs, n_tokens, checksum
        # subtle: np.memmap cannot map an empty file; an empty shard is a valid zero-length array.
        self.tokens = np.memmap(bin_path, dtype=self.dtype, mode="r") if n_tokens else np.zeros(0, dtype=self.dtype)
        if verify and self._checksum() != checksum:
            raise FatalError(f"{bin_path}: checksum does not match its index; the file was modified or damaged")

    def _checksum(self, chunk_tokens: int = 1 << 24) -> int:
        """xxh64 of the .bin, read in chunks so memory stays flat whatever the shard's size."""
        h = xxhash.xxh64()
        for start in range(0, len(self.tokens), chunk_tokens):
            h.update(np.ascontiguousarray(self.tokens[start : start + chunk_tokens]).tobytes())
        return h.intdigest()

    def __len__(self) -> int:
        return int(self.n_tokens)

    def document(self, i: int) -> np.ndarray:
        return self.tokens[int(self.offsets[i]) : int(self.offsets[i + 1])]


def open_split(tokenize_dir: Path, split: str, verify: bool = False) -> dict[str, TokenShard]:
    """{source: shard} for one split ("train" or "val") of a finished tokenize stage."""
    found = {p.parent.name: TokenShard(p.with_suffix(""), verify=verify) for p in sorted(Path(tokenize_dir).glob(f"*/{split}.idx"))}
    if not found:
        raise FatalError(f"{tokenize_dir}: no {split} token shards; run `kiln tokenize` first")
    return found
