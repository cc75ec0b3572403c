"""kiln.curate.steps.url with category archives in UT1's layout (built here, as a folder and as a .tar.gz),
URL lists, and the word, soft-word and subword lists kiln ships; the bad lists refused before any work."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.blocklists import read_categories
from kiln.curate.steps.url import CategoryListConfig, URLFilter, URLFilterConfig

CATEGORIES = {
    "adult": ("# adult\nadult-site.example\nxn--bcher-kva.example\n", "clean-host.example/members/private\n"),
    "gambling": ("casino-royal.example\nbets.example\n", None),
    "phishing": ("login-verify.example\n", "docs.example/fake-login\n"),
}


def ut1_folder(root: Path) -> Path:
    """A small archive in UT1's layout: blacklists/<category>/domains (and urls)."""
    for name, (domains, urls) in CATEGORIES.items():
        folder = root / "blacklists" / name
        folder.mkdir(parents=True)
        (folder / "domains").write_text(domains, encoding="utf-8")
        (folder / "usage").write_text("black\n", encoding="utf-8")
        if urls is not None:
            (folder / "urls").write_text(urls, encoding="utf-8")
    return root / "blacklists"


def ut1_tar(root: Path) -> Path:
    folder = ut1_folder(root / "src")
    archive = root / "blacklists.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="blacklists")
    return archive


def verdict(step: URLFilter, url: str) -> tuple[str, str | None] | None:
    ledger = Ledger()
    kept = list(step.process([Document("d", "text", "web", {"url": url})], ledger))
    if kept:
        return None
    return ledger.removed[0]["reason"], ledger.removed[0]["note"]


@pytest.mark.parametrize("layout", [ut1_folder, ut1_tar])
def test_chosen_categories_block_their_domains_and_urls_and_no_others(tmp_path: Path, layout) -> None:
    archive = layout(tmp_path)
    step = URLFilter(
        URLFilterConfig(categories=[CategoryListConfig(path=str(archive), categories=("adult", "phishing"))])
    )
    assert verdict(step, "https://www.adult-site.example/page") == (
        "url_filter:blocked_domain",
        "adult-site.example (adult)",
    )
    assert verdict(step, "https://Bücher.example/") == ("url_filter:blocked_domain", "xn--bcher-kva.example (adult)")
    assert verdict(step, "http://clean-host.example/members/private/photo?id=3") == (
        "url_filter:blocked_url",
        "clean-host.example/members/private (adult)",
    )
    assert verdict(step, "https://clean-host.example/members/public") is None  # a sibling path of a listed URL
    assert verdict(step, "https://docs.example/fake-login") == (
        "url_filter:blocked_url",
        "docs.example/fake-login (phishing)",
    )
    assert verdict(step, "https://casino-royal.example/") is None  # gambling not chosen
    [listed] = [found for found in step.lists if found["name"] == archive.name]
    assert listed["categories"] == {"adult": 3, "phishing": 2} and len(listed["sha256"]) == 64
    assert listed["version"][:2] == "20"  # the date of the archive's newest file


def test_a_category_the_archive_lacks_is_named_with_those_it_has(tmp_path: Path) -> None:
    archive = ut1_tar(tmp_path)
    with pytest.raises(ConfigError, match=r"has no categories adultt, malware .*it has: adult, gambling, phishing"):
        read_categories(str(archive), ("adultt", "gambling", "malware"), "url_filter.categories")


def test_a_list_that_is_not_text_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    domains = tmp_path / "domains.txt"
    domains.write_bytes(b"ok.example\nbad\xff.example\n")
    with pytest.raises(ConfigError, match=rf"{domains}:2: not UTF-8 text \(byte 0xff\)"):
        URLFilter(URLFilterConfig(blocked_domain_files=[str(domains)]))
    binary = tmp_path / "blacklists"
    (binary / "adult").mkdir(parents=True)
    (binary / "adult" / "domains").write_bytes(b"a.example\n\x00\x01\x02")
    with pytest.raises(ConfigError, match=r"adult/domains:2: a NUL byte: this is not a text list"):
        URLFilter(URLFilterConfig(categories=[CategoryListConfig(path=str(binary), categories=("adult",))]))
    not_archive = tmp_path / "list.zip"
    not_archive.write_bytes(b"PK\x03\x04")
    with pytest.raises(ConfigError, match=r"list\.zip: not a folder or a tar archive"):
        URLFilter(URLFilterConfig(categories=[CategoryListConfig(path=str(not_archive), categories=("adult",))]))


SHIPPED = URLFilter(URLFilterConfig())


@pytest.mark.parametrize(
    ("url", "reason", "note"),
    [
        ("https://example.com/free-PORN-videos", "url_filter:blocked_word", "porn"),
        ("https://example.com/%D0%BF%D0%BE%D1%80%D0%BD%D0%BE/1", "url_filter:blocked_word", "порно"),  # percent-encoded
        ("https://nude-webcam.example/", "url_filter:soft_words", "nude webcam"),
        ("https://freepornvideos.example/", "url_filter:blocked_subword", "freeporn"),
    ],
)
def test_kilns_url_lists_block_by_word_soft_words_and_subword(url: str, reason: str, note: str) -> None:
    assert verdict(SHIPPED, url) == (reason, note)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.org/sex-education/curriculum",  # one soft word alone
        "https://cars.example/ford-escort-1998",
        "https://de.example/wiki/Ansporn",  # porn inside a longer word: words are whole tokens
        "https://docs.example/document/cumulative",  # no subword is short enough to match inside words
        "https://birds.example/blue-tit-nesting",
    ],
)
def test_everyday_urls_pass_kilns_url_lists(url: str) -> None:
    assert verdict(SHIPPED, url) is None


def test_shipped_lists_are_recorded_and_can_be_turned_off() -> None:
    names = [found["name"] for found in SHIPPED.lists]
    assert names == ["kiln url_words", "kiln url_soft_words", "kiln url_subwords"]
    assert all(found["version"] == "kiln-lists v1" and found["entries"] > 10 for found in SHIPPED.lists)
    assert verdict(URLFilter(URLFilterConfig(shipped_words=False)), "https://example.com/porn") is None


def test_only_the_named_categories_are_read_and_an_edited_folder_is_read_again(tmp_path: Path) -> None:
    archive = ut1_folder(tmp_path)
    (archive / "french").mkdir()
    (archive / "french" / "urls").write_bytes(b"caf\xe9.example\n")  # not UTF-8, and not asked for
    (archive / "french" / "domains").write_bytes(b"caf\xe9.example\n")
    config = URLFilterConfig(categories=[CategoryListConfig(path=str(archive), categories=("gambling",))])
    assert verdict(URLFilter(config), "https://new-casino.example/") is None
    with (archive / "gambling" / "domains").open("a", encoding="utf-8") as f:
        f.write("new-casino.example\n")
    assert verdict(URLFilter(config), "https://new-casino.example/") == (
        "url_filter:blocked_domain",
        "new-casino.example (gambling)",
    )


def test_url_words_are_tokens_of_any_script_and_a_word_that_is_not_one_token_is_refused() -> None:
    assert verdict(SHIPPED, "https://example.com/หนังโป๊/1") == ("url_filter:blocked_word", "หนังโป๊")
    with pytest.raises(ValueError, match=r"'free-porn' is not one token"):
        URLFilterConfig(blocked_words=["free-porn"])
