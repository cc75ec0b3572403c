"""Drop documents holding words from a per-language list of obscene words (C4's bad-words filter).

C4 (Raffel et al. 2020, section 2.2) drops a page holding any word of LDNOOBW's list; FineWeb-2 and dolma
also allow a density instead (listed words over all words). kiln ships LDNOOBW's lists for 26 languages
(kiln.curate.blocklists) and matches whole words in the document's language (its `meta.language`, else
`default_language`): the document's words as kiln.text.segments splits them, a segmenter's words for
Chinese, Japanese and Thai, so a listed word inside a longer one is no hit (`乳` in `牛乳`, `ass` in
`class`). An entry of several words (`2 girls 1 cup`, or one the segmenter splits) matches as a run of
words. A document with exactly one hit is kept with `single_hit_keep_probability` (C4's lists catch some
innocent pages by one word; datatrove's filter has a keep fraction too), drawn from a hash of its id, so
a rerun keeps the same ones. Entries kiln removes from LDNOOBW (everyday words in clean text: `REMOVED`
below, each measured) and the recipe's `allow` never match.
Not handled here: spelling variants and obfuscations (`f*ck`), words in URLs (kiln.curate.steps.url),
languages without a list (their documents pass, counted as bad_words:no_list:<code>).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash
from pydantic import Field, model_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.blocklists import BAD_WORDS_DIR, LDNOOBW, SHIPPED_VERSION, read_list, record
from kiln.curate.steps.base import Drop, Filter
from kiln.text.segments import segments, split_words

# LDNOOBW entries kiln leaves out: words with an everyday sense that removed clean documents, found by running the
# full lists over the demo corpus (75 of its 1,361 /usr/share/doc documents went, 5.5%: placeholders `xx` and `xxx`,
# surnames Cumming, Dick, Poon, Hooker, Cock, Butt, the `ass` subtitle format, "this sucks", "sexual orientation" in
# codes of conduct), over /usr/share/common-licenses (the GPL's sample signatory, "Ty Coon, President of Vice",
# removed four GPL and LGPL texts) and over the translated program messages (挿入, "insert" in 8 of 24 Japanese
# documents); and
# datatrove's allowlist (ja sm, グロ, 女の子; zh 性). docs/curation.md gives the rates with and without them.
REMOVED: dict[str, frozenset[str]] = {
    "en": frozenset(
        {"xx", "xxx", "cumming", "dick", "poon", "hooker", "cock", "butt", "ass", "poof", "suck", "sucks", "sex"}
        | {"sexual", "hard core", "coon"}
    ),
    "ja": frozenset({"sm", "グロ", "女の子", "挿入"}),
    "zh": frozenset({"性"}),
}


# Language codes whose list has another name: lid.176 says tl for Tagalog, LDNOOBW's list is Filipino (fil).
LIST_OF = {"tl": "fil"}


class BadWordsConfig(Section):
    enabled: bool = Field(True, description="Drop documents holding listed obscene words (prose only).")
    shipped_lists: bool = Field(True, description="Use the LDNOOBW lists kiln ships (26 languages; CC-BY-4.0).")
    word_files: dict[str, list[str]] = Field(
        default_factory=dict,
        description="More list files per language code (one entry a line, # comments), added to kiln's lists.",
    )
    allow: dict[str, list[str]] = Field(
        default_factory=dict, description="Entries per language code that never match (words innocent in your text)."
    )
    default_language: str | None = Field(
        "en", description="The list for documents without meta.language; None: such documents pass."
    )
    max_density: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Drop only above this share of listed words among all words (FineWeb-2, dolma); None: any hit.",
    )
    single_hit_keep_probability: float = Field(
        0.0, ge=0, le=1, description="Keep a document with exactly one hit with this probability (drawn per id)."
    )
    seed: int = Field(0, description="Seed of the keep draw (a hash of the seed and the document id).")

    @model_validator(mode="after")
    def _lists_exist(self) -> BadWordsConfig:
        for code, paths in self.word_files.items():
            for path in paths:
                if not Path(path).expanduser().is_file():
                    raise ValueError(f"word_files.{code}: list file {path!r} does not exist; fix the path")
        return self


@dataclass(frozen=True)
class WordList:
    """One language's entries: single words (a set), and runs of words, each with its words as a set and as a
    pattern of the case-folded text (its words apart by whitespace or nothing, as consecutive words are)."""

    single: frozenset[str]
    runs: tuple[tuple[str, ...], ...]
    run_words: tuple[frozenset[str], ...]
    run_texts: tuple[re.Pattern[str], ...]

    def candidates(self, present: set[str], folded_text: Callable[[], str]) -> list[int] | None:
        """The runs a document may hold, given its case-folded words (`present`) and text; None when it can hold
        no entry at all, so its words need no lookup in order."""
        runs = [i for i, needed in enumerate(self.run_words) if needed <= present]
        if self.single.isdisjoint(present):
            folded = folded_text() if runs else ""
            runs = [i for i in runs if self.run_texts[i].search(folded)]
            if not runs:
                return None
        return runs

    def hits(self, words: list[str], runs: list[int]) -> list[str]:
        """The listed words found in `words` (case-folded), then those of the runs numbered in `runs`."""
        found = list(filter(self.single.__contains__, words))  # perf: the scan in C
        for run in (self.runs[i] for i in runs):
            at = -1
            while True:
                try:
                    at = words.index(run[0], at + 1)  # perf: the scan in C, Python only at each start
                except ValueError:
                    break
                if tuple(words[at : at + len(run)]) == run:
                    found.append(" ".join(run))
        return found


@functools.cache
def fold(code: str) -> Callable[[str], str]:
    """Case folding for a language's words: str.casefold (SCHEISSE and Scheiße fold alike), after Turkish and
    Azerbaijani's dotted and dotless I (İ to i, I to ı)."""
    if code in ("tr", "az"):
        return lambda text: text.replace("İ", "i").replace("I", "ı").casefold()
    return str.casefold


