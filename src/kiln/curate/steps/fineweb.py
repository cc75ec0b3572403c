"""FineWeb's own quality rules (Penedo et al. 2024, "The FineWeb Datasets: Decanting the Web for
the Finest Text Data at Scale", arXiv:2406.17557, section 3.5, "custom filters").

Drops documents whose non-blank lines mostly do not end in punctuation (fewer than 12%), are
mostly short (more than 67% of at most 30 characters), carry more than 1% of their characters
in repeated lines, or have more than 0.3 newlines per word: list-like and boilerplate pages.
Thresholds and counts follow datatrove's FineWebQualityFilter, which produced FineWeb.
Not handled here: FineWeb's other stages (URL filter, language ID, Gopher, C4, MinHash: other steps).
"""

from __future__ import annotations

from pydantic import Field

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.steps.base import Drop, Filter
from kiln.curate.steps.gopher import duplicates
from kiln.text.segments import Segments, segments

# A line "ends in punctuation" when its last character is a sentence terminal: Unicode's
# Sentence_Terminal property (PropList.txt, Unicode 16), which is what FineWeb's list holds.
_SENTENCE_TERMINAL_RANGES = (  # first and last character of each range
    "!!..??\u0589\u0589\u061d\u061f\u06d4\u06d4\u0700\u0702\u07f9\u07f9\u0837\u0837\u0839\u0839"
    "\u083d\u083d\u083e\u083e\u0964\u0964\u0965\u0965\u104a\u104a\u104b\u104b\u1362\u1362\u1367\u1367"
    "\u1368\u1368\u166e\u166e\u1735\u1735\u1736\u1736\u17d4\u17d4\u17d5\u17d5\u1803\u1803\u1809\u1809"
    "\u1944\u1944\u1945\u1945\u1aa8\u1aab\u1b4e\u1b4e\u1b4f\u1b4f\u1b5a\u1b5a\u1b5b\u1b5b\u1b5e\u1b5e"
    "\u1b5f\u1b5f\u1b7d\u1b7f\u1c3b\u1c3b\u1c3c\u1c3c\u1c7e\u1c7e\u1c7f\u1c7f\u2024\u2024\u203c\u203c"
    "\u203d\u203d\u2047\u2049\u2cf9\u2cfb\u2e2e\u2e2e\u2e3c\u2e3c\u2e53\u2e53\u2e54\u2e54\u2e60\u2e60"
    "\u2e61\u2e61\u3002\u3002\ua4ff\ua4ff\ua60e\ua60e\ua60f\ua60f\ua6f3\ua6f3\ua6f7\ua6f7\ua876\ua876"
    "\ua877\ua877\ua8ce\ua8ce\ua8cf\ua8cf\ua92f\ua92f\ua9c8\ua9c8\ua9c9\ua9c9\uaa5d\uaa5f\uaaf0\uaaf0"
    "\uaaf1\uaaf1\uabeb\uabeb\ufe12\ufe12\ufe15\ufe15\ufe16\ufe16\ufe52\ufe52\ufe56\ufe56\ufe57\ufe57"
    "\uff01\uff01\uff0e\uff0e\uff1f\uff1f\uff61\uff61\U00010a56\U00010a56\U00010a57\U00010a57"
    "\U00010f55\U00010f59\U00010f86\U00010f89\U00011047\U00011047\U00011048\U00011048"
    "\U000110be\U000110c1\U00011141\U00011143\U000111c5\U000111c5\U000111c6\U000111c6"
    "\U000111cd\U000111cd\U000111de\U000111de\U000111df\U000111df\U00011238\U00011238"
    "\U00011239\U00011239\U0001123b\U0001123b\U0001123c\U0001123c\U000112a9\U000112a9"
    "\U000113d4\U000113d4\U000113d5\U000113d5\U0001144b\U0001144b\U0001144c\U0001144c"
    "\U000115c2\U000115c2\U000115c3\U000115c3\U000115c9\U000115d7\U00011641\U00011641"
    "\U00011642\U00011642\U0001173c\U0001173e\U00011944\U00011944\U00011946\U00011946"
    "\U00011a42\U00011a42\U00011a43\U00011a43\U00011a9b\U00011a9b\U00011a9c\U00011a9c"
    "\U00011c41\U00011c41\U00011c42\U00011c42\U00011ef7\U00011ef7\U00011ef8\U00011ef8"
    "\U00011f43\U00011f43\U00011f44\U00011f44\U00016a6e\U00016a6e\U00016a6f\U00016a6f"
    "\U00016af5\U00016af5\U00016b37\U00016b37\U00016b38\U00016b38\U00016b44\U00016b44"
    "\U00016d6e\U00016d6e\U00016d6f\U00016d6f\U00016e98\U00016e98\U0001bc9f\U0001bc9f"
    "\U0001da88\U0001da88"
)
SENTENCE_TERMINALS = frozenset(
    chr(c)
    for lo, hi in zip(_SENTENCE_TERMINAL_RANGES[::2], _SENTENCE_TERMINAL_RANGES[1::2])
    for c in range(ord(lo), ord(hi) + 1)
)


