"""The n-gram index of the evaluation sets that decontamination checks documents against.

Built once per curate run before the filter phase (`build_index`, into a folder), then
memory-mapped by every filter task (`load_index`, cached per process). Words are normalized as
for shingles (lowercased, punctuation and whitespace as breaks); every string value of an item
(or of its named fields) is a separate text, and n-grams never span two texts. Exact mode keeps
each n-gram's hash and where it occurs, and confirms every hash hit against the item's stored
words, so a hash collision never reports a match. Bloom mode keeps one Bloom filter per set: far
smaller, but a hit names only the set (never the item) and is wrong with the filter's
false-positive rate per n-gram looked up.
The index reads its settings through `IndexSettings` (the step's DecontaminateConfig is one), so
this module imports nothing from kiln.curate.steps: the step builds on the index, never the reverse.
Not handled here: what a match does to a document, the step's config and the report
(kiln.curate.steps.decontaminate); scripts written without spaces (see kiln.text.shingles).
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import Field

from kiln.core.atomic import save_npy, write_atomically
from kiln.core.config import Section
from kiln.core.errors import FatalError
from kiln.curate.dedup.bloom import BloomFilter
from kiln.curate.readers.streams import STREAM_ERRORS, open_decompressed
from kiln.text.shingles import SHINGLE_VERSION, ngram_hashes, text_hashes, word_hashes, words

log = logging.getLogger("kiln.curate")

INDEX_FORMAT = "kiln-decontamination-index v1"
# Exact mode's prefilter: one bit per value of a hash's top bits, about PREFILTER_BITS_PER_NGRAM
# bits per n-gram (so ~3% of them set), capped at 2^30 bits (128 MB).
PREFILTER_BITS_PER_NGRAM = 32
_ENTRY = np.dtype([("set", "<i4"), ("item", "<i8"), ("text", "<i4"), ("row", "<i8"), ("pos", "<i4")])


class EvalSetConfig(Section):
    path: str = Field(description="JSONL file of evaluation items, one JSON object per line (.gz and .zst read too).")
    name: str | None = Field(
        None,
        min_length=1,
        description="Name in reasons and reports; None uses the file name without .jsonl/.json/.gz/.zst.",
    )
    fields: tuple[str, ...] = Field(
        (),
        description=(
            "Keys of an item that hold its text; empty uses every string value, inside lists and nested objects too."
        ),
    )


class IndexSettings(Protocol):
    """What build_index reads of curate.decontaminate (kiln.curate.steps.decontaminate.DecontaminateConfig)."""

    @property
    def eval_sets(self) -> tuple[EvalSetConfig, ...]: ...
    @property
    def ngram(self) -> int: ...
    @property
    def mode(self) -> Literal["exact", "bloom"]: ...
    @property
    def bloom_fp_rate(self) -> float: ...
    @property
    def fold_digits(self) -> bool: ...
    @property
    def action(self) -> str: ...  # recorded in index.json for the report, never read by the index


def set_name(es: EvalSetConfig) -> str:
    """The set's name: as configured, else the file name without its .jsonl/.json/.gz/.zst suffixes."""
    if es.name is not None:
        return es.name
    name = Path(es.path).name
    for suffix in (".gz", ".zst", ".jsonl", ".json"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name or "eval"


# --- reading evaluation sets ----------------------------------------------------------------------


def item_texts(record: dict[str, Any], fields: tuple[str, ...]) -> list[str]:
    """The item's texts in document order: the string values under `fields` (all keys when empty),
    found inside lists and nested objects too; keys themselves are never text."""
    out: list[str] = []
    stack: list[Any] = [record[f] for f in reversed(fields) if f in record] if fields else [record]
    # An explicit stack (depth-first, left to right) rather than recursion: deep JSON cannot overflow it.
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            stack.extend(reversed(value))
        elif isinstance(value, dict):
            stack.extend(reversed(list(value.values())))
    return out


def read_eval_set(es: EvalSetConfig) -> Iterator[tuple[int, list[str]]]:
    """(item index, texts) for each non-blank line; bad input raises FatalError naming file and line."""
    path = es.path
    fix = "fix or remove that line, or drop the set from curate.decontaminate.eval_sets"
    try:
        with open_decompressed(path) as opened:
            for index, line in enumerate(opened.stream):
                if not line.strip():
                    continue  # a blank line is no item, but still counts for the indices after it
                where = f"evaluation set {path}, line {index + 1} (item {index})"
                try:
                    record = json.loads(line)
                except ValueError as e:  # JSONDecodeError and UnicodeDecodeError both are
                    raise FatalError(f"curate: {where} is not valid JSON ({e}); {fix}") from None
                if not isinstance(record, dict):
                    raise FatalError(
                        f"curate: {where} is a JSON {type(record).__name__}, not an object; each line must be one "
                        f"item as a JSON object; {fix}"
                    )
                texts = item_texts(record, es.fields)
                if not texts:
                    named = f"fields {list(es.fields)}" if es.fields else "any value"
                    raise FatalError(
                        f"curate: {where} has no text (no string in {named}); set `fields` to the keys holding "
                        f"the item's text, or {fix}"
                    )
                yield index, texts
    except FileNotFoundError:
        raise FatalError(
            f"curate: evaluation set {path} does not exist; check curate.decontaminate.eval_sets[].path (relative "
            "paths are from the working directory)"
        ) from None
    except STREAM_ERRORS as e:
        raise FatalError(
            f"curate: evaluation set {path} could not be read ({e}); check the file, or re-download it"
        ) from None


# --- building the index ---------------------------------------------------------------------------


def build_index(cfg: IndexSettings, folder: Path) -> dict[str, Any]:
    """Read every evaluation set and write the index into `folder` (index.json last, so its presence
    means the rest is whole). Returns the summary that index.json holds: per set items,
    items_too_short (no text of `ngram` words: those cannot be checked), ngrams (distinct), and in
    bloom mode the filter's bits, hashes and false-positive rate. (Whether an index is stale needs
    no hash here: the eval files are inputs of the curate stage, which starts over when one changes.)"""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.json").unlink(missing_ok=True)  # a rebuild that fails halfway leaves no index, never a mixed one
    n = cfg.ngram
    sets: list[dict[str, Any]] = []
    exact = ExactParts()
    for s, es in enumerate(cfg.eval_sets):
        set_hashes, items, too_short_sample, too_short = read_set(s, es, cfg, exact)
        distinct = np.unique(np.concatenate(set_hashes)) if set_hashes else np.zeros(0, dtype=np.uint64)
        if items == 0 or too_short == items:
            what = "holds no item" if items == 0 else f"has no item of {n} words or more (all {items} too short)"
            log.warning(
                (
                    "decontaminate: evaluation set %s %s: nothing in it can be checked, so it removes nothing; check "
                    "the file and its fields"
                ),
                es.path,
                what,
            )
        info: dict[str, Any] = {
            "name": set_name(es),
            "path": es.path,
            "items": items,
            "items_too_short": too_short,
            "too_short_sample": too_short_sample,
            "ngrams": len(distinct),
        }
        if cfg.mode == "bloom":
            bloom = BloomFilter.build(distinct, cfg.bloom_fp_rate)
            save_npy(folder / f"bloom_{s}.npy", bloom.bits)
            info.update(bits=bloom.m, hashes=bloom.k, fp_rate=bloom.fp_rate(len(distinct)))
        else:
            exact.hashes.extend(set_hashes)
        sets.append(info)

    summary: dict[str, Any] = {
        "format": INDEX_FORMAT,
        "shingles": SHINGLE_VERSION,
        "mode": cfg.mode,
        "ngram": n,
        "fold_digits": cfg.fold_digits,
        "action": cfg.action,
        "sets": sets,
    }
    if cfg.mode == "exact":
        summary["prefilter_log2"] = exact.write(folder)
    write_atomically(
        folder / "index.json", lambda p: p.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    )
    return summary


@dataclass
class ExactParts:
    """Exact mode's index as it is read: every set's n-gram hashes, one entry per hash (set, item, text, row,
    position), and each checkable text's normalized words, space-separated (its row)."""

    hashes: list[np.ndarray] = field(default_factory=list)
    entries: list[np.ndarray] = field(default_factory=list)
    rows: list[bytes] = field(default_factory=list)

    def add(self, s: int, item: int, t: int, h: np.ndarray, ws: list[str]) -> None:
        """Text `t` of item `item` of set `s`: its n-gram hashes `h` and its words `ws` (the hashes go in by set)."""
        e = np.zeros(len(h), dtype=_ENTRY)
        e["set"], e["item"], e["text"], e["row"], e["pos"] = s, item, t, len(self.rows), np.arange(len(h))
        self.entries.append(e)
        self.rows.append(" ".join(ws).encode("utf-8", "surrogatepass") + b"\n")

    def write(self, folder: Path) -> int:
        """Write the sorted hashes, their entries, the texts and the prefilter; returns the prefilter's log2 size."""
        hashes = np.concatenate(self.hashes) if self.hashes else np.zeros(0, dtype=np.uint64)
        entries = np.concatenate(self.entries) if self.entries else np.zeros(0, dtype=_ENTRY)
        # Sorted by hash with repeats (one entry per text holding it); within a text only the first
        # occurrence is kept, since every occurrence carries the same words.
        order = np.lexsort((entries["pos"], entries["row"], hashes))
        hashes, entries = hashes[order], entries[order]
        first = np.ones(len(hashes), dtype=bool)
        first[1:] = (hashes[1:] != hashes[:-1]) | (entries["row"][1:] != entries["row"][:-1])
        hashes, entries = hashes[first], entries[first]
        offsets = np.zeros(len(self.rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in self.rows], out=offsets[1:])
        prefilter_log2 = min(30, max(16, math.ceil(math.log2(PREFILTER_BITS_PER_NGRAM * max(1, len(hashes))))))
        on = np.zeros(1 << prefilter_log2, dtype=bool)
        on[hashes >> np.uint64(64 - prefilter_log2)] = True
        save_npy(folder / "prefilter.npy", np.packbits(on, bitorder="little"))
        save_npy(folder / "hashes.npy", hashes)
        save_npy(folder / "entries.npy", entries)
        save_npy(folder / "text_offsets.npy", offsets)
        write_atomically(folder / "texts.txt", lambda p: p.write_bytes(b"".join(self.rows)))
        return prefilter_log2


def read_set(
    s: int, es: EvalSetConfig, cfg: IndexSettings, exact: ExactParts
) -> tuple[list[np.ndarray], int, list[int], int]:
    """Set `s`'s n-gram hashes per checkable text (added to `exact` in exact mode), its item count, the first
    ten items with no text of `ngram` words, and how many such items it has."""
    set_hashes: list[np.ndarray] = []
    items = too_short = 0
    too_short_sample: list[int] = []
    for item, texts in read_eval_set(es):
        items += 1
        checkable = False
        for t, text in enumerate(texts):
            ws = words(text, cfg.fold_digits)
            if len(ws) < cfg.ngram:
                continue  # shingles gives a shorter text one n-gram of all its words; never a match here
            checkable = True
            h = ngram_hashes(word_hashes(ws), cfg.ngram)
            set_hashes.append(h)
            if cfg.mode == "exact":
                exact.add(s, item, t, h, ws)
        if not checkable:
            too_short += 1
            if len(too_short_sample) < 10:
                too_short_sample.append(item)
    return set_hashes, items, too_short_sample, too_short


# --- loading and looking up -----------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """One matched evaluation item (item None in bloom mode) and where the doc's first matching n-gram starts."""

    set: int
    item: int | None
    start: int  # word position in the document's normalized words


class Index:
    """A built index, memory-mapped: the sorted hashes and their entries (exact) or one filter per set (bloom)."""

    def __init__(self, folder: Path):
        self.folder = folder
        path = folder / "index.json"
        try:
            self.summary: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FatalError(
                f"curate: no decontamination index at {folder} (index.json is missing); build it with build_index "
                "before the filter phase"
            ) from None
        if self.summary.get("format") != INDEX_FORMAT or self.summary.get("shingles") != SHINGLE_VERSION:
            raise FatalError(
                f"curate: the decontamination index at {folder} is {self.summary.get('format')!r} with "
                f"{self.summary.get('shingles')!r}; this kiln reads {INDEX_FORMAT!r} "
                f"with {SHINGLE_VERSION!r}; delete the folder and rebuild it"
            )
        self.mode: str = self.summary["mode"]
        self.ngram: int = self.summary["ngram"]
        self.fold_digits: bool = self.summary["fold_digits"]
        self.names: list[str] = [s["name"] for s in self.summary["sets"]]
        self.blooms: list[BloomFilter] = []
        if self.mode == "bloom":
            for i, s in enumerate(self.summary["sets"]):
                self.blooms.append(
                    BloomFilter(np.load(folder / f"bloom_{i}.npy", mmap_mode="r"), s["bits"], s["hashes"])
                )
        else:
            self.prefilter: np.ndarray = np.load(folder / "prefilter.npy", mmap_mode="r")
            self.prefilter_shift = np.uint64(64 - self.summary["prefilter_log2"])
            self.hashes: np.ndarray = np.load(folder / "hashes.npy", mmap_mode="r")
            self.entries: np.ndarray = np.load(folder / "entries.npy", mmap_mode="r")
            self.offsets: np.ndarray = np.load(folder / "text_offsets.npy", mmap_mode="r")
            size = int(self.offsets[-1])
            # np.memmap refuses an empty file (no checkable text at all); then nothing can be looked up.
            self.texts = (
                np.memmap(folder / "texts.txt", dtype=np.uint8, mode="r") if size else np.zeros(0, dtype=np.uint8)
            )

    def row_words(self, row: int) -> list[str]:
        """The normalized words of one stored text (exact mode)."""
        raw = bytes(self.texts[int(self.offsets[row]) : int(self.offsets[row + 1]) - 1])  # without its newline
        return raw.decode("utf-8", "surrogatepass").split(" ")

    def verify(self, row: int, pos: int, doc_words: list[str], start: int) -> bool:
        """Whether the n-gram at `pos` of stored text `row` is word for word the one at `start` of the
        document: a hash hit whose words differ is a collision, never a match."""
        n = self.ngram
        return self.row_words(row)[pos : pos + n] == doc_words[start : start + n]

    def hits(self, text: str) -> tuple[list[Hit], list[str]]:
        """Every evaluation item (exact) or set (bloom) sharing an n-gram with the text, once each,
        sorted by (set, item), each with the earliest confirmed n-gram position found for it; and
        the text's normalized words when anything matched (else [], since they are not needed)."""
        n = self.ngram
        # Performance: text_hashes skips building str words for ASCII text (37 against 18 MB/s for
        # words() then word_hashes(), /usr/share/doc prose, one core); the words themselves are
        # made only for the rare document with a candidate hit.
        word_h = text_hashes(text, self.fold_digits)
        if len(word_h) < n:
            return [], []  # shingles would give it one n-gram of all its words; no indexed n-gram is that short
        h = ngram_hashes(word_h, n)
        if self.mode == "bloom":
            out = []
            for s, bloom in enumerate(self.blooms):
                found = np.flatnonzero(bloom.contains(h))
                if len(found):
                    out.append(Hit(s, None, int(found[0])))
            return out, (self._words(text, len(word_h)) if out else [])
        # Performance: a bit test on the hash's top bits first rules out ~97% of n-grams (7 us per 800
        # n-grams whatever the index size, against 70-260 us for searchsorted into 50k-1M hashes,
        # measured on one core); one searchsorted then takes all the survivors at once, and the right
        # end of each run of equal hashes is looked up only for the (rare) n-grams that hit.
        top = h >> self.prefilter_shift
        maybe = np.flatnonzero((self.prefilter[top >> np.uint64(3)] >> (top & np.uint64(7)).astype(np.uint8)) & 1)
        if not len(maybe):
            return [], []
        lo = np.searchsorted(self.hashes, h[maybe], side="left")
        hit = self.hashes[np.minimum(lo, len(self.hashes) - 1)] == h[maybe]
        if not hit.any():
            return [], []
        doc_words = self._words(text, len(word_h))
        starts, lo = maybe[hit], lo[hit]
        # A repeated n-gram (a boilerplate sentence) is looked up at its first position only; a
        # collision between two n-grams of one document could hide a match there (chance ~2^-64).
        _, firsts = np.unique(h[starts], return_index=True)
        starts, lo = starts[firsts], lo[firsts]
        counts = np.searchsorted(self.hashes, h[starts], side="right") - lo
        # Every (entry, document position) candidate: entry indices lo[j] .. lo[j] + counts[j] - 1.
        first = np.repeat(lo - (np.cumsum(counts) - counts), counts)
        candidates = self.entries[first + np.arange(int(counts.sum()))]
        at = np.repeat(starts, counts)
        order = np.lexsort((at, candidates["item"], candidates["set"]))
        candidates, at = candidates[order], at[order]
        # One group of candidates per (set, item), earliest document position first. Python looks
        # at a group's first candidate, and at the next only when verification fails (a collision):
        # a document sharing a common n-gram with thousands of items costs one check per item.
        new_item = np.ones(len(at), dtype=bool)
        new_item[1:] = (candidates["set"][1:] != candidates["set"][:-1]) | (
            candidates["item"][1:] != candidates["item"][:-1]
        )
        bounds = [*np.flatnonzero(new_item).tolist(), len(at)]
        out: list[Hit] = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            for j in range(a, b):
                e = candidates[j]
                if self.verify(int(e["row"]), int(e["pos"]), doc_words, int(at[j])):
                    out.append(Hit(int(e["set"]), int(e["item"]), int(at[j])))
                    break
        return out, doc_words

    def _words(self, text: str, count: int) -> list[str]:
        doc_words = words(text, self.fold_digits)
        # subtle: hit positions index these words, so text_hashes must split exactly as words() does.
        assert len(doc_words) == count, "kiln.text.shingles: text_hashes and words disagree"
        return doc_words


def load_index(folder: Path) -> Index:
    """The index in `folder`, memory-mapped, loaded once per process (again if index.json changes)."""
    folder = Path(folder).resolve()
    try:
        stat = (folder / "index.json").stat()
        version = (stat.st_mtime_ns, stat.st_size)
    except FileNotFoundError:
        version = (0, 0)  # Index() raises the error that says what to do
    return _load_index(str(folder), version)


@functools.lru_cache(maxsize=8)
def _load_index(folder: str, version: tuple[int, int]) -> Index:
    return Index(Path(folder))
