"""Writing a file so that it exists whole or not at all: write a temporary sibling, then rename.

A reader (or a resumed run) never sees half a file: `os.replace` is atomic on one filesystem.
`replace_dir` does the same for a whole folder (a checkpoint, a model's weights).
Not handled here: durability across power loss (no fsync), streaming writers (kiln.core.docshards
has its own, on the same principle).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` on a temporary path beside `path`, then rename it to `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def save_npy(path: Path, array: np.ndarray) -> None:
    """np.save, atomically."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.save given a path would add ".npy" to the temporary name
            np.save(f, array)

    write_atomically(path, write)


def replace_dir(folder: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` on an empty folder beside `folder`, then swap it in for `folder`.

    A crash while writing leaves the old folder in place; a crash between the two renames leaves
    a complete one under `<folder>.old` or `<folder>.tmp`.
    """
    folder = Path(folder)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        shutil.rmtree(old)
