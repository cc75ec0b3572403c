"""kiln.curate.audit: the ledger balances, merges by addition, and samples the same documents whatever the merge
order."""

from __future__ import annotations

import pytest

from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.curate.audit import Ledger, sample_key


def doc(i: int, text: str = "some text", source: str = "web") -> Document:
    return Document(f"{source}/{i}", text, source)


def test_remove_records_value_threshold_and_reason():
    ledger = Ledger()
    d = doc(1, "héllo")
    ledger.seen("web", 6)
    ledger.remove(d, "gopher_quality", "mean_word_length", 11.5, 10)
    assert ledger.removed == [
        {
            "id": "web/1",
            "source": "web",
            "step": "gopher_quality",
            "reason": "gopher_quality:mean_word_length",
            "value": 11.5,
            "threshold": 10.0,
            "note": None,
            "kept_id": None,
        }
    ]
    t = ledger.tally("web")
    assert t.removed == {"gopher_quality:mean_word_length": 1} and t.removed_bytes == {
        "gopher_quality:mean_word_length": 6
    }
    ledger.check_balanced("test")


def test_note_and_kept_id_are_recorded():
    ledger = Ledger()
    ledger.remove(doc(1), "language", "not_allowed", 0.93, None, note="detected fr; allowed en")
    ledger.remove(doc(2), "exact_dedup", "duplicate", note="duplicate of web/1", kept_id="web/1")
    assert [(r["value"], r["note"], r["kept_id"]) for r in ledger.removed] == [
        (0.93, "detected fr; allowed en", None),
        (None, "duplicate of web/1", "web/1"),
    ]


def test_quarantine_counts_as_seen_unless_already_counted():
    ledger = Ledger()
    ledger.quarantine("web/x", "web", "read:bad_json", file="a.jsonl", position=3, nbytes=10)
    ledger.seen("web", 5)
    ledger.quarantine("web/y", "web", "step raised", counted=True)
    t = ledger.tally("web")
    assert (t.docs_in, t.bytes_in, t.quarantined) == (2, 15, 2)
    assert t.stats == {"quarantined:read:bad_json": 1, "quarantined:step raised": 1}
    assert ledger.quarantined[0] == {
        "id": "web/x",
        "source": "web",
        "file": "a.jsonl",
        "position": "3",
        "error": "read:bad_json",
    }
    ledger.check_balanced("test")


def test_unbalanced_ledger_fails_with_the_numbers():
    ledger = Ledger()
    ledger.seen("web", 1)
    ledger.seen("web", 1)
    ledger.kept(doc(1))
    with pytest.raises(FatalError, match=r"source web: 2 documents in, but 1 kept \+ 0 removed \+ 0 quarantined = 1"):
        ledger.check_balanced("shard task 00003")


def test_counters_and_funnel_merge_by_addition():
    a, b = Ledger(), Ledger()
    for ledger in (a, b):
        ledger.seen("web", 9)
        ledger.passed("normalize", doc(1, "abc"))
        ledger.count("web", "pii:email", 2)
        ledger.kept(doc(1, "abc"))
    a.merge(b)
    t = a.tally("web")
    assert (
        t.funnel == {"normalize": [2, 6]}
        and t.stats == {"pii:email": 4}
        and (t.docs_in, t.docs_out, t.bytes_out) == (2, 2, 6)
    )


def test_sample_keeps_smallest_id_hashes_whatever_the_merge_order():
    ids = list(range(200))
    expected = sorted((f"web/{i}" for i in ids), key=sample_key)[:5]
    whole = Ledger(sample_size=5)
    for i in ids:
        whole.remove(doc(i), "length", "too_short", 1, 200)
    parts = [Ledger(sample_size=5) for _ in range(3)]
    for i in ids:
        parts[i % 3].remove(doc(i), "length", "too_short", 1, 200)
    merged = Ledger(sample_size=5)
    for part in reversed(parts):
        merged.merge(part)
    assert [e["id"] for e in whole.sample("web", "length:too_short")] == expected
    assert [e["id"] for e in merged.sample("web", "length:too_short")] == expected
    assert whole.sample("web", "length:too_short")[0]["text"] == "some text"


def test_sample_size_zero_keeps_nothing():
    ledger = Ledger(sample_size=0)
    ledger.remove(doc(1), "length", "too_short")
    assert ledger.sample("web", "length:too_short") == [] and len(ledger.removed) == 1
