"""kiln.curate.readers.jsonl: JSONL plain, .gz and .zst, streamed and never trusting a line."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest
import xxhash
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kiln.curate.audit import Ledger
from kiln.curate.readers import InputConfig, ReadLimits, ReadTask, ReadUnit, read_task
from kiln.curate.readers.jsonl import JSON_BYTES_PER_TEXT_BYTE

from .helpers import errors, read_inputs

WRITERS = {".jsonl": lambda b: b, ".jsonl.gz": gzip.compress, ".jsonl.zst": zstandard.ZstdCompressor().compress}


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = "".join(path.suffixes[-2:]) if path.name.endswith((".gz", ".zst")) else path.suffix
    path.write_bytes(WRITERS[suffix](data))
    return path


def lines(*records: object) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


@pytest.mark.parametrize("suffix", list(WRITERS))
def test_round_trip_each_compression(tmp_path, suffix):
    path = write(
        tmp_path / "web" / f"part{suffix}",
        lines(
            {"id": 7, "text": "seven"},
            {"text": "no id", "meta": {"lang": "en"}},
            {"text": "with metadata", "metadata": {"url": "u", "line": 99}, "extra": 1},
        ),
    )
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "web" / "*")))
    assert [(d.id, d.text, d.source) for d in docs] == [
        ("7", "seven", "web"),
        (f"web/part{suffix}:2", "no id", "web"),
        (f"web/part{suffix}:3", "with metadata", "web"),
    ]
    assert docs[1].meta == {"lang": "en", "path": str(path), "line": 2}
    assert docs[2].meta == {
        "url": "u",
        "line": 3,
        "path": str(path),
        "record_line": 99,
    }  # kiln's own keys win; the record's is kept aside
    assert ledger.quarantined == []


def test_field_names_are_configurable_and_source_comes_from_the_record(tmp_path):
    write(
        tmp_path / "dump" / "a.jsonl",
        lines(
            {"content": "one", "doc_id": "x1", "origin": "wiki-en"},
            {"content": "two"},
            {"content": "three", "origin": ""},
        ),
    )
    cfg = InputConfig(
        path=str(tmp_path / "dump" / "a.jsonl"), text_field="content", id_field="doc_id", source_field="origin"
    )
    docs, _ = read_inputs(cfg)
    wiki = f"wiki_en_{xxhash.xxh64_hexdigest(b'wiki-en')[:8]}"  # made safe, and kept apart from a wiki_en source
    assert [(d.id, d.source) for d in docs] == [("x1", wiki), ("dump/a.jsonl:2", "dump"), ("dump/a.jsonl:3", "dump")]
    assert docs[0].meta["source_name"] == "wiki-en" and "source_name" not in docs[1].meta
    named, _ = read_inputs(cfg.model_copy(update={"source": "web"}))  # the input's source wins over the record's
    assert {d.source for d in named} == {"web"}


def test_top_level_url_and_the_records_own_location_keys(tmp_path):
    path = write(
        tmp_path / "web" / "c4.jsonl",
        lines(
            {
                "text": "c4 style",
                "url": "https://a.example/1",
                "timestamp": "2019",
            },  # C4, FineWeb: url at the top level
            {"text": "both", "url": "https://top.example/", "meta": {"url": "https://meta.example/"}},  # meta first
            {"text": "empty meta url", "url": "https://top.example/2", "meta": {"url": ""}},
            {"text": "own path", "meta": {"path": "src/lib.rs", "line": 12, "lang": "rust"}},
            {"text": "odd url", "url": 5},
        ),
    )
    docs, _ = read_inputs(InputConfig(path=str(path)))
    assert [d.meta.get("url") for d in docs] == [
        "https://a.example/1",
        "https://meta.example/",
        "https://top.example/2",
        None,
        None,
    ]
    assert docs[3].meta == {
        "path": str(path),
        "line": 4,
        "record_path": "src/lib.rs",
        "record_line": 12,
        "lang": "rust",
    }
    assert "timestamp" not in docs[0].meta  # other top-level fields are not meta


def test_malformed_lines_are_quarantined_with_file_and_line(tmp_path):
    path = write(
        tmp_path / "web" / "a.jsonl",
        lines(
            {"text": "ok"},
            b"{not json",
            b"",
            b"[1, 2]",
            {"text": None},
            {"text": 5},
            {"title": "no text"},
            {"text": "", "id": "e"},
            {"text": "last"},
        ),
    )
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    assert [d.text for d in docs] == ["ok", "last"] and docs[1].meta["line"] == 9
    rows = [
        (q["id"], q["file"], q["position"], q["error"].split(":")[0] + ":" + q["error"].split(":")[1])
        for q in ledger.quarantined
    ]
    assert rows == [
        ("web/a.jsonl:2", str(path), "2", "read:bad_json"),
        ("web/a.jsonl:4", str(path), "4", "read:bad_record"),
        ("web/a.jsonl:5", str(path), "5", "read:bad_record"),
        ("web/a.jsonl:6", str(path), "6", "read:bad_record"),
        ("web/a.jsonl:7", str(path), "7", "read:bad_record"),
    ]
    assert "field 'text' is a int, not a string" in errors(ledger)[3] and "is missing" in errors(ledger)[4]
    assert [(r["id"], r["reason"]) for r in ledger.removed] == [
        ("e", "read:empty")
    ]  # line 3 is blank: no record at all


def test_invalid_utf8_and_lone_surrogates_are_replaced_and_counted(tmp_path):
    path = write(
        tmp_path / "web" / "a.jsonl",
        lines(
            b'{"text": "caf\xe9 \xff"}',
            b'{"text": "half \\ud83d pair", "id": "s\\udfff"}',
            b'{"text": "whole \\ud83d\\ude00 pair"}',
            {"text": "clean"},
        ),
    )
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    assert [d.text for d in docs] == ["caf\ufffd \ufffd", "half \ufffd pair", "whole \U0001f600 pair", "clean"]
    assert docs[1].id == "s\ufffd"
    assert ledger.tally("web").stats["read:invalid_utf8"] == 2
    for doc in docs:
        doc.text.encode("utf-8")  # every text can be written out


def test_text_over_the_cap_is_quarantined(tmp_path):
    path = write(tmp_path / "web" / "a.jsonl", lines({"text": "a" * 1001}, {"text": "é" * 600}, {"text": "a" * 1000}))
    docs, ledger = read_inputs(InputConfig(path=str(path)), limits=ReadLimits(max_doc_bytes=1000))
    assert [len(d.text) for d in docs] == [1000]
    assert [(q["id"], q["error"].split(":")[1]) for q in ledger.quarantined] == [
        ("web/a.jsonl:1", "too_large"),
        ("web/a.jsonl:2", "too_large"),
    ]  # é is 2 bytes


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_a_100_mb_line_is_quarantined_in_bounded_memory(tmp_path, suffix):
    path = tmp_path / "web" / f"huge{suffix}"
    path.parent.mkdir()
    piece = b"a" * (1 << 20)
    with open(path, "wb") as raw:
        sink = zstandard.ZstdCompressor().stream_writer(raw) if suffix == ".jsonl.zst" else raw
        sink.write(b'{"text": "before"}\n{"text": "')
        for _ in range(100):
            sink.write(piece)
        sink.write(b'"}\n{"text": "after"}\n')
        if sink is not raw:
            sink.close()
    tracemalloc.start()
    try:
        docs, ledger = read_inputs(InputConfig(path=str(path)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(d.text, d.meta["line"]) for d in docs] == [("before", 1), ("after", 3)]
    [q] = ledger.quarantined
    assert (
        q["id"] == f"web/huge{suffix}:2"
        and q["position"] == "2"
        and q["error"].startswith("read:too_large: line 2 of 104857613 bytes is over the line limit of 4000000 bytes")
    )
    assert peak < 15 * 2**20, f"peak Python memory {peak / 2**20:.1f} MiB while reading a 100 MB line"
    path.unlink()  # pytest keeps recent tmp folders; do not leave 100 MB behind


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_truncated_compressed_file_keeps_what_was_read_and_quarantines_the_rest(tmp_path, suffix):
    data = lines(*({"text": f"record {i} " * 20} for i in range(2000)))
    path = write(tmp_path / "web" / f"a{suffix}", data)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    [q] = ledger.quarantined
    assert 0 < len(docs) < 2000 and q["error"].startswith(f"read:io_error: {path} after line {len(docs)}: EOFError")
    assert (q["id"], q["position"]) == (f"web/a{suffix}:{len(docs) + 1}", str(len(docs) + 1))
    assert [d.meta["line"] for d in docs] == list(range(1, len(docs) + 1))


def test_multi_frame_zstd_reads_to_the_end(tmp_path):
    c = zstandard.ZstdCompressor()
    path = tmp_path / "web" / "a.jsonl.zst"
    path.parent.mkdir()
    path.write_bytes(c.compress(lines({"text": "frame one"})) + c.compress(lines({"text": "frame two"})))
    assert [d.text for d in read_inputs(InputConfig(path=str(path)))[0]] == ["frame one", "frame two"]


def test_the_cap_budget_reads_a_prefix(tmp_path):
    path = write(
        tmp_path / "web" / "a.jsonl", lines(*({"text": f"doc {i:04d}"} for i in range(100)))
    )  # 21 bytes a line
    docs, _ = read_inputs(InputConfig(source="web", path=str(path)), cap=500)
    assert [d.text for d in docs] == [f"doc {i:04d}" for i in range(24)]  # the lines that start before byte 500


# --- properties ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=8,
)
records = st.fixed_dictionaries(
    {"text": st.text(min_size=1)},
    optional={
        "id": st.text(min_size=1) | st.integers(),
        "meta": st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    },
)


def read_bytes_as_jsonl(tmp_path: Path, data: bytes) -> tuple[list, Ledger]:
    path = tmp_path / "web" / "p.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    task = ReadTask(
        0,
        0,
        InputConfig(source="web", path=str(path)),
        (ReadUnit(str(path), "web/p.jsonl", "web", "jsonl", len(data)),),
        len(data),
    )
    ledger = Ledger()
    return list(read_task(task, ReadLimits(max_doc_bytes=200), ledger)), ledger


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(records, max_size=6), st.booleans())
@example(
    [{"text": "\U00010000" * 40, "meta": {"m": "\x1f" * 60}}, {"text": "ok"}], True
)  # 160 text bytes, an 850-byte line
def test_arbitrary_records_round_trip(tmp_path, recs, ascii_only):
    encoded = [json.dumps(r, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass") for r in recs]
    docs, ledger = read_bytes_as_jsonl(tmp_path, b"".join(line + b"\n" for line in encoded))
    # A record is read when its line is within the line limit (escaping can take an astral
    # character to 12 bytes, a control character to 6) and its text within the cap.
    line_limit = JSON_BYTES_PER_TEXT_BYTE * 200
    fits = [
        (i, r)
        for i, (r, line) in enumerate(zip(recs, encoded), 1)
        if len(line) <= line_limit and len(r["text"].encode("utf-8", "surrogatepass")) <= 200
    ]
    clean = [
        (i, r)
        for i, r in fits
        if not any(
            0xD800 <= ord(c) <= 0xDFFF
            for c in r["text"] + str(r.get("id", "")) + json.dumps(r.get("meta", {}), ensure_ascii=False)
        )
    ]
    by_line = {d.meta["line"]: d for d in docs}
    for i, r in clean:
        doc = by_line[i]
        assert doc.text == r["text"] and doc.id == (str(r["id"]) if r.get("id", "") != "" else f"web/p.jsonl:{i}")
        own = dict(r.get("meta", {}))
        moved = {f"record_{key}": own.pop(key) for key in ("path", "line") if key in own}  # kiln's location keys win
        assert doc.meta == {**own, **moved, "path": str(tmp_path / "web" / "p.jsonl"), "line": i}
    assert len(docs) + len(ledger.quarantined) == len(recs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=300) | st.builds(lambda r: json.dumps(r).encode(), records), max_size=8))
def test_arbitrary_byte_lines_never_raise_and_are_all_accounted_for(tmp_path, raw_lines):
    body = [line.replace(b"\n", b" ") for line in raw_lines]
    docs, ledger = read_bytes_as_jsonl(tmp_path, b"\n".join(body))
    records_in = sum(1 for line in body if line.strip())
    t = ledger.tally("web") if "web" in ledger.sources else None
    removed = sum(t.removed.values()) if t else 0
    assert len(docs) + len(ledger.quarantined) + removed == records_in
    assert (t.docs_in if t else 0) == records_in - len(docs)  # the reader counts in what it does not yield
    for doc in docs:
        doc.text.encode("utf-8")
        assert len(doc.text.encode()) <= 200


def test_meta_is_made_json_safe_and_a_meta_too_deep_to_write_is_quarantined(tmp_path):
    deep = (
        b'{"text": "deep", "meta": ' + b'{"a": [' * 51 + b"1" + b"]}" * 51 + b"}"
    )  # 102 levels, meta's own object the first
    path = write(
        tmp_path / "web" / "a.jsonl",
        lines(b'{"text": "nan", "meta": {"score": NaN, "big": -Infinity, "k": "\\ud800"}}', deep, {"text": "after"}),
    )
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    assert [d.text for d in docs] == ["nan", "after"]
    assert docs[0].meta == {"score": "NaN", "big": "-Infinity", "k": "\ufffd", "path": str(path), "line": 1}
    json.dumps(docs[0].to_json(), ensure_ascii=False, allow_nan=False).encode("utf-8")
    [q] = ledger.quarantined
    assert (q["id"], q["position"], q["file"]) == ("web/a.jsonl:2", "2", str(path))
    assert q["error"] == "read:bad_record: meta is nested more than 100 levels deep (line 2)"


def test_a_null_text_is_told_apart_from_a_missing_one(tmp_path):
    path = write(tmp_path / "web" / "a.jsonl", lines({"text": None}, {"title": "no text"}))
    _, ledger = read_inputs(InputConfig(path=str(path)))
    assert errors(ledger) == [
        "read:bad_record: field 'text' is null (line 1)",
        "read:bad_record: field 'text' is missing (line 2)",
    ]


def test_a_byte_order_mark_does_not_cost_the_first_record(tmp_path):
    path = write(
        tmp_path / "web" / "bom.jsonl",
        b"\xef\xbb\xbf" + lines({"id": "a", "text": "first"}, {"id": "b", "text": "second"}),
    )
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    assert [(d.id, d.text) for d in docs] == [("a", "first"), ("b", "second")] and not ledger.quarantined


def test_an_existing_file_name_with_glob_characters_is_read_literally(tmp_path):
    # as a pattern, a[1].jsonl matches a1.jsonl: the other file
    write(tmp_path / "web" / "a1.jsonl", lines({"id": "wrong", "text": "the other file"}))
    literal = write(tmp_path / "web" / "a[1].jsonl", lines({"id": "right", "text": "this file"}))
    docs, _ = read_inputs(InputConfig(path=str(literal)))
    assert [d.id for d in docs] == ["right"]
    docs, _ = read_inputs(InputConfig(path=str(tmp_path / "web" / "a?.jsonl")))  # a real pattern still expands
    assert [d.id for d in docs] == ["wrong"]


def test_a_file_name_that_is_not_utf8_round_trips_into_ids_and_the_quarantine(tmp_path):
    import os
    import re

    folder = tmp_path / "web"
    folder.mkdir()
    raw_name = b"caf\xe9.jsonl"  # Latin-1: not UTF-8
    path = Path(os.fsdecode(os.fsencode(folder) + b"/" + raw_name))
    path.write_bytes(lines({"text": "a record without an id"}, b"{not json"))
    docs, ledger = read_inputs(InputConfig(path=str(folder)))
    [doc] = docs
    [q] = ledger.quarantined
    assert (
        doc.id == "web/caf\\xe9.jsonl:1" and q["id"] == "web/caf\\xe9.jsonl:2" and q["file"].endswith("caf\\xe9.jsonl")
    )
    json.dumps([doc.meta, q], ensure_ascii=False).encode("utf-8")  # what the shards and quarantine.jsonl write
    binary = Path(os.fsdecode(os.fsencode(folder) + b"/bin\xff.txt"))
    binary.write_bytes(b"abc\x00def")  # quarantined with a message that names the file
    _, ledger = read_inputs(InputConfig(path=str(binary)))
    [q] = ledger.quarantined
    assert q["id"] == "web/bin\\xff.txt" and "bin\\xff.txt contains NUL bytes" in q["error"]
    json.dumps(q, ensure_ascii=False).encode("utf-8")
    # the name on disk comes back from the id: each \xHH is that byte
    shown = doc.id.split("/", 1)[1].rsplit(":", 1)[0]
    assert re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m[1], 16)]), shown.encode("utf-8")) == raw_name
