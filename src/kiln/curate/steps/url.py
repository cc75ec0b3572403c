"""Drop documents whose URL is on a block list: by domain (and every subdomain), by URL, by word, or by substring.

The URL is read from `doc.meta["url"]` (the key is configurable); a document without one passes.
Lists come inline from the recipe, from list files (kiln.curate.blocklists) and from category archives
in UT1's layout (`adult`, `gambling`, `phishing`, ... chosen by name), all matched case-insensitively.
A host is compared in its ASCII (punycode) form after dropping userinfo, port and a trailing dot, so
`Bücher.example` and `xn--bcher-kva.example` are one entry; a domain lookup checks each suffix of the
host in a set, so its cost does not grow with the list (millions of domains). A listed URL (`host/path`)
blocks itself and every path below it. As FineWeb's URL filter does, and on by default with the lists
kiln ships: a URL holding a listed word as a whole token (split at every character that is not a letter
or digit) goes, as does one holding `soft_word_threshold` soft words or a listed subword anywhere in its
letters and digits run together. Substrings are matched against the lowercased, percent-decoded URL
with one regex compiled from a trie of the entries (about 30 us a URL for 100k entries, where a flat
alternation takes 25 ms).
Not handled here: fetching lists from the network, regular-expression entries, IDNA 2008-only
spellings (hosts are encoded with Python's IDNA 2003 codec, which maps `ß` to `ss`), and URLs in
the text itself.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import regex
from pydantic import Field, field_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.blocklists import (
    SHIPPED_VERSION,
    URL_SOFT_WORDS,
    URL_SUBWORDS,
    URL_WORDS,
    archive_stamp,
    archive_version,
    line_of,
    list_file,
    read_categories,
    read_list,
    record,
    stamp,
)
from kiln.curate.steps.base import Drop, Filter

# sre compiles and matches nested groups recursively, one level per character where the trie
# branches; entries longer than this could exhaust Python's recursion limit.
MAX_SUBSTRING_CHARS = 200


class CategoryListConfig(Section):
    path: str = Field(description="A folder or tar archive (.tar.gz, .tgz, .tar) in UT1's layout: <category>/domains.")
    categories: tuple[str, ...] = Field(
        min_length=1, description="The categories to block, by folder name (adult, gambling, phishing, ...)."
    )


class URLFilterConfig(Section):
    enabled: bool = Field(True, description="Run the URL filter (documents without meta.url pass).")
    categories: list[CategoryListConfig] = Field(
        default_factory=list,
        description=(
            "Category lists in UT1's layout, each {path, categories}: the categories' domains and URLs are blocked."
        ),
    )
    shipped_words: bool = Field(
        True,
        description="Block URLs by the word, soft-word and subword lists kiln ships (adult terms; docs/curation.md).",
    )
    blocked_words: list[str] = Field(
        default_factory=list, description="More words that block a URL holding one as a whole token."
    )
    soft_word_threshold: int = Field(
        2, ge=1, description="Block a URL holding at least this many soft words (kiln's list) as whole tokens."
    )
    blocked_url_files: list[str] = Field(
        default_factory=list,
        description="Files of blocked URLs (host/path, scheme optional): each blocks itself and every path below it.",
    )
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

    @field_validator("blocked_domains", "blocked_substrings", "blocked_words")
    @classmethod
    def _no_blank_entries(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if not entry.strip():
                raise ValueError("a blank entry would match every URL; remove it")
        return entries

    @field_validator("blocked_words")
    @classmethod
    def _one_token_each(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if regex.search(r"[^\p{L}\p{M}\p{N}]", entry.strip()):
                raise ValueError(
                    f"{entry!r} is not one token (letters and digits only), so no URL token could equal it; put it in "
                    "blocked_substrings instead"
                )
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


# The common entry, already a lowercase ASCII host: taken as it is. perf: FineWeb's copy of UT1's adult list
# (4,558,940 domains) loads in 5 s; through the general path below, with its IP address check, it took 25.
_PLAIN_DOMAIN = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)+")


def _normalize_domain_entry(entry: str, where: str) -> str:
    """A block-list domain as a bare ASCII host: tolerates `*.`/leading dots and whole URLs. `where`: the
    recipe key or the file it was read from."""
    if _PLAIN_DOMAIN.fullmatch(entry):
        return entry
    raw = entry.strip()
    if any(c.isspace() for c in raw):
        raise ConfigError(
            f"url_filter: {line_of(where, entry)}: domain entry {raw!r} contains whitespace; write one domain per "
            "line, e.g. example.com"
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
            f"url_filter: {line_of(where, entry)}: domain entry {raw!r} names no host; write one domain per line, "
            "e.g. example.com"
        )
    return host


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


# A URL's tokens: runs of letters (with their combining marks: Thai and Indic words keep their vowels) and digits.
_NOT_WORD = regex.compile(r"[^\p{L}\p{M}\p{N}]+")


def _url_key(entry: str) -> str | None:
    """A listed or document URL as `host/path` (host as url_host gives it, no `www.`, no query, no trailing
    slash, lowercase), or None when it has no host."""
    host = url_host(entry)
    if host is None:
        return None
    rest = re.sub(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:)?//", "", entry.strip())
    path = re.split(r"[?#]", rest.partition("/")[2] if "/" in rest else "", maxsplit=1)[0]
    return (host.removeprefix("www.") + "/" + unquote(path).lower()).rstrip("/")


@functools.lru_cache(maxsize=4)
def _tables(
    categories: tuple[tuple[str, tuple[str, ...], tuple], ...],
    inline: tuple[str, ...],
    domain_files: tuple[tuple[str, tuple[int, float]], ...],
    url_files: tuple[tuple[str, tuple[int, float]], ...],
) -> tuple[dict[str, str], dict[str, str], tuple[dict[str, Any], ...]]:
    """The blocked domains and URLs, each with the category it came from ("": the recipe's own lists), and the
    records of the archives read. Built once a process for the same lists (the files' sizes and times are in
    the key): a worker builds its URL filter for every task, and millions of domains take seconds to load."""
    domains: dict[str, str] = {}
    urls: dict[str, str] = {}
    records = []
    for path_text, names, _ in categories:
        found = read_categories(path_text, names, f"url_filter.categories ({path_text})")
        for category in found:
            for entry in category.domains:
                domains.setdefault(_normalize_domain_entry(entry, category.domains_at), category.name)
            for entry in category.urls:
                if (url := _url_key(entry)) is not None:
                    urls.setdefault(url, category.name)
        path = Path(path_text).expanduser()
        counts = {c.name: len(c.domains) + len(c.urls) for c in found}
        records.append(record(path, path.name, archive_version(path), sum(counts.values()), counts))
    for entry in inline:
        domains.setdefault(_normalize_domain_entry(entry, "url_filter.blocked_domains"), "")
    for path, _ in domain_files:
        where = str(Path(path).expanduser())
        for entry in read_list(path, "url_filter.blocked_domain_files"):
            domains.setdefault(_normalize_domain_entry(entry, where), "")
    for path, _ in url_files:
        for entry in read_list(path, "url_filter.blocked_url_files"):
            if (url := _url_key(entry)) is not None:
                urls.setdefault(url, "")
    return domains, urls, tuple(records)


def _noted(entry: str, category: str) -> str:
    return f"{entry} ({category})" if category else entry


class URLFilter(Filter):
    """The `url_filter` step: drops a document whose URL's host, URL, words or text are on a block list."""

    name = "url_filter"

    def __init__(self, config: URLFilterConfig):
        self.config = config
        self.lists: list[dict[str, Any]] = []  # what the manifest records of each list read
        key = "url_filter"

        def stamped(paths: list[str], name: str) -> tuple[tuple[str, tuple[int, float]], ...]:
            return tuple((path, stamp(list_file(path, f"{key}.{name}"))) for path in paths)

        categories = tuple((c.path, c.categories, archive_stamp(Path(c.path).expanduser())) for c in config.categories)
        domain_files = stamped(config.blocked_domain_files, "blocked_domain_files")
        url_files = stamped(config.blocked_url_files, "blocked_url_files")
        domains, urls, records = _tables(categories, tuple(config.blocked_domains), domain_files, url_files)
        self.lists.extend(records)
        substrings: set[str] = set()
        substring_files = config.blocked_substring_files
        for entry, where in [(e, "blocked_substrings") for e in config.blocked_substrings] + [
            (entry, path) for path in substring_files for entry in read_list(path, f"{key}.blocked_substring_files")
        ]:
            entry = entry.strip().lower()
            if len(entry) > MAX_SUBSTRING_CHARS:
                raise ConfigError(
                    f"url_filter: {where}: substring entry of {len(entry)} characters is longer than "
                    f"{MAX_SUBSTRING_CHARS}; shorten it"
                )
            substrings.add(entry)
        words = {w.strip().lower() for w in config.blocked_words}
        soft: set[str] = set()
        subwords: set[str] = set()
        if config.shipped_words:
            for path, into in ((URL_WORDS, words), (URL_SOFT_WORDS, soft), (URL_SUBWORDS, subwords)):
                entries = [e.lower() for e in read_list(str(path), "url_filter.shipped_words")]
                into.update(entries)
                self.lists.append(record(path, f"kiln {path.stem}", SHIPPED_VERSION, len(entries)))
        self.domains, self.urls = domains, urls
        self.words, self.soft_words = frozenset(words), frozenset(soft)
        self._substrings = _trie_regex(substrings)
        self._subwords = _trie_regex(subwords)

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

    def blocked_url(self, url: str) -> str | None:
        """The listed URL that `url` is, or lies below, or None."""
        key = _url_key(url)
        while key:
            if key in self.urls:
                return key
            key = key.rpartition("/")[0] if "/" in key else ""
        return None

    def check(self, doc: Document) -> Drop | None:
        url = doc.meta.get(self.config.url_key)
        if not isinstance(url, str) or not url:
            return None
        if self.domains:
            host = url_host(url)
            if host is not None and (entry := self.blocked_domain(host)) is not None:
                return Drop("blocked_domain", note=_noted(entry, self.domains[entry]))
        if self.urls and (entry := self.blocked_url(url)) is not None:
            return Drop("blocked_url", note=_noted(entry, self.urls[entry]))
        lowered = unquote(url).lower()
        if self.words or self.soft_words:
            tokens = set(_NOT_WORD.split(lowered))
            if found := tokens & self.words:
                return Drop("blocked_word", note=min(found))
            soft = tokens & self.soft_words
            if len(soft) >= self.config.soft_word_threshold:
                return Drop("soft_words", len(soft), self.config.soft_word_threshold, note=" ".join(sorted(soft)))
        if self._subwords is not None:
            found = self._subwords.search(_NOT_WORD.sub("", lowered))
            if found is not None:
                return Drop("blocked_subword", note=found.group(0))
        if self._substrings is not None:
            found = self._substrings.search(lowered)
            if found is not None:
                return Drop("blocked_substring", note=found.group(0))
        return None
