"""gettext_messages: the machine's translated messages as a parallel corpus, document k one text in every locale."""

from __future__ import annotations

import gettext
import logging
import shutil
from pathlib import Path

import pytest

from kiln.curate.audit import Ledger
from kiln.curate.readers import InputConfig, plan_reads
from kiln.curate.readers.gettext import MESSAGES_PER_DOC, aligned
from kiln.curate.readers.intake import ReadLimits
from kiln.curate.readers.read import read_task

LOCALE = Path("/usr/share/locale")
DOMAINS = ("gtk30.mo", "glib20.mo", "coreutils.mo", "tar.mo")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of a few catalogs of fr and ja (so a package installed meanwhile changes nothing), one damaged."""
    found = [d for d in DOMAINS if all((LOCALE / loc / "LC_MESSAGES" / d).is_file() for loc in ("fr", "ja"))]
    if len(found) < 2:
        pytest.skip("this machine lacks the fr and ja catalogs of " + ", ".join(DOMAINS))
    for loc in ("fr", "ja"):
        folder = tmp_path / loc / "LC_MESSAGES"
        folder.mkdir(parents=True)
        for domain in found:
            shutil.copy(LOCALE / loc / "LC_MESSAGES" / domain, folder / domain)
    (tmp_path / "ja" / "LC_MESSAGES" / "broken.mo").write_bytes(b"\xde\x12\x04\x95 not a catalog")
    (tmp_path / "fr" / "LC_MESSAGES" / "broken.mo").write_bytes(b"\xde\x12\x04\x95 not a catalog")
    return tmp_path


def read_all(cfg: InputConfig) -> list:
    ledger = Ledger(0)
    return [doc for task in plan_reads((cfg,), None, 1 << 20) for doc in read_task(task, ReadLimits(), ledger)]


def test_document_k_holds_the_same_messages_in_every_locale(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "kiln.curate"):
        docs = read_all(InputConfig(format="gettext_messages", path=str(root), locales=("en", "fr", "ja")))
    assert "broken.mo" in caplog.text  # a damaged catalog costs its own messages, named; never the run
    by = {(d.source, d.meta["parallel_id"]): d for d in docs}
    n_docs = len(aligned(str(root.absolute()), ("en", "fr", "ja"))) // MESSAGES_PER_DOC
    assert n_docs >= 2 and len(docs) == 3 * n_docs
    catalogs: dict[str, dict[str, str]] = {"fr": {}, "ja": {}}  # English (its whitespace folded) -> translation
    for loc in catalogs:
        for mo in sorted((root / loc / "LC_MESSAGES").glob("*.mo")):
            if mo.name != "broken.mo":
                with mo.open("rb") as f:
                    for k, v in gettext.GNUTranslations(f)._catalog.items():
                        if isinstance(k, str):
                            catalogs[loc].setdefault(" ".join(k.split()), " ".join(v.split()))
    for k in range(n_docs):
        english = by[("en", k)].text.splitlines()
        assert len(english) == MESSAGES_PER_DOC and all(len(line.split()) >= 6 for line in english)
        for loc in ("fr", "ja"):
            doc = by[(loc, k)]
            assert doc.meta["locale"] == loc and doc.id == f"{loc}/{k:05d}"
            assert doc.text.splitlines() == [catalogs[loc][e] for e in english]


def test_the_order_is_fixed_and_a_source_name_prefixes_the_locales(root: Path) -> None:
    first = read_all(InputConfig(format="gettext_messages", path=str(root), locales=("en", "ja")))
    again = read_all(InputConfig(format="gettext_messages", source="ui", path=str(root), locales=("en", "ja")))
    assert {d.source for d in again} == {"ui_en", "ui_ja"}
    assert [d.text for d in first] == [d.text for d in again]


def test_locales_sharing_no_message_give_no_document_and_say_so(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "kiln.curate"):
        assert read_all(InputConfig(format="gettext_messages", path=str(root), locales=("en", "xx"))) == []
    assert "fewer than 12 sentences translated into all of en, xx" in caplog.text
