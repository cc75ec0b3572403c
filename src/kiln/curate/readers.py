"""Finding and loading raw input: the built-in corpus and plain text files.

Planning (`plan_inputs`) only lists files and sizes, in the main process; loading
(`load_unit`) happens inside shard tasks. The built-in corpus is text every machine with
Python has: the standard library's .py files (code), the docs text in `pydoc_data.topics`
(prose), and READMEs, changelogs and licenses under /usr/share/doc (docs). A missing
source is skipped with a note. Not handled yet: JSONL, Parquet, WARC and HTML (later readers).
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import itertools
import logging
import os
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import xxhash

from kiln.core.errors import DocumentError
from kiln.curate.config import InputConfig

log = logging.getLogger("kiln.curate")

# Names (lowercase, .gz stripped) of the /usr/share/doc files worth reading as prose.
DOC_NAME_PATTERNS = ("readme*", "changelog*", "changes*", "news*", "history*", "copyright", "license*", "copying*", "authors*", "*.txt", "*.md", "*.rst")


CAP_SEED = 0x6B696C6E  # "kiln"; any seed but split's 0 works


@dataclass(frozen=True)
class InputUnit:
    """One future document: where it is and how to load it. `key` picks a topic inside a file."""

    source: str
    doc_id: str
    path: str
    size: int  # bytes on disk (compressed size for .gz); what the input cap counts
    key: str | None = None


def list_units(cfg: InputConfig) -> list[InputUnit]:
    """All candidate documents of one input, or [] with a logged note when it is absent."""
    if cfg.reader == "stdlib_code":
        root = Path(sysconfig.get_paths()["stdlib"])
        files = [p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file()]
        return [InputUnit(cfg.source, f"{cfg.source}/{p.relative_to(root).as_posix()}", str(p), p.stat().st_size) for p in files]
    if cfg.reader == "pydoc_topics":
        try:
            import pydoc_data.topics as topics_module
        except ImportError:
            log.warning("input %s: pydoc_data is not shipped with this Python; skipped", cfg.source)
            return []
        path = topics_module.__file__
        return [InputUnit(cfg.source, f"{cfg.source}/{name}", path, len(text.encode("utf-8")), key=name) for name, text in topics_module.topics.items()]
    if cfg.reader == "usr_share_doc":
        root = Path(cfg.path or "/usr/share/doc")
        if not root.is_dir():
            log.warning("input %s: %s does not exist on this machine; skipped", cfg.source, root)
            return []
        units = []
        for dirpath, _, names in os.walk(root):
            for name in names:
                plain = name.lower().removesuffix(".gz")
                if any(fnmatch.fnmatch(plain, pat) for pat in DOC_NAME_PATTERNS):
                    p = Path(dirpath) / name
                    if p.is_file():
                        units.append(InputUnit(cfg.source, f"{cfg.source}/{p.relative_to(root).as_posix()}", str(p), p.stat().st_size))
        return units
    assert cfg.reader == "text_files" and cfg.path
    files = sorted(Path(p) for p in glob.glob(cfg.path, recursive=True) if Path(p).is_file())
    if not files:
        log.warning("input %s: no files match %s; skipped", cfg.source, cfg.path)
    root = glob_root(cfg.path)
    return [InputUnit(cfg.source, f"{cfg.source}/{p.relative_to(root).as_posix()}", str(p), p.stat().st_size) for p in files]


def glob_root(pattern: str) -> Path:
    """The folder before the first wildcard: ids are relative to it, so moving the data keeps them."""
    parts = Path(pattern).parts
    static = list(itertools.takewhile(lambda part: not any(c in part for c in "*?["), parts))
    root = Path(*static) if static else Path()
    return root.parent if len(static) == len(parts) else root  # a plain file path: its folder


def plan_inputs(inputs: tuple[InputConfig, ...], max_total_bytes: int) -> list[InputUnit]:
    """Choose units under the byte cap, shared fairly: a small source leaves its share to the rest.

    Within a source the cap keeps a pseudo-random but fixed subset (ordered by a hash of the
    id), so a small cap still samples the whole source rather than its alphabetical start.
    subtle: the hash is seeded differently from kiln.core.split's; with the same hash the kept
    documents would be exactly those with the smallest split scores, and a capped source would
    send far more than its validation fraction to validation.
    """
    by_source = {cfg.source: sorted(list_units(cfg), key=lambda u: xxhash.xxh3_64_intdigest(u.doc_id.encode(), seed=CAP_SEED)) for cfg in inputs}
    sizes = {s: sum(u.size for u in units) for s, units in by_source.items()}
    budget, shares = max_total_bytes, {}
    for rank, source in enumerate(sorted(sizes, key=lambda s: sizes[s])):  # water-filling, smallest first
        shares[source] = min(sizes[source], budget // (len(sizes) - rank))
        budget -= shares[source]
    chosen = []
    for source, units in by_source.items():
        used = 0
        for unit in units:
            if used + unit.size > shares[source]:
                continue
            chosen.append(unit)
            used += unit.size
    return sorted(chosen, key=lambda u: (u.source, u.doc_id))


def load_unit(unit: InputUnit, max_bytes: int) -> tuple[str, bool]:
    """The unit's text and whether invalid UTF-8 had to be replaced. Raises DocumentError."""
    if unit.key is not None:
        import pydoc_data.topics as topics_module

        return topics_module.topics[unit.key], False
    try:
        opener = gzip.open if unit.path.endswith(".gz") else open
        with opener(unit.path, "rb") as f:
            data = f.read(max_bytes + 1)  # never load more than the cap, whatever the file's size
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: a .gz with damaged compressed data
        raise DocumentError(f"read:io_error: {unit.path}: {e}") from None
    if len(data) > max_bytes:
        raise DocumentError(f"read:too_large: {unit.path} is over {max_bytes} bytes (curate.max_file_mb)")
    if b"\x00" in data:
        raise DocumentError(f"read:binary: {unit.path} contains NUL bytes; not text")
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), True
