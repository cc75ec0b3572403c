"""Words per language (kiln.text.languages through kiln.text.segments): examples worked by hand for each way
of writing, the script fallback named, the language a text's script implies, and (hypothesis) that no rule
loses or invents a character."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.document import Document
from kiln.text import languages
from kiln.text.languages import SUDACHI_MAX_BYTES, fallbacks, script_language
from kiln.text.segments import segments, split_words


@pytest.mark.parametrize(
    ("language", "text", "words"),
    [
        ("fr", "L'homme qu'il aime, aujourd'hui.", ["L'", "homme", "qu'", "il", "aime", ",", "aujourd'hui", "."]),
        ("fr", "Jusqu'à l’été d'abord", ["Jusqu'", "à", "l’", "été", "d'", "abord"]),
        ("it", "dell'anno, all'inizio c'è", ["dell'", "anno", ",", "all'", "inizio", "c'", "è"]),
        ("ca", "l'aigua d'ahir", ["l'", "aigua", "d'", "ahir"]),
        ("de", "Die Donaudampfschifffahrt ist's.", ["Die", "Donaudampfschifffahrt", "ist's", "."]),
        ("es", "¿Dónde está? No sé.", ["¿", "Dónde", "está", "?", "No", "sé", "."]),
        (
            "ko",
            "사용자 설정 CSS를 일시적으로 사용할 수 있습니다.",
            ["사용자", "설정", "CSS를", "일시적으로", "사용할", "수", "있습니다", "."],
        ),
        (
            "zh",
            "您可以点击上面的按钮来暂时停用这个自定义 CSS。",
            ["您", "可以", "点击", "上面", "的", "按钮", "来", "暂时", "停用", "这个", "自定义", "CSS", "。"],
        ),
        (
            "ja",
            "一時的に無効化する場合は、ボタンを押してください。",
            ["一時的", "に", "無効化", "する", "場合", "は", "、", "ボタン", "を", "押し", "て", "ください", "。"],
        ),
        ("th", "คุณสามารถปิดใช้ CSS ที่กำหนดเองได้", ["คุณ", "สามารถ", "ปิด", "ใช้", "CSS", "ที่", "กำหนด", "เอง", "ได้"]),
        ("en", "Don't do it, it's John's.", ["Do", "n't", "do", "it", ",", "it", "'s", "John", "'s", "."]),
    ],
)
def test_each_way_of_writing_splits_as_worked_by_hand(language: str, text: str, words: list[str]) -> None:
    assert split_words(text, language) == words


def test_a_language_without_a_segmenter_here_falls_back_to_its_characters_and_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    languages.segmenter.cache_clear()  # as in a fresh process: the fallback is said once per process
    languages._fallbacks.clear()
    with caplog.at_level(logging.WARNING, logger="kiln.text"):
        assert split_words("ສະບາຍດີ ທ່ານ CSS", "lo") == ["ສ", "ະ", "ບ", "າ", "ຍ", "ດີ", "ທ່", "າ", "ນ", "CSS"]
        split_words("ສະບາຍດີ", "lo")
    assert fallbacks() == ["lo"]
    assert caplog.text.count("lo text is split one character per word (no segmenter for it here)") == 1


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("plain English, ASCII", None),
        ("naïve café résumé", None),
        ("我们的软件是免费的", "zh"),
        ("ひらがなと漢字", "ja"),
        ("ภาษาไทย", "th"),
        ("한국어 텍스트", "ko"),
        ("mostly Latin text with 中文", None),
    ],
)
def test_a_text_of_no_known_language_is_split_by_the_language_its_script_implies(text: str, language: str) -> None:
    assert script_language(text) == language


def test_a_documents_words_follow_its_language_once_the_language_step_names_it() -> None:
    doc = Document(id="d", text="L'homme qu'il aime.", source="web", meta={})
    assert segments(doc).lines == ["L'homme qu'il aime."]
    assert segments(doc).words[0] == "L'homme"  # no language yet: English's rule
    named = doc.with_meta(language="fr")
    assert segments(named).words[:2] == ["L'", "homme"]


def test_japanese_longer_than_one_sudachi_call_is_split_in_pieces() -> None:
    line = "一時的に無効化する場合は、ボタンを押してください。\n"
    text = line * (SUDACHI_MAX_BYTES // len(line.encode()) * 3)
    assert len(text.encode()) > 3 * SUDACHI_MAX_BYTES * 0.9
    words = split_words(text, "ja")
    assert words.count("無効化") == text.count("無効化")


# Characters of every way of writing, and the marks and spaces between them.
SCRIPTS = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴跑乐喝云朋板纸"
    "カタカナひらがなあいうえおかきくけこ한국어텍스트ภาษาไทยกขคงສະບາຍດີ .,!?\n'’lL"
)
any_text = st.text(
    alphabet=st.one_of(st.characters(codec="utf-8", exclude_categories=("Cs",)), st.sampled_from(SCRIPTS)),
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(text=any_text, language=st.sampled_from([None, "en", "fr", "it", "de", "ko", "zh", "ja", "th", "lo"]))
def test_no_rule_loses_or_invents_a_character(text: str, language: str | None) -> None:
    words = split_words(text, language)
    assert "".join("".join(words).split()) == "".join(text.split())  # whitespace aside (a segmenter keeps \x1f)
    assert all(w.strip() == w and w for w in words)
