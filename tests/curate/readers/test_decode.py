"""kiln.curate.readers.decode: page charsets, including names that are no text charset."""

from __future__ import annotations

import pytest

from kiln.curate.readers.decode import decode_html, html_charset

PAGE = "<html><body><p>café</p></body></html>".encode()


@pytest.mark.parametrize(
    "declared", ["base64", "hex", "rot13", "zlib", "idna", "punycode", "undefined", "no-such-charset"]
)
def test_a_name_that_is_no_page_charset_falls_back_to_utf8(declared):
    assert html_charset(PAGE, declared) == "utf-8"
    assert decode_html(PAGE, declared) == ("<html><body><p>café</p></body></html>", None)


def test_a_bad_header_charset_falls_back_to_the_meta_one():
    body = b"<html><head><meta charset='iso-8859-2'></head><body>\xb1</body></html>"
    assert html_charset(body, "base64") == "iso8859-2"
    assert decode_html(body, "base64")[0].endswith("<body>\u0105</body></html>")


def test_a_codec_that_fails_outright_reads_the_page_as_utf8(monkeypatch):
    # a text codec whose decode raises plain UnicodeError even with errors="replace" (idna does)
    monkeypatch.setattr("kiln.curate.readers.decode.html_charset", lambda body, declared: "idna")
    assert decode_html(b"<p>caf\xc3\xa9 \xff</p>", "idna") == ("<p>café \ufffd</p>", "read:invalid_encoding")
