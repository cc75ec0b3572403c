"""Harmful content measured end to end (tests/curate/safety_measure.py): planted adult, abusive and gambling
documents in four languages among clean text of this machine, removed by the default URL and bad-words steps
and a classifier trained on another seed's labels; the report's funnel and examples show what each removed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from safety_measure import measure

from kiln.report_hooks import build_report


@pytest.mark.slow
def test_planted_unsafe_documents_go_and_clean_ones_stay(tmp_path: Path) -> None:
    found = measure(tmp_path, per_kind=8, clean_mb=1.5)
    assert found["planted"] == 4 * 3 * 8 and found["clean"] >= 100
    assert found["planted_removed"] >= 0.95 * found["planted"], found["by_reason"]
    assert found["clean_removed"] <= 0.02 * found["clean"], found["clean_reasons"]
    # Each step removes some planted documents the others would have let through.
    assert {reason.split(":")[0] for reason in found["by_reason"]} == {"url_filter", "bad_words", "classifiers"}

    # The report: the funnel rows of the three steps, and their examples masked.
    page = build_report(found["stage"].parent).read_text()
    funnel = page[page.index('id="funnel"') : page.index('id="removals"')]
    for row in ("url_filter", "prose/bad_words", "prose/classifiers"):
        assert f">{row}<" in funnel
    removals = page[page.index('id="removals"') : page.index('id="duplicates"')]
    assert "text (masked: removed as unsafe)" in removals and not re.search(r"\b(fuck|casino|Casino)\b", removals)
