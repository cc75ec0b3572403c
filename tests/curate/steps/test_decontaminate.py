"""kiln.curate.steps.decontaminate and its index (kiln.curate.dedup.ngram_index): planted n-grams
found and shorter overlaps ignored, normalization, attribution to every set and item, verification
against words, flag mode, Bloom filters sized by hand and their measured false-positive rate, bad
evaluation files, and the report worked by hand."""

from __future__ import annotations

import gzip
import json
import math
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.curate.audit import Ledger
from kiln.curate.dedup.bloom import BloomFilter
from kiln.curate.dedup.ngram_index import build_index, item_texts, load_index, set_name
from kiln.curate.steps.decontaminate import (
    Decontaminate,
    DecontaminateConfig,
    EvalSetConfig,
    build_report,
    format_report,
)
from kiln.text.shingles import words

# 19 words; its first 13 are the planted n-gram.
QUESTION = (
    "Which of the following best describes the role of the mitochondria in a eukaryotic cell during aerobic "
    "respiration today?"
)
FILLER = "Some unrelated training prose about gardens and rivers comes first, and more of it follows after."


def write_set(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def step_for(tmp_path: Path, sets: dict[str, list[Any]], **config: Any) -> Decontaminate:
    """Write the sets, build the index, and return the step reading it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = DecontaminateConfig(
        eval_sets=[
            EvalSetConfig(path=str(write_set(tmp_path / f"{name}.jsonl", records))) for name, records in sets.items()
        ],
        **config,
    )
    build_index(cfg, tmp_path / "index")
    return Decontaminate(cfg, tmp_path / "index")


def run(step: Decontaminate, *texts: str) -> tuple[list[Document], Ledger]:
    ledger = Ledger()
    return list(step.process([Document(f"web/{i}", t, "web") for i, t in enumerate(texts)], ledger)), ledger


def first_words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


MMLU = [
    {"question": "What is two plus two?", "choices": ["3", "4"]},
    {"question": QUESTION, "choices": ["energy", "storage"], "answer": 0},
]


# --- found and not found --------------------------------------------------------------------------


def test_planted_13_gram_is_removed_and_a_12_gram_kept(tmp_path):
    step = step_for(tmp_path, {"mmlu": MMLU})
    planted = f"{FILLER} {first_words(QUESTION, 13)} {FILLER}"
    near = f"{FILLER} {first_words(QUESTION, 12)} {FILLER}"
    out, ledger = run(step, planted, near)
    assert [d.id for d in out] == ["web/1"] and out[0].text == near
    (row,) = ledger.removed
    assert (
        row["id"] == "web/0"
        and row["reason"] == "decontaminate:ngram_overlap"
        and (row["value"], row["threshold"]) == (1.0, 1.0)
    )
    assert row["note"] == "mmlu:1 (13-gram: 'which of the following best describes the role of the mitochondria in a')"
    assert ledger.records == {
        "contamination": [{"id": "web/0", "source": "web", "set": "mmlu", "item": 1, "action": "remove"}]
    }
    assert ledger.tally("web").stats == {"decontaminate:mmlu": 1}


def test_case_and_punctuation_do_not_hide_a_match(tmp_path):
    step = step_for(tmp_path, {"mmlu": MMLU})
    shouted = "WHICH of the following -- best describes... the ROLE of the 'mitochondria' in a eukaryotic\ncell"
    out, ledger = run(step, f"{FILLER} {shouted}")
    assert out == [] and ledger.records["contamination"][0]["item"] == 1


def test_digits_are_not_folded_by_default(tmp_path):
    item = {"question": "If you add 2 and 2 together the result is 4 and never anything else at all"}
    other = "If you add 3 and 3 together the result is 6 and never anything else at all"
    out, ledger = run(step_for(tmp_path / "plain", {"math": [item]}), other, item["question"])
    assert [d.id for d in out] == ["web/0"] and [r["id"] for r in ledger.removed] == ["web/1"]
    out, ledger = run(step_for(tmp_path / "folded", {"math": [item]}, fold_digits=True), other)
    assert out == [] and ledger.removed[0]["reason"] == "decontaminate:ngram_overlap"


def test_an_item_in_two_sets_and_an_n_gram_in_several_items_attribute_to_all(tmp_path):
    shared = "the committee agreed that the proposal would be reviewed again by the full board next spring"
    sets = {
        "arc": [
            {"q": "unrelated and short"},
            {"q": f"Question one: {shared}."},
            {"q": "filler"},
            {"q": f"{shared}, said the chair."},
        ],
        "obqa": [{"stem": f"Long ago {shared}"}],
    }
    out, ledger = run(step_for(tmp_path, sets), f"News. {shared}. Other news.")
    assert out == []
    assert ledger.records["contamination"] == [
        {"id": "web/0", "source": "web", "set": "arc", "item": 1, "action": "remove"},
        {"id": "web/0", "source": "web", "set": "arc", "item": 3, "action": "remove"},
        {"id": "web/0", "source": "web", "set": "obqa", "item": 0, "action": "remove"},
    ]
    assert ledger.removed[0]["value"] == 3.0 and ledger.removed[0]["note"].startswith("arc:1, arc:3, obqa:0 (13-gram: ")
    assert ledger.tally("web").stats == {"decontaminate:arc": 1, "decontaminate:obqa": 1}


def test_lone_surrogates_in_items_and_documents(tmp_path):
    # A reader passes undecodable bytes on as lone surrogates (surrogateescape); JSON can hold them too.
    text = "caf\udce9 au lait is served here every morning before the long meeting starts at the office"
    out, ledger = run(step_for(tmp_path, {"s": [{"q": text}]}), f"\ud800 {text.upper()} \udfff")
    assert out == [] and ledger.records["contamination"][0]["item"] == 0


def test_n_grams_never_span_two_fields(tmp_path):
    # The question ends with 7 words and the first choice starts with 6: 13 in a row only if the
    # two fields were joined.
    item = {"question": "alpha beta gamma delta epsilon zeta eta", "choices": ["theta iota kappa lambda mu nu", "x"]}
    out, ledger = run(
        step_for(tmp_path, {"s": [item]}), "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu"
    )
    assert len(out) == 1 and ledger.records == {}


def test_verification_rejects_a_hash_hit_whose_words_differ(tmp_path):
    step = step_for(tmp_path, {"mmlu": MMLU})
    index = step.index
    row, pos = int(index.entries["row"][0]), int(index.entries["pos"][0])
    stored = index.row_words(row)
    assert stored == words(QUESTION, False)
    gram = stored[pos : pos + 13]
    # Same position, same hash entry, but one word differs: what a 64-bit collision would look like.
    assert index.verify(row, pos, ["lead"] + gram, 1)
    assert not index.verify(row, pos, ["lead"] + gram[:-1] + ["different"], 1)
    assert not index.verify(row, pos, gram[:12], 0)  # a document ending early


def test_flag_keeps_the_document_with_its_matches(tmp_path):
    step = step_for(tmp_path, {"mmlu": MMLU}, action="flag")
    ledger = Ledger()
    doc = Document("web/0", f"{FILLER} {QUESTION}", "web", meta={"url": "https://example.org/"})
    (out,) = step.process([doc], ledger)
    assert out.text == doc.text and out.meta == {
        "url": "https://example.org/",
        "contamination": [{"set": "mmlu", "item": 1}],
    }
    assert ledger.removed == [] and ledger.tally("web").stats == {"decontaminate:flagged": 1, "decontaminate:mmlu": 1}
    assert ledger.records["contamination"] == [
        {"id": "web/0", "source": "web", "set": "mmlu", "item": 1, "action": "flag"}
    ]


def test_short_documents_and_items_are_not_checked(tmp_path):
    cfg = DecontaminateConfig(
        eval_sets=[
            EvalSetConfig(
                path=str(write_set(tmp_path / "s.jsonl", [*MMLU, "", {"q": "too short", "tags": ["a", "b"]}]))
            )
        ]
    )
    summary = build_index(cfg, tmp_path / "index")
    # line 2 is blank: no item, but the item after it keeps index 3
    (s,) = summary["sets"]
    assert (s["name"], s["items"], s["items_too_short"], s["too_short_sample"], s["ngrams"]) == (
        "s",
        3,
        2,
        [0, 3],
        19 - 13 + 1,
    )
    out, _ = run(Decontaminate(cfg, tmp_path / "index"), "What is two plus two?", "")
    assert len(out) == 2


# --- Bloom mode -----------------------------------------------------------------------------------


def test_bloom_size_by_hand():
    # n = 1000 keys at p = 0.01: m = -n ln p / (ln 2)^2 = 4605.2 / 0.48045 = 9585.06, up to a
    # multiple of 64: 9600 bits. k = (m / n) ln 2 = 9.6 * 0.6931 = 6.65 -> 7. Then the rate is
    # (1 - e^(-7 * 1000 / 9600))^7 = (1 - 0.48231)^7 = 0.51769^7 = 0.00997.
    assert BloomFilter.size(1000, 0.01) == (9600, 7)
    assert BloomFilter(np.zeros(1200, dtype=np.uint8), 9600, 7).fp_rate(1000) == pytest.approx(0.00997, abs=1e-5)
    assert BloomFilter.size(0, 1e-6) == (64, 1)


def test_bloom_finds_the_planted_13_gram_and_ignores_a_12_gram(tmp_path):
    step = step_for(tmp_path, {"mmlu": MMLU, "arc": [{"q": "nothing to see"}]}, mode="bloom")
    out, ledger = run(
        step, f"{FILLER} {first_words(QUESTION, 13)} {FILLER}", f"{FILLER} {first_words(QUESTION, 12)} {FILLER}"
    )
    assert [d.id for d in out] == ["web/1"]
    assert ledger.removed[0]["reason"] == "decontaminate:ngram_overlap" and ledger.removed[0]["note"].startswith(
        "mmlu (13-gram: 'which of"
    )
    assert ledger.records["contamination"] == [
        {"id": "web/0", "source": "web", "set": "mmlu", "item": None, "action": "remove"}
    ]


def test_bloom_false_positive_rate_is_as_stated(tmp_path):
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(5000)]
    items = [{"text": " ".join(rng.choices(vocab, k=30))} for _ in range(300)]
    cfg = DecontaminateConfig(
        eval_sets=[EvalSetConfig(path=str(write_set(tmp_path / "rand.jsonl", items)))], mode="bloom", bloom_fp_rate=0.01
    )
    (s,) = build_index(cfg, tmp_path / "index")["sets"]
    assert s["ngrams"] == 300 * 18 and s["fp_rate"] == pytest.approx(0.01, rel=0.05)
    bloom = load_index(tmp_path / "index").blooms[0]
    queries = np.random.default_rng(1).integers(0, 2**64 - 1, size=200_000, dtype=np.uint64, endpoint=True)
    measured = bloom.contains(queries).mean()  # about 2,000 false positives expected: +-2% noise
    assert s["fp_rate"] / 1.3 < measured < s["fp_rate"] * 1.3


# --- properties -----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(st.text(min_size=1, max_size=10), min_size=13, max_size=24),
    before=st.text(max_size=40),
    after=st.text(max_size=40),
    mode=st.sampled_from(["exact", "bloom"]),
)
def test_any_whole_eval_text_is_found_and_nothing_raises(tmp_path_factory, pieces, before, after, mode):
    text = " ".join(pieces)
    assume(len(words(text, False)) >= 13)
    folder = tmp_path_factory.mktemp("prop")
    step = step_for(
        folder,
        {"p": [{"q": "some other item that is not in the document at all, none of it", "n": 1}, {"text": text}]},
        mode=mode,
    )
    ledger = Ledger()
    docs = [Document("web/0", f"{before} {text} {after}", "web"), Document("web/1", before + after, "web")]
    kept = list(step.process(docs, ledger))
    assert "web/0" not in [d.id for d in kept]
    assert {
        "id": "web/0",
        "source": "web",
        "set": "p",
        "item": None if mode == "bloom" else 1,
        "action": "remove",
    } in ledger.records["contamination"]


# --- bad input and config -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lines, fields, message",
    [
        (['{"q": "fine"}', '{"q": "broken"'], (), r"bad\.jsonl, line 2 \(item 1\) is not valid JSON"),
        (['{"q": "fine"}', '["a", "list"]'], (), r"bad\.jsonl, line 2 \(item 1\) is a JSON list, not an object"),
        (
            ['{"q": "fine"}', '{"q": "also"}', '{"answer": 3}'],
            ("q",),
            r"bad\.jsonl, line 3 \(item 2\) has no text \(no string in fields \['q'\]\)",
        ),
        (['{"q": 1, "r": [2, null]}'], (), r"bad\.jsonl, line 1 \(item 0\) has no text \(no string in any value\)"),
    ],
)
def test_bad_eval_files_name_file_and_line(tmp_path, lines, fields, message):
    cfg = DecontaminateConfig(
        eval_sets=[EvalSetConfig(path=str(write_set(tmp_path / "bad.jsonl", lines)), fields=fields)]
    )
    with pytest.raises(FatalError, match=message):
        build_index(cfg, tmp_path / "index")


def test_missing_eval_file_and_missing_index(tmp_path):
    cfg = DecontaminateConfig(eval_sets=[EvalSetConfig(path=str(tmp_path / "nope.jsonl"))])
    with pytest.raises(FatalError, match=r"nope\.jsonl does not exist"):
        build_index(cfg, tmp_path / "index")
    with pytest.raises(FatalError, match=r"no decontamination index at .*build it with build_index"):
        Decontaminate(cfg, tmp_path / "elsewhere")


def test_index_built_for_another_config_is_refused(tmp_path):
    step = step_for(tmp_path, {"mmlu": MMLU})
    with pytest.raises(FatalError, match=r"was built for .* rebuild the index"):
        Decontaminate(step.cfg.model_copy(update={"ngram": 8}), tmp_path / "index")


def test_config_rules():
    for bad in (
        {"ngram": 0},
        {"ngram": 65},
        {"bloom_fp_rate": 0},
        {"bloom_fp_rate": 1},
        {"action": "drop"},
        {"mode": "minhash"},
    ):
        with pytest.raises(ValidationError):
            DecontaminateConfig(**bad)
    with pytest.raises(ValidationError, match="mmlu is used twice"):
        DecontaminateConfig(eval_sets=[EvalSetConfig(path="a/mmlu.jsonl"), EvalSetConfig(path="b/mmlu.jsonl.gz")])
    with pytest.raises(ValidationError, match="may not be named 'flagged'"):
        DecontaminateConfig(eval_sets=[EvalSetConfig(path="flagged.jsonl")])
    assert [set_name(EvalSetConfig(path=p)) for p in ("x/mmlu.jsonl.gz", "hellaswag.json", "arc.zst")] == [
        "mmlu",
        "hellaswag",
        "arc",
    ]
    assert set_name(EvalSetConfig(path="x.jsonl", name="custom")) == "custom"


def test_item_texts_recurse_in_document_order():
    record = {"id": "q1", "question": "Q?", "choices": ["a", {"text": "b", "label": "B"}], "n": 3, "meta": {"src": "s"}}
    assert item_texts(record, ()) == ["q1", "Q?", "a", "b", "B", "s"]
    assert item_texts(record, ("choices", "question", "missing")) == ["a", "b", "B", "Q?"]


def test_gzip_eval_set_and_the_step_pickles_as_its_config(tmp_path):
    path = tmp_path / "mmlu.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in MMLU))
    cfg = DecontaminateConfig(eval_sets=[EvalSetConfig(path=str(path), fields=("question",))])
    build_index(cfg, tmp_path / "index")
    step = pickle.loads(pickle.dumps(Decontaminate(cfg, tmp_path / "index")))
    assert len(pickle.dumps(step)) < 2000  # config and folder, never the arrays
    out, ledger = run(step, QUESTION)
    assert out == [] and ledger.records["contamination"][0]["set"] == "mmlu"


def test_note_is_capped(tmp_path):
    shared = "one two three four five six seven eight nine ten eleven twelve thirteen"
    out, ledger = run(step_for(tmp_path, {"s": [{"q": shared}] * 200}), shared)
    note = ledger.removed[0]["note"]
    assert ledger.removed[0]["value"] == 200.0 and len(note) <= 300 and ", ... (200 in all) (13-gram: 'one two" in note


def test_records_merge_by_kind():
    a, b = Ledger(), Ledger()
    a.record("contamination", {"id": "x"})
    b.record("contamination", {"id": "y"})
    b.record("other", {"id": "z"})
    a.merge(b)
    assert a.records == {"contamination": [{"id": "x"}, {"id": "y"}], "other": [{"id": "z"}]}


# --- the report -----------------------------------------------------------------------------------


def test_report_worked_by_hand():
    summary = {
        "mode": "exact",
        "ngram": 13,
        "fold_digits": False,
        "action": "remove",
        "sets": [
            {"name": "mmlu", "items": 1000, "items_too_short": 12, "ngrams": 40_000},
            {"name": "arc", "items": 5, "items_too_short": 0, "ngrams": 90},
        ],
    }
    rows = [
        {"id": "b", "source": "web", "set": "mmlu", "item": 40, "action": "remove"},
        {"id": "a", "source": "web", "set": "mmlu", "item": 40, "action": "remove"},
        {"id": "a", "source": "web", "set": "mmlu", "item": 7, "action": "remove"},
        {"id": "c", "source": "books", "set": "mmlu", "item": 100, "action": "remove"},
    ]
    report = build_report(summary, rows)
    # mmlu: items 7, 40 and 100 (3 items) in documents a, b and c (3 documents); arc: nothing.
    assert report == {
        "format": "kiln-decontamination-report v1",
        "mode": "exact",
        "ngram": 13,
        "action": "remove",
        "fold_digits": False,
        "sets": {
            "mmlu": {
                "items": 1000,
                "items_too_short": 12,
                "ngrams": 40_000,
                "items_found": 3,
                "documents_found": 3,
                "found": {
                    "7": [{"id": "a", "source": "web"}],
                    "40": [{"id": "a", "source": "web"}, {"id": "b", "source": "web"}],
                    "100": [{"id": "c", "source": "books"}],
                },
            },
            "arc": {
                "items": 5,
                "items_too_short": 0,
                "ngrams": 90,
                "items_found": 0,
                "documents_found": 0,
                "found": {},
            },
        },
    }
    assert format_report(report) == (
        "decontamination: 13-gram overlap, exact mode, matching documents removed\n"
        "mmlu: 3 of 1,000 items found in 3 training documents (12 items too short to check)\n"
        "arc: 0 of 5 items found in 0 training documents"
    )


def test_bloom_report_names_sets_only():
    summary = {
        "mode": "bloom",
        "ngram": 13,
        "fold_digits": False,
        "action": "flag",
        "sets": [{"name": "mmlu", "items": 1000, "items_too_short": 1, "ngrams": 40_000, "fp_rate": 1e-6}],
    }
    report = build_report(summary, [{"id": "a", "source": "web", "set": "mmlu", "item": None, "action": "flag"}])
    assert report["sets"]["mmlu"] == {
        "items": 1000,
        "items_too_short": 1,
        "ngrams": 40_000,
        "items_found": None,
        "documents_found": 1,
        "fp_rate": 1e-6,
        "found": {},
        "documents": [{"id": "a", "source": "web"}],
    }
    assert format_report(report).splitlines()[1] == (
        "mmlu: found in 1 training document (bloom mode: items not identified; false-positive rate 1.0e-06 per "
        "n-gram) (1 item too short to check)"
    )
    assert math.isclose(report["sets"]["mmlu"]["fp_rate"], 1e-6)


@pytest.mark.parametrize(
    ("records", "said"),
    [
        ([], "holds no item"),
        ([{"q": "too short"}, {"q": "also too short"}], "has no item of 13 words or more (all 2 too short)"),
    ],
)
def test_an_evaluation_set_with_nothing_to_check_is_warned_about(tmp_path, caplog, records, said):
    cfg = DecontaminateConfig(eval_sets=[EvalSetConfig(path=str(write_set(tmp_path / "empty.jsonl", records)))])
    caplog.set_level("WARNING", logger="kiln.curate")
    build_index(cfg, tmp_path / "index")
    assert f"empty.jsonl {said}: nothing in it can be checked, so it removes nothing" in caplog.text
