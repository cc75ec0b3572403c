"""The lists the safety steps read: plain list files, category archives in UT1's layout, and the lists kiln ships.

A list file holds one entry per line; `#` starts a comment and blank lines are ignored. A file that is not
UTF-8 text (a binary, a compressed file given by mistake) is refused naming the file and line. A category
archive is the layout of Université Toulouse 1's blacklists (UT1, the lists FineWeb's URL filter builds on):
one folder per category (`adult/`, `gambling/`, `phishing/`, ...) each holding a `domains` file and often a
`urls` file (`host/path` without a scheme), as a folder or a tar archive (`.tar.gz`, `.tgz`, `.tar`), the
category folders at its top or one folder down (`blacklists/adult/domains`). A category the recipe names
and the archive lacks stops the run before any work, naming the categories it has.
kiln ships the LDNOOBW word lists (`lists/bad_words/<code>.txt`, CC-BY-4.0) and its own URL word lists
(`lists/url_*.txt`); `record()` describes any list (name, version, sha256, entries) for the manifest.
An archive is read once a process (cached by path, size and modification time).
Not handled here: matching (kiln.curate.steps.url, kiln.curate.steps.bad_words), fetching lists from the
network (docs/curation.md says where the full lists are).
"""

from __future__ import annotations

import functools
import hashlib
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from kiln.core.errors import ConfigError
from kiln.core.storage import sha256_file

SHIPPED = Path(__file__).with_name("lists")
BAD_WORDS_DIR = SHIPPED / "bad_words"
URL_WORDS, URL_SUBWORDS, URL_SOFT_WORDS = (SHIPPED / f"url_{kind}.txt" for kind in ("words", "subwords", "soft_words"))
# What a stage records for the lists kiln ships; bump it with any change to a file under lists/.
SHIPPED_VERSION = "kiln-lists v1"
LDNOOBW = "LDNOOBW (npm naughty-words 1.2.0, CC-BY-4.0)"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


@dataclass(frozen=True)
class Category:
    """One category of an archive: its domains and its URLs (`host/path`), and where each file was read."""

    name: str
    domains: tuple[str, ...]
    urls: tuple[str, ...]
    domains_at: str
    urls_at: str


def entries_of(text: str, where: str) -> tuple[str, ...]:
    """The entries of a list's text (`where`: its file, for messages); NUL bytes mean it is not text.
    perf: entries alone, no location each (4.6 million domains); `line_of` finds one when a message needs it."""
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise ConfigError(f"{where}:{line}: a NUL byte: this is not a text list; give a file of one entry a line")
    if "#" not in text:
        return tuple(filter(None, map(str.strip, text.splitlines())))
    return tuple(filter(None, (line.partition("#")[0].strip() for line in text.splitlines())))


def line_of(where: str, entry: str) -> str:
    """`where:line` of an entry of a list file or of an archive's member (`archive!member`)."""
    path, _, member = where.partition("!")
    try:
        if member:
            with tarfile.open(path) as tar:
                extracted = tar.extractfile(member)
                data = extracted.read() if extracted is not None else b""
        else:
            data = Path(path).read_bytes()
    except (OSError, tarfile.TarError):
        return where
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        if line.partition("#")[0].strip() == entry:
            return f"{where}:{number}"
    return where


