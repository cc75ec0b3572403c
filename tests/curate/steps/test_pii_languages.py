"""The `pii` step in other languages: phone, section and version words of the 24 languages of
kiln.curate.steps.pii.regions, and national phone formats read with the document's language.

Every number is checked by the real `phonenumbers`; each hinted case is also shown to stay without the
language, where none of the default phone_regions has it as a valid number.
"""

from __future__ import annotations

import time

import phonenumbers
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.pii import LANGUAGE_REGIONS, PIIConfig, RedactPII, language_regions, writes_without_trunk

REDACT = RedactPII(PIIConfig())


def redacted(text: str, language: str | None = None, **config: object) -> str:
    step = RedactPII(PIIConfig(**config)) if config else REDACT
    return step.redact(text, language)[0]


# --- phone words ------------------------------------------------------------------------------------
# 968 is no assigned area code: 968-909-5111 alone stays, after a phone word it goes (as in English).

PHONE_WORDS = [
    "Teléfono:",  # es
    "Tfno.",
    "móvil",
    "Téléphone :",  # fr
    "Tél. :",
    "Telefon:",  # de pl cs sv ro hu tr
    "Telefonnummer:",
    "Handy:",
    "Rufnummer",
    "telefonszám:",
    "cellulare",  # it
    "Telefone:",  # pt
    "telemóvel",
    "Telefoon:",  # nl
    "Komórka:",  # pl
    "Телефон:",  # ru uk
    "тел.",
    "Мобильный:",
    "мобільний",
    "Telepon:",  # id
    "điện thoại:",  # vi
    "ĐT:",
    "Cep:",  # tr
    "Τηλ.:",  # el
    "Τηλέφωνο:",
    "هاتف:",  # ar
    "الهاتف:",
    "تلفن:",  # fa
    "\u095eोन:",  # hi, फ़ as one code point
    "फ\u093cोन:",  # and as a letter and a combining nukta
    "फोन:",  # and without the nukta
    "मोबाइल",
    "电话：",  # zh
    "联系电话：",
    "手機:",
    "電話番号：",  # ja
    "携帯",
    "전화",  # ko
    "전화번호:",
    "휴대폰",
    "โทร",  # th
    "โทรศัพท์",
    "มือถือ",
]


@pytest.mark.parametrize("word", PHONE_WORDS)
def test_a_phone_word_of_each_language_makes_a_phone_shape_a_phone(word: str) -> None:
    assert redacted(f"{word} 968-909-5111") == f"{word} <PHONE>"


def test_without_a_phone_word_the_same_numbers_stay() -> None:
    assert redacted("968-909-5111") == "968-909-5111"
    assert redacted("Hoteles 968-909-5111") == "Hoteles 968-909-5111"  # a word that only starts like one


# --- section and version words ----------------------------------------------------------------------
# Each dotted quad here is a public address: alone it is redacted, after these words it is kept.

SECTION_NUMBERS = [
    "Section 1.2.3.4",
    "Sección 6.2.1.2",
    "Abschnitt 3.4.1.2",
    "第 4.6.1.2 节",
    "Раздел 1.2.3.4",
    "в разделе 1.2.3.4",
    "セクション 1.2.3.4",
    "1.2.3.4 節",
    "Seção 1.2.3.4",
    "sezione 1.2.3.4",
    "w rozdziale 1.2.3.4",
    "у розділі 1.2.3.4",
    "Bölüm 1.2.3.4",
    "Bagian 1.2.3.4",
    "Mục 1.2.3.4",
    "kapitola 1.2.3.4",
    "avsnitt 1.2.3.4",
    "secțiunea 1.2.3.4",
    "a 1.2.3.4. pontban",
    "Ενότητα 1.2.3.4",
    "القسم 1.2.3.4",
    "بخش 1.2.3.4",
    "खंड 1.2.3.4",
    "섹션 1.2.3.4",
    "ส่วนที่ 1.2.3.4",
    "版本 1.2.3.4",
    "versión 1.2.3.4",
    "Версия 1.2.3.4",
    "버전 1.2.3.4",
]


@pytest.mark.parametrize("text", SECTION_NUMBERS)
def test_a_section_or_version_word_of_each_language_keeps_the_number(text: str) -> None:
    assert redacted("1.2.3.4") == "<IP_ADDRESS>"
    assert redacted(text) == text
    assert redacted(text, "ja") == text  # a language changes nothing for addresses


