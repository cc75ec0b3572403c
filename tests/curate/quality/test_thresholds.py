"""`kiln quality thresholds`: thresholds from a trusted reference remove what they say, through the real steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kiln.cli import main
from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.config import CurateConfig
from kiln.curate.quality.thresholds import derive
from kiln.curate.readers.gettext import aligned
from kiln.curate.steps.fineweb import FineWebQuality
from kiln.curate.steps.gopher import GopherQuality, GopherRepetition

LOCALE = Path("/usr/share/locale")


def french_reference(n_docs: int = 120) -> list[Document]:
    """Documents of eight translated French messages each: text of the language that a user would trust."""
    if not (LOCALE / "fr" / "LC_MESSAGES").is_dir():
        pytest.skip("this machine has no French message catalogs")
    messages = aligned(str(LOCALE), ("fr",))[: 8 * n_docs]
    return [
        Document(id=f"fr{i}", text="\n".join(m.translations["fr"] for m in messages[i : i + 8]), source="reference")
        for i in range(0, len(messages) - 7, 8)
    ]


def test_each_threshold_removes_from_the_reference_the_share_it_reports_through_the_real_step() -> None:
    docs = french_reference()
    d = derive(docs, "fr", remove=0.1)
    assert all(share <= 0.1 for share in d.removes.values()), d.removes
    assert d.removes["gopher_quality.max_mean_word_length"] > 0.05  # placed where it bites, not past the data
    assert {"de", "la", "les"} <= set(d.stop_words)
    french = [doc.with_meta(language="fr") for doc in docs]

    def share_removed(step: object) -> float:
        return sum(step.check(doc) is not None for doc in french) / len(french)

    off = {"max_dup_paragraph_fraction": 1, "max_dup_line_char_fraction": 1, "max_dup_paragraph_char_fraction": 1}
    top2 = GopherRepetition(
        CurateConfig.model_validate(
            {
                "gopher_repetition": {
                    **off,
                    "max_dup_line_fraction": 1,
                    "max_top_ngram_char_fraction": {2: d.thresholds["gopher_repetition.max_top_ngram_char_fraction.2"]},
                    "max_dup_ngram_char_fraction": {},
                }
            }
        ).gopher_repetition
    )
    assert share_removed(top2) == pytest.approx(d.removes["gopher_repetition.max_top_ngram_char_fraction.2"])
    newlines = d.thresholds["fineweb.max_newlines_per_word"]
    fineweb = FineWebQuality(
        CurateConfig.model_validate(
            {
                "fineweb": {
                    "min_punctuated_line_fraction": 0,
                    "max_short_line_fraction": 1,
                    "max_dup_line_char_fraction": 1,
                    "max_newlines_per_word": newlines,
                }
            }
        ).fineweb
    )
    assert share_removed(fineweb) == pytest.approx(d.removes["fineweb.max_newlines_per_word"])
    alpha = d.thresholds["gopher_quality.min_alpha_word_fraction"]
    quality = GopherQuality(
        CurateConfig.model_validate(
            {
                "gopher_quality": {
                    "min_words": 0,
                    "min_mean_word_length": 0,
                    "max_mean_word_length": 100,
                    "max_hashes_per_word": 100,
                    "max_ellipses_per_word": 100,
                    "min_stop_words": 0,
                    "min_alpha_word_fraction": alpha,
                }
            }
        ).gopher_quality
    )
    assert share_removed(quality) == pytest.approx(d.removes["gopher_quality.min_alpha_word_fraction"])


def test_the_command_writes_recipe_yaml_that_a_recipe_takes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    reference = tmp_path / "fr.jsonl"
    reference.write_text(
        "".join(json.dumps({"text": d.text}, ensure_ascii=False) + "\n" for d in french_reference(60)), "utf-8"
    )
    out = tmp_path / "fr.yaml"
    assert main(["quality", "thresholds", "--reference", str(reference), "--language", "fr", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gopher_quality.max_mean_word_length" in printed and "all together" in printed
    settings = yaml.safe_load(out.read_text(encoding="utf-8"))["curate"]
    cfg = CurateConfig.model_validate(settings)
    assert cfg.for_language("web", "fr").gopher_quality.stop_words == tuple(
        settings["languages"]["fr"]["gopher_quality"]["stop_words"]
    )


def test_a_reference_too_small_or_a_language_unknown_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="the reference holds 3 documents; give at least 50"):
        derive(french_reference()[:3], "fr")
    assert main(["quality", "thresholds", "--reference", "x.jsonl", "--language", "french"]) == 2
