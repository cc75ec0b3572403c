"""kiln.curate.steps.url: host parsing, domain and substring blocking on both paths, list files,
the trie regex worked by hand, and speed with 100k-entry lists."""

from __future__ import annotations

import pickle
import random
import string
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.steps.url import URLFilter, URLFilterConfig, _trie_regex, url_host


def doc(url: str | None) -> Document:
    return Document("d", "some text", "web", {} if url is None else {"url": url})


def run(step: URLFilter, d: Document) -> tuple[list[Document], Ledger]:
    ledger = Ledger()
    return list(step.process([d], ledger)), ledger


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://User:pw@WWW.Example.COM:8080/a?b#c", "www.example.com"),
        ("example.com/page", "example.com"),
        ("//cdn.example.com/x.js", "cdn.example.com"),
        ("HTTP://EXAMPLE.COM./", "example.com"),
        ("https://%65xample.com/", "example.com"),
        ("http://[2001:DB8::1]:80/", "2001:db8::1"),
        ("https://bücher.example/x", "xn--bcher-kva.example"),
        ("https://例子。测试/", "xn--fsqu00a.xn--0zwm56d"),  # ideographic full stop is a dot
        ("mailto:someone@example.com", None),
        ("", None),
    ],
)
def test_url_host(url: str, host: str | None):
    assert url_host(url) == host


def test_trie_regex_by_hand():
    # Entries ab, ac, b share the prefix a; at a terminal node the shorter entry wins, so "abc" is not needed.
    assert _trie_regex({"ab", "ac", "b", "abc"}).pattern == "(?:a(?:b|c)|b)"
    assert _trie_regex(set()) is None


STEP = URLFilter(
    URLFilterConfig(
        blocked_domains=["example.com", "*.bad.org", "Bücher.example", "1.2.3.4"],
        blocked_substrings=["casino", "PORN"],
        shipped_words=False,  # the recipe's own lists alone (kiln's lists: test_url_categories.py)
    )
)


@pytest.mark.parametrize(
    ("url", "entry"),
    [
        ("https://example.com/", "example.com"),
        ("https://a.b.EXAMPLE.com:443/x", "example.com"),  # every subdomain, any case, any port
        ("https://user@sub.bad.org", "bad.org"),
        ("https://xn--bcher-kva.example/", "xn--bcher-kva.example"),  # punycode matches the unicode entry
        ("http://1.2.3.4/admin", "1.2.3.4"),
    ],
)
def test_blocked_domain_drops_with_entry(url: str, entry: str):
    out, ledger = run(STEP, doc(url))
    assert out == []
    assert (ledger.removed[0]["reason"], ledger.removed[0]["note"]) == ("url_filter:blocked_domain", entry)


@pytest.mark.parametrize(
    "url",
    [
        "https://notexample.com/",
        "https://example.co/",
        "https://example.com.evil.net/",
        "http://5.1.2.3.4/",
        "https://ok.org/casin",
        None,
        "",
        "mailto:x@example.org",
    ],
)
def test_unblocked_url_kept_unchanged(url: str | None):
    d = doc(url)
    out, ledger = run(STEP, d)
    assert out == [d] and out[0] is d and not ledger.removed


@pytest.mark.parametrize(
    ("url", "entry"), [("https://ok.org/Casino-night", "casino"), ("https://ok.org/%70orn", "porn")]
)
def test_blocked_substring_drops_with_entry(url: str, entry: str):
    out, ledger = run(STEP, doc(url))
    assert out == []
    assert (ledger.removed[0]["reason"], ledger.removed[0]["note"]) == ("url_filter:blocked_substring", entry)


def test_list_files_skip_comments_and_blank_lines(tmp_path: Path):
    domains = tmp_path / "domains.txt"
    domains.write_text("# adult sites\n\nblocked.net  # trailing comment\n.dotted.org\n", encoding="utf-8")
    words = tmp_path / "words.txt"
    words.write_text("#c\nspam\n", encoding="utf-8")
    step = URLFilter(URLFilterConfig(blocked_domain_files=[str(domains)], blocked_substring_files=[str(words)]))
    assert set(step.domains) == {"blocked.net", "dotted.org"}
    assert step.check(doc("https://www.blocked.net/")) is not None
    assert step.check(doc("https://x.org/SPAM")) is not None
    assert step.check(doc("https://x.org/ham")) is None


def test_missing_list_file_is_a_config_error_naming_it(tmp_path: Path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ConfigError, match="nope.txt"):
        URLFilter(URLFilterConfig(blocked_domain_files=[str(missing)]))
    with pytest.raises(ConfigError, match="nope.txt"):
        URLFilter(URLFilterConfig(blocked_substring_files=[str(missing)]))


def test_bad_entries_are_refused(tmp_path: Path):
    with pytest.raises(ValidationError):
        URLFilterConfig(blocked_substrings=[" "])  # would block everything
    bad = tmp_path / "bad.txt"
    bad.write_text("ok.com\nnot a domain\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="bad.txt:2"):
        URLFilter(URLFilterConfig(blocked_domain_files=[str(bad)]))


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_never_raises_on_any_url(url: str):
    STEP.check(doc(url))


def test_hundred_thousand_entries_are_fast(tmp_path: Path):
    rng = random.Random(0)
    names = {"".join(rng.choices(string.ascii_lowercase, k=rng.randint(5, 12))) for _ in range(100_000)}
    domains = tmp_path / "domains.txt"
    domains.write_text("\n".join(n + ".com" for n in names), encoding="utf-8")
    words = tmp_path / "words.txt"
    words.write_text("\n".join(sorted(names)[:5_000]), encoding="utf-8")
    start = time.perf_counter()
    step = URLFilter(URLFilterConfig(blocked_domain_files=[str(domains)], blocked_substring_files=[str(words)]))
    built = time.perf_counter() - start
    urls = [
        f"https://www.{''.join(rng.choices(string.ascii_lowercase, k=10))}.net/"
        f"{''.join(rng.choices(string.ascii_lowercase + '/-', k=60))}"
        for _ in range(2_000)
    ]
    start = time.perf_counter()
    for u in urls:
        step.check(doc(u))
    per_url = (time.perf_counter() - start) / len(urls)
    assert built < 5.0 and per_url < 1e-3  # measured about 1 s and 40 us
    assert step.check(doc(f"https://a.{next(iter(names))}.com/")) is not None


def test_step_pickles_for_workers():
    assert pickle.loads(pickle.dumps(STEP)).check(doc("https://x.example.com")) is not None
