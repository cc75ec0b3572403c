"""Which files an input names, and the stable names (relative paths, sources) derived from them.

`path` is a glob (`data/**/*.jsonl`), a folder (read recursively; with an explicit format only
files with that format's extensions), or one file. Ids use the path relative to the folder
before the first wildcard, so moving a dataset keeps its ids. Hidden files and folders (names
starting with a dot) are skipped, as glob skips them. Not handled here: inputs in an object
store (URLs; plan.store_units lists them through kiln.core.storage).
"""

from __future__ import annotations

import glob
import itertools
import os
from pathlib import Path

from kiln.curate.readers.config import InputConfig, detect_format, sanitize_source

_WILDCARDS = "*?["


def glob_root(pattern: str) -> Path:
    """The folder before the first wildcard: ids are relative to it, so moving the data keeps them."""
    parts = Path(pattern).parts
    static = list(itertools.takewhile(lambda part: not any(c in part for c in _WILDCARDS), parts))
    root = Path(*static) if static else Path()
    return root.parent if len(static) == len(parts) else root  # a plain file path: its folder


def list_files(cfg: InputConfig) -> tuple[Path, list[Path]]:
    """(root the ids are relative to, the input's files in sorted order); no files: an empty list."""
    assert cfg.path is not None
    pattern = cfg.path
    # An existing path is taken literally before any glob expansion: `a[1].jsonl` as a pattern
    # would match a1.jsonl instead.
    if Path(pattern).is_file():
        return Path(pattern).parent, [Path(pattern)]
    if Path(pattern).is_dir():
        root = Path(pattern)
        found = []
        for dirpath, dirnames, names in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in names:
                # An explicit format on a folder picks its own files out (a dataset folder also
                # holds README.md); `auto` and `text` take every file.
                if not name.startswith(".") and cfg.format in ("auto", "text", detect_format(name)):
                    found.append(Path(dirpath) / name)
        return root, sorted(p for p in found if p.is_file())
    files = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    return glob_root(pattern), files


def file_format(cfg: InputConfig, path: Path) -> str:
    return detect_format(path.name) if cfg.format == "auto" else cfg.format


def folder_source(path: Path) -> str:
    """The source a file gets when neither the input nor the record names one: its folder's name."""
    return sanitize_source(path.absolute().parent.name)
