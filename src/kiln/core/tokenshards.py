"""Token shards: a flat `.bin` of token ids and an `.idx` of document boundaries.

`.bin` is raw little-endian uint16 (vocab <= 65536) or uint32, read with numpy.memmap.
`.idx` is a 48-byte header then n_docs + 1 uint64 offsets (in tokens) into the `.bin`:

    magic b"KILNIDX\\0" | version u32 | itemsize u32 | n_docs u64 | n_tokens u64 | xxh64 of .bin u64 | xxh64 of the
    offsets u64

Each document's span ends with its end-of-document token. Beside the pair, `.scores.npy` holds
one float32 row per document with the curation scores a curriculum can order by (DOC_SCORES,
NaN where curation did not score the document). Opening checks the `.bin` length
against the header and the checksum (xxh64 reads about 10 GB/s; `verify=False` skips it for a
pair just checked), so a truncated, mismatched or damaged pair fails loudly instead of being
read as garbage. The tokenize manifest counts each split's documents, tokens and bytes per source and
per language (`split_languages` reads the tokens).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import xxhash

from kiln.core.errors import FatalError
from kiln.core.manifest import read_manifest

MAGIC = b"KILNIDX\x00"
VERSION = 2  # v2: the last header field checksums the offsets (v1 left it zero)
HEADER = struct.Struct("<8sIIQQQQ")


UINT16_IDS = 2**16
# Per-document scores carried from the curated documents' meta, in column order.
DOC_SCORES = ("quality_score", "perplexity", "language_score")
SCORES_SUFFIX = ".scores.npy"


def dtype_for(vocab_size: int, requested: str = "auto") -> np.dtype:
    """uint16 when every id fits (vocab up to 65,536) unless uint32 is asked for; FatalError if uint16 cannot hold the
    vocabulary."""
    if requested == "uint16" and vocab_size > UINT16_IDS:
        raise FatalError(
            f"tokenize.dtype is uint16, but the vocabulary has {vocab_size:,} ids (uint16 holds 65,536); set "
            "tokenize.dtype=uint32 (or auto)"
        )
    if requested == "uint32" or vocab_size > UINT16_IDS:
        return np.dtype(np.uint32)
    return np.dtype(np.uint16)


class TokenShardWriter:
    """Append documents (already ending in end-of-document) and finalize the pair atomically.

    Offsets go to the index file as they come, so memory does not grow with the shard.
    """

    def __init__(self, prefix: Path, vocab_size: int, dtype: np.dtype | None = None):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype) if dtype is not None else dtype_for(vocab_size)
        if self.dtype == np.uint16 and vocab_size > UINT16_IDS:
            raise FatalError(
                f"{self.prefix}: a uint16 shard cannot hold a vocabulary of {vocab_size:,} ids; use uint32 "
                "(tokenize.dtype=auto or uint32)"
            )
        self.vocab_size = vocab_size
        self._bin_tmp, self._idx_tmp = self.prefix.with_suffix(".bin.tmp"), self.prefix.with_suffix(".idx.tmp")
        self._bin = open(self._bin_tmp, "wb")
        self._idx = open(self._idx_tmp, "wb")
        self._idx.write(bytes(HEADER.size))  # filled in by close()
        self._hash, self._offsets_hash = xxhash.xxh64(), xxhash.xxh64()
        self._write_offset_bytes(np.zeros(1, dtype=np.uint64).tobytes())
        self.n_docs = self.n_tokens = 0

    def add(self, ids: list[int] | np.ndarray) -> None:
        """One document's ids (ending in end-of-document)."""
        arr = np.asarray(ids, dtype=np.int64)
        self.add_many(arr, np.asarray([arr.size], dtype=np.int64))

    def add_many(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Several documents at once: their ids concatenated, and each one's length."""
        if flat.size and self.dtype == np.uint16 and flat.max() >= UINT16_IDS:
            raise FatalError(
                f"{self.prefix}: token id {int(flat.max()):,} does not fit a uint16 shard; the tokenizer has more "
                "ids than this shard's type: set tokenize.dtype=uint32 (or auto) and rerun `kiln tokenize "
                "--force`"
            )
        if flat.size and (flat.max() >= self.vocab_size or flat.min() < 0):
            raise FatalError(
                f"{self.prefix}: token id {int(flat.max() if flat.max() >= self.vocab_size else flat.min())} "
                f"outside vocab of {self.vocab_size}; the tokenizer and the shard disagree"
            )
        assert int(lengths.sum()) == flat.size, "lengths must cover the ids"
        self._write_tokens(flat.astype(self.dtype))
        self._write_offsets(lengths.astype(np.uint64))

    def append(self, shard: TokenShard, chunk_tokens: int = 1 << 24) -> None:
        """Every document of a finished shard of the same type, copied in chunks."""
        if shard.dtype != self.dtype:
            raise FatalError(f"{shard.prefix}: a {shard.dtype} shard cannot be appended to a {self.dtype} one")
        for start in range(0, shard.n_docs, 1 << 20):
            offsets = shard.offsets[start : min(start + (1 << 20), shard.n_docs) + 1].astype(np.uint64)
            lo, hi = int(offsets[0]), int(offsets[-1])
            for a in range(lo, hi, chunk_tokens):
                self._write_tokens(np.asarray(shard.tokens[a : min(a + chunk_tokens, hi)]))
            self._write_offsets(np.diff(offsets))

    def _write_tokens(self, tokens: np.ndarray) -> None:
        data = np.ascontiguousarray(tokens).tobytes()
        self._bin.write(data)
        self._hash.update(data)

    def _write_offsets(self, lengths: np.ndarray) -> None:
        ends = self.n_tokens + np.cumsum(lengths, dtype=np.uint64)
        self._write_offset_bytes(ends.tobytes())
        self.n_docs += len(lengths)
        self.n_tokens = int(ends[-1]) if len(ends) else self.n_tokens

    def _write_offset_bytes(self, data: bytes) -> None:
        self._idx.write(data)
        self._offsets_hash.update(data)

    def close(self) -> None:
        self._bin.close()
        self._idx.seek(0)
        self._idx.write(
            HEADER.pack(
                MAGIC,
                VERSION,
                self.dtype.itemsize,
                self.n_docs,
                self.n_tokens,
                self._hash.intdigest(),
                self._offsets_hash.intdigest(),
            )
        )
        self._idx.close()
        os.replace(self._bin_tmp, self.prefix.with_suffix(".bin"))
        os.replace(
            self._idx_tmp, self.prefix.with_suffix(".idx")
        )  # the .idx appears last: its presence means the pair is whole


class TokenShard:
    """A read-only view: `tokens` is a memmap, `offsets[i]:offsets[i+1]` is document i."""

    def __init__(self, prefix: Path, verify: bool = True):
        self.prefix = Path(prefix)
        idx, bin_path = self.prefix.with_suffix(".idx"), self.prefix.with_suffix(".bin")
        if not idx.is_file() or not bin_path.is_file():
            raise FatalError(f"{self.prefix}: .bin/.idx pair incomplete; rerun `kiln tokenize --force`")
        with open(idx, "rb") as f:
            head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise FatalError(f"{idx}: shorter than its header; corrupt, rerun `kiln tokenize --force`")
        magic, version, itemsize, n_docs, n_tokens, checksum, offsets_checksum = HEADER.unpack(head)
        if magic != MAGIC or version != VERSION:
            raise FatalError(
                f"{idx}: not a kiln token index v{VERSION} (magic {magic!r}, version {version}); rerun `kiln "
                "tokenize --force`"
            )
        if idx.stat().st_size != HEADER.size + 8 * (n_docs + 1):
            raise FatalError(
                f"{idx}: holds {idx.stat().st_size} bytes, expected {HEADER.size + 8 * (n_docs + 1)} for {n_docs} "
                "documents; corrupt, rerun `kiln tokenize --force`"
            )
        if itemsize not in (2, 4) or bin_path.stat().st_size != n_tokens * itemsize:
            raise FatalError(
                f"{bin_path}: {bin_path.stat().st_size} bytes, but its index says {n_tokens} tokens of {itemsize} "
                "bytes; the pair does not match, rerun `kiln tokenize --force`"
            )
        self.dtype = np.dtype(np.uint16 if itemsize == 2 else np.uint32)
        # Both files are mapped, not read: opening costs no memory whatever the shard's size.
        self.offsets = np.memmap(idx, dtype=np.uint64, mode="r", offset=HEADER.size, shape=(n_docs + 1,))
        self.n_docs, self.n_tokens, self.checksum = n_docs, n_tokens, checksum
        # subtle: np.memmap cannot map an empty file; an empty shard is a valid zero-length array.
        self.tokens = np.memmap(bin_path, dtype=self.dtype, mode="r") if n_tokens else np.zeros(0, dtype=self.dtype)
        if verify:
            if (
                _xxh64(self.offsets) != offsets_checksum
                or int(self.offsets[0]) != 0
                or int(self.offsets[-1]) != n_tokens
            ):
                raise FatalError(
                    f"{idx}: document offsets do not match their checksum; the index was modified or damaged, "
                    "rerun `kiln tokenize --force`"
                )
            if _xxh64(self.tokens) != checksum:
                raise FatalError(
                    f"{bin_path}: checksum does not match its index; the file was modified or damaged, rerun "
                    "`kiln tokenize --force`"
                )

    def __len__(self) -> int:
        return int(self.n_tokens)

    def document(self, i: int) -> np.ndarray:
        return self.tokens[int(self.offsets[i]) : int(self.offsets[i + 1])]


def doc_scores(meta: dict) -> list[float]:
    """A document's DOC_SCORES row from its meta (NaN for a score it lacks)."""
    return [float(meta[k]) if isinstance(meta.get(k), int | float) else float("nan") for k in DOC_SCORES]


def read_scores(prefix: Path, n_docs: int) -> dict[str, np.ndarray]:
    """{score name: float32 per document} from `<prefix>.scores.npy`."""
    path = Path(prefix).with_suffix(SCORES_SUFFIX)
    table = np.load(path) if path.is_file() else None
    if table is None or table.shape != (n_docs, len(DOC_SCORES)):
        raise FatalError(
            f"{path}: missing or not {n_docs} rows of {len(DOC_SCORES)} scores; rerun `kiln tokenize --force`"
        )
    return {k: table[:, i] for i, k in enumerate(DOC_SCORES)}


def _xxh64(array: np.ndarray, chunk: int = 1 << 24) -> int:
    """xxh64 of an array's bytes, read in chunks so memory stays flat whatever its size."""
    h = xxhash.xxh64()
    for start in range(0, len(array), chunk):
        h.update(np.ascontiguousarray(array[start : start + chunk]).tobytes())
    return h.intdigest()


def open_split(tokenize_dir: Path, split: str, verify: bool = True) -> dict[str, TokenShard]:
    """{source: shard} for one split ("train" or "val") of a finished tokenize stage."""
    found = {
        p.parent.name: TokenShard(p.with_suffix(""), verify=verify)
        for p in sorted(Path(tokenize_dir).glob(f"*/{split}.idx"))
    }
    if not found:
        raise FatalError(f"{tokenize_dir}: no {split} token shards; run `kiln tokenize` first")
    return found


def split_languages(tokenize_dir: Path, split: str) -> dict[str, dict[str, int]] | None:
    """{source: {language: tokens}} of one split, from a finished tokenize stage's manifest (curate's
    meta.language; `code` and `und` for documents without one); None when the stage is not there or
    counted no languages (a kiln before the count), and a source it did not count is left out."""
    try:
        per_source = read_manifest(Path(tokenize_dir))["counts"]["per_source"]
    except (FatalError, KeyError):
        return None
    found = {
        source: {lang: int(v["tokens"]) for lang, v in splits[split]["languages"].items()}
        for source, splits in per_source.items()
        if "languages" in splits.get(split, {})
    }
    return found or None
