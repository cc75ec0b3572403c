"""How each language splits into words: the one table every rule asks (kiln.text.segments).

A language is written one of three ways, and its words come from the matching rule:
- English: the rule of kiln.text.segments (spaCy's English tokenizer: contractions, clitics,
  abbreviations);
- another language that separates words with spaces: the same rule without English's exceptions,
  with the language's elided words split off the word they lean on (French `l'homme` -> `l'` `homme`,
  `qu'il` -> `qu'` `il`; Italian `dell'anno`; Catalan `d'aigua`), compounds left whole (German), and
  Korean's space-separated words (eojeol) as they stand;
- a language written without spaces: a segmenter. Chinese: rjieba (jieba's dictionary, in Rust, MIT,
  about 23 MB/s); Japanese: SudachiPy with sudachidict_core, split mode C (compounds whole, Apache-2.0,
  about 2 MB/s); Thai: nlpo3 (newmm in Rust, Apache-2.0) on PyThaiNLP's CC0 word list, about 13 MB/s,
  or PyThaiNLP's own newmm where nlpo3 is not installed.
A language written without spaces whose segmenter is not installed (or that has none here: Lao,
Khmer, Burmese, Tibetan) falls back to its script: each character of those scripts is a word
(character unigrams, which the shingles then join into character n-grams), and the fallback is
named once in the log and in `fallbacks()` for the stage's summary. A document of no known language
is split as English unless most of its letters are Han, kana, Hangul or Thai; then it is split as
the language of that script (kana present: Japanese).
Not handled here: language identification (kiln.text.language), stop words and thresholds per
language.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
from collections.abc import Callable
from pathlib import Path

import regex

log = logging.getLogger("kiln.text")

# Elided words that lean on the next word, split off it with their apostrophe (spaCy's French, Italian
# and Catalan tokenizer exceptions, shortened to the ones that occur in running text).
ELISIONS = {
    "fr": "c|ç|d|j|l|m|n|s|t|qu|jusqu|lorsqu|puisqu|quoiqu|presqu|quelqu",
    "it": "l|d|c|m|n|s|t|v|un|dell|all|dall|nell|sull|coll|pell|quell|quest|bell|sant|nessun|buon",
    "ca": "d|l|m|n|s|t",
}
# Languages whose text has no spaces between words: the segmenter each uses (None: none is used here).
UNSPACED = {
    "zh": "zh",
    "yue": "zh",
    "wuu": "zh",
    "ja": "ja",
    "th": "th",
    "lo": None,
    "km": None,
    "my": None,
    "bo": None,
}
# Han, kana, Hangul, Thai, Lao, Khmer, Myanmar, Tibetan letters: the scripts written without spaces
# (Hangul is spaced, and counted here only to tell Korean text from Chinese).
UNSPACED_CHAR = re.compile(
    "[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"  # Han
    "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f"  # kana
    "\u0e00-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\u0f00-\u0fff]"  # Thai, Lao, Khmer, Myanmar, Tibetan
)
_KANA = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HANGUL = re.compile("[\uac00-\ud7af\u1100-\u11ff\u3130-\u318f]")
_THAI = re.compile("[\u0e00-\u0e7f]")
_LETTER = re.compile(r"[^\W\d_]")
# One character of a script written without spaces with the marks that combine with it (Thai and Lao vowel
# signs and tones), or a run of anything else.
_BY_CHARACTER = regex.compile(rf"({UNSPACED_CHAR.pattern}\p{{M}}*)")
_SURROGATE = re.compile("([\ud800-\udfff])")
SUDACHI_MAX_BYTES = 49_000  # SudachiPy refuses one input over 49,149 bytes: longer text goes in pieces
_fallbacks: set[str] = set()


def script_language(text: str) -> str | None:
    """The language a text's script implies when most of its letters are in a script written without spaces
    (kana: ja; Thai: th; else Han: zh) or in Hangul (ko); None otherwise (a spaced script: no guess)."""
    if text.isascii():  # perf: English and code, the common case, in one C pass
        return None
    hangul, unspaced = len(_HANGUL.findall(text)), len(UNSPACED_CHAR.findall(text))
    if not hangul and not unspaced:  # perf: other non-ASCII text is not counted letter by letter
        return None
    letters = len(_LETTER.findall(text))
    if hangul * 2 > letters:
        return "ko"
    if unspaced * 2 <= letters:
        return None
    if _KANA.search(text):
        return "ja"
    return "th" if len(_THAI.findall(text)) * 2 > unspaced else "zh"


Rule = tuple[str, str | Callable[[str], list[str]]]
ENGLISH: Rule = ("english", "")


def word_rule(language: str | None, text: str) -> Rule:
    """How to split `text` of `language` (None: unknown): ("english", ""), ("spaced", elisions) or
    ("segmented", a function from text to its words)."""
    if language is None:
        language = script_language(text)
    return ENGLISH if language is None else language_rule(language)


@functools.cache
def language_rule(language: str) -> Rule:
    """word_rule for a language code (`zh-Hant`, `pt_BR`: the part before the region or script decides)."""
    code = re.split(r"[-_]", language, maxsplit=1)[0].lower()
    if code == "en":
        return ENGLISH
    if code in UNSPACED:
        return "segmented", segmenter(code)
    return "spaced", ELISIONS.get(code, "")


@functools.cache
def segmenter(code: str) -> Callable[[str], list[str]]:
    """The segmenter of a language written without spaces, or the script fallback (named once)."""
    split = _segmenter(code)

    def run(text: str) -> list[str]:
        if not _SURROGATE.search(text):
            return split(text)
        # subtle: a lone surrogate (text read with surrogateescape) cannot cross into the Rust segmenters:
        # each is a word of its own, the text between them segmented.
        return [w for i, part in enumerate(_SURROGATE.split(text)) for w in ([part] if i % 2 else split(part))]

    return run


def _segmenter(code: str) -> Callable[[str], list[str]]:
    kind = UNSPACED.get(code)
    try:
        if kind == "zh":
            return _chinese()
        if kind == "ja":
            return _japanese()
        if kind == "th":
            return _thai()
    except ImportError as e:
        _fall_back(code, f"its segmenter is not installed ({e.name}); `pip install kiln` installs it")
        return by_character
    _fall_back(code, "no segmenter for it here")
    return by_character


def _fall_back(code: str, why: str) -> None:
    if code not in _fallbacks:
        _fallbacks.add(code)
        log.warning("words: %s text is split one character per word (%s)", code, why)


SEGMENTER_PACKAGES = {"zh": ("rjieba",), "ja": ("sudachipy", "sudachidict-core"), "th": ("nlpo3", "pythainlp")}


def segmenters() -> dict[str, str]:
    """What splits each language written without spaces on this machine: its packages and versions (a
    new dictionary changes word counts, so filter decisions: recorded in manifests), or `characters`."""
    from importlib import metadata

    found = {}
    for code, kind in sorted(UNSPACED.items()):
        installed = []
        for package in SEGMENTER_PACKAGES.get(kind or "", ()):
            try:
                installed.append(f"{package} {metadata.version(package)}")
            except metadata.PackageNotFoundError:
                pass
        # Thai needs only one of its two (nlpo3 first); the others every package listed.
        complete = installed and (kind == "th" or len(installed) == len(SEGMENTER_PACKAGES[kind or ""]))
        found[code] = ", ".join(installed) if complete else "characters"
    return found


def fallbacks() -> list[str]:
    """The languages this process split by the script fallback, for a stage's summary."""
    return sorted(_fallbacks)


