"""kiln.curate.readers.parquet: Hugging Face style Parquet, read by row groups in batches."""

from __future__ import annotations

import datetime
import json
import math
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.curate.readers import InputConfig, ReadLimits, plan_reads

from .helpers import errors, read_inputs


def write_dataset(folder, rows: int = 50, row_group_size: int = 10, **columns):
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"text": [f"document number {i}. " * 3 for i in range(rows)], **columns})
    path = folder / "train-00000-of-00001.parquet"
    pq.write_table(table, path, row_group_size=row_group_size)
    return path, table


def test_round_trip_with_several_row_groups_and_tasks(tmp_path):
    ids = [f"doc-{i}" if i % 2 else None for i in range(50)]
    meta = [{"url": f"https://example.org/{i}", "lang": "en"} for i in range(50)]
    path, table = write_dataset(tmp_path / "data", id=ids, meta=meta, extra=list(range(50)))
    assert pq.ParquetFile(path).num_row_groups == 5
    cfg = InputConfig(path=str(tmp_path / "data"), format="parquet")
    one, _ = read_inputs(cfg)
    split, ledger = read_inputs(cfg, shard_bytes=1)  # one task per row group
    assert len(plan_reads((cfg,), None, 1)) == 5
    assert one == split  # the same documents whatever the cut
    assert [d.text for d in split] == table.column("text").to_pylist()
    assert [d.id for d in split[:3]] == [
        "data/train-00000-of-00001.parquet:0",
        "doc-1",
        "data/train-00000-of-00001.parquet:2",
    ]
    assert split[13].meta == {"url": "https://example.org/13", "lang": "en", "path": str(path), "row": 13}
    assert {d.source for d in split} == {"data"} and ledger.quarantined == []


def test_source_column_and_text_column_name(tmp_path):
    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"content": ["a b c", "d e f"], "source": ["wiki", None]}), tmp_path / "ds" / "x.parquet")
    docs, _ = read_inputs(InputConfig(path=str(tmp_path / "ds" / "x.parquet"), text_field="content"))
    assert [(d.id, d.source) for d in docs] == [("wiki/x.parquet:0", "wiki"), ("ds/x.parquet:1", "ds")]


def test_oversize_null_and_invalid_cells(tmp_path):
    (tmp_path / "web").mkdir()
    texts = pa.array([b"fine", b"x" * 2000, None, b"caf\xe9 broken", b""], type=pa.binary()).view(
        pa.string()
    )  # invalid UTF-8 in a string column
    pq.write_table(pa.table({"text": texts}), tmp_path / "web" / "a.parquet", row_group_size=2)
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "web")), limits=ReadLimits(max_doc_bytes=1000))
    assert [(d.text, d.meta["row"]) for d in docs] == [("fine", 0), ("caf\ufffd broken", 3)]
    assert [(q["id"], q["position"], q["error"].split(":")[1]) for q in ledger.quarantined] == [
        ("web/a.parquet:1", "1", "too_large"),
        ("web/a.parquet:2", "2", "bad_record"),
    ]
    assert ledger.tally("web").stats["read:invalid_utf8"] == 1
    assert [(r["id"], r["reason"]) for r in ledger.removed] == [("web/a.parquet:4", "read:empty")]


def test_missing_text_column_and_unreadable_file_quarantine_the_file(tmp_path):
    (tmp_path / "web").mkdir()
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "web" / "a.parquet")
    (tmp_path / "web" / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "web")))
    assert docs == []
    assert [q["id"] for q in ledger.quarantined] == ["web/a.parquet", "web/b.parquet"]
    assert errors(ledger)[0].startswith("read:bad_file: ") and "no column 'text'" in errors(ledger)[0]
    assert str(tmp_path / "web" / "b.parquet") in errors(ledger)[1]


def test_non_string_text_column_is_quarantined_row_by_row(tmp_path):
    (tmp_path / "web").mkdir()
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "web" / "a.parquet")
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "web")))
    assert docs == [] and len(ledger.quarantined) == 2 and "is a int, not a string" in errors(ledger)[0]


def test_cap_takes_whole_row_groups(tmp_path):
    path, _ = write_dataset(tmp_path / "web", rows=100, row_group_size=10)
    meta = pq.read_metadata(path)
    first_two = sum(
        meta.row_group(i).column(j).total_compressed_size for i in range(2) for j in range(meta.num_columns)
    )
    docs, _ = read_inputs(InputConfig(source="web", path=str(path)), cap=first_two + 1)
    assert [d.meta["row"] for d in docs] == list(range(20))


