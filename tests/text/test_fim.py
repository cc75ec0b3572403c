"""kiln.text.fim: both layouts by hand, exact reversal for any text, and stable per-document draws."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.text.fim import FimCut, draw_cut, fim_ids, restore

PRE, MID, SUF = -1, -2, -3  # marker ids outside any byte range, as the tokenizer's specials are


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))  # a byte-level stand-in: one id per byte


def decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8")


def test_layouts_by_hand() -> None:
    cut = FimCut("psm", "ab", "c", "d")
    assert fim_ids(cut, encode, PRE, MID, SUF) == [PRE, 97, 98, SUF, 100, MID, 99]
    spm = FimCut("spm", "ab", "c", "d")
    assert fim_ids(spm, encode, PRE, MID, SUF) == [SUF, 100, PRE, 97, 98, MID, 99]
    for c in (cut, spm):  # the middle comes last in both, and reading order comes back
        assert restore(fim_ids(c, encode, PRE, MID, SUF), PRE, MID, SUF) == encode("abcd")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(), doc_id=st.text(min_size=1, max_size=20), seed=st.integers(0, 2**32 - 1), spm_rate=st.floats(0, 1)
)
def test_the_transform_is_exactly_reversible(text: str, doc_id: str, seed: int, spm_rate: float) -> None:
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates cannot be UTF-8 text
    cut = draw_cut(text, doc_id, seed, rate=1.0, spm_rate=spm_rate)
    assert cut is not None and cut.prefix + cut.middle + cut.suffix == text  # cuts fall between characters
    ids = fim_ids(cut, encode, PRE, MID, SUF)
    assert decode(restore(ids, PRE, MID, SUF)) == text


def test_draws_are_fixed_per_document_and_follow_the_rates() -> None:
    text = "def add(a, b):\n    return a + b\n"
    assert draw_cut(text, "code/x.py", 0, 0.5, 0.5) == draw_cut(text, "code/x.py", 0, 0.5, 0.5)
    assert draw_cut(text, "code/x.py", 0, 0.0, 0.5) is None
    cuts = [draw_cut(text, f"doc-{i}", 0, 0.5, 0.25) for i in range(4000)]
    applied = [c for c in cuts if c is not None]
    # Binomial: 2000 +- 32 (1 std) rearranged, of those 500 +- 19 in spm; allow about 5 std.
    assert abs(len(applied) - 2000) < 160
    assert abs(sum(c.layout == "spm" for c in applied) / len(applied) - 0.25) < 0.05