# --- national formats read with the document's language -----------------------------------------------

HINTED = [
    ("es", "Llame al 612 34 56 78.", "Llame al <PHONE>."),  # Spain, no trunk 0
    ("es", "Oficina: 91 123 45 67", "Oficina: <PHONE>"),
    ("es", "CDMX 55 1234 5678", "CDMX <PHONE>"),  # Mexico
    ("pt", "Ligue (11) 96123-4567", "Ligue <PHONE>"),  # Brazil, an area in parentheses
    ("pt", "ligue 11 96123-4567", "ligue <PHONE>"),
    ("pt", "liga para 912 345 678", "liga para <PHONE>"),  # Portugal, three groups of three
    ("zh", "请拨打 138 0013 8000", "请拨打 <PHONE>"),  # a Chinese mobile
    ("zh", "高雄 07 292 0344", "高雄 <PHONE>"),  # Taiwan, trunk 0
    ("ru", "Звоните 8 (495) 123-45-67", "Звоните <PHONE>"),  # Russia's trunk 8 ...
    ("ru", "Звоните (495) 123-45-67", "Звоните <PHONE>"),  # ... or none
    ("ru", "горячая линия 8 800 555-35-35", "горячая линия <PHONE>"),
    ("ko", "문의 032-9230-0209", "문의 <PHONE>"),  # Korea, trunk 0
    ("it", "cell. 312 345 6789", "cell. <PHONE>"),  # an Italian mobile (North American shape with dashes too)
    ("it", "chiamare 333-345-6789", "chiamare <PHONE>"),  # no US area: the North American shape, read as Italian
    ("el", "Αθήνα 21 2345 6789", "Αθήνα <PHONE>"),
    ("pl", "Kraków 12 345 67 89", "Kraków <PHONE>"),
    ("cs", "volejte 601 123 456", "volejte <PHONE>"),
    ("tr", "arayın 0539 559 97 89", "arayın <PHONE>"),
    ("th", "ติดต่อ 032 697 650", "ติดต่อ <PHONE>"),
    ("pt-BR", "Ligue (11) 96123-4567", "Ligue <PHONE>"),  # a region subtag
]


@pytest.mark.parametrize(("language", "text", "expected"), HINTED)
def test_a_national_number_is_read_with_the_documents_language(language: str, text: str, expected: str) -> None:
    assert redacted(text, language) == expected
    assert redacted(text) == text  # valid in none of the default phone_regions, or not of their shapes
    assert redacted(text, language, phone_regions_from_language=False) == text


def test_japanese_numbers_are_found_with_the_language_too() -> None:
    # 03-1234-5678 and 090-1234-5678 are valid in a default region as well (Italy's, Britain's): found either way.
    for text in ("お問い合わせは 03-1234-5678 まで", "携帯：090-1234-5678"):
        assert "<PHONE>" in redacted(text, "ja") and "<PHONE>" in redacted(text)


def test_the_language_adds_regions_and_never_removes_phone_regions() -> None:
    assert redacted("Tel. 020 7946 0958", "ja") == "Tel. <PHONE>"  # GB stays checked in a Japanese document
    assert redacted("Llame al 612 34 56 78", "es", phone_regions=[]) == "Llame al <PHONE>"


KEPT_WITH_LANGUAGE = [
    ("de", "Summe 612 34 56 78"),  # no German number: Germany writes it 06123 45678
    ("ru", "код 29 123-45-67"),  # Belarus writes 8 029 123-45-67
    ("es", "el 15-01-2024 a las 10:30"),
    ("es", "2024-01-15 10:30"),
    ("fr", "le 01.02.2024 12:30"),  # a date and time with a trunk-0 shape, in any document
    ("es", "1 234 567 890 habitantes"),  # thousands
    ("es", "612.345.678 euros"),
    ("pl", "kwota 123 456 789 zł"),  # three groups of three beside a currency
    ("pt", "R$ 123 456 789"),
    ("pt", "CEP 01310-100"),
    ("pt", "CPF 123.456.789-09"),
    ("es", "ISBN 84-376-0494-2"),
    ("zh", "1998-2003 2005-2010"),
    ("ru", "ИНН 7707083893"),  # a bare digit run
    ("es", "HP part no 33471-90901"),  # two groups only
    ("pl", "A W E\n  041 117 132\n  133 112 255\n  135 132 275"),  # a column of a table
    ("es", "666-12-3456"),  # an SSN's shape
]


