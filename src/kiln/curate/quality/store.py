"""The quality models' file format: one .npz of named arrays, led by the model's format and the
version of the word hashing it was trained with (kiln.text.shingles).

Saves are atomic and repeatable (identical arrays give identical bytes: np.savez would stamp each
entry with the current time); loads read every array eagerly, so a truncated or corrupt file
fails here, as one FatalError naming the file and the command that retrains it, never later in
a worker. Not handled here: what the arrays mean (kiln.curate.quality.ngram, kiln.curate.quality.classifier).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from kiln.core.atomic import write_atomically
from kiln.core.errors import FatalError
from kiln.text.shingles import SHINGLE_VERSION


class ModelArrays(dict[str, np.ndarray]):
    """A loaded model's arrays; a missing one, or `corrupt(..)`, is a FatalError naming the file."""

    def __init__(self, path: Path, fix: str, arrays: dict[str, np.ndarray]):
        super().__init__(arrays)
        self.path, self.fix = path, fix

    def __missing__(self, name: str) -> np.ndarray:
        raise self.corrupt(f"has no array {name!r}")

    def scalar(self, name: str, kind: type[int] | type[float] | type[bool]) -> int | float | bool:
        try:
            return kind(self[name].item())
        except (TypeError, ValueError):
            raise self.corrupt(
                f"holds {self[name].dtype}{list(self[name].shape)} as {name!r}, not one {kind.__name__}"
            ) from None

    def corrupt(self, what: str) -> FatalError:
        return FatalError(f"quality: {self.path} {what}; the file is corrupt; {self.fix}")


def save_arrays(path: Path, fmt: str, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` after `format` and `shingles` entries: stored (uncompressed) .npy entries with
    a fixed date, which np.load reads as an .npz."""
    entries = {"format": np.array(fmt), "shingles": np.array(SHINGLE_VERSION), **arrays}

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, array in entries.items():
                info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
                with zf.open(info, "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)

    write_atomically(Path(path), write)


def load_arrays(path: Path, fmt: str, what: str, fix: str) -> ModelArrays:
    """Every array of a file `save_arrays` wrote with format `fmt`. FatalError (naming `what`, e.g.
    "n-gram model", and `fix`) when the file is missing, not an .npz, of another format or word
    hashing, truncated or corrupt."""
    path = Path(path)
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):  # a lone .npy array
            raise FatalError(f"quality: {path} holds one numpy array, not a {what}; {fix}")
        with data:
            found = str(data["format"]) if "format" in data.files else None
            shingles = str(data["shingles"]) if "shingles" in data.files else None
            if found != fmt or shingles != SHINGLE_VERSION:
                raise FatalError(
                    f"quality: {path} is {found!r} with word hashes {shingles!r}; this kiln reads {fmt!r} with "
                    f"{SHINGLE_VERSION!r}; {fix}"
                )
            arrays = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise FatalError(f"quality: no {what} at {path}; {fix}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        # np.load raises ValueError/OSError for a file that is not .npy/.npz (or an empty one),
        # BadZipFile or EOFError for a truncated or corrupted one (a bad CRC).
        raise FatalError(
            f"quality: {path} is not a readable {what} (corrupt, truncated or foreign: {type(e).__name__}: {e}); {fix}"
        ) from None
    return ModelArrays(path, fix, arrays)
