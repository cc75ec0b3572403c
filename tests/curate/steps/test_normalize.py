"""kiln.curate.steps.normalize and the step chain (kiln.curate.steps.chain): normalization by hand and as properties,
the length filter, run_document."""

from __future__ import annotations

import pickle
import unicodedata
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.config import PER_SOURCE_STEPS, CurateConfig
from kiln.curate.steps.chain import SourceSteps, StepSettings, code_steps, early_steps, prose_steps, run_document
from kiln.curate.steps.lines import line_key
from kiln.curate.steps.normalize import LengthConfig, LengthFilter, Normalize, normalize_text

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
    same = doc("already clean")
    assert list(Normalize().process([same], ledger))[0] is same  # unchanged text keeps its object (and cache)


# --- the length filter, both paths ---------------------------------------------------------------


def test_length_filter_bounds_are_inclusive():
    step = LengthFilter(LengthConfig(min_chars=5, max_chars=10))
    for text in ("abcde", "abcdefghij"):
        ledger = Ledger()
        original = doc(text)
        assert list(step.process([original], ledger)) == [original] and ledger.removed == []
    for text, rule, limit in (("abcd", "too_short", 5), ("abcdefghijk", "too_long", 10), ("", "too_short", 5)):
        ledger = Ledger()
        assert list(step.process([doc(text)], ledger)) == []
        assert ledger.removed == [
            {
                "id": "web/a.txt",
                "source": "web",
                "step": "length",
                "reason": f"length:{rule}",
                "value": float(len(text)),
                "threshold": float(limit),
                "note": None,
                "kept_id": None,
            }
        ]


# --- the chain --------------------------------------------------------------------------------------


def test_chains_hold_the_enabled_steps_in_order():
    cfg = CurateConfig()
    assert [s.name for s in early_steps(cfg)] == ["normalize", "url_filter"]
    assert [s.name for s in prose_steps(cfg)] == [
        "line_dedup",
        "language",
        "gopher_repetition",
        "gopher_quality",
        "bad_words",
        "c4",
        "fineweb",
        "pii",
        "length",
    ]
    assert [s.name for s in code_steps(cfg)] == ["code_quality", "pii", "length"]
    off = CurateConfig(
        language={"enabled": False},
        bad_words={"enabled": False},
        c4={"enabled": False},
        pii={"enabled": False},
        line_dedup={"enabled": False},
    )
    assert [s.name for s in prose_steps(off)] == ["gopher_repetition", "gopher_quality", "fineweb", "length"]


def test_a_job_carries_each_sources_step_settings_and_builds_the_same_chain_as_the_config():
    # What a read or filter job carries instead of the whole curate config: every step a source can set.
    assert {f.name for f in fields(StepSettings)} == set(PER_SOURCE_STEPS)
    cfg = CurateConfig(sources={"docs": {"c4": {"enabled": False}, "pii": {"phones": False}}})
    steps = pickle.loads(pickle.dumps(SourceSteps.of(cfg)))  # as a process pool or Ray worker gets it
    assert set(steps.own) == {"docs"}
    for source in ("docs", "web"):
        own, reference = steps.for_source(source), cfg.for_source(source)
        assert [s.name for s in early_steps(own)] == [s.name for s in early_steps(reference)]
        assert [s.name for s in prose_steps(own)] == [s.name for s in prose_steps(reference)]
        assert [s.name for s in code_steps(own)] == [s.name for s in code_steps(reference)]
        assert own.pii == reference.pii
    assert "c4" not in [s.name for s in prose_steps(steps.for_source("docs"))]
    assert "c4" in [s.name for s in prose_steps(steps.for_source("web"))]
    assert steps.for_source("docs").pii.phones is False and steps.for_source("web").pii.phones is True


class Explodes:
    name = "explodes"

    def process(self, docs, ledger):
        for d in docs:
            raise ValueError(f"cannot handle {d.id}")
            yield d


def test_run_document_counts_the_funnel_and_quarantines_a_step_that_raises():
    ledger = Ledger()
    ledger.seen("web", 20)
    out = run_document(
        doc("fifteen chars!!" + " " * 10), [Normalize(), LengthFilter(LengthConfig(min_chars=5))], ledger
    )
    assert out is not None and out.text == "fifteen chars!!"
    assert ledger.tally("web").funnel == {"normalize": [1, 15], "length": [1, 15]}
    ledger.seen("web", 5)
    assert run_document(doc("hello", "web/b"), [Normalize(), Explodes(), LengthFilter(LengthConfig())], ledger) is None
    assert ledger.quarantined == [
        {
            "id": "web/b",
            "source": "web",
            "file": "a.txt",
            "position": None,
            "error": "explodes: ValueError: cannot handle web/b",
        }
    ]
    assert ledger.tally("web").docs_in == 2  # counted once, by the reader, not again by the quarantine
    ledger.kept(out)
    ledger.check_balanced("test")


# --- no step raises, whatever the text -------------------------------------------------------------

_CHAIN_CFG = CurateConfig()
_BOILERPLATE_KEYS = [line_key("web", "accept cookies"), line_key("web", "")]
_CHAINS = {
    "prose": early_steps(_CHAIN_CFG) + prose_steps(_CHAIN_CFG, _BOILERPLATE_KEYS),
    "code": early_steps(_CHAIN_CFG) + code_steps(_CHAIN_CFG),
}
# Arbitrary characters mixed with pieces the rules react to (lines, ellipses, braces, a boilerplate line, PII).
ANY_TEXT = st.lists(
    st.one_of(
        st.text(max_size=30),
        st.sampled_from(
            [
                "\n",
                "\n\n",
                " ",
                "...",
                "#",
                "{",
                "Accept cookies\n",
                "\u2028",
                "a@b.co",
                "4111 1111 1111 1111",
                "the of and to",
            ]
        ),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(ANY_TEXT, st.sampled_from(sorted(_CHAINS)))
def test_no_step_raises_on_any_text(text, branch):
    """Every step of both branches, in order, on arbitrary unicode (lone surrogates included):
    a document is kept or removed with a reason, never quarantined by an exception."""
    ledger = Ledger()
    ledger.seen("web", 0)
    out = run_document(
        Document("web/x", text, "web", {"path": "x.txt", "url": "https://example.org/a"}),
        _CHAINS[branch],
        ledger,
        branch,
    )
    assert ledger.quarantined == []
    if out is None:
        assert len(ledger.removed) == 1
    else:
        ledger.kept(out)
    ledger.check_balanced("property test")
