"""FineWeb's custom rules, each just inside and just outside its threshold; no step raises on any text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.c4 import C4, C4Config
from kiln.curate.steps.fineweb import FineWebQuality, FineWebQualityConfig
from kiln.curate.steps.gopher import GopherQuality, GopherQualityConfig, GopherRepetition, GopherRepetitionConfig

STEP = FineWebQuality(FineWebQualityConfig())


def line(i: int, end: str = "") -> str:
    """A unique line of 6 words, over 30 characters."""
    return f"line number {i:03d} has several words{end}"


def check(text: str) -> tuple[str | None, float | None]:
    drop = STEP.check(Document(id="d", text=text, source="web"))
    return (None, None) if drop is None else (drop.rule, drop.value)


def test_line_punctuation() -> None:
    # 3 of 25 non-blank lines end in a sentence terminal: 0.12 exactly; "。" counts as one too
    lines = [line(i, "." if i < 2 else "") for i in range(25)]
    lines[2] = line(2, "。")
    assert check("\n".join(lines)) == (None, None)
    lines[2] = line(2, ",")
    assert check("\n".join(lines)) == ("line_punctuation", pytest.approx(2 / 25))


def test_short_lines() -> None:
    # 2 of 3 lines of at most 30 characters: 0.667 (kept); 3 of 3: dropped
    long = line(0, ".")
    short = "Short line with five words."
    assert len(short) <= 30 < len(long)
    assert check("\n".join([short, "A second short line, ok.", long])) == (None, None)
    assert check("\n".join([short, "A second short line, ok.", "A third short one here."])) == ("short_lines", 1.0)


def test_duplicated_line_characters() -> None:
    # one repeated 10-character line: 10 / (non-newline characters) against 0.01
    dup = "Same line."
    lines = [line(i, ".") for i in range(30)] + [dup, dup]
    text = "\n".join(lines)
    share = 10 / (len(text) - text.count("\n"))
    assert share < 0.01 and check(text) == (None, None)
    text = "\n".join([line(i, ".") for i in range(20)] + [dup, dup])
    assert check(text) == ("dup_line_chars", pytest.approx(10 / (len(text) - text.count("\n"))))


def test_newlines_per_word() -> None:
    # lines of 3 tokens ("ab cd." is ab, cd, .): 10 lines, 9 newlines, 30 tokens: 0.3 exactly; blank lines add newlines
    lines = [f"Word{i} thing{i}." for i in range(10)]
    relaxed = FineWebQuality(FineWebQualityConfig(max_short_line_fraction=1.0))
    assert relaxed.check(Document(id="d", text="\n".join(lines), source="web")) is None
    drop = relaxed.check(Document(id="d", text="\n".join(lines) + "\n", source="web"))
    assert (drop.rule, drop.value, drop.threshold) == ("newlines_per_word", pytest.approx(10 / 30), 0.3)


def test_empty() -> None:
    assert check("") == ("empty", None)
    assert check(" \n\t\n") == ("empty", None)


ALL_STEPS = [
    GopherRepetition(GopherRepetitionConfig()),
    GopherQuality(GopherQualityConfig()),
    C4(C4Config()),
    FineWebQuality(FineWebQualityConfig()),
]
# text drawn from every unicode category, with the characters these rules look at made likely
TEXT = st.text(
    alphabet=st.one_of(st.characters(), st.sampled_from(list(" \n\n.,!?-•…#{}[]'\"()“”:/0123456789abcXYZ"))),
    max_size=400,
)


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_no_step_raises_on_any_text(text: str) -> None:
    ledger = Ledger()
    docs = [Document(id="d", text=text, source="web")]
    for step in ALL_STEPS:
        docs = list(step.process(docs, ledger))
    assert len(docs) + sum(ledger.tally("web").removed.values()) == 1
