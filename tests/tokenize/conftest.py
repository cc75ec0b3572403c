"""Small curated runs shared by the tokenize stage tests: real text, built once per session."""

from __future__ import annotations

import gettext
import json
import pydoc_data.topics
import shutil
import struct
import sysconfig
from pathlib import Path

import pytest
from basic_curation import ONLY_BASIC_STEPS

from kiln.curate.config import CurateConfig, InputConfig
from kiln.curate.run import run as curate


@pytest.fixture(scope="session")
def curated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~700 KB of real text as files (40 stdlib modules, 50 Python docs topics), curated into <tmp>/run.

    Ids are relative to each glob's folder, so they (and the held-out split) do not depend on
    where pytest puts its temporary folders. Tests copy this run before adding stages to it.
    """
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    (root / "code").mkdir()
    (root / "prose").mkdir()
    for p in [p for p in sorted(stdlib.glob("*.py")) if 2_000 < p.stat().st_size < 20_000][:40]:
        shutil.copy(p, root / "code" / p.name)
    for name in sorted(pydoc_data.topics.topics)[:50]:
        (root / "prose" / f"{name}.txt").write_text(pydoc_data.topics.topics[name], encoding="utf-8")
    cfg = CurateConfig(
        inputs=(
            InputConfig(source="code", format="text", path=str(root / "code" / "*.py")),
            InputConfig(source="prose", format="text", path=str(root / "prose" / "*.txt")),
        ),
        shard_mb=0.1,
        executor={"workers": 1},
        **ONLY_BASIC_STEPS,
    )
    curate(cfg, root / "run")
    return root / "run"


LOCALE_DIR = Path("/usr/share/locale")
# kiln's language code -> the gettext locale of its catalogs. Thai is the small language: its catalogs translate
# about a seventh of the sentences the others do.
LOCALES = {"fr": "fr", "de": "de", "ja": "ja", "zh": "zh_CN", "th": "th"}
REQUIRED = ("fr", "de", "ja", "zh")
PER_DOC = 4  # sentences per document


def catalog(locale: str, domain: str) -> dict[str, str]:
    path = LOCALE_DIR / locale / "LC_MESSAGES" / f"{domain}.mo"
    try:
        with path.open("rb") as f:
            found = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
    except (OSError, UnicodeDecodeError, ValueError, struct.error):  # absent, or a catalog gettext cannot read
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def is_sentence(text: str) -> bool:
    """A plain English sentence: five words or more, capitalised, a full stop, no placeholders or markup."""
    return (
        len(text.split()) >= 5
        and text[0].isupper()
        and text.endswith(".")
        and not any(c in text for c in "%{}<>_\\\n\t")
    )


def parallel_sentences() -> dict[str, dict[str, str]]:
    """English sentence -> {language: its translation} from every catalog of the machine that French has,
    for sentences translated into all of REQUIRED (Thai where it is); the first catalog's translation wins."""
    found: dict[str, dict[str, str]] = {}
    for mo in sorted((LOCALE_DIR / "fr" / "LC_MESSAGES").glob("*.mo")):
        french = catalog("fr", mo.stem)
        english = [e for e in french if e not in found and is_sentence(e)]
        if not english:  # country and language names, commands: the other catalogs need not be read
            continue
        catalogs = {"fr": french} | {lang: catalog(locale, mo.stem) for lang, locale in LOCALES.items() if lang != "fr"}
        for e in english:
            translated = {
                lang: " ".join(c[e].split())
                for lang, c in catalogs.items()
                if c.get(e, "").strip() and c[e] != e and "\n" not in c[e]
            }
            if all(lang in translated for lang in REQUIRED):
                found[e] = {"en": e, **translated}
    return found


@pytest.fixture(scope="session")
def parallel_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gettext catalogs' parallel sentences (about 1,400 in en fr de ja zh, 200 of them in th too; 580 KB),
    curated into <tmp>/run: documents of PER_DOC sentences, one per language, each carrying meta.language and
    the meta.parallel_id its translations share. Skipped where the machine has too few catalogs."""
    sentences = parallel_sentences()
    with_thai = sorted(e for e, t in sentences.items() if "th" in t)
    rest = sorted(e for e, t in sentences.items() if "th" not in t)
    if len(with_thai) < 100 or len(rest) < 500:
        pytest.skip(f"this machine's gettext catalogs give {len(sentences)} parallel sentences, too few")
    root = tmp_path_factory.mktemp("parallel")
    records = []
    for part, english in (("t", with_thai), ("x", rest)):
        for start in range(0, len(english) - PER_DOC + 1, PER_DOC):
            group = english[start : start + PER_DOC]
            for lang in sentences[group[0]]:
                records.append(
                    {
                        "id": f"{lang}/{part}{start // PER_DOC:04d}",
                        "text": "\n".join(sentences[e][lang] for e in group) + "\n",
                        "meta": {"language": lang, "parallel_id": f"{part}{start // PER_DOC:04d}"},
                    }
                )
    (root / "messages.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    cfg = CurateConfig(
        inputs=(InputConfig(source="messages", format="jsonl", path=str(root / "messages.jsonl")),),
        shard_mb=0.1,
        executor={"workers": 1},
        # A group's Chinese is a third of its French in characters: no minimum length, or groups lose languages.
        **{**ONLY_BASIC_STEPS, "length": {"enabled": False}},
    )
    curate(cfg, root / "run")
    return root / "run"
