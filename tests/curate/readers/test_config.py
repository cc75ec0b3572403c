"""kiln.curate.readers.config: format detection, source names, and the input section's checks."""

from __future__ import annotations

import pytest
import xxhash
from pydantic import ValidationError

from kiln.curate.readers.config import MAX_SOURCE_CHARS, InputConfig, detect_format, sanitize_source


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.jsonl", "jsonl"),
        ("a.JSONL.GZ", "jsonl"),
        ("a.json.zst", "jsonl"),
        ("shard.ndjson", "jsonl"),
        ("train-00000-of-00002.parquet", "parquet"),
        ("cc.warc", "warc"),
        ("CC-MAIN-1.warc.gz", "warc"),
        ("page.html", "html"),
        ("page.htm.gz", "html"),
        ("notes.txt", "text"),
        ("notes.txt.gz", "text"),
        ("README", "text"),
        ("archive.tar.gz", "text"),
        ("x.parquet.bak", "text"),
    ],
)
def test_detect_format(name, fmt):
    assert detect_format(name) == fmt


def h8(name: str) -> str:
    return xxhash.xxh64_hexdigest(name.encode())[:8]


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("web", "web"),
        ("Web_2024", "Web_2024"),
        ("x" * 64, "x" * 64),  # valid names are kept as they are
        ("my-web.data", f"my_web_data_{h8('my-web.data')}"),
        ("crawl 2024", f"crawl_2024_{h8('crawl 2024')}"),
        ("", "input"),
        ("Ünïcode", f"_n_code_{h8('Ünïcode')}"),
        ("日本語", f"____{h8('日本語')}"),
    ],
)
def test_sanitize_source(name, source):
    assert sanitize_source(name) == source


def test_sanitized_sources_stay_distinct_and_short():
    names = ["a-b", "a_b", "a.b", "日本語", "中文", "x" * 300, "x" * 299 + "y", "x" * 65]
    safe = [sanitize_source(n) for n in names]
    assert len(set(safe)) == len(names), safe  # a-b and a_b, 日本語 and 中文 used to merge
    assert safe[1] == "a_b"  # already valid: unchanged
    assert all(len(s) <= MAX_SOURCE_CHARS and s.isascii() and s.replace("_", "").isalnum() for s in safe), safe
    assert sanitize_source("x" * 300) == "x" * 55 + "_" + h8("x" * 300)  # 55 + 1 + 8 = 64
    with pytest.raises(ValidationError, match="source"):
        InputConfig(source="x" * 65, path="x.jsonl")  # a configured source must already be valid


def test_file_formats_need_a_path():
    for fmt in ("auto", "jsonl", "parquet", "text", "html", "warc"):
        with pytest.raises(ValidationError, match="needs `path`"):
            InputConfig(format=fmt)
    for fmt in ("stdlib_code", "pydoc_topics", "usr_share_doc"):
        assert InputConfig(format=fmt).path is None


def test_source_pattern_and_strictness():
    with pytest.raises(ValidationError, match="source"):
        InputConfig(source="web-2024", path="x.jsonl")
    with pytest.raises(ValidationError, match="reader"):
        InputConfig(source="web", reader="text_files", path="x")  # the old key is gone: extra keys are refused
    with pytest.raises(ValidationError, match="extractor"):
        InputConfig(path="x.warc", extractor="readability")
    cfg = InputConfig(path="data/*.jsonl")
    assert (cfg.source, cfg.format, cfg.text_field, cfg.id_field, cfg.source_field, cfg.code, cfg.extractor) == (
        None,
        "auto",
        "text",
        "id",
        "source",
        None,
        "resiliparse",
    )
