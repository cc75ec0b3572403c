"""kiln.core.docshards: documents round-trip through a shard exactly, lines copy verbatim, and a
corrupt line stops with its file and line number."""

from __future__ import annotations

import json
import math

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.docshards import ShardWriter, encode_line, read_shard, read_shard_lines
from kiln.core.document import Document
from kiln.core.errors import FatalError

# Shard text never holds lone surrogates: readers replace them before a document exists.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=200)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=10,
)
DOCS = st.builds(
    Document,
    id=TEXT,
    text=TEXT,
    source=st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True),
    meta=st.dictionaries(TEXT, JSON_VALUE, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(docs=st.lists(DOCS, max_size=5))
def test_documents_round_trip(tmp_path_factory, docs):
    path = tmp_path_factory.mktemp("shard") / "web-00000.jsonl.zst"
    with ShardWriter(path) as writer:
        for doc in docs:
            writer.write(doc)
    back = list(read_shard(path))
    assert [d.to_json() for d in back] == [d.to_json() for d in docs]
    # each line is one JSON object that the json module reads as the document
    assert [json.loads(encode_line(d)) for d in docs] == [d.to_json() for d in docs]


def test_meta_values_survive_as_json_reads_them(tmp_path):
    # orjson would write NaN as null and read integers past 64 bits as floats; meta is json's
    doc = Document(
        id="a",
        text="x\u2028y\x00\ttab \U0001f600",
        source="web",
        meta={"nan": math.nan, "big": 2**70, "inf": -math.inf},
    )
    path = tmp_path / "web-00000.jsonl.zst"
    with ShardWriter(path) as writer:
        writer.write(doc)
    (back,) = read_shard(path)
    assert (
        back.text == doc.text
        and back.meta["big"] == 2**70
        and math.isnan(back.meta["nan"])
        and back.meta["inf"] == -math.inf
    )


def test_lines_copy_verbatim(tmp_path):
    docs = [Document(id=f"d{i}", text=f"text {i} é", source="web", meta={"i": i}) for i in range(3)]
    first, second = tmp_path / "a-00000.jsonl.zst", tmp_path / "b-00000.jsonl.zst"
    with ShardWriter(first) as writer:
        for doc in docs:
            writer.write(doc)
    with ShardWriter(second) as writer:
        for doc, line in read_shard_lines(first):
            if doc.id != "d1":
                writer.write_line(line)
    assert [d.id for d in read_shard(second)] == ["d0", "d2"]
    assert [line for _, line in read_shard_lines(second)] == [encode_line(docs[0]), encode_line(docs[2])]


@pytest.mark.parametrize(
    "bad", [b'{"id": "x", "text": "y"', b"\xff\xfe not json", b'["a list"]', b'{"text": "no id", "source": "web"}']
)
def test_corrupt_line_names_file_and_line(tmp_path, bad):
    path = tmp_path / "web-00000.jsonl.zst"
    good = encode_line(Document(id="a", text="fine", source="web"))
    path.write_bytes(zstandard.ZstdCompressor().compress(good + bad + b"\n"))
    with pytest.raises(FatalError, match=rf"{path.name}:2: not a kiln document line"):
        list(read_shard(path))
