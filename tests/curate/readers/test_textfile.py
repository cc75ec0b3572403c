"""kiln.curate.readers.textfile: one document per file (text, the built-in corpus, HTML)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import xxhash
import zstandard

from kiln.curate.audit import Ledger
from kiln.curate.readers import InputConfig, ReadLimits, ReadTask, ReadUnit, read_task

from .helpers import errors, read_inputs


def read_file(path: Path | str, max_doc_bytes: int = 1000, source: str = "web") -> tuple[list, Ledger]:
    """Read one file as a text unit, bypassing planning (so /dev/zero and missing files work)."""
    unit = ReadUnit(str(path), f"{source}/{Path(path).name}", source, "text", 0)
    task = ReadTask(0, 0, InputConfig(source=source, format="text", path=str(path)), (unit,), 0)
    ledger = Ledger()
    docs = list(read_task(task, ReadLimits(max_doc_bytes=max_doc_bytes), ledger))
    return docs, ledger


def test_plain_utf8(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("naïve café — 東京 🙂\n", encoding="utf-8")
    [doc], ledger = read_file(p)
    assert (doc.id, doc.text, doc.source, doc.meta) == ("web/a.txt", "naïve café — 東京 🙂\n", "web", {"path": str(p)})
    assert "web" not in ledger.sources  # a yielded document is counted in by the caller, not the reader


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes("café ok".encode("latin-1") + b" \xff\xfe end")
    [doc], ledger = read_file(p)
    assert doc.text == "caf\ufffd ok \ufffd\ufffd end"
    assert ledger.tally("web").stats["read:invalid_utf8"] == 1


def test_nul_bytes_are_binary(tmp_path):
    p = tmp_path / "image.txt"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    docs, ledger = read_file(p)
    assert docs == [] and ledger.quarantined[0]["id"] == "web/image.txt"
    assert errors(ledger)[0].startswith("read:binary: ") and str(p) in errors(ledger)[0]


def test_file_over_the_cap_is_too_large(tmp_path):
    p = tmp_path / "big.txt"
    p.write_text("a" * 1001)
    docs, ledger = read_file(p)
    assert docs == [] and errors(ledger)[0].startswith("read:too_large: ") and "over 1000 bytes" in errors(ledger)[0]
    p.write_text("a" * 1000)  # exactly at the cap is fine
    assert [d.text for d in read_file(p)[0]] == ["a" * 1000]


def test_too_large_is_decided_without_reading_the_whole_file():
    # /dev/zero never ends: only a bounded read can return at all.
    docs, ledger = read_file("/dev/zero", max_doc_bytes=4096)
    assert docs == [] and errors(ledger)[0].startswith("read:too_large")


@pytest.mark.parametrize("compress", [gzip.compress, zstandard.ZstdCompressor().compress])
def test_compressed_text_is_decompressed(tmp_path, compress):
    p = tmp_path / ("notes.txt.gz" if compress is gzip.compress else "notes.txt.zst")
    body = "compressed notes\nsecond line ü\n" * 10
    p.write_bytes(compress(body.encode()))
    assert [d.text for d in read_file(p, 10_000)[0]] == [body]


def test_gzip_cap_counts_decompressed_bytes(tmp_path):
    p = tmp_path / "bomb.txt.gz"
    p.write_bytes(gzip.compress(b"a" * 100_000))
    assert p.stat().st_size < 1000
    docs, ledger = read_file(p, 10_000)
    assert docs == [] and errors(ledger)[0].startswith("read:too_large")


@pytest.mark.parametrize(
    "content", [b"not gzip at all", gzip.compress(b"truncated text " * 50, mtime=0)[:30]], ids=["not-gzip", "truncated"]
)
def test_broken_gzip_is_an_io_error(tmp_path, content):
    p = tmp_path / "broken.txt.gz"
    p.write_bytes(content)
    docs, ledger = read_file(p, 10_000)
    assert docs == [] and errors(ledger)[0].startswith("read:io_error: ")


def test_missing_file_is_an_io_error(tmp_path):
    docs, ledger = read_file(tmp_path / "gone.txt")
    assert (
        docs == [] and ledger.quarantined[0]["id"] == "web/gone.txt" and errors(ledger)[0].startswith("read:io_error")
    )
    assert ledger.tally("web").docs_in == 1  # a quarantined file still counts as one document in


def test_empty_file_is_removed_not_yielded(tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "empty.txt").write_text("")
    docs, ledger = read_inputs(InputConfig(source="web", path=str(tmp_path / "web" / "*.txt")))
    assert docs == [] and [(r["id"], r["reason"]) for r in ledger.removed] == [("web/empty.txt", "read:empty")]


def test_source_from_parent_folder(tmp_path):
    for folder in ("books", "my-web"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.txt").write_text(f"text in {folder}")
    docs, _ = read_inputs(InputConfig(path=str(tmp_path / "*" / "*.txt")))
    web = f"my_web_{xxhash.xxh64_hexdigest(b'my-web')[:8]}"  # made safe, plus a hash of the folder's name
    assert [(d.id, d.source) for d in docs] == [("books/books/a.txt", "books"), (f"{web}/my-web/a.txt", web)]


def test_builtin_pydoc_topics_are_read_from_the_module():
    from pydoc_data import topics

    docs, ledger = read_inputs(InputConfig(source="prose", format="pydoc_topics"), cap=50_000)
    assert docs and all(d.text == topics.topics[d.meta["topic"]] and d.id == f"prose/{d.meta['topic']}" for d in docs)
    assert ledger.tally("prose").docs_in == len(docs)


def test_html_file_main_text(tmp_path):
    (tmp_path / "site").mkdir()
    page = tmp_path / "site" / "page.html"
    page.write_text(
        "<html><head><meta charset='windows-1252'></head><body><nav><a href='/'>Home</a> <a href='/shop'>Shop</a></nav>"
        "<main><p>" + "Caf\xe9 owners roast their own beans every morning before opening. " * 3 + "</p></main>"
        "<footer>Copyright 2024 Example Ltd</footer></body></html>",
        encoding="cp1252",
    )
    (tmp_path / "site" / "empty.htm").write_text("<html><body><nav>Home</nav></body></html>")
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "site")))
    [doc] = docs
    assert (
        doc.id == "site/page.html"
        and doc.text.startswith("Café owners roast")
        and "Home" not in doc.text
        and "Copyright" not in doc.text
    )
    assert [(r["id"], r["reason"]) for r in ledger.removed] == [("site/empty.htm", "extract:no_text")]
