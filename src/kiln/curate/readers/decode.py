"""Bytes to text: UTF-8 with replacement, lone surrogates, and the charset of an HTML page.

Every reader decodes through here, so "invalid UTF-8 is replaced and counted" means the same
thing for text files, JSONL lines, Parquet cells and web pages. Not handled here: guessing the
encoding of text that declares none (undeclared bytes are read as UTF-8; chardet-style
detection is slow and often wrong on short pages).
"""

from __future__ import annotations

import codecs
import re
from typing import Any

# A lone UTF-16 surrogate (from a JSON "\ud800" escape) cannot be written as UTF-8: every shard
# write would fail on it, so it is replaced like any invalid byte.
_SURROGATE = re.compile("[\ud800-\udfff]")
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
SNIFF_BYTES = 4096  # a <meta charset> must sit in the first 1024 bytes by the HTML spec; allow slack
# Text codecs Python knows that are no page's charset: idna and punycode encode host names, and
# `undefined` raises on every byte (codecs that are not text at all, base64 or rot13, are caught
# by `_is_text_encoding`).
_NOT_PAGE_CHARSETS = frozenset({"idna", "punycode", "undefined"})


def decode_utf8(data: bytes) -> tuple[str, bool]:
    """The text, and whether invalid bytes had to be replaced with U+FFFD."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), True


def scrub_surrogates(text: str) -> tuple[str, bool]:
    """`text` with lone surrogates replaced by U+FFFD, and whether there were any."""
    fixed, n = _SURROGATE.subn("\ufffd", text)
    return fixed, n > 0


def scrub_value(value: Any) -> Any:
    """A JSON value (meta, ids) with lone surrogates replaced in every string, however nested."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {scrub_value(k): scrub_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_value(v) for v in value]
    return value


def html_charset(body: bytes, declared: str | None) -> str:
    """The codec to read an HTML page with: the HTTP header's charset, else a <meta> one, else utf-8.

    A declared name that is no text charset (`base64`, `hex`, `rot13`, `idna`) is skipped like a
    misspelt one: `bytes.decode("base64")` raises LookupError, which would lose the page.
    """
    for candidate in (declared, _sniff_meta(body)):
        if candidate:
            try:
                info = codecs.lookup(candidate.strip().strip("\"'"))
            except LookupError:  # a misspelt or invented charset: try the next source
                continue
            name = info.name
            # subtle: _is_text_encoding is private but is what str.decode itself checks (3.4+)
            if not getattr(info, "_is_text_encoding", True) or name in _NOT_PAGE_CHARSETS:
                continue
            # subtle: pages labelled latin-1 or ascii are in practice windows-1252 (the HTML spec
            # maps them so); decoding as latin-1 would turn curly quotes into C1 controls.
            return "cp1252" if name in ("latin-1", "iso8859-1", "ascii") else name
    return "utf-8"


def _sniff_meta(body: bytes) -> str | None:
    found = _META_CHARSET.search(body[:SNIFF_BYTES])
    return found.group(1).decode("ascii") if found else None


def decode_html(body: bytes, declared: str | None) -> tuple[str, str | None]:
    """The page as text and the name of a counter to bump when bytes had to be replaced.

    The counter is `read:invalid_utf8` for UTF-8 pages and `read:invalid_encoding` for pages in
    another declared charset, so a misdeclared charset does not pass for broken UTF-8. Never
    raises: a codec that cannot decode even with replacement (some raise plain UnicodeError, or
    reject the `replace` handler) leaves the page read as UTF-8, counted `read:invalid_encoding`.
    """
    codec = html_charset(body, declared)
    if body.startswith(codecs.BOM_UTF8):
        codec, body = "utf-8", body[len(codecs.BOM_UTF8) :]
    try:
        return body.decode(codec), None
    except (UnicodeError, LookupError):  # UnicodeDecodeError is a UnicodeError
        pass
    try:
        return body.decode(
            codec, errors="replace"
        ), "read:invalid_utf8" if codec == "utf-8" else "read:invalid_encoding"
    except (UnicodeError, LookupError):
        return decode_utf8(body)[0], "read:invalid_encoding"
