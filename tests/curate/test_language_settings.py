"""Settings per language (kiln.curate.languages): the shipped file, which value wins, the chain's ByLanguage step.
The keep rates of one text in twelve languages are tests/test_demo.py's, on recipes/multilingual.yaml."""

from __future__ import annotations

import hashlib

import pytest

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.languages import LANGUAGE_DEFAULTS, LANGUAGES_FILE, USED, shipped, shipped_source
from kiln.curate.steps.chain import SourceSteps, prose_steps, run_document

# The shipped file as LANGUAGE_DEFAULTS names it: a change to the file must come with a new version (and this digest).
SHIPPED_SHA256 = "3e07766a722551bed8ad2aab42a24040b31e78f4574642ed4d40ec0146932b77"
# The languages of the web's largest shares that must have settings of their own (the issue's list, and more).
REQUIRED = "zh ja ko th hi ar ru de fr es pt it id vi tr pl nl fa uk cs sv ro hu el da fi he bg sk".split()


def test_the_shipped_file_is_the_version_it_names_and_every_entry_is_valid_with_its_source() -> None:
    assert hashlib.sha256(LANGUAGES_FILE.read_bytes()).hexdigest() == SHIPPED_SHA256, (
        f"languages.yaml changed: bump LANGUAGE_DEFAULTS (now {LANGUAGE_DEFAULTS}) and this digest"
    )
    assert set(REQUIRED) <= set(shipped()) and len(shipped()) >= 25
    cfg = CurateConfig()
    for code in shipped():
        own = cfg.for_language("web", code)  # validates every section the language sets
        assert own.gopher_quality.stop_words != cfg.gopher_quality.stop_words, code
        assert shipped_source(code).startswith("FineWeb-2 configs/"), code
    assert shipped()["fr"]["gopher_quality"]["min_alpha_word_fraction"] == 0.812  # fra_Latn's max_non_alpha_words_ratio
    assert cfg.for_language("web", "en") is cfg  # English keeps the steps' own settings


def test_which_value_wins_source_then_recipe_language_then_recipe_then_shipped_then_default() -> None:
    cfg = CurateConfig.model_validate(
        {
            "gopher_quality": {"min_alpha_word_fraction": 0.5},  # the recipe's, for every language
            "languages": {"fr": {"gopher_quality": {"max_mean_word_length": 30}}},
            "sources": {"manual": {"gopher_quality": {"max_mean_word_length": 40, "min_words": 10}}},
        }
    )
    web = cfg.for_language("web", "fr").gopher_quality
    assert web.min_alpha_word_fraction == 0.5  # the recipe's own value beats the shipped 0.812
    assert web.max_mean_word_length == 30  # the recipe's language value beats the shipped 11
    assert web.min_mean_word_length == 2  # shipped, where the recipe kept kiln's default (3)
    assert web.min_words == 50  # no one's: kiln's default
    manual = cfg.for_language("manual", "fr").gopher_quality
    assert (manual.max_mean_word_length, manual.min_words) == (40, 10)  # the source's own beat everything
    off = CurateConfig.model_validate({"language_defaults": None}).for_language("web", "fr")
    assert off.gopher_quality == CurateConfig().gopher_quality


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"languages": {"xx": {}}}, "curate.languages.xx: 'xx' is not a language code"),
        ({"languages": {"fr": {"url_filter": {}}}}, "curate.languages.fr.url_filter: not a step a language can set"),
        ({"languages": {"fr": {"language": {"languages": ["fr"]}}}}, "curate.languages.fr.language.languages: set"),
        ({"languages": {"fr": {"gopher_quality": {"min_words": -1}}}}, "curate.languages.fr.gopher_quality.min_words"),
        (
            {"languages": {"fr": {"gopher_quality": 3}}},
            "languages.fr.gopher_quality\n  Input should be a valid dictionary",
        ),
        ({"c4": {"enabled": False}, "languages": {"fr": {"c4": {"enabled": True}}}}, "can turn a step off, not on"),
        ({"language_defaults": "kiln-languages v0"}, "is not a set of settings this kiln ships"),
    ],
)
def test_bad_language_settings_are_refused_naming_the_key(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        CurateConfig.model_validate(settings)


FRENCH = (
    "L'outil lit les pages et les documents de la maison, puis il garde le texte propre et retire les doublons.\n"
    "Les fichiers du projet sont écrits dans un dossier par source et par tâche, au fil des étapes du travail.\n"
    "Chaque règle dit pourquoi elle retire une page : trop peu de mots, des lignes répétées ou des symboles.\n"
    "Le résumé donne le nombre de documents gardés pour chaque langue, avec les réglages de cette langue.\n"
)


def outcome(cfg: CurateConfig, text: str, language: str | None) -> tuple[Document | None, Ledger]:
    steps = SourceSteps.of(cfg)
    chain = prose_steps(steps.for_source("web"), languages=steps.languages_of("web"))
    chain = [s for s in chain if s.name not in ("line_dedup", "language", "decontaminate")]
    ledger = Ledger(0)
    meta = {"language": language} if language else {}
    return run_document(Document(id="d", text=text, source="web", meta=meta), chain, ledger), ledger


def test_a_document_goes_through_its_languages_steps_and_is_counted_for_the_manifest() -> None:
    cfg = CurateConfig(c4={"enabled": False})
    kept, ledger = outcome(cfg, FRENCH, "fr")
    assert kept is not None and ledger.sources["web"].stats[USED + "fr"] == 1
    dropped, ledger = outcome(cfg, FRENCH, None)  # without a language: English's stop words
    assert dropped is None and ledger.sources["web"].removed == {"gopher_quality:too_few_stop_words": 1}
    strict = cfg.model_copy(update={"languages": {"fr": {"gopher_quality": {"min_words": 500}}}})
    dropped, ledger = outcome(CurateConfig.model_validate(strict.model_dump()), FRENCH, "fr")
    assert dropped is None and ledger.sources["web"].removed == {"gopher_quality:too_few_words": 1}
    off = CurateConfig.model_validate(
        {"c4": {"enabled": False}, "languages": {"fr": {"gopher_quality": {"enabled": False}}}}
    )
    kept, _ = outcome(off.model_copy(update={"language_defaults": None}), FRENCH, "fr")
    assert kept is not None  # the language turned the rule off
