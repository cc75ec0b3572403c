"""The built-in demo corpus: text every machine with Python has, one document per unit.

stdlib_code: the standard library's .py files (code); pydoc_topics: the docs text in
`pydoc_data.topics` (prose); usr_share_doc: READMEs, changelogs and licenses under
/usr/share/doc (docs); gettext_messages: translated messages as a parallel corpus (gettext.py).
`path` points stdlib_code and usr_share_doc at another root (a copy of
them, as the tests take so that a package installed meanwhile changes nothing). Ids are exactly those of the original
reader, so the demo's shards and
its cap sample do not change. A missing source is skipped with a warning. Not handled here:
reading the files (stdlib and /usr/share/doc files are read as text files, see textfile.py).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import sysconfig
from pathlib import Path

from kiln.curate.readers.config import BUILTIN_SOURCES, InputConfig
from kiln.curate.readers.gettext import list_gettext
from kiln.curate.readers.task import ReadUnit

log = logging.getLogger("kiln.curate")

# Names (lowercase, .gz stripped) of the /usr/share/doc files worth reading as prose.
DOC_NAME_PATTERNS = (
    "readme*",
    "changelog*",
    "changes*",
    "news*",
    "history*",
    "copyright",
    "license*",
    "copying*",
    "authors*",
    "*.txt",
    "*.md",
    "*.rst",
)


def list_builtin(cfg: InputConfig) -> list[ReadUnit]:
    """All documents of one built-in input, or [] with a warning when this machine lacks it."""
    if cfg.format == "gettext_messages":
        return list_gettext(cfg)
    source = cfg.source or BUILTIN_SOURCES[cfg.format]
    if cfg.format == "stdlib_code":
        root = Path(cfg.path or sysconfig.get_paths()["stdlib"]).absolute()
        if not root.is_dir():
            log.warning("input %s: %s does not exist on this machine; skipped", source, root)
            return []
        files = [p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file()]
        return [
            ReadUnit(str(p), f"{source}/{p.relative_to(root).as_posix()}", source, "stdlib_code", p.stat().st_size)
            for p in files
        ]
    if cfg.format == "pydoc_topics":
        try:
            import pydoc_data.topics as topics_module
        except ImportError:
            log.warning("input %s: pydoc_data is not shipped with this Python; skipped", source)
            return []
        path = topics_module.__file__
        return [
            ReadUnit(path, f"{source}/{name}", source, "pydoc_topics", len(text.encode("utf-8")), key=name)
            for name, text in topics_module.topics.items()
        ]
    assert cfg.format == "usr_share_doc"
    root = Path(cfg.path or "/usr/share/doc").absolute()  # planned paths are absolute (plan.py)
    if not root.is_dir():
        log.warning("input %s: %s does not exist on this machine; skipped", source, root)
        return []
    units = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            plain = name.lower().removesuffix(".gz")
            if any(fnmatch.fnmatch(plain, pat) for pat in DOC_NAME_PATTERNS):
                p = Path(dirpath) / name
                if p.is_file():
                    units.append(
                        ReadUnit(
                            str(p),
                            f"{source}/{p.relative_to(root).as_posix()}",
                            source,
                            "usr_share_doc",
                            p.stat().st_size,
                        )
                    )
    return units


def topic_text(key: str) -> str:
    import pydoc_data.topics as topics_module

    return topics_module.topics[key]