def by_character(text: str) -> list[str]:
    """Each character of a script written without spaces (with its combining marks) as a word; the rest as
    whitespace-separated chunks."""
    return [piece for i, part in enumerate(_BY_CHARACTER.split(text)) for piece in ([part] if i % 2 else part.split())]


def _words_only(tokens: list[str]) -> list[str]:
    """A segmenter's tokens without the whitespace it keeps as tokens of their own."""
    return [t.strip() for t in tokens if t and not t.isspace()]


def _chinese() -> Callable[[str], list[str]]:
    import rjieba  # dictionary loaded at import (0.1 s)

    def split(text: str) -> list[str]:
        return _words_only(rjieba.cut(text))

    return split


def _japanese() -> Callable[[str], list[str]]:
    from sudachipy import Dictionary, SplitMode

    tokenizer = Dictionary(dict="core").tokenizer(mode=SplitMode.C)  # mode C: compounds whole (一時的, 無効化)

    def split(text: str) -> list[str]:
        out: list[str] = []
        for piece in _pieces(text, SUDACHI_MAX_BYTES):
            out += _words_only([m.surface() for m in tokenizer.tokenize(piece)])
        return out

    return split


def _pieces(text: str, max_bytes: int) -> list[str]:
    """The text in pieces of at most max_bytes UTF-8 bytes, cut after a line break where one is near."""
    if len(text) * 4 <= max_bytes:  # perf: no UTF-8 character is longer than 4 bytes
        return [text]
    pieces, start = [], 0
    while start < len(text):
        end = start + max_bytes // 4
        if end < len(text):
            cut = text.rfind("\n", start + 1, end)
            end = cut + 1 if cut > start else end
        pieces.append(text[start:end])
        start = end
    return pieces


def _thai() -> Callable[[str], list[str]]:
    spec = importlib.util.find_spec("pythainlp")  # found, not imported: importing it writes ~/pythainlp-data
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("pythainlp", name="pythainlp")
    words = Path(next(iter(spec.submodule_search_locations))) / "corpus" / "words_th.txt"  # CC0
    try:
        import nlpo3
    except ImportError:  # no wheel for the platform (Linux aarch64): PyThaiNLP's own newmm, 5x slower
        import os

        os.environ.setdefault("PYTHAINLP_READ_ONLY", "1")
        from pythainlp.tokenize import word_tokenize

        return lambda text: _words_only(word_tokenize(text, engine="newmm"))
    nlpo3.load_dict(str(words), "kiln-th")
    return lambda text: _words_only(nlpo3.segment(text, "kiln-th"))