def test_url_column_and_the_records_own_row_and_path(tmp_path):
    # FineWeb's layout: text, id, url columns at the top level; the URL filter reads meta["url"]
    urls = [f"https://example.org/{i}" if i % 3 else None for i in range(6)]
    meta = [{"url": "https://meta.example/"} if i == 1 else {"row": 100 + i, "path": "orig.txt"} for i in range(6)]
    path, _ = write_dataset(tmp_path / "fw", rows=6, url=urls, meta=meta)
    docs, _ = read_inputs(InputConfig(path=str(path)))
    assert [d.meta.get("url") for d in docs] == [
        None,
        "https://meta.example/",
        "https://example.org/2",
        None,
        "https://example.org/4",
        "https://example.org/5",
    ]
    # Arrow gives every row of a struct column every key: url is None where the row had none
    assert docs[0].meta == {"url": None, "path": str(path), "row": 0, "record_path": "orig.txt", "record_row": 100}


def test_meta_values_that_are_not_json_are_converted_and_every_document_can_be_written(tmp_path):
    (tmp_path / "web").mkdir()
    meta = [
        {
            "when": datetime.datetime(2020, 1, 1),
            "blob": b"\x00\xab",
            "price": Decimal("1.50"),
            "score": math.nan,
            "tags": ["a", "b"],
        },
        {"when": None, "blob": None, "price": None, "score": 2.0, "tags": []},
    ]
    table = pa.table(
        {
            "text": ["first page", "second page"],
            "meta": pa.array(
                meta,
                type=pa.struct(
                    [
                        ("when", pa.timestamp("us")),
                        ("blob", pa.binary()),
                        ("price", pa.decimal128(5, 2)),
                        ("score", pa.float64()),
                        ("tags", pa.list_(pa.string())),
                    ]
                ),
            ),
        }
    )
    table = table.append_column(
        "metadata", pa.array([[("k", 1)], []], type=pa.map_(pa.string(), pa.int64()))
    )  # ignored: meta comes first
    pq.write_table(table, tmp_path / "web" / "x.parquet")
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "web")))
    assert ledger.quarantined == [] and len(docs) == 2
    path = str(tmp_path / "web" / "x.parquet")
    assert docs[0].meta == {
        "when": "2020-01-01T00:00:00",
        "blob": "00ab",
        "price": "1.50",
        "score": "NaN",
        "tags": ["a", "b"],
        "path": path,
        "row": 0,
    }
    assert docs[1].meta == {"when": None, "blob": None, "price": None, "score": 2.0, "tags": [], "path": path, "row": 1}
    for doc in docs:  # what ShardWriter.write does, in strict JSON
        json.dumps(doc.to_json(), ensure_ascii=False, allow_nan=False).encode("utf-8")


def test_a_map_meta_column_is_taken_as_an_object(tmp_path):
    (tmp_path / "web").mkdir()
    meta = pa.array([[("day", datetime.date(2021, 5, 6))], []], type=pa.map_(pa.string(), pa.date32()))
    pq.write_table(pa.table({"text": ["a b", "c d"], "meta": meta}), tmp_path / "web" / "m.parquet")
    docs, _ = read_inputs(InputConfig(path=str(tmp_path / "web")))
    assert [d.meta for d in docs] == [
        {"day": "2021-05-06", "path": str(tmp_path / "web" / "m.parquet"), "row": 0},
        {"path": str(tmp_path / "web" / "m.parquet"), "row": 1},
    ]


def test_a_null_text_is_reported_as_null(tmp_path):
    (tmp_path / "web").mkdir()
    pq.write_table(pa.table({"text": ["kept", None]}), tmp_path / "web" / "a.parquet")
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "web")))
    assert [d.text for d in docs] == ["kept"]
    assert errors(ledger) == ["read:bad_record: field 'text' is null (row 1)"]


def test_missing_text_column_is_one_entry_however_the_file_is_split(tmp_path):
    (tmp_path / "web").mkdir()
    path = tmp_path / "web" / "multi.parquet"
    pq.write_table(pa.table({"body": [f"row {i} " * 20 for i in range(400)]}), path, row_group_size=100)
    cfg = InputConfig(path=str(tmp_path / "web"))
    assert len(plan_reads((cfg,), None, 1)) == 4  # one task per row group
    for shard_bytes in (1, 10**9):
        docs, ledger = read_inputs(cfg, shard_bytes=shard_bytes)
        assert docs == [] and [q["id"] for q in ledger.quarantined] == ["web/multi.parquet"]
        assert "no column 'text'" in errors(ledger)[0]
        tally = ledger.tally("web")
        assert (tally.docs_in, tally.bytes_in) == (1, path.stat().st_size)
