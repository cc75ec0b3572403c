"""kiln.curate.steps.bad_words: whole words in each language's segmentation, runs of words, the keep draw for one
hit, the density mode, languages without a list, and bad lists refused before any document."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.steps.bad_words import BadWords, BadWordsConfig, preview

STEP = BadWords(BadWordsConfig())


def verdict(step: BadWords, text: str, language: str | None = "en", doc_id: str = "d") -> tuple[str, str | None] | None:
    ledger = Ledger()
    meta = {} if language is None else {"language": language}
    kept = list(step.process([Document(doc_id, text, "web", meta)], ledger))
    return None if kept else (ledger.removed[0]["reason"], ledger.removed[0]["note"])


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("The class on assessment met in the grass by the Scunthorpe canal.", "en"),  # listed words inside words
        ("我每天早上喝一杯牛乳，然后去上班。", "zh"),  # 乳 is listed; 牛乳 (milk) is one word
        ("Die Analyse der Daten dauerte drei Wochen.", "de"),
        ("Ce document décrit la configuration du serveur.", "fr"),
        ("今日は図書館で本を読みました。", "ja"),
        ("오늘은 도서관에서 책을 읽었어요.", "ko"),
    ],
)
def test_clean_text_passes(text: str, language: str) -> None:
    assert verdict(STEP, text, language) is None


@pytest.mark.parametrize(
    ("text", "language", "note"),
    [
        ("Watch this fucking video now.", "en", "en: f******"),
        ("这个网站有很多色情内容。", "zh", "zh: 色*"),
        ("Ceci est une page pour une salope.", "fr", "fr: s*****"),
        ("Это полное говно.", "ru", "ru: г****"),
        ("Have you seen 2 girls 1 cup?", "en", "en: 2" + "*" * 12),  # an entry of several words, as a run of words
        ("このサイトには無料のフェラチオの画像があります。", "ja", "ja: フ****"),  # a segmenter's words
        ("이 사이트는 보지 사진이 많아요.", "ko", "ko: 보*"),
        ("เว็บนี้มีรูปหีเยอะมาก", "th", "th: ห*"),
    ],
)
def test_a_listed_word_drops_the_document_with_a_masked_note(text: str, language: str, note: str) -> None:
    assert verdict(STEP, text, language) == ("bad_words:listed_word", note)


def test_documents_without_a_language_use_the_default_list_and_others_pass_counted() -> None:
    assert verdict(STEP, "Watch this fucking video now.", None) == ("bad_words:listed_word", "en: f******")
    ledger = Ledger()
    doc = Document("d", "Watch this fucking video now.", "web", {"language": "xx"})
    assert list(STEP.process([doc], ledger)) == [doc]
    assert ledger.tally("web").stats["bad_words:no_list:xx"] == 1
    assert verdict(BadWords(BadWordsConfig(default_language=None)), "Watch this fucking video.", None) is None


def test_one_hit_is_kept_with_the_keep_probability_the_same_documents_every_run() -> None:
    half = BadWords(BadWordsConfig(single_hit_keep_probability=0.5, seed=7))
    one_hit = [verdict(half, "Some shit happened at work.", doc_id=f"doc-{i}") is None for i in range(400)]
    assert 160 < sum(one_hit) < 240  # about half
    again = [verdict(half, "Some shit happened at work.", doc_id=f"doc-{i}") is None for i in range(400)]
    assert again == one_hit
    two_hits = [verdict(half, "Shit, this shit again.", doc_id=f"doc-{i}") for i in range(50)]
    assert all(v == ("bad_words:listed_word", "en: s***") for v in two_hits)


def test_density_mode_drops_only_above_the_share_of_listed_words() -> None:
    dense = BadWords(BadWordsConfig(max_density=0.05))
    long_clean = " ".join(["The report covers the results of the survey."] * 4)  # 32 words, 4 marks
    assert verdict(dense, f"{long_clean} Shit.") is None  # 1 of 33 words: 0.030
    assert verdict(dense, "Shit, this shit thing, shit.") == ("bad_words:density", "en: 3 hits, s***")


def test_allow_and_own_files(tmp_path: Path) -> None:
    assert verdict(BadWords(BadWordsConfig(allow={"en": ["shit"]})), "Some shit happened.") is None
    own = tmp_path / "xx.txt"
    own.write_text("# a list of our own\nblorf\n", encoding="utf-8")
    step = BadWords(BadWordsConfig(word_files={"xx": [str(own)]}))
    assert verdict(step, "the blorf is here", "xx") == ("bad_words:listed_word", "xx: b****")
    assert {"curate.bad_words.word_files.xx"} <= {found["name"] for found in step.lists}


def test_bad_lists_are_refused_before_any_document(tmp_path: Path) -> None:
    binary = tmp_path / "xx.txt"
    binary.write_bytes(b"fine\n\x89PNG\r\n")
    with pytest.raises(ConfigError, match=rf"{binary}:2: not UTF-8 text"):
        BadWords(BadWordsConfig(word_files={"xx": [str(binary)]}))
    with pytest.raises(ConfigError, match=r"default_language: no list for 'tlh'"):
        BadWords(BadWordsConfig(default_language="tlh"))
    with pytest.raises(ValueError, match=r"word_files\.xx: list file .* does not exist"):
        BadWordsConfig(word_files={"xx": [str(tmp_path / "missing.txt")]})


def test_preview_masks_all_but_the_first_character() -> None:
    assert (preview("fuck"), preview("色情"), preview("x")) == ("f***", "色*", "x")


CLEAN_WORDS = ["report", "server", "table", "river", "market", "garden", "class", "grass", "analysis", "cocktail"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(CLEAN_WORDS), min_size=1, max_size=30), st.integers(0, 30))
def test_a_listed_word_anywhere_drops_and_none_keeps(words: list[str], at: int) -> None:
    text = " ".join(words) + "."
    assert verdict(STEP, text) is None
    words.insert(min(at, len(words)), "bollocks")
    assert verdict(STEP, " ".join(words) + ".") == ("bad_words:listed_word", "en: b*******")
