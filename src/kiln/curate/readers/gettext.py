"""gettext_messages: a parallel corpus from the translations every Linux machine carries.

The compiled message catalogs under /usr/share/locale/<locale>/LC_MESSAGES/*.mo hold, for each
English message a program shows, its translation into that locale. kiln keeps the messages that
are sentences in English (at least MIN_WORDS words, ending with a full stop) and translated into
every locale the input names, each once, in a fixed pseudo-random order (the xxh64 of the English
text: sibling messages of one program, "the padding at the top/bottom/left/right of the widget",
would otherwise fill a document with one template), and puts MESSAGES_PER_DOC of them in each
document, one per line. Document k holds the same messages in every locale: the corpus is parallel,
so a rule's keep rate, a tokenizer's fertility or a model's bits per byte compare across languages
on the same content. `en` names the English originals. Each document's meta carries
`parallel_id: k` and its `locale`; its path is the catalog its first message came from.
Not handled here: plural forms and message contexts (left out), catalogs in other encodings than
UTF-8 (Python's gettext decodes them; a catalog it cannot read is skipped with a warning).
"""

from __future__ import annotations

import functools
import gettext
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from kiln.core.document import Document
from kiln.curate.readers.config import InputConfig, sanitize_source
from kiln.curate.readers.intake import Intake
from kiln.curate.readers.task import ReadUnit

log = logging.getLogger("kiln.curate")

ENGLISH = "en"  # the locale name of the English originals (msgids)
MIN_WORDS = 6
MESSAGES_PER_DOC = 12
DEFAULT_LOCALES = ("en", "fr", "de", "es", "pt_BR", "it", "ru", "ko", "ja", "zh_CN", "zh_TW", "th")


@dataclass(frozen=True)
class Message:
    english: str
    translations: dict[str, str]  # locale -> text (en: the English itself)
    catalogs: dict[str, str]  # locale -> the .mo file it came from (en: the first locale's)


@functools.cache
def aligned(root: str, locales: tuple[str, ...]) -> tuple[Message, ...]:
    """The messages translated into every one of `locales`, in their fixed order (see the module docstring)."""
    others = [loc for loc in locales if loc != ENGLISH]
    if not others:
        return ()
    base = Path(root)
    domains = sorted(p.name for p in (base / others[0] / "LC_MESSAGES").glob("*.mo"))
    found: dict[str, Message] = {}
    for domain in domains:
        catalogs = {loc: _catalog(base / loc / "LC_MESSAGES" / domain) for loc in others}
        for msgid in catalogs[others[0]]:
            english = " ".join(msgid.split())  # one line: a message wrapped for a terminal is the same sentence
            if english in found or not _is_sentence(english):
                continue
            texts = {loc: catalogs[loc].get(msgid) for loc in others}
            if all(t and t.strip() and t != msgid for t in texts.values()):
                files = {loc: str(base / loc / "LC_MESSAGES" / domain) for loc in others}
                translations = {ENGLISH: english, **{loc: " ".join(t.split()) for loc, t in texts.items()}}
                found[english] = Message(english, translations, {ENGLISH: files[others[0]], **files})
    return tuple(sorted(found.values(), key=lambda m: xxhash.xxh64_intdigest(m.english.encode("utf-8"))))


def _is_sentence(english: object) -> bool:
    return isinstance(english, str) and len(english.split()) >= MIN_WORDS and english.rstrip().endswith(".")


def _catalog(path: Path) -> dict[str, str]:
    """msgid -> msgstr of one compiled catalog; {} when the locale lacks it or it cannot be read."""
    if not path.is_file():
        return {}
    try:
        with path.open("rb") as f:
            return {k: v for k, v in gettext.GNUTranslations(f)._catalog.items() if isinstance(k, str)}
    except Exception as e:  # noqa: BLE001 - a damaged catalog (header, offsets, encoding) costs its messages only
        log.warning("gettext_messages: cannot read %s (%s: %s); skipped", path, type(e).__name__, e)
        return {}


def list_gettext(cfg: InputConfig) -> list[ReadUnit]:
    """One unit per document and locale; [] with a warning when the locales share no message."""
    root = str(Path(cfg.path or "/usr/share/locale").absolute())
    locales = tuple(cfg.locales or DEFAULT_LOCALES)
    messages = aligned(root, locales)
    n_docs = len(messages) // MESSAGES_PER_DOC
    if n_docs == 0:
        log.warning(
            "input gettext_messages: %s holds fewer than %d sentences translated into all of %s; skipped",
            root,
            MESSAGES_PER_DOC,
            ", ".join(locales),
        )
        return []
    units = []
    for locale in locales:
        source = sanitize_source(f"{cfg.source}_{locale}" if cfg.source else locale)
        for k in range(n_docs):
            group = messages[k * MESSAGES_PER_DOC : (k + 1) * MESSAGES_PER_DOC]
            size = sum(len(m.translations[locale].encode("utf-8")) + 1 for m in group)
            path = group[0].catalogs[locale]
            units.append(ReadUnit(path, f"{source}/{k:05d}", source, "gettext_messages", size, key=f"{locale}:{k}"))
    return units


def read_gettext_unit(unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Iterator[Document]:
    assert unit.key is not None
    locale, _, k = unit.key.rpartition(":")
    root = str(Path(cfg.path or "/usr/share/locale").absolute())
    group = aligned(root, tuple(cfg.locales or DEFAULT_LOCALES))[
        int(k) * MESSAGES_PER_DOC : (int(k) + 1) * MESSAGES_PER_DOC
    ]
    text = "\n".join(m.translations[locale] for m in group)
    doc = intake.accept(
        unit.name, text, unit.source, {"path": unit.shown_path, "locale": locale, "parallel_id": int(k)}
    )
    if doc is not None:
        yield doc
