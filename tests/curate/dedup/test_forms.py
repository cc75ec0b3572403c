"""kiln.curate.dedup.forms: the folds exact and line dedup take their keys after, worked by hand, and
ASCII keys checked against the keys as they were before the folds (DEDUP_KEY_VERSION v1)."""

from __future__ import annotations

import re
import string

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.curate.dedup.exact import text_hash
from kiln.curate.dedup.forms import DEDUP_KEY_VERSION, FOLDS, fold, folded_utf8
from kiln.curate.steps.lines import normalize_line


def key_v1(text: str) -> tuple[int, int]:
    """The exact-dedup key before the folds: xxh3-128 of the text's UTF-8."""
    digest = xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass"))
    return digest >> 64, digest & 0xFFFF_FFFF_FFFF_FFFF


def normalize_line_v1(line: str) -> str:
    """Line dedup's normalization before the folds."""
    return re.sub(r"\s+", " ", re.sub(r"\d", "0", line.casefold())).strip(" \t-*•·|>:;,.!?()[]\"'")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # full-width ASCII and the ideographic space; half-width katakana with its sound marks composed
        ("ＡＢＣ１２３　ｶﾞｷﾞｸﾞｰ", "ABC123 ガギグー"),
        ("ｶﾀｶﾅのﾃｷｽﾄ｡", "カタカナのテキスト."),
        # CJK marks to ASCII, the spaces beside them (next to a Han letter) gone; the space between two
        # words of Latin letters stays
        ("你好，世界。这是 Linux 的测试！", "你好,世界.这是 Linux 的测试!"),
        ("他说：「你好。」 然后『笑』（注）", "他说:\"你好.\"然后'笑'(注)"),
        ("你好 , 世界 . 再见", "你好,世界.再见"),
        # a full-width comma in English text: the space after it stays, as in the ASCII copy
        ("Hello， world", "Hello, world"),
        ("〜と～", "~と~"),
        # what NFKC would change and the fold leaves: superscripts, circled numbers, squared words,
        # Roman numerals, ellipses, typographic quotes, the no-break space
        ("x² ① ㌔ Ⅻ … “q” a\u00a0b", "x² ① ㌔ Ⅻ … “q” a\u00a0b"),
        ("世界 \n 。", "世界 \n ."),  # line breaks are never removed
        ("", ""),
    ],
)
def test_fold_by_hand(text: str, expected: str) -> None:
    assert fold(text) == expected
    assert fold(expected) == expected


def test_copies_differing_in_width_punctuation_or_spacing_share_an_exact_key() -> None:
    copies = [
        "你好，世界。这是一个测试！价格：１２３元（含税）。",
        "你好, 世界. 这是一个测试! 价格: 123元 (含税).",
        "你好 ，世界 。这是一个测试 ！价格：123元（含税） 。",
        "你好,世界.这是一个测试!价格:１２３元(含税).",
    ]
    assert len({text_hash(c) for c in copies}) == 1
    assert text_hash("ｶﾀｶﾅのﾃｷｽﾄです｡") == text_hash("カタカナのテキストです。")
    assert text_hash("「引用」です。") == text_hash('"引用"です.')
    # different text still differs
    assert text_hash("你好，世界。") != text_hash("你好，世界！")
    assert text_hash("ABC") == text_hash("ＡＢＣ") != text_hash("abc")


def test_ascii_exact_keys_are_those_before_the_folds() -> None:
    # fixed values of the v1 key (xxh3-128 of the UTF-8): English dedup decisions do not move
    assert text_hash("Hello, world.") == (0x79E28A50AD14254E, 0x7B4373B7C23FABF5)
    assert text_hash("Page 3 of 12\nAccept cookies") == (0x64F3BDD2E768F776, 0x731E48BE4943D4AE)
    assert DEDUP_KEY_VERSION == "kiln-dedup-keys v2"


def test_line_keys_fold_before_they_normalize() -> None:
    assert normalize_line("ＰＡＧＥ　３ ｏｆ　１２。") == normalize_line("Page 3 of 12.") == "page 0 of 00"
    assert normalize_line("版权所有 ©2024，保留所有权利。") == normalize_line("版权所有 ©2024, 保留所有权利.")
    assert normalize_line("「ホーム」｜「ログイン」") == normalize_line('"ホーム"|"ログイン"') == 'ホーム"|"ログイン'
    assert normalize_line("* Share   on\tTwitter!") == "share on twitter"  # as before


# Text heavy in what the folds touch: full-width forms, half-width katakana and sound marks, CJK marks,
# Han and kana, ASCII punctuation and spaces of several kinds, line breaks.
FOLD_HEAVY = st.text(
    st.sampled_from(
        list("你好世界テストかなｶﾀｶﾅﾞﾟ\u3099々〇ＡＢ１，。、！？：；「」『』（）〜～　")
        + list(" \t\n\u00a0ab1,.!?:;()\"'-")
        + ["\u201c", "…", "《", "é", "😀", "\ufffd", "\ufeff"]
    ),
    max_size=60,
)
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)  # lone surrogates too


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(FOLD_HEAVY, ANY_TEXT))
def test_fold_is_idempotent_and_the_key_is_the_hash_of_the_fold(text: str) -> None:
    folded = fold(text)
    assert fold(folded) == folded
    data = text.encode("utf-8", "surrogatepass")
    assert folded_utf8(text, data) == folded.encode("utf-8", "surrogatepass")  # the byte scan misses nothing
    assert not set(folded) & set(FOLDS)


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.sampled_from(string.printable + "\x00\x7f"), max_size=200))
def test_ascii_text_is_left_as_it_is(text: str) -> None:
    assert fold(text) == text
    assert text_hash(text) == key_v1(text)
    for line in text.splitlines():
        assert normalize_line(line) == normalize_line_v1(line)


@settings(max_examples=100, deadline=None)
@given(text=st.text(st.characters(exclude_categories=("Cs",), max_codepoint=0x2FFF), max_size=80))
def test_text_below_the_cjk_blocks_keeps_its_key(text: str) -> None:
    # Latin, Cyrillic, Greek, Arabic, Devanagari, typographic punctuation: nothing below U+3000 is folded
    assert fold(text) == text and text_hash(text) == key_v1(text)
