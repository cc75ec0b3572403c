"""kiln.curate.readers.warc: HTML pages out of WARC files, with main-text extraction."""

from __future__ import annotations

import gzip
import io

import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from kiln.curate.readers import InputConfig, ReadLimits

from .helpers import read_inputs

ARTICLE = (
    "Firing clay in a kiln drives out the remaining water and then changes the minerals themselves.",
    (
        "Potters usually fire twice: a slow bisque firing that hardens the ware, and a glaze firing that melts the "
        "glass coating."
    ),
    (
        "The temperature curve matters as much as the peak, because steam trapped in thick walls can crack a piece "
        "heated too fast."
    ),
)
PAGE = (
    "<!DOCTYPE html><html><head><title>Kiln notes</title></head><body>"
    "<nav class='navbar'><ul><li><a href='/'>Home</a></li><li><a href='/about'>About us</a></li><li><a "
    "href='/shop'>Shop now</a></li></ul></nav>"
    "<div id='cookie-banner' class='cookie-consent'>We use cookies to improve your experience. <button>Accept all "
    "cookies</button></div>"
    "<main><article><h1>How clay becomes pottery</h1>" + "".join(f"<p>{p}</p>" for p in ARTICLE) + "</article></main>"
    "<footer class='site-footer'><p>Copyright 2024 Example Pottery Ltd. All rights reserved. Privacy "
    "policy</p></footer>"
    "</body></html>"
)
BOILERPLATE = ("Home", "About us", "Shop now", "cookies", "Copyright", "Privacy")


def record(
    writer: WARCWriter,
    url: str,
    body: bytes,
    content_type: str = "text/html; charset=utf-8",
    status: str = "200 OK",
    kind: str = "response",
) -> None:
    http = (
        StatusAndHeaders(status, [("Content-Type", content_type)], protocol="HTTP/1.1") if kind == "response" else None
    )
    headers = None if kind == "response" else [("Content-Type", content_type)]
    rec = writer.create_warc_record(
        url, kind, payload=io.BytesIO(body), http_headers=http, warc_headers_dict=dict(headers or []) or None
    )
    if kind != "response":
        rec.rec_headers.replace_header("Content-Type", content_type)
    writer.write_record(rec)


def make_warc(path, gz: bool, malformed: bool = True) -> list[int]:
    """A small crawl: the offsets of its records, in order, come back."""
    buf = io.BytesIO()
    offsets = []

    def add(*args, **kwargs):
        offsets.append(buf.tell())
        record(WARCWriter(buf, gzip=gz), *args, **kwargs)

    offsets.append(0)
    WARCWriter(buf, gzip=gz).write_record(
        WARCWriter(buf, gzip=gz).create_warcinfo_record("crawl.warc", {"software": "test"})
    )
    add("http://example.org/kiln", PAGE.encode())  # 1: the page
    add("http://example.org/logo.png", b"\x89PNG\r\n\x1a\n", content_type="image/png")  # 2: not a document
    add("http://example.org/old", b"<html><body>Moved</body></html>", status="301 Moved Permanently")  # 3: a redirect
    if malformed:
        offsets.append(buf.tell())  # 4: a record whose header block is garbage
        junk = b"WARC/1.0\r\nthis line is no header\x00\xff\r\n\r\nrest of a broken record\r\n\r\n"
        buf.write(gzip.compress(junk) if gz else junk)
    add(
        "http://example.org/latin",
        (
            "<html><body><main><p>Crème brûlée and café au lait, served in the garden every "
            "afternoon.</p></main></body></html>"
        ).encode("latin-1"),
        content_type="text/html; charset=ISO-8859-1",
    )  # 5
    add("http://example.org/nav-only", b"<html><body><nav><a href='/'>Home</a></nav></body></html>")  # 6: no main text
    add(
        "urn:text:1",
        b"Already extracted plain text from a WET conversion.",
        content_type="text/plain",
        kind="conversion",
    )  # 7
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return offsets


@pytest.mark.parametrize("gz", [False, True])
def test_pages_are_extracted_and_bad_records_quarantined(tmp_path, gz):
    path = tmp_path / "crawl" / ("a.warc.gz" if gz else "a.warc")
    offsets = make_warc(path, gz)
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "crawl")))
    name = path.name
    assert [d.id for d in docs] == [
        f"crawl/{name}@{offsets[1]}",
        f"crawl/{name}@{offsets[5]}",
        f"crawl/{name}@{offsets[7]}",
    ]
    page, latin, wet = docs
    assert page.text.startswith("How clay becomes pottery") and all(p in page.text for p in ARTICLE)
    assert not [w for w in BOILERPLATE if w in page.text], page.text
    assert "\n" in page.text  # paragraphs stay apart
    assert (
        page.meta["url"] == "http://example.org/kiln"
        and page.meta["offset"] == offsets[1]
        and page.meta["path"] == str(path)
    )
    assert page.meta["warc_record_id"].startswith("<urn:uuid:") and page.meta["warc_date"]
    assert latin.text == "Crème brûlée and café au lait, served in the garden every afternoon."
    assert wet.text == "Already extracted plain text from a WET conversion."
    [q] = ledger.quarantined
    assert (q["id"], q["position"], q["file"]) == (f"crawl/{name}@{offsets[4]}", str(offsets[4]), str(path))
    assert q["error"].startswith("read:bad_record: ") and f"at byte {offsets[4]}" in q["error"], q
    assert [(r["id"], r["reason"]) for r in ledger.removed] == [(f"crawl/{name}@{offsets[6]}", "extract:no_text")]
    assert ledger.tally("crawl").stats["read:warc_skipped"] == 2  # the image and the redirect: not documents
    assert ledger.tally("crawl").docs_in == 5  # 3 pages kept + 1 removed + 1 quarantined


