"""kiln.curate.steps.language: lid.176 from the installed package, annotation, both drop reasons at
their thresholds, the rounding rule worked by hand, pickling, and no-raise on any text."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.steps import language
from kiln.curate.steps.language import LanguageConfig, LanguageID
from kiln.text import language as text_language
from kiln.text.language import load_model, predict_language

ENGLISH = (
    "The kiln was fired slowly over three days, and the potters watched the colour of the flame\nchange from orange "
    "to a bright, steady yellow."
)
FRENCH = (
    "Le four a été chauffé lentement pendant trois jours, et les potiers ont regardé la couleur de la flamme changer."
)


def doc(text: str) -> Document:
    return Document("d", text, "web", {"path": "a.txt"})


def run(d: Document, **config: object) -> tuple[list[Document], Ledger]:
    ledger = Ledger()
    return list(LanguageID(LanguageConfig(**config)).process([d], ledger)), ledger


def test_model_is_loaded_once_from_the_package():
    assert load_model() is load_model()
    assert text_language.model_path().name == "lid.176.ftz"


def test_english_kept_and_annotated():
    d = doc(ENGLISH)
    out, ledger = run(d)
    lang, score = predict_language(ENGLISH)
    assert lang == "en" and score > 0.9
    assert out[0].text == d.text and out[0].meta == {
        "path": "a.txt",
        "language": "en",
        "language_score": round(score, 4),
    }
    assert not ledger.removed


def test_other_language_dropped_with_language_as_note():
    out, ledger = run(doc(FRENCH))
    row = ledger.removed[0]
    assert (
        out == []
        and row["reason"] == "language:not_allowed"
        and row["note"] == "detected fr; allowed en"
        and row["value"] > 0.9
        and row["threshold"] is None
    )


def test_min_score_just_inside_and_just_outside():
    score = round(predict_language(ENGLISH)[1], 4)
    out, _ = run(doc(ENGLISH), min_score=score)
    assert len(out) == 1
    out, ledger = run(doc(ENGLISH), min_score=score + 0.0001)
    assert out == [] and ledger.removed[0]["reason"] == "language:low_score"
    assert (ledger.removed[0]["value"], ledger.removed[0]["threshold"]) == (score, score + 0.0001)


def test_rounded_score_decides_by_hand(monkeypatch: pytest.MonkeyPatch):
    # 0.64996 rounds to 0.65 (kept at min_score 0.65, and recorded as 0.65); 0.64994 rounds to 0.6499 (dropped).
    monkeypatch.setattr(language, "predict_language", lambda text, max_chars=None: ("en", 0.64996))
    out, _ = run(doc("x"))
    assert out[0].meta["language_score"] == 0.65
    monkeypatch.setattr(language, "predict_language", lambda text, max_chars=None: ("en", 0.64994))
    out, ledger = run(doc("x"))
    assert out == [] and ledger.removed[0]["value"] == 0.6499


@pytest.mark.parametrize("languages", [None, []])
def test_no_language_list_keeps_everything_and_annotates(languages: list[str] | None):
    out, ledger = run(doc(FRENCH), languages=languages)
    assert out[0].meta["language"] == "fr" and not ledger.removed
    out, _ = run(doc(""), languages=languages)  # even a score far below min_score
    assert "language_score" in out[0].meta


def test_several_languages_allowed():
    out, _ = run(doc(FRENCH), languages=["en", "fr"])
    assert out[0].meta["language"] == "fr"


def test_unknown_language_code_is_a_config_error():
    with pytest.raises(ConfigError, match="eng"):
        LanguageID(LanguageConfig(languages=["eng"]))


def test_prefix_limit_reads_only_the_start():
    text = ENGLISH + " " + FRENCH * 20
    assert predict_language(text)[0] == "fr"
    assert predict_language(text, max_chars=len(ENGLISH))[0] == "en"


def test_step_pickles_for_workers():
    step = pickle.loads(pickle.dumps(LanguageID(LanguageConfig())))
    assert step.check(doc(ENGLISH)) is None


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_never_raises_on_any_text(text: str):
    lang, score = predict_language(text)
    assert lang and 0.0 <= score <= 1.0
    list(LanguageID(LanguageConfig()).process([doc(text)], Ledger()))


def test_nul_does_not_end_the_text():
    assert predict_language("\x00" + FRENCH)[0] == "fr"
