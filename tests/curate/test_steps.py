"""kiln.curate.steps: normalization worked by hand and as properties; every filter on both paths."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.steps import (
    LengthFilter,
    MeanWordLengthFilter,
    Normalize,
    SymbolRatioFilter,
    build_steps,
    normalize_text,
    run_steps,
)

PROSE = (
    "The kiln was fired slowly over three days, and the potters watched the colour of the flame "
    "change from orange to a bright, steady yellow before they sealed the door."
)


def doc(text: str, doc_id: str = "web/a.txt", source: str = "web") -> Document:
    return Document(doc_id, text, source, {"path": "a.txt"})


# --- normalize_text, worked by hand -------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("cafe\u0301", "caf\u00e9"),  # NFC composes e + combining acute
        ("one\r\ntwo\rthree\n", "one\ntwo\nthree"),  # CRLF and lone CR become LF
        ("trailing   \nspaces\t \nend  ", "trailing\nspaces\nend"),
        ("a\x00b\x07c\x1bd\x7fe\x85f\x0bg\x0ch", "abcdefgh"),  # C0/C1 controls, VT and FF removed
        ("para one\n\n\n\n\npara two", "para one\n\npara two"),  # 4 blank lines -> 1 empty line
        ("a\n   \n\t\n  \nb", "a\n\nb"),  # whitespace-only lines count as blank
        ("def f():\n    if x:\n\treturn 1\n", "def f():\n    if x:\n\treturn 1"),  # indentation kept
        ("\n\n\nstart and end\n\n\n", "start and end"),
        ("tab\tinside and  double  spaces", "tab\tinside and  double  spaces"),
        ("", ""),
    ],
)
def test_normalize_by_hand(raw, expected):
    assert normalize_text(raw) == expected


# --- normalize_text properties ------------------------------------------------------------------

# Any text, with extra weight on the characters that interact: whitespace, line ends, combining
# marks with their bases, and the control characters normalize_text deletes (_REMOVED).
_REMOVED = {chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}
TEXT = st.text(
    alphabet=st.one_of(
        st.characters(exclude_categories=("Cs",)),
        st.sampled_from(" \t\n\r\u0301\u0308e\u1100\u1161\x00\x07\x85"),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_normalize_properties(text):
    out = normalize_text(text)
    assert normalize_text(out) == out
    assert unicodedata.is_normalized("NFC", out)
    assert "\r" not in out
    assert all(line == line.rstrip(" \t") for line in out.split("\n"))
    assert "\n\n\n" not in out
    assert not out.startswith("\n") and not out.endswith("\n")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \t\n\r\x00\x07\x1b\x7f\x85"), max_size=60))
def test_controls_between_plain_letters_are_simply_removed(text):
    out = normalize_text(text)
    assert not any(c in _REMOVED for c in out)
    assert normalize_text(out) == out


@pytest.mark.parametrize("raw", ["e\x00\u0301", "\u1100\x07\u1161"])
def test_normalize_output_is_nfc_even_around_controls(raw):
    out = normalize_text(raw)
    assert unicodedata.is_normalized("NFC", out)
    assert normalize_text(out) == out


# --- the Normalize step -------------------------------------------------------------------------


def test_normalize_step_changes_text_only():
    ledger = Ledger()
    [out] = list(Normalize().process([doc("Hello  \r\nworld\x00")], ledger))
    assert out == Document("web/a.txt", "Hello\nworld", "web", {"path": "a.txt"})
    assert ledger.removed == [] and ledger.sources == {}


# --- filters, both paths ------------------------------------------------------------------------


def run_filter(step, text: str) -> tuple[list[Document], Ledger]:
    ledger = Ledger()
    original = doc(text)
    kept = list(step.process([original], ledger))
    if kept:
        assert kept == [original] and kept[0] is original  # kept unchanged
    return kept, ledger


def assert_dropped(step, text: str, reason: str) -> None:
    kept, ledger = run_filter(step, text)
    assert kept == []
    assert ledger.removed == [{"id": "web/a.txt", "source": "web", "reason": reason}]
    assert dict(ledger.tally("web").removed) == {reason: 1}


def assert_kept(step, text: str) -> None:
    kept, ledger = run_filter(step, text)
    assert len(kept) == 1
    assert ledger.removed == []


def test_length_filter():
    step = LengthFilter(min_chars=5, max_chars=10)
    assert_kept(step, "abcde")  # both bounds are inclusive
    assert_kept(step, "abcdefghij")
    assert_dropped(step, "abcd", "length:too_short")
    assert_dropped(step, "abcdefghijk", "length:too_long")
    assert_dropped(step, "", "length:too_short")


def test_mean_word_length_filter():
    step = MeanWordLengthFilter(min_length=3, max_length=10)
    assert_kept(step, PROSE)
    # "the cat sat on a mat": (3+3+3+2+1+3)/6 = 2.5 letters per word
    assert_dropped(step, "the cat sat on a mat", "gopher_quality:mean_word_length_below_min")
    # boundaries are inclusive: 3.0 and 10.0 pass
    assert_kept(step, "abc def ghi")
    assert_kept(step, "abcdefghij klmnopqrst")
    assert_dropped(step, "abcdefghijk klmnopqrst", "gopher_quality:mean_word_length_above_max")  # 10.5
    assert_dropped(step, "a" * 40 + " " + "b" * 30, "gopher_quality:mean_word_length_above_max")
    assert_dropped(step, " \n\t ", "gopher_quality:no_words")


def test_symbol_ratio_filter():
    step = SymbolRatioFilter(max_ratio=0.1)
    ten_words = "one two three four five six seven eight nine ten"
    assert_kept(step, ten_words)
    assert_kept(step, ten_words + " #")  # 1 symbol / 11 words
    assert_kept(step, "# one two three four five six seven eight nine")  # 1 / 10 = 0.1 is allowed
    assert_dropped(step, "# one two three four five six seven eight nine...", "gopher_quality:symbol_word_ratio_above_max")
    assert_dropped(step, "wait\u2026 one two three four five six seven eight #", "gopher_quality:symbol_word_ratio_above_max")
    assert_dropped(step, "## heading one two three four five six seven eight", "gopher_quality:symbol_word_ratio_above_max")
    assert_dropped(step, "", "gopher_quality:symbol_word_ratio_above_max")


def test_build_steps_pipeline():
    cfg = CurateConfig(min_chars=20, max_chars=400)
    ledger = Ledger()
    docs = [
        doc(PROSE + "   \r\n", "web/1"),  # kept, normalized
        doc("too short", "web/2"),
        doc("x y z " * 20, "web/3"),  # long enough, words too short
        doc(" ".join(["antidisestablishmentarianism"] * 5), "web/4"),
        doc(" ".join(["# heading"] * 10), "web/5"),
        doc(PROSE * 3, "web/6"),
    ]
    kept = list(run_steps(docs, build_steps(cfg), ledger))
    assert [d.id for d in kept] == ["web/1"]
    assert kept[0].text == PROSE
    assert {r["id"]: r["reason"] for r in ledger.removed} == {
        "web/2": "length:too_short",
        "web/3": "gopher_quality:mean_word_length_below_min",
        "web/4": "gopher_quality:mean_word_length_above_max",
        "web/5": "gopher_quality:symbol_word_ratio_above_max",
        "web/6": "length:too_long",
    }


def test_length_is_measured_after_normalization():
    # 25 characters of which 10 are trailing spaces: normalization runs first, so it is too short
    ledger = Ledger()
    kept = list(run_steps([doc("fifteen chars!!" + " " * 10)], build_steps(CurateConfig(min_chars=20, max_chars=100)), ledger))
    assert kept == []
    assert ledger.removed[0]["reason"] == "length:too_short"