def shipped_languages() -> list[str]:
    return sorted(p.stem for p in BAD_WORDS_DIR.glob("*.txt"))


@functools.lru_cache(maxsize=64)
def word_list(code: str, files: tuple[str, ...], allow: frozenset[str]) -> WordList:
    """A language's list from `files`, each entry split into words as that language's text is."""
    single: set[str] = set()
    runs: dict[str, set[tuple[str, ...]]] = {}
    dropped = REMOVED.get(code, frozenset()) | allow
    for path in files:
        for entry in read_list(path, f"curate.bad_words.word_files.{code}"):
            entry = fold(code)(entry)
            if entry in dropped:
                continue
            words = tuple(w for w in split_words(entry, code) if w.strip())
            if len(words) == 1:
                single.add(words[0])
            elif words:
                runs.setdefault(words[0], set()).add(words)
    ordered = tuple(sorted(run for each in runs.values() for run in each))
    texts = tuple(re.compile(r"\s*".join(map(re.escape, run))) for run in ordered)
    return WordList(frozenset(single), ordered, tuple(frozenset(run) for run in ordered), texts)


class BadWords(Filter):
    """The `bad_words` step: drops a document with a listed word of its language (or above a density of them)."""

    name = "bad_words"

    def __init__(self, cfg: BadWordsConfig):
        self.cfg = cfg
        shipped = shipped_languages() if cfg.shipped_lists else []
        own = cfg.word_files
        self.files = {
            code: (*([str(BAD_WORDS_DIR / f"{code}.txt")] if code in shipped else []), *own.get(code, []))
            for code in sorted({*shipped, *own})
        }
        if cfg.default_language is not None and cfg.default_language not in self.files:
            raise ConfigError(
                f"curate.bad_words.default_language: no list for {cfg.default_language!r}; lists: "
                f"{', '.join(self.files)} (add one with word_files.{cfg.default_language}, or set it to null)"
            )
        # The recipe's own files read now (one that is not text stops the run before any document); kiln's are
        # read when the driver records them (`lists`) and when a document of their language first comes.
        for code, paths in own.items():
            for path in paths:
                read_list(path, f"curate.bad_words.word_files.{code}")

    @functools.cached_property
    def lists(self) -> list[dict[str, Any]]:
        """What the manifest records of each list (curate's driver asks; a worker building the step per task
        does not hash 26 files each time)."""
        return [
            record(Path(f), *_named(Path(f), code), len(read_list(f, f"curate.bad_words.word_files.{code}")))
            for code, files in self.files.items()
            for f in files
        ]

    def words_of(self, code: str) -> WordList:
        return word_list(code, self.files[code], frozenset(map(fold(code), self.cfg.allow.get(code, ()))))

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            code = self.language(doc)
            if code is not None and code not in self.files:
                ledger.count(doc.source, f"bad_words:no_list:{code}")  # passed unread: the summary says how many
                yield doc
                continue
            drop = self.check(doc)
            if drop is None:
                yield doc
            else:
                ledger.remove(doc, self.name, drop.rule, drop.value, drop.threshold, note=drop.note)

    def language(self, doc: Document) -> str | None:
        code = doc.meta.get("language") or self.cfg.default_language
        return LIST_OF.get(code, code) if code else code

    def check(self, doc: Document) -> Drop | None:
        code = self.language(doc)
        if code is None or code not in self.files:
            return None
        seg = segments(doc)
        listed = self.words_of(code)
        # perf: the set of a document's lowercased words, and for a run of words a pattern of the text, rule out
        # nearly every clean document before its words are looked up in order: 11 ms a MB of the demo corpus's
        # prose and docs (words already split), where looking up every word took 30
        folding = fold(code)
        present = set(map(folding, set(seg.words)))  # perf: each distinct word folded once
        runs = listed.candidates(present, lambda: folding(doc.text))
        if runs is None:
            return None
        hits = listed.hits(list(map(folding, seg.words)), runs)
        if not hits:
            return None
        shown = preview(hits[0])
        if self.cfg.max_density is not None:
            density = len(hits) / max(len(seg.alnum_words), 1)
            if density <= self.cfg.max_density:
                return None
            return Drop("density", round(density, 4), self.cfg.max_density, note=f"{code}: {len(hits)} hits, {shown}")
        if len(hits) == 1 and self.cfg.single_hit_keep_probability > 0 and self.kept(doc.id):
            return None
        return Drop("listed_word", len(hits), note=f"{code}: {shown}")

    def kept(self, doc_id: str) -> bool:
        """The keep draw of a one-hit document: the same for the same id and seed on every run."""
        draw = xxhash.xxh64_intdigest(doc_id.encode(), seed=self.cfg.seed) / 2**64
        return draw < self.cfg.single_hit_keep_probability


def _named(path: Path, code: str) -> tuple[str, str]:
    """A list's name and version for the manifest: kiln's copy of LDNOOBW, or the recipe's file."""
    if path.parent == BAD_WORDS_DIR:
        return f"{LDNOOBW} {code}", SHIPPED_VERSION
    return f"curate.bad_words.word_files.{code}", "the file's sha256"


def preview(word: str) -> str:
    """A listed word as the audit shows it: its first character, the rest masked (`f***`)."""
    return word[:1] + "*" * (len(word) - 1)
