"""The shared split: lines, paragraphs, spaCy-style words, sentences; computed once per text."""

from __future__ import annotations

import time

import pytest

from kiln.core.document import Document
from kiln.text.segments import Segments, segments


def test_lines_and_paragraphs() -> None:
    seg = Segments("\n first line\nsecond\n\n\nthird para\n")
    assert seg.lines == ["", " first line", "second", "", "", "third para"]
    # Gopher's paragraphs: the stripped text split at two or more newlines
    assert seg.paragraphs == ["first line\nsecond", "third para"]
    assert Segments("  \n ").paragraphs == []


def test_words_follow_spacy_english() -> None:
    # expected tokens are what spacy.blank("en") (3.8) produces for the same text, whitespace tokens dropped
    text = "Hello, world! It's a don't-care state... e.g. Mr. Smith paid $3.50 (approx.) at 10:30am."
    assert Segments(text).words == [
        "Hello",
        ",",
        "world",
        "!",
        "It",
        "'s",
        "a",
        "don't",
        "-",
        "care",
        "state",
        "...",
        "e.g.",
        "Mr.",
        "Smith",
        "paid",
        "$",
        "3.50",
        "(",
        "approx",
        ".",
        ")",
        "at",
        "10:30am",
        ".",
    ]
    text = (
        "(foo) printf(3) --verbose /usr/share a/b 1/2 x:y 1,000 end.Start file.txt 3-4 50% **x** #1 can't 10km GPLv2+ "
        "cannot ─┼─"
    )
    assert Segments(text).words == [
        "(",
        "foo",
        ")",
        "printf(3",
        ")",
        "--verbose",
        "/usr",
        "/",
        "share",
        "a",
        "/",
        "b",
        "1/2",
        "x",
        ":",
        "y",
        "1,000",
        "end",
        ".",
        "Start",
        "file.txt",
        "3",
        "-",
        "4",
        "50",
        "%",
        "*",
        "*",
        "x",
        "*",
        "*",
        "#",
        "1",
        "ca",
        "n't",
        "10",
        "km",
        "GPLv2",
        "+",
        "can",
        "not",
        "─",
        "┼",
        "─",
    ]
    assert Segments("see https://example.com/a?b=1. and foo-bar@x.org) now").words == [
        "see",
        "https://example.com/a?b=1",
        ".",
        "and",
        "foo-bar@x.org",
        ")",
        "now",
    ]
    assert Segments("").words == []


def test_alnum_words_leave_out_punctuation() -> None:
    assert Segments("a, b -- 3 ... (c)").alnum_words == ["a", "b", "3", "c"]


def test_sentences_follow_the_sentencizer_and_stay_in_lines() -> None:
    seg = Segments(
        "Hello world. This is it! Really? Mr. Smith said e.g. this.\nNo end here\n\nend.Start (approx.) at ten."
    )
    assert seg.sentences == [
        "Hello world.",
        "This is it!",
        "Really?",
        "Mr. Smith said e.g. this.",
        "No end here",
        "end.",
        "Start (approx.)",
        "at ten.",
    ]
    assert seg.line_sentence_counts == [4, 1, 0, 3]
    # an ellipsis, a decimal point and a file name end no sentence
    assert Segments("wait... version 3.5 of file.txt is out").line_sentence_counts == [1]


def test_line_word_counts_are_whitespace_words() -> None:
    assert Segments("a b c\n\n  x-y  z ").line_word_counts == [3, 0, 2]


def test_segments_are_computed_once_and_reset_by_an_edit() -> None:
    doc = Document(id="d", text="one two", source="s")
    seg = segments(doc)
    assert segments(doc) is seg
    assert seg.words is seg.words  # cached view
    edited = doc.with_text("three")
    assert segments(edited) is not seg and segments(edited).words == ["three"]


# Inputs that once took seconds to minutes (exponential or quadratic regex backtracking), with what
# they cost before the fix on the 2-core dev machine; each must now finish well inside the bound.
_PATHOLOGICAL = {
    "dots_before_a_digit": ("words", "Introduction" + "." * 40 + "5"),  # 98 s at 30 dots, doubling per dot
    "dots_3000": ("words", "Introduction" + "." * 3000 + "5"),
    "hyphenated_200kb": ("words", "ab-" * 66_000),  # 5.1 s at 60 KB
    "colons_200kb": ("words", "a:" * 100_000),  # 32 s
    "commas_200kb": ("words", "a," * 100_000),
    "slashes_200kb": ("words", "ab/" * 66_000),
    "dotted_labels_200kb": ("words", "Ab." * 66_000),
    "mark_run_inside_a_chunk": ("words", "x" + "," * 200_000 + "y"),
    "mark_run_after_a_url": ("words", "http://x.com/" + "," * 200_000 + "y"),
    "dot_space_sentences": ("sentences", ". " * 40_000),  # 133 s
    "dot_space_counts": ("line_sentence_counts", ". " * 40_000),  # 133 s
    "bangs_before_a_word": ("line_sentence_counts", "!" * 200_000 + "x"),
}


@pytest.mark.parametrize("name", sorted(_PATHOLOGICAL))
def test_pathological_inputs_take_linear_time(name: str) -> None:
    view, text = _PATHOLOGICAL[name]
    start = time.perf_counter()
    getattr(Segments(text), view)
    assert time.perf_counter() - start < 2.0  # each now takes under 0.6 s; before, seconds to minutes


def test_the_bounded_rules_keep_their_tokens() -> None:
    # the regex bounds change nothing at ordinary sizes (outputs as before the fix): mark runs, schemes, e-mail, URLs
    assert Segments("Introduction" + "." * 40 + "5").words == ["Introduction", "." * 40, "5"]
    assert Segments("word" + "=" * 200 + " next").words == ["word"] + ["="] * 200 + ["next"]
    assert Segments("git+ssh://git@example.com/x.git, ok").words == ["git+ssh://git@example.com/x.git", ",", "ok"]
    assert Segments("mail first.last@a.b.c.d.example.org.").words == ["mail", "first.last@a.b.c.d.example.org", "."]
    assert Segments("see http://x.com/a,,b,, now").words == ["see", "http://x.com/a,,b", ",", ",", "now"]
    # a terminal's trailing marks and spaces, and a line's, end sentences as before
    assert Segments("Done!!! Next. . . end . .").sentences == ["Done!!!", "Next. . .", "end . ."]
    assert Segments("Done!!! Next. . . end . .").line_sentence_counts == [3]