@pytest.mark.parametrize(("language", "text"), KEPT_WITH_LANGUAGE)
def test_dates_amounts_and_codes_stay_in_a_document_with_a_language(language: str, text: str) -> None:
    assert redacted(text, language) == text


def test_a_phone_word_still_decides_an_amount_shaped_number() -> None:
    assert redacted("Teléfono: 612 345 678", "es") == "Teléfono: <PHONE>"
    assert redacted("1 612 345 678", "es") == "1 612 345 678"


def test_process_reads_the_language_from_meta() -> None:
    ledger = Ledger()
    docs = [
        Document("a", "Llame al 612 34 56 78", "web", {"language": "es"}),
        Document("b", "Llame al 612 34 56 78", "web"),
        Document("c", "Llame al 612 34 56 78", "web", {"language": "en"}),
    ]
    out = list(RedactPII(PIIConfig()).process(docs, ledger))
    assert [d.text for d in out] == ["Llame al <PHONE>", "Llame al 612 34 56 78", "Llame al 612 34 56 78"]
    assert ledger.tally("web").stats["pii:phone"] == 1


def test_language_regions_by_hand() -> None:
    assert language_regions("pt") == ("BR", "PT")
    assert language_regions("pt-BR") == ("BR", "PT") and language_regions("es_AR") == ("AR", "ES", "MX", "CO")
    assert language_regions("zh-Hant") == ("CN", "TW", "HK")
    assert language_regions("en") == language_regions("xx") == language_regions(None) == ()
    assert all(regions and len(regions) <= 4 for regions in LANGUAGE_REGIONS.values())


def test_which_regions_write_numbers_without_a_trunk_0() -> None:
    assert [r for r in ("ES", "BR", "CN", "RU", "IT", "DE", "JP", "FR", "KR") if writes_without_trunk(r)] == [
        "ES",
        "BR",
        "CN",
        "RU",
        "IT",
    ]


# --- properties -------------------------------------------------------------------------------------

# A region that writes numbers without a trunk 0, and a language that names it.
WITHOUT_TRUNK = {"ES": "es", "MX": "es", "BR": "pt", "PT": "pt", "CN": "zh", "RU": "ru", "PL": "pl", "GR": "el"}


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(WITHOUT_TRUNK)),
    st.sampled_from([phonenumbers.PhoneNumberType.FIXED_LINE, phonenumbers.PhoneNumberType.MOBILE]),
    st.integers(0, 9999),
)
def test_any_valid_national_number_as_libphonenumber_writes_it_is_found(region: str, kind: int, last: int) -> None:
    example = phonenumbers.example_number_for_type(region, kind)
    digits = str(example.national_number)
    number = phonenumbers.parse(digits[:-4] + f"{last:04d}", region)
    assume(phonenumbers.is_valid_number(number))
    national = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL)
    assert redacted(f"Contacto {national} hoy", WITHOUT_TRUNK[region]) == "Contacto <PHONE> hoy"


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 999),
    st.lists(st.integers(0, 999), min_size=2, max_size=3),
    st.sampled_from(sorted(LANGUAGE_REGIONS)),
)
def test_a_number_in_thousands_is_never_a_phone(head: int, groups: list[int], language: str) -> None:
    text = "total " + " ".join([str(head), *(f"{g:03d}" for g in groups)])
    assume(not (len(groups) == 2 and head >= 100))  # three groups of three: how mobiles are written too
    assert redacted(text, language) == text


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from("0123456789 -()+8.:\n§第节電話ab"), max_size=40), st.sampled_from(["es", "ru"]))
def test_never_raises_and_is_idempotent_with_a_language(text: str, language: str) -> None:
    once = redacted(text, language)
    assert redacted(once, language) == once


ADVERSARIAL = {
    "groups": "12 " * 70_000,
    "trunk 8 and areas": "8 (12) 3" * 30_000,
    "dashed groups": "1-22-" * 40_000,
    "phones in a row": "612 34 56 78 " * 16_000,
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_the_grouped_shape_stays_linear(name: str) -> None:
    start = time.perf_counter()
    redacted(ADVERSARIAL[name], "ru")
    assert time.perf_counter() - start < 5.0  # 200 KB; backtracking would take minutes