def test_trafilatura_also_drops_the_boilerplate(tmp_path):
    path = tmp_path / "crawl" / "a.warc.gz"
    make_warc(path, gz=True, malformed=False)
    docs, _ = read_inputs(InputConfig(path=str(path), extractor="trafilatura"))
    page = docs[0]
    assert all(p in page.text for p in ARTICLE) and not [w for w in BOILERPLATE if w in page.text], page.text


def test_truncated_warc_keeps_the_records_before_the_damage(tmp_path):
    path = tmp_path / "crawl" / "a.warc.gz"
    offsets = make_warc(path, gz=True, malformed=False)
    data = path.read_bytes()
    latin = offsets[4]  # no malformed record: the latin-1 page is the fourth after warcinfo
    path.write_bytes(data[: latin + 40])  # cut inside its gzip member
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    assert [d.meta["offset"] for d in docs] == [offsets[1]]
    [q] = ledger.quarantined
    assert q["position"] == str(latin) and q["error"].startswith("read:bad_record"), q


def test_oversize_page_is_quarantined_unread(tmp_path):
    path = tmp_path / "crawl" / "a.warc"
    offsets = make_warc(path, gz=False, malformed=False)
    docs, ledger = read_inputs(InputConfig(path=str(path)), limits=ReadLimits(max_html_bytes=len(PAGE) - 1))
    assert offsets[1] not in [d.meta["offset"] for d in docs]
    assert [(q["position"], q["error"].split(":")[1]) for q in ledger.quarantined] == [(str(offsets[1]), "too_large")]


def test_a_corrupt_gzip_member_is_quarantined_and_reading_resumes_after_it(tmp_path):
    path = tmp_path / "crawl" / "a.warc.gz"
    offsets = make_warc(path, gz=True)
    data = bytearray(path.read_bytes())
    middle = (offsets[1] + offsets[2]) // 2
    data[middle : middle + 20] = bytes(20)  # zero out part of the first page's compressed data
    path.write_bytes(bytes(data))
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    assert [d.meta["offset"] for d in docs] == [offsets[5], offsets[7]]
    assert [q["position"] for q in ledger.quarantined] == [str(offsets[1]), str(offsets[4])]


def test_a_warc_gzipped_as_one_member_reads_every_record(tmp_path):
    # `gzip -c crawl.warc > crawl.warc.gz`: one member for the whole file. fastwarc alone gives
    # every record after the first one position, and the reader used to drop them unseen.
    plain = tmp_path / "plain" / "a.warc"
    offsets = make_warc(plain, gz=False, malformed=False)
    path = tmp_path / "crawl" / "a.warc.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(plain.read_bytes()))
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "crawl")))
    # ids: the member's offset (0) plus the record's offset in the decompressed member, which
    # for one member is its offset in the plain file
    assert [d.id for d in docs] == [f"crawl/a.warc.gz@0+{offsets[i]}" for i in (1, 4, 6)]
    assert [(d.meta["offset"], d.meta["offset_in_member"]) for d in docs] == [(0, offsets[i]) for i in (1, 4, 6)]
    reference, _ = read_inputs(InputConfig(path=str(plain)))
    assert [d.text for d in docs] == [d.text for d in reference] and len(docs) == 3
    assert [r["id"] for r in ledger.removed] == [f"crawl/a.warc.gz@0+{offsets[5]}"]
    tally = ledger.tally("crawl")
    assert tally.docs_in == 4 and tally.stats["read:warc_skipped"] == 2 and not ledger.quarantined


def test_a_junk_record_in_a_single_member_ends_that_member_with_a_quarantine(tmp_path):
    plain = tmp_path / "plain" / "a.warc"
    offsets = make_warc(plain, gz=False)
    path = tmp_path / "crawl" / "a.warc.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(plain.read_bytes()))
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    assert [d.id for d in docs] == [f"crawl/a.warc.gz@0+{offsets[1]}"]
    [q] = ledger.quarantined  # reading resumes at the next member, and there is none: said in the entry
    assert (
        q["position"] == f"0+{offsets[4]}"
        and "lacks WARC-Type" in q["error"]
        and "rest of its gzip member" in q["error"]
    ), q


