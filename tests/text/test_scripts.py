"""kiln.text.scripts: the script of a text's letters, worked by hand for each kind of script, the Han
resolution (Jpan, Hans, Hant, Hani) and its weight, the one-form tables, and (hypothesis) the counts against
a character-by-character reference and no raise on any text."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.text import scripts
from kiln.text.scripts import (
    LETTER_WEIGHTS,
    SCRIPTS,
    SIMPLIFIED_ONLY,
    TRADITIONAL_ONLY,
    char_script,
    script_letters,
    text_script,
    weighted_letters,
)


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("The kiln was fired slowly.", "Latn"),
        ("Le four a été chauffé lentement.", "Latn"),
        ("Пећ је полако загревана.", "Cyrl"),  # Serbian in Cyrillic
        ("Peć je polako zagrevana.", "Latn"),  # the same in Latin letters
        ("Ο κλίβανος θερμάνθηκε αργά.", "Grek"),
        ("הכבשן חומם לאט.", "Hebr"),
        ("تم تسخين الفرن ببطء.", "Arab"),
        ("भट्ठी को धीरे-धीरे गरम किया गया।", "Deva"),
        ("เตาเผาถูกทำให้ร้อนอย่างช้าๆ", "Thai"),
        ("가마를 천천히 데웠다.", "Hang"),
        ("窯はゆっくりと温められた。", "Jpan"),
        ("这座窑慢慢加热。", "Hans"),
        ("這座窯慢慢加熱。", "Hant"),
        ("中文", "Hani"),  # neither character has another form: undecided
        ("ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ", "Cher"),
        ("", "Zyyy"),
        ("12:30 -- 4.5% 😀 ©", "Zyyy"),
        ("ー", "Zyyy"),  # the prolonged sound mark is a letter of both kana scripts: of no one script
        ("a\udcff b", "Latn"),  # a lone surrogate (text read with surrogateescape) is no letter
        ("\U00020000\U00020001", "Hani"),  # Han outside the Basic Multilingual Plane
    ],
)
def test_script_of_each_kind(text: str, script: str):
    assert text_script(text) == script and script in SCRIPTS


def test_letters_counted_by_hand():
    # 'Kiln' 4 Latin, 'печь' 4 Cyrillic, '窯' 1 Han, 'かま' 2 Hiragana; digits, marks and spaces count for none.
    assert script_letters("Kiln 42, печь: 窯 かま!") == {"Cyrl": 4, "Latn": 4, "Hira": 2, "Hani": 1}
    assert script_letters("kiln 42") == {"Latn": 4} and script_letters("42") == {}


def test_the_most_letters_win():
    assert text_script("Пећ je") == "Cyrl"  # 3 Cyrillic letters against 2 Latin
    assert text_script("Пећ jeste") == "Latn"


def test_letters_weighed_by_hand():
    assert weighted_letters("It's 4:30, l'été!") == 7  # I t s l é t é: digits and punctuation are not letters
    assert weighted_letters("नमस्ते") == 4  # न म स त: the vowel signs and the virama are marks
    assert weighted_letters("窯はかま, kiln") == 3 + 3 * 1.5 + 4  # a Han weighs 3 letters, a kana 1.5
    assert weighted_letters("가마") == 4 and weighted_letters("ー") == 0


def test_han_weighs_three_letters_against_latin():
    # 汉 (漢 in traditional) and 语 (語): 2 Han characters weigh 6 letters, beating 5 Latin but not 7.
    assert text_script("汉语 abcde") == "Hans"
    assert text_script("汉语 abcdefg") == "Latn"


def test_kana_share_makes_japanese():
    # A katakana loan word in a longer Chinese text stays Chinese (3 kana of 63 Han and kana letters, under 0.05).
    chinese = "这座窑用了三天慢慢加热，陶工们看着火焰的颜色从橙色变成明亮稳定的黄色。" * 2 + "オーブン"
    assert text_script(chinese) == "Hans"
    assert text_script("窯を開けると、器はすべて無事だった。") == "Jpan"


def test_han_form_by_the_majority_of_one_form_characters():
    assert text_script("这个程序是自由软件，國") == "Hans"  # 这 个 against 國
    assert text_script("這個程式是自由軟體，国") == "Hant"  # 這 個 體 against 国
    assert text_script("国國") == "Hani"  # one each: undecided


def test_one_form_tables():
    assert {"国", "这", "个", "为", "体"} <= SIMPLIFIED_ONLY and {"國", "這", "個", "為", "體"} <= TRADITIONAL_ONLY
    assert not SIMPLIFIED_ONLY & TRADITIONAL_ONLY
    shared = set("后台里面着群中文的是人")  # written the same in both forms (or used in Taiwan as they are)
    assert not shared & (SIMPLIFIED_ONLY | TRADITIONAL_ONLY)
    assert (len(SIMPLIFIED_ONLY), len(TRADITIONAL_ONLY)) == (1217, 1766)


def reference_letters(text: str) -> dict[str, int]:
    """script_letters the slow way: every character looked up on its own."""
    counts = Counter(script for c in text if (script := char_script(c)) is not None)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, exclude_categories=("Cs",)) | st.sampled_from("aяא中かカ한ー\udcff")))
def test_counts_match_the_reference_and_never_raise(text: str):
    letters = reference_letters(text)
    assert script_letters(text) == letters
    assert weighted_letters(text) == sum(n * LETTER_WEIGHTS.get(script, 1) for script, n in letters.items())
    assert text_script(text) in SCRIPTS


def test_unknown_script_code_is_skipped_not_an_error():
    assert not scripts._known("Qaaa")  # ISO 15924's private-use code: no Unicode script