def text_lines(seg: Segments) -> list[str]:
    """The lines FineWeb's rules count: those with a character other than whitespace."""
    return [line for line in seg.lines if line and not line.isspace()]


def punctuated_fraction(lines: list[str]) -> float:
    """The share of `lines` (non-blank) ending in a sentence terminal (0 for none)."""
    return sum(1 for line in lines if line[-1] in SENTENCE_TERMINALS) / len(lines) if lines else 0.0


class FineWebQualityConfig(Section):
    """FineWeb's custom filters (arXiv:2406.17557, section 3.5); defaults are FineWeb's."""

    enabled: bool = Field(True, description="Run the FineWeb quality rules.")
    min_punctuated_line_fraction: float = Field(
        0.12, ge=0, le=1, description="Smallest fraction of non-blank lines ending in sentence-terminal punctuation."
    )
    max_short_line_chars: int = Field(30, ge=0, description="A line of at most this many characters is short.")
    max_short_line_fraction: float = Field(
        0.67, ge=0, le=1, description="Largest fraction of non-blank lines that are short."
    )
    max_dup_line_char_fraction: float = Field(
        0.01, ge=0, le=1, description="Largest share of the non-newline characters in lines repeating an earlier line."
    )
    max_newlines_per_word: float = Field(0.3, ge=0, description="Most newline characters per word token.")


class FineWebQuality(Filter):
    """Keeps documents that pass FineWeb's line-punctuation, short-line, repeated-line and newline rules."""

    name = "fineweb"

    def __init__(self, cfg: FineWebQualityConfig):
        self.cfg = cfg

    def check(self, doc: Document) -> Drop | None:
        cfg = self.cfg
        seg = segments(doc)
        lines = text_lines(seg)
        if not lines:
            return Drop("empty")
        punctuated = punctuated_fraction(lines)
        if punctuated < cfg.min_punctuated_line_fraction:
            return Drop("line_punctuation", punctuated, cfg.min_punctuated_line_fraction)
        short = sum(1 for line in lines if len(line) <= cfg.max_short_line_chars) / len(lines)
        if short > cfg.max_short_line_fraction:
            return Drop("short_lines", short, cfg.max_short_line_fraction)
        text = doc.text
        newlines = text.count("\n")
        dup = duplicates(lines)[1] / max(len(text) - newlines, 1)
        if dup > cfg.max_dup_line_char_fraction:
            return Drop("dup_line_chars", dup, cfg.max_dup_line_char_fraction)
        n_words = len(seg.words)
        if n_words == 0:
            # subtle: a non-blank text can have no tokens only if it is all whitespace-like marks; datatrove divides by
            # zero here
            return Drop("newlines_per_word", None, cfg.max_newlines_per_word) if newlines else None
        per_word = newlines / n_words
        if per_word > cfg.max_newlines_per_word:
            return Drop("newlines_per_word", per_word, cfg.max_newlines_per_word)
        return None
