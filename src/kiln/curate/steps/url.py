"""Drop documents whose URL is on a block list: by domain (and every subdomain), or by substring.

The URL is read from `doc.meta["url"]` (the key is configurable); a document without one passes.
Lists come inline from the recipe and from files (one entry per line, `#` starts a comment, blank
lines ignored), all matched case-insensitively. A host is compared in its ASCII (punycode) form
after dropping userinfo, port and a trailing dot, so `Bücher.example` and `xn--bcher-kva.example`
are one entry; a domain lookup checks each suffix of the host in a set, so its cost does not grow
with the list (100k domains). Substrings are matched against the lowercased, percent-decoded URL
with one regex compiled from a trie of the entries (about 30 us a URL for 100k entries, where a
flat alternation takes 25 ms).
Not handled: fetching lists from the network, regular-expression entries, IDNA 2008-only
spellings (hosts are encoded with Python's IDNA 2003 codec, which maps `ß` to `ss`), and URLs in
the text itself.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from urllib.parse import unquote

from pydantic import Field, field_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.steps.base import Drop, Filter

# sre compiles and matches nested groups recursively, one level per character where the trie
# branches; entries longer than this could exhaust Python's recursion limit.
MAX_SUBSTRING_CHARS = 200


class URLFilterConfig(Section):
    enabled: bool = Field(True, description="Run the URL filter (a no-op while every list is empty).")
    blocked_domains: list[str] = Field(
        default_factory=list,
        description="Domains to block, with all their subdomains (example.com also blocks www.example.com).",
    )
    blocked_domain_files: list[str] = Field(
        default_factory=list, description="Files of blocked domains: one per line, # comments and blank lines ignored."
    )
    blocked_substrings: list[str] = Field(
        default_factory=list,
        description="Strings that block a URL containing them anywhere (case-insensitive, after percent-decoding).",
    )
    blocked_substring_files: list[str] = Field(
        default_factory=list,
        description="Files of blocked substrings: one per line, # comments and blank lines ignored.",
    )
    url_key: str = Field("url", description="Meta key holding the document's URL; documents without it pass.")

    @field_validator("blocked_domains", "blocked_substrings")
    @classmethod
    def _no_blank_entries(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if not entry.strip():
                raise ValueError("a blank entry would match every URL; remove it")
        return entries


_AUTHORITY = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:)?//([^/?#\\]*)")
_HOSTLESS_SCHEME = re.compile(r"^(?:mailto|data|javascript|about|urn|tel|file):", re.IGNORECASE)
_NUMERIC_TLD = re.compile(r"(?:^|\.)\d+$")


def url_host(url: str) -> str | None:
    """The host of `url` as matched against the domain list: ASCII, lowercase, no port or userinfo.

    A URL without a scheme (`example.com/page`) is read as a host and path. None when there is no
    host (`mailto:`, `data:`, empty). IPv6 literals come back without brackets.
    """
    url = url.strip()
    m = _AUTHORITY.match(url)
    if m is not None:
        authority = m.group(1)
    elif _HOSTLESS_SCHEME.match(url):
        return None
    else:
        authority = re.split(r"[/?#\\]", url, maxsplit=1)[0]
    host = authority.rpartition("@")[2]
    if host.startswith("["):
        host = host[1:].partition("]")[0]
        try:
            return str(ipaddress.IPv6Address(host))  # compressed form, as entries are stored
        except ValueError:
            return host.lower() or None
    host = unquote(host.partition(":")[0]).strip().rstrip(".").lower()
    return _ascii_host(host) or None


def _ascii_host(host: str) -> str:
    """The punycode form of a host; the host itself (lowercased) when it cannot be encoded."""
    if host.isascii():
        return host
    try:
        # The IDNA codec also maps the ideographic full stops (U+3002, U+FF0E, U+FF61) to dots.
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        return host


def _normalize_domain_entry(entry: str, where: str) -> str:
    """A block-list domain as a bare ASCII host: tolerates `*.`/leading dots and whole URLs."""
    raw = entry.strip()
    if any(c.isspace() for c in raw):
        raise ConfigError(
            f"url_filter: {where}: domain entry {raw!r} contains whitespace; write one domain per line, e.g. "
            "example.com"
        )
    raw = raw.removeprefix("*.")
    try:
        return str(ipaddress.ip_address(raw.strip("[]")))  # an address entry blocks that address only
    except ValueError:
        pass
    host = (
        url_host(raw.lstrip("."))
        if "/" in raw or "@" in raw or ":" in raw
        else _ascii_host(raw.lstrip(".").rstrip(".").lower())
    )
    if not host:
        raise ConfigError(
            f"url_filter: {where}: domain entry {raw!r} names no host; write one domain per line, e.g. example.com"
        )
    return host


def _read_list(path_text: str, kind: str) -> list[tuple[str, str]]:
    """(entry, 'path:line') for each entry of a list file; a missing file is a ConfigError."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"url_filter.{kind}: list file {str(path)!r} does not exist or is not a file; fix the path or remove "
            "it from the recipe"
        )
    entries = []
    with path.open(encoding="utf-8", errors="strict") as f:
        for number, line in enumerate(f, start=1):
            entry = line.partition("#")[0].strip()
            if entry:
                entries.append((entry, f"{path}:{number}"))
    return entries