def _decoded(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{where}:{line}: not UTF-8 text (byte {data[e.start]:#04x}); give a text file of one entry a line"
        ) from None


def list_file(path_text: str, key: str) -> Path:
    """The list file a recipe key names; `key` goes into the message when it is missing."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(f"{key}: list file {str(path)!r} does not exist or is not a file; fix the path or remove it")
    return path


def read_list(path_text: str, key: str) -> tuple[str, ...]:
    """A list file's entries (read each time: the steps keep what they build from it, not the entries)."""
    path = list_file(path_text, key)
    return entries_of(_decoded(path.read_bytes(), str(path)), str(path))


def stamp(path: Path) -> tuple[int, float]:
    """A file's size and modification time: what the caches of lists read from it are keyed on."""
    stat = path.stat()
    return stat.st_size, stat.st_mtime


def read_categories(path_text: str, names: tuple[str, ...], key: str) -> list[Category]:
    """The named categories of an archive in UT1's layout (a folder or a tar file), in the order named; the
    others are never read."""
    path = Path(path_text).expanduser()
    if not path.exists():
        raise ConfigError(f"{key}: category archive {str(path)!r} does not exist; fix the path or remove it")
    version = archive_stamp(path)
    found = _category_names(path, version)
    missing = [name for name in names if name not in found]
    if missing:
        raise ConfigError(
            f"{key}: {path} has no categor{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)} (no "
            f"<category>/domains file); it has: {', '.join(sorted(found)) or 'none'}"
        )
    return [_category(path, version, name) for name in names]


def archive_stamp(path: Path) -> tuple[tuple[str, int, float], ...]:
    """What an archive's caches are keyed on: a tar file's size and time, or each list file's of a folder
    (editing a file inside a folder leaves the folder's own time as it was)."""
    files = sorted(path.glob("*/*")) + sorted(path.glob("*/*/*")) if path.is_dir() else [path]
    return tuple((str(f), *stamp(f)) for f in files if f.is_file() and (f == path or f.name in LIST_NAMES))


LIST_NAMES = ("domains", "urls")


@functools.lru_cache(maxsize=8)
def _category_names(path: Path, version: tuple) -> frozenset[str]:
    """The categories of an archive: the folders holding a `domains` file."""
    if path.is_dir():
        return frozenset(Path(f).parent.name for f, *_ in version if Path(f).name == "domains")
    return frozenset(category for category, kind in _members(path) if kind == "domains")


@functools.lru_cache(maxsize=16)
def _category(path: Path, version: tuple, name: str) -> Category:
    files = _archive_files(path, name)
    (data, where), urls = files["domains"], files.get("urls")
    return Category(
        name,
        entries_of(_decoded(data, where), where),
        entries_of(_decoded(urls[0], urls[1]), urls[1]) if urls else (),
        where,
        urls[1] if urls else "",
    )


def _tar(path: Path) -> tarfile.TarFile:
    if not path.name.endswith(ARCHIVE_SUFFIXES):
        raise ConfigError(
            f"{path}: not a folder or a tar archive ({', '.join(ARCHIVE_SUFFIXES)}) of category folders; for a plain "
            "list of domains use url_filter.blocked_domain_files"
        )
    try:
        return tarfile.open(path)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ConfigError(f"{path}: not a readable tar archive ({type(e).__name__}: {e})") from None


def _list_member(member: tarfile.TarInfo) -> tuple[str, str] | None:
    """(category, domains | urls) of a tar member in UT1's layout, or None."""
    parts = Path(member.name).parts
    if member.isfile() and parts and parts[-1] in LIST_NAMES and 2 <= len(parts) <= 3:
        return parts[-2], parts[-1]
    return None


def _members(path: Path) -> list[tuple[str, str]]:
    try:
        with _tar(path) as tar:
            return [found for member in tar if (found := _list_member(member)) is not None]
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ConfigError(f"{path}: not a readable tar archive ({type(e).__name__}: {e})") from None


def _archive_files(path: Path, category: str) -> dict[str, tuple[bytes, str]]:
    """{"domains" | "urls": (contents, where)} of one category of a folder or tar archive in UT1's layout."""
    files: dict[str, tuple[bytes, str]] = {}
    if path.is_dir():
        for file in sorted(path.glob(f"{category}/*")) + sorted(path.glob(f"*/{category}/*")):
            if file.name in LIST_NAMES and file.is_file():
                files.setdefault(file.name, (file.read_bytes(), str(file)))
        return files
    try:
        with _tar(path) as tar:
            for member in tar:
                found = _list_member(member)
                if found is not None and found[0] == category:
                    extracted = tar.extractfile(member)
                    assert extracted is not None  # a regular file
                    files.setdefault(found[1], (extracted.read(), f"{path}!{member.name}"))
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ConfigError(f"{path}: not a readable tar archive ({type(e).__name__}: {e})") from None
    return files


def record(path: Path, name: str, version: str, entries: int, categories: dict[str, int] | None = None) -> dict:
    """What the manifest says of one list: its name, version, file, sha256 and how many entries were used."""
    found = {"name": name, "version": version, "path": str(path), "sha256": sha256_of(path), "entries": entries}
    return {**found, "categories": categories} if categories is not None else found


def archive_version(path: Path) -> str:
    """An archive's version: UT1 publishes by date, so the date of its newest file (UTC)."""
    if path.is_dir():
        newest = max((f.stat().st_mtime for f in path.rglob("*") if f.is_file()), default=path.stat().st_mtime)
    else:
        with tarfile.open(path) as tar:
            newest = max((m.mtime for m in tar.getmembers()), default=path.stat().st_mtime)
    return time.strftime("%Y-%m-%d", time.gmtime(newest))


def sha256_of(path: Path) -> str:
    """A file's sha256, or for a folder the sha256 of its files' relative paths and sha256s, in order."""
    if not path.is_dir():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in sorted(f for f in path.rglob("*") if f.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\x00" + sha256_file(file).encode())
    return digest.hexdigest()
