"""Line-level boilerplate removal: lines found in many documents of a source are cut (CCNet).

CCNet (Wenzek et al. 2020, section 3.1) removes lines that repeat across the documents of a
shard group: navigation, cookie notices, share buttons, legal footers. kiln counts, per source,
the documents each normalized line occurs in (a global map phase over all shards, partitioned
by hash), and this step cuts the lines whose count exceeds `max_docs`. A line is normalized
before hashing (width variants and CJK punctuation folded as exact dedup folds them, case folded,
digits to 0, whitespace collapsed, surrounding punctuation and spaces stripped), so "Page 3 of 12"
and "page 4 of 12" count as one line, and so do "ＰＡＧＥ　３。" and "page 3.".
Not handled here: code sources (a repeated `import os` is not boilerplate; the pipeline does not
run this step on code) and lines that repeat inside one document (Gopher repetition rules).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import numpy as np
import xxhash
from pydantic import Field

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.dedup.forms import fold
from kiln.curate.steps.normalize import BLANK_RUNS
from kiln.text.segments import segments

_DIGITS = re.compile(r"\d")
_SPACES = re.compile(r"\s+")
_EDGE = " \t-*•·|>:;,.!?()[]\"'"


class LineDedupConfig(Section):
    enabled: bool = Field(
        default=True,
        description="Cut lines that occur in more than max_docs documents of the same source (prose sources only).",
    )
    max_docs: int = Field(
        default=10,
        ge=1,
        description=(
            "A normalized line found in more documents of one source than this is boilerplate (CCNet removes every "
            "repeated line of a shard group; a count keeps common short sentences in small corpora)."
        ),
    )


def normalize_line(line: str) -> str:
    """The form a line is counted under (DEDUP_KEY_VERSION); an ASCII line's is what it was before the folds."""
    # perf: the ASCII test inline (fold returns such a line as it is): a call saved on each of millions of lines
    return _SPACES.sub(" ", _DIGITS.sub("0", (line if line.isascii() else fold(line)).casefold())).strip(_EDGE)


def line_key(source: str, line: str) -> int:
    """The 64-bit key a normalized line is counted under; the source is part of it (counts are per source)."""
    return xxhash.xxh64_intdigest(f"{source}\x00{line}".encode("utf-8", "surrogatepass"))


def document_line_keys(doc: Document) -> set[int]:
    """The distinct keys of a document's non-empty lines: each document counts a line once."""
    keys = set()
    for line in segments(doc).lines:
        norm = normalize_line(line)
        if norm:
            keys.add(line_key(doc.source, norm))
    return keys


class LineCounts:
    """Documents per line key over one shard task, in sorted numpy arrays (16 bytes per distinct line).

    Keys arrive one document's set at a time into a buffer; every `flush_keys` keys the buffer is
    folded into the sorted (key, count) arrays, so memory follows the number of distinct lines,
    never the number of documents or the bytes read.
    """

    def __init__(self, flush_keys: int = 1 << 20):
        self.flush_keys = flush_keys
        self.keys = np.zeros(0, dtype=np.uint64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._buffer: list[np.ndarray] = []
        self._buffered = 0

    def add(self, keys: set[int]) -> None:
        self._buffer.append(np.fromiter(keys, dtype=np.uint64, count=len(keys)))
        self._buffered += len(keys)
        if self._buffered >= self.flush_keys:
            self._fold()

    def _fold(self) -> None:
        if not self._buffer:
            return
        new_keys, new_counts = np.unique(np.concatenate(self._buffer), return_counts=True)
        self._buffer, self._buffered = [], 0
        keys = np.concatenate([self.keys, new_keys])
        counts = np.concatenate([self.counts, new_counts.astype(np.int64)])
        self.keys, inverse = np.unique(keys, return_inverse=True)
        self.counts = np.bincount(inverse.ravel(), weights=counts, minlength=len(self.keys)).astype(np.int64)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted unique keys (uint64) and the number of documents holding each (int64)."""
        self._fold()
        return self.keys, self.counts


def count_keys(key_sets: Iterable[set[int]], flush_keys: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    counter = LineCounts(flush_keys)
    for keys in key_sets:
        counter.add(keys)
    return counter.result()


class BoilerplateLines:
    """Cuts the lines whose key is in `boilerplate` (keys counted over the whole corpus)."""

    name = "line_dedup"

    def __init__(self, boilerplate: Iterable[int]):
        self.boilerplate = frozenset(int(k) for k in boilerplate)

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            lines = segments(doc).lines
            kept = [
                line
                for line in lines
                if not (norm := normalize_line(line)) or line_key(doc.source, norm) not in self.boilerplate
            ]
            if len(kept) == len(lines):
                yield doc
                continue
            ledger.count(doc.source, "line_dedup:lines_removed", len(lines) - len(kept))
            text = BLANK_RUNS.sub("\n\n", "\n".join(kept)).strip(
                "\n"
            )  # a cut between two paragraphs leaves one empty line
            if text.strip():
                yield doc.with_text(text)
            else:
                ledger.remove(doc, self.name, "all_lines_boilerplate", len(lines), None)