def test_members_holding_several_records_each(tmp_path):
    plain = tmp_path / "a.warc"
    offsets = make_warc(plain, gz=False, malformed=False)
    data = plain.read_bytes()
    first, second = gzip.compress(data[: offsets[4]]), gzip.compress(data[offsets[4] :])
    path = tmp_path / "crawl" / "a.warc.gz"
    path.parent.mkdir()
    path.write_bytes(first + second)
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    # the latin-1 page starts the second member: a plain member offset; the rest are inside one
    assert [d.id for d in docs] == [
        "crawl/a.warc.gz@0+" + str(offsets[1]),
        f"crawl/a.warc.gz@{len(first)}",
        f"crawl/a.warc.gz@{len(first)}+{offsets[6] - offsets[4]}",
    ]
    assert not ledger.quarantined and ledger.tally("crawl").docs_in == 4


def test_a_truncated_single_member_warc_keeps_what_came_before_and_quarantines_the_rest(tmp_path):
    plain = tmp_path / "a.warc"
    make_warc(plain, gz=False, malformed=False)
    path = tmp_path / "crawl" / "a.warc.gz"
    path.parent.mkdir()
    data = gzip.compress(plain.read_bytes())
    path.write_bytes(data[: len(data) - 30])  # the member's end (and its CRC) is gone
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    [q] = ledger.quarantined
    assert q["position"] == "0" and "truncated gzip member" in q["error"], q
    assert ledger.tally("crawl").docs_in == len(docs) + 1 + len(ledger.removed)


def five_pages(path, gz: bool, third_type: str) -> list[int]:
    """A crawl of five copies of PAGE, the third served with `third_type`; the record offsets come back."""
    buf, offsets = io.BytesIO(), []
    for i in range(5):
        offsets.append(buf.tell())
        body = PAGE.replace("How clay", f"Page {i}: how clay").encode()
        record(
            WARCWriter(buf, gzip=gz),
            f"http://example.org/{i}",
            body,
            content_type=third_type if i == 2 else "text/html; charset=utf-8",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return offsets


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("charset", ["base64", "rot13", "idna"])
def test_a_charset_that_is_no_text_encoding_reads_the_page_as_utf8(tmp_path, gz, charset):
    path = tmp_path / "crawl" / ("a.warc.gz" if gz else "a.warc")
    offsets = five_pages(path, gz, f"text/html; charset={charset}")
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "crawl")))
    assert [d.id for d in docs] == [f"crawl/{path.name}@{o}" for o in offsets]
    assert docs[2].text.startswith("Page 2: how clay") and ledger.quarantined == []
    assert ledger.tally("crawl").docs_in == 5


@pytest.mark.parametrize("gz", [False, True])
def test_a_record_whose_page_fails_is_quarantined_at_its_own_offset(tmp_path, monkeypatch, gz):
    from kiln.curate.readers import page

    real = page.decode_html

    def decode_html(body, charset):
        if b"Page 2:" in body:
            raise RuntimeError("a decoder bug")
        return real(body, charset)

    monkeypatch.setattr(page, "decode_html", decode_html)
    path = tmp_path / "crawl" / ("a.warc.gz" if gz else "a.warc")
    offsets = five_pages(path, gz, "text/html; charset=utf-8")
    docs, ledger = read_inputs(InputConfig(path=str(tmp_path / "crawl")))
    assert [d.id for d in docs] == [
        f"crawl/{path.name}@{o}" for i, o in enumerate(offsets) if i != 2
    ]  # the next record is not blamed
    [q] = ledger.quarantined
    assert (q["id"], q["position"]) == (f"crawl/{path.name}@{offsets[2]}", str(offsets[2]))
    assert q["error"] == f"read:bad_record: WARC record at byte {offsets[2]}: RuntimeError: a decoder bug"
    assert ledger.tally("crawl").docs_in == 5


def test_an_uncompressed_warc_cut_inside_a_record_body_quarantines_that_record(tmp_path):
    path = tmp_path / "crawl" / "a.warc"
    offsets = make_warc(path, gz=False, malformed=False)
    data = path.read_bytes()
    whole, _ = read_inputs(InputConfig(path=str(path)))
    last = max(d.meta["offset"] for d in whole)
    path.write_bytes(data[: data.index(b"\r\n\r\n", last) + 4 + 20])  # 20 bytes into the last document's body
    docs, ledger = read_inputs(InputConfig(path=str(path)))
    assert [d.meta["offset"] for d in docs] == [d.meta["offset"] for d in whole if d.meta["offset"] != last]
    [q] = ledger.quarantined
    assert q["position"] == str(last) and "is truncated: its Content-Length reaches byte" in q["error"], q
    assert offsets  # the fixture's records were written
