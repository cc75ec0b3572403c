"""The report's evaluation section: a per-language table where the eval manifest has per-language figures,
none where it has not; the tokenizer section of a corpus too small to hold documents out."""

from __future__ import annotations

import json
from pathlib import Path

from kiln.core.layout import EVAL, TOKENIZER
from kiln.report.results import evaluation, tokenizer
from kiln.report.run_files import RunFiles


def scores(loss: float, bpb: float, tokens: int) -> dict[str, float]:
    return {"loss": loss, "perplexity": 1.0, "bpb": bpb, "tokens": tokens, "bytes": 4 * tokens}


def test_the_evaluation_section_has_a_row_per_language(tmp_path: Path) -> None:
    after = {
        "sources": {"fr": scores(2.0, 0.9, 100), "zh_CN": scores(3.0, 1.4, 80), "zh_TW": scores(3.2, 1.5, 20)},
        "all": scores(2.5, 1.1, 200),
        "languages": {
            "zh": {**scores(3.04, 1.42, 100), "sources": ["zh_CN", "zh_TW"]},
            "fr": {**scores(2.0, 0.9, 100), "sources": ["fr"]},
        },
    }
    before = {**after, "languages": {"zh": {**scores(9.0, 4.25, 100), "sources": ["zh_CN", "zh_TW"]}}}
    run = RunFiles(tmp_path, {EVAL: {"counts": {"after": after, "before": before}}})
    html = evaluation(run).body
    assert "<h3>Per language</h3>" in html
    zh = (
        '<td>zh</td><td class="num">4.25</td><td class="num">1.42</td><td class="num">3.04</td><td class="num">400</td>'
        '<td class="num">100</td><td>zh_CN, zh_TW</td>'
    )
    assert zh in html and "<td>fr</td><td></td>" in html  # fr has no figure before training here
    del after["languages"]
    assert "Per language" not in evaluation(run).body


def test_a_tokenizer_with_no_held_out_documents_says_so(tmp_path: Path) -> None:
    stage = tmp_path / TOKENIZER
    stage.mkdir()
    (stage / "report.json").write_text(json.dumps({"sample_docs": 12, "sample_bytes": 900, "heldout": None}))
    section = tokenizer(RunFiles(tmp_path, {TOKENIZER: {"counts": {}}}))
    assert "No held-out documents" in section.body
