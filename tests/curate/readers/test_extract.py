"""kiln.curate.readers.extract: main text in a helper process, and what a hung page costs."""

from __future__ import annotations

import time

import pytest

from kiln.curate.readers import InputConfig, ReadLimits
from kiln.curate.readers.extract import EXTRACTORS, PageExtractor, extract_main_text

from . import pathological_extractor
from .helpers import read_inputs

ARTICLE = (
    "<html><body><nav><a href='/'>Home</a></nav><article>"
    + "<p>A long enough paragraph about glazes and kilns for any extractor to keep.</p>" * 3
    + "</article></body></html>"
)
PATHOLOGICAL = f"{pathological_extractor.__name__}:extract"


@pytest.mark.parametrize("extractor", ["resiliparse", "trafilatura"])
def test_extract_main_text(extractor):
    text = extract_main_text(ARTICLE, extractor)
    assert "glazes and kilns" in text and "Home" not in text
    assert extract_main_text("<html><body></body></html>", extractor) == ""


@pytest.mark.parametrize("extractor", ["resiliparse", "trafilatura"])
def test_the_helper_process_gives_the_same_text(extractor):
    pages = [ARTICLE, "<html><body></body></html>", ARTICLE.replace("glazes", "glasuren \u00e9 \u65e5\u672c")]
    with PageExtractor(extractor, 30.0) as extractor_process:
        outcomes = [
            o for i, page in enumerate(pages) for o in extractor_process.submit(page, i)
        ] + extractor_process.flush()
    assert outcomes == [(i, extract_main_text(page, extractor)) for i, page in enumerate(pages)]


def test_a_hung_page_is_killed_and_the_next_pages_still_read(monkeypatch):
    monkeypatch.setitem(EXTRACTORS, "resiliparse", PATHOLOGICAL)
    pages = [
        "<p>hang here</p>",
        ARTICLE,
        "<p>explode here</p>",
        "<p>crash here</p>",
        "<p>dawdle here</p>" + ARTICLE,
        "<p>hang here</p>",
        ARTICLE,
    ]
    start = time.monotonic()
    with PageExtractor("resiliparse", 1.0) as extractor_process:
        outcomes = [
            o for i, page in enumerate(pages) for o in extractor_process.submit(page, i)
        ] + extractor_process.flush()
    assert time.monotonic() - start < 10
    assert [i for i, _ in outcomes] == list(range(len(pages)))  # every page answered, in order
    kinds = [type(o).__name__ if isinstance(o, Exception) else "text" for _, o in outcomes]
    assert kinds == ["ExtractTimeout", "text", "ExtractFailed", "ExtractFailed", "text", "ExtractTimeout", "text"]
    assert str(outcomes[2][1]) == "ValueError: parser exploded"
    assert "process died (exit code -11)" in str(outcomes[3][1])
    assert "glazes and kilns" in outcomes[4][1]  # 0.3 s is slow but under the limit: never a timeout


def test_hung_failing_and_crashing_pages_are_quarantined_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(EXTRACTORS, "resiliparse", PATHOLOGICAL)
    site = tmp_path / "site"
    site.mkdir()
    for name, body in (
        ("a_fast", ARTICLE),
        ("b_hang", "<p>hang here</p>"),
        ("c_after", ARTICLE),
        ("d_broken", "<p>explode here</p>"),
        ("e_crash", "<p>crash here</p>"),
        ("f_last", ARTICLE),
    ):
        (site / f"{name}.html").write_text(body)
    (site / "g_note.txt").write_text("plain text after the pages")
    start = time.monotonic()
    docs, ledger = read_inputs(InputConfig(path=str(site)), limits=ReadLimits(extract_timeout_s=0.5))
    assert time.monotonic() - start < 10
    assert [d.id for d in docs] == [
        "site/a_fast.html",
        "site/c_after.html",
        "site/f_last.html",
        "site/g_note.txt",
    ]  # input order
    assert [(q["id"], q["error"].split(": ")[0]) for q in ledger.quarantined] == [
        ("site/b_hang.html", "extract:timeout"),
        ("site/d_broken.html", "extract:error"),
        ("site/e_crash.html", "extract:error"),
    ]
    assert (
        ledger.quarantined[0]["error"]
        == "extract:timeout: resiliparse: no text after 0.5 s; the extractor process was killed"
    )
    assert ledger.quarantined[1]["error"] == "extract:error: resiliparse: ValueError: parser exploded"


def test_an_extractor_that_cannot_start_quarantines_every_page(tmp_path, monkeypatch):
    monkeypatch.setitem(EXTRACTORS, "resiliparse", "no_such_module_for_kiln:extract")
    site = tmp_path / "site"
    site.mkdir()
    for name in ("a", "b"):
        (site / f"{name}.html").write_text(ARTICLE)
    docs, ledger = read_inputs(InputConfig(path=str(site)))
    assert docs == [] and len(ledger.quarantined) == 2
    assert all(
        "cannot start the resiliparse extractor process: ModuleNotFoundError" in q["error"] for q in ledger.quarantined
    )


def test_a_helper_that_cannot_be_spawned_quarantines_each_page_once(tmp_path, monkeypatch):
    import errno
    import subprocess

    def popen(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(subprocess, "Popen", popen)
    site = tmp_path / "site"
    site.mkdir()
    for name in ("a", "b", "c"):
        (site / f"{name}.html").write_text(ARTICLE)
    docs, ledger = read_inputs(InputConfig(path=str(site)))
    assert docs == [] and [q["id"] for q in ledger.quarantined] == ["site/a.html", "site/b.html", "site/c.html"]
    assert ledger.quarantined[0]["error"] == (
        "extract:error: resiliparse: cannot start the resiliparse extractor process: OSError: [Errno 24] Too many "
        "open files"
    )
    assert ledger.tally("site").docs_in == 3  # each page counted once, never also as its unreadable file