def _trie_regex(entries: set[str]) -> re.Pattern[str] | None:
    """One regex matching any entry, built from a trie so that the engine follows one branch per
    character instead of trying every entry; at a terminal node the shorter entry wins."""
    if not entries:
        return None
    root: dict[str, dict] = {}
    for entry in entries:
        node = root
        for ch in entry:
            node = node.setdefault(ch, {})
        node[""] = {}  # terminal marker

    def emit(node: dict[str, dict]) -> str:
        parts: list[str] = []
        # Follow single-child chains without recursing, so recursion depth is the branching depth.
        while "" not in node and len(node) == 1:
            ((ch, node),) = node.items()
            parts.append(re.escape(ch))
        if "" in node:
            return "".join(parts)
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items())]
        return "".join(parts) + "(?:" + "|".join(branches) + ")"

    return re.compile(emit(root))


class URLFilter(Filter):
    """The `url_filter` step: drops a document whose URL's host or text is on a block list."""

    name = "url_filter"

    def __init__(self, config: URLFilterConfig):
        self.config = config
        domains: set[str] = set()
        for entry, where in [(e, "blocked_domains") for e in config.blocked_domains] + [
            item for path in config.blocked_domain_files for item in _read_list(path, "blocked_domain_files")
        ]:
            domains.add(_normalize_domain_entry(entry, where))
        substrings: set[str] = set()
        for entry, where in [(e, "blocked_substrings") for e in config.blocked_substrings] + [
            item for path in config.blocked_substring_files for item in _read_list(path, "blocked_substring_files")
        ]:
            entry = entry.strip().lower()
            if len(entry) > MAX_SUBSTRING_CHARS:
                raise ConfigError(
                    f"url_filter: {where}: substring entry of {len(entry)} characters is longer than "
                    f"{MAX_SUBSTRING_CHARS}; shorten it"
                )
            substrings.add(entry)
        self.domains = frozenset(domains)
        self._substrings = _trie_regex(substrings)

    def blocked_domain(self, host: str) -> str | None:
        """The block-list entry that `host` falls under (itself or a parent domain), or None."""
        if host in self.domains:
            return host
        if ":" in host or _NUMERIC_TLD.search(host):
            # an IP address (or any all-numeric "TLD") is blocked only by itself, never by a suffix such as 2.3.4
            return None
        dot = host.find(".")
        while dot != -1:
            suffix = host[dot + 1 :]
            if suffix in self.domains:
                return suffix
            dot = host.find(".", dot + 1)
        return None

    def check(self, doc: Document) -> Drop | None:
        url = doc.meta.get(self.config.url_key)
        if not isinstance(url, str) or not url:
            return None
        if self.domains:
            host = url_host(url)
            if host is not None and (entry := self.blocked_domain(host)) is not None:
                return Drop("blocked_domain", note=entry)
        if self._substrings is not None:
            found = self._substrings.search(unquote(url).lower())
            if found is not None:
                return Drop("blocked_substring", note=found.group(0))
        return None
