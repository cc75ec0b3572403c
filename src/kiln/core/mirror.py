"""A run whose location is on an object store, worked on through a local mirror of it.

`runs_dir` may be a URL (`--set runs_dir=s3://bucket/runs`). kiln then works in a local folder
standing for it, `<cache>/stores/<hash of the URL>/` ($KILN_CACHE, else ~/.cache/kiln), marked
with the URL: stages read and write local files there as in a local run (token shards stay
memory-mapped, writes stay atomic renames), and the store holds the truth:
- a stage's manifest is read fresh from the store, and the outputs a later stage reads are
  downloaded into the mirror when missing or different, each checked against the sha256 its
  manifest recorded (so the mirror holds what this machine read, nothing more);
- a finished stage is published: its old manifest removed first (the stage reads as unfinished
  from then on), its files uploaded (an output whose recorded sha256 is unchanged is not sent
  again), the objects the old manifest listed and the new one does not removed (kiln wrote them;
  nothing else is ever deleted), its manifest put last. A reader that finds a manifest finds
  every file it lists;
- every write under a stage goes through kiln.core.store_lock.guard: a run that lost the stage's lock
  (kiln.core.store_lock.StoreLock) stops writing;
- `pull`, `push_files`, `place`/`local_path`: what tasks on other machines use to fetch the files
  they read and store the files they wrote (kiln.curate.jobs, kiln.tokenize.encode,
  kiln.train.resume);
- the fetched outputs stay within KILN_CACHE_GB, least recently used evicted first.
Not handled here: the objects themselves (kiln.core.storage).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kiln.core import storage
from kiln.core.atomic import write_atomically
from kiln.core.errors import FatalError
from kiln.core.layout import MANIFEST as MANIFEST_NAME
from kiln.core.layout import SUMMARY as SUMMARY_NAME
from kiln.core.store_lock import guard, guard_held

MARKER = ".kiln-store.json"  # in a mirror's root: {"url": the store location it stands for}
VERIFIED = ".kiln-verified"  # in a mirror's root: one file per checked download, so a file is hashed once
CACHE_GB = 100.0  # the fetched outputs a machine keeps (KILN_CACHE_GB overrides): beyond it, the least recently used go
STARTED = time.time()  # files this process fetched or used are never evicted by it
log = logging.getLogger("kiln.core")


def cache_root() -> Path:
    return Path(os.environ.get("KILN_CACHE") or Path.home() / ".cache" / "kiln")


def cache_limit() -> float:
    """KILN_CACHE_GB in bytes (CACHE_GB when unset); a FatalError naming it when it is not a positive number."""
    said = os.environ.get("KILN_CACHE_GB")
    try:
        limit = float(said) if said else CACHE_GB
    except ValueError:
        limit = -1.0
    if not limit > 0:
        raise FatalError(f"KILN_CACHE_GB={said!r}: not a positive number of gigabytes; set it as e.g. 50, or unset it")
    return limit * 1e9


def check_cache() -> Path:
    """The cache folder, made if missing: a FatalError naming KILN_CACHE, this machine and the fix when it is a
    file or cannot be written (checked before a run on a store starts, and on every machine that runs its tasks)."""
    root = cache_root()
    cache_limit()
    try:
        (root / "stores").mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise FatalError(
            f"KILN_CACHE={root} on {socket.gethostname()}: cannot keep kiln's copies of store objects there "
            f"({e.strerror}); point KILN_CACHE at a writable folder with room for the shards a run reads"
        ) from None
    return root


def mirror_of(url: str) -> Path:
    """The local folder standing for the store location `url` (made, and marked, on first use). Its name
    is a hash of the URL and, for S3, the endpoint it is reached at: one bucket name on two servers (a
    local MinIO and AWS, an old test server and a new one) gets two mirrors."""
    url = url.rstrip("/")
    key_path(Path("/"), url.partition("://")[2], url)  # s3://bucket/../x: refused, not folded into another prefix
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "") if url.startswith("s3://") else ""
    name = hashlib.sha256(f"{endpoint} {url}".strip().encode()).hexdigest()[:16]
    root = cache_root() / "stores" / name
    cache_limit()
    if not (root / MARKER).is_file():
        check_cache()
        root.mkdir(parents=True, exist_ok=True)
        write_atomically(root / MARKER, lambda p: p.write_text(json.dumps({"url": url, "endpoint": endpoint}) + "\n"))
        _marked.cache_clear()
    return root


@functools.cache
def _marked(folder: Path) -> str | None:
    marker = folder / MARKER
    return json.loads(marker.read_text())["url"] if marker.is_file() else None


def _root(path: Path | str) -> tuple[Path, str] | None:
    """(the mirror folder holding `path`, the store URL it stands for), or None outside any mirror."""
    path = Path(os.path.abspath(path))
    for folder in (path, *path.parents):
        if (url := _marked(folder)) is not None:
            return folder, url
    return None


def url_of(path: Path | str) -> str | None:
    """The store URL a path inside a mirror stands for; None for any other path (a local run)."""
    if (found := _root(path)) is None:
        return None
    folder, url = found
    rel = Path(os.path.abspath(path)).relative_to(folder).as_posix()
    return url if rel == "." else f"{url}/{rel}"


def place(path: Path | str) -> tuple[str, str] | None:
    """Where a path of a mirror is, in terms every machine can resolve: (the mirror's URL, the path
    within it); None outside any mirror. `local_path` turns it back into this machine's path."""
    if (found := _root(path)) is None:
        return None
    folder, url = found
    return url, Path(os.path.abspath(path)).relative_to(folder).as_posix()


def local_path(where: tuple[str, str]) -> Path:
    """This machine's path for a place() made on any machine (each keeps its own mirror)."""
    root = mirror_of(where[0])
    return root if where[1] == "." else key_path(root, where[1], where[0])


def key_path(root: Path, key: str, where: str) -> Path:
    """`root / key` for a key that names a file below `root`: an object's key relative to a prefix, or an
    output a manifest records. Every download goes through it: a key with an empty, `.` or `..` component,
    an absolute one or one holding NUL is refused naming `where` (what listed it), since joined unchecked
    it would place a file outside the mirror or the folder that asked for it (anyone who may write to a
    bucket may put such a key there)."""
    parts = key.split("/")
    if not key or any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise FatalError(
            f"{where}: {key!r} has an empty, '.' or '..' part (or starts with '/'), so it would land outside the "
            "folder kiln keeps it in; kiln did not write it: remove that object from the store"
        )
    return root.joinpath(*parts)


def pull(folder: Path, patterns: Iterable[str]) -> dict[str, int]:
    """For a folder of a mirror: download the store's objects below it that match a pattern (a glob
    relative to the folder; its part before the first wildcard narrows the listing) and that the
    mirror lacks or holds at another size. Returns each matching object's path relative to the
    folder with the bytes downloaded for it (0: the mirror had it). Nothing outside a mirror."""
    url = url_of(folder)
    if url is None:
        return {}
    fetched: dict[str, int] = {}
    for pattern in patterns:
        literal = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        under, _, starting = literal.rpartition("/")
        listed = storage.objects(f"{url}/{under}/" if under else f"{url}/", starting)
        for rel, info in sorted(listed.items()):
            rel = f"{under}/{rel}" if under else rel
            if not fnmatch.fnmatchcase(rel, pattern):
                continue
            local = key_path(folder, rel, f"{url}/")
            fetched[rel] = 0
            if not (local.is_file() and local.stat().st_size == info["bytes"]):
                _download(url, folder, rel)
                fetched[rel] = info["bytes"]
    return fetched


def _download(url: str, root: Path, key: str, sha256: str | None = None) -> None:
    """The object `url/key` at `root/key` (key_path checks the key), whole or not at all (a part file named
    for this process: the ranks of one machine may fetch it at once); with `sha256`, a copy of other
    content is refused, naming the object."""
    local = key_path(root, key, f"{url}/")
    local.parent.mkdir(parents=True, exist_ok=True)
    part = local.with_name(f"{local.name}.part-{os.getpid()}")
    got = storage.get_file(f"{url}/{key}", str(part))
    if sha256 is not None and got != sha256:
        part.unlink(missing_ok=True)
        raise FatalError(
            f"{url}/{key}: its content (sha256 {got[:12]}) is not what its stage's manifest recorded ({sha256[:12]}); "
            "it was changed or damaged on the store: rerun the stage that wrote it with --force"
        )
    os.replace(part, local)


def push_files(folder: Path, paths: Iterable[Path]) -> int:
    """Upload these files of a folder of a mirror to the store, in the order given (a completion
    marker last). Returns the bytes uploaded. Nothing outside a mirror."""
    url = url_of(folder)
    if url is None:
        return 0
    sent = 0
    for p in paths:
        put(p, f"{url}/{Path(p).relative_to(folder).as_posix()}")
        sent += Path(p).stat().st_size
    return sent


def put(local: Path, url: str) -> None:
    """Upload a local file to `url`, unless the run lost the lock of the stage it belongs to (guard). A lock
    lost while the upload was in flight (the process frozen mid-request) takes the upload back."""
    guard(url)
    storage.put_file(str(local), url)
    try:
        guard_held(url)
    except FatalError:
        # subtle: the upload landed after another run took the stage over; its object goes again unless that run
        # has written the key since (an S3 ETag is the content's MD5 for an upload in one part)
        try:
            stored = storage.identity(url).get("etag")
        except FatalError:  # gone already (the other run cleared the prefix): nothing to take back
            stored = None
        if stored == storage.md5_file(local):
            storage.remove([url])
        raise


def clear(folder: Path, marker: str) -> None:
    """Remove a folder's objects from the store (a stage's partial prefix, once published or
    abandoned), only when it holds `marker`, the file kiln writes first in every such folder:
    otherwise the prefix is not kiln's and is left alone."""
    url = url_of(folder)
    if url is None:
        return
    found = storage.objects(url + "/")
    if marker in found:
        guard(url + "/")
        storage.remove([f"{url}/{rel}" for rel in sorted(found) if rel != marker] + [f"{url}/{marker}"])


def move(src: Path, dst: Path, manifest_name: str) -> None:
    """For two folders of one mirror: every object under src's prefix moved under dst's (copied within the
    store, then removed, src's manifest first, so src reads as unfinished from the first removal on).
    Nothing for folders outside a mirror."""
    src_url, dst_url = url_of(src), url_of(dst)
    if src_url is None or dst_url is None:
        return
    found = sorted(storage.objects(src_url + "/"))
    guard(src_url + "/")
    for rel in found:
        key_path(dst, rel, f"{src_url}/")
        storage.copy(f"{src_url}/{rel}", f"{dst_url}/{rel}")
    first = [rel for rel in found if rel == manifest_name]
    storage.remove([f"{src_url}/{rel}" for rel in first])
    storage.remove([f"{src_url}/{rel}" for rel in found if rel not in first])


def copy_of(prefix: str) -> Path:
    """A local copy of every object under a store's prefix (a model folder to import), in
    `<cache>/copies/<hash of the URL>/`; an object the copy holds at its size is not fetched again."""
    prefix = prefix.rstrip("/")
    root = check_cache() / "copies" / hashlib.sha256(prefix.encode()).hexdigest()[:16]
    found = storage.objects(prefix + "/")
    if not found:
        storage.check_bucket(prefix)
        raise FatalError(f"{prefix}: no objects under this prefix; check the URL (a folder's files are read from it)")
    for rel, info in sorted(found.items()):
        local = key_path(root, rel, f"{prefix}/")
        if not (local.is_file() and local.stat().st_size == info["bytes"]):
            _download(prefix, root, rel)
    return root


def local_folder(location: str) -> Path:
    """A folder named by a path or by a store's URL (a checkpoint to start from): the path, or a local copy."""
    return copy_of(location) if storage.is_url(location) else Path(location)


def run_path(location: str) -> Path:
    """A run (or a folder of one) named by a path or by a store's URL: the path, or its place in the mirror
    of the URL's parent (whose files kiln fetches as it reads them, checked)."""
    if not storage.is_url(location):
        return Path(location)
    parent, _, name = location.rstrip("/").rpartition("/")
    return mirror_of(parent) / name


def shown(path: Path | str) -> str:
    """How messages name a path: its store URL when it lies in a mirror."""
    return url_of(path) or str(path)


def refresh(path: Path) -> bool:
    """Bring the mirror's copy of one small file (a manifest, a marker) up to the store's: fetched
    when the store has it, removed from the mirror when the store does not. Returns whether it
    exists. For a path outside any mirror: whether the local file exists."""
    url = url_of(path)
    if url is None:
        return path.is_file()
    found = storage.read_bytes(url)
    if found is None:
        path.unlink(missing_ok=True)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda p: p.write_bytes(found[0]))
    return True


def fetch(path: Path, size: int, sha256: str) -> None:
    """Make the mirror's copy of a recorded output the one its manifest describes: kept when it has
    that size and sha256 (checked once per download), else downloaded and checked. A mismatch after
    download names the object: it was changed on the store after its stage wrote it."""
    found = _root(path)
    if found is None:
        return
    root, root_url = found
    seen = _verified(path)
    stat = path.stat() if path.is_file() else None
    if stat is not None and stat.st_size == size:
        if seen.is_file() and seen.read_text().split("\n")[0] == f"{stat.st_size} {stat.st_mtime_ns} {sha256}":
            seen.touch()  # used now: the last to be evicted
            return
        if storage.sha256_file(path) == sha256:
            _remember(path, sha256)
            return
    _download(root_url, root, Path(os.path.abspath(path)).relative_to(root).as_posix(), sha256)
    _remember(path, sha256)
    if time.time() - _checked[0] > 60:  # perf: the records are listed at most once a minute (and after a batch)
        _evict(seen.parent)


_checked = [0.0]  # when _evict last listed the records


def _evict(records: Path) -> None:
    """Keep the fetched files within KILN_CACHE_GB: remove the least recently used ones that no command of
    this process has used (a memory-mapped file removed stays readable to whoever mapped it)."""
    _checked[0] = time.time()
    limit = cache_limit()
    found = []
    for record in records.iterdir():
        size, _, rest = record.read_text().partition(" ")
        found.append((record.stat().st_mtime, int(size), Path(rest.partition("\n")[2]), record))
    total = sum(size for _, size, _, _ in found)
    for used, size, path, record in sorted(found, key=lambda f: f[0]):
        if total <= limit or used >= STARTED:
            break
        path.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        total -= size
    if total > limit:
        log.warning(
            "the mirror %s holds %.1f GB of fetched files this command uses, over KILN_CACHE_GB=%.0f",
            records.parent,
            total / 1e9,
            limit / 1e9,
        )


def fetch_recorded(stage_dir: Path, outputs: Iterable[Mapping[str, Any]]) -> None:
    """fetch() each output (manifest entries: path relative to the stage, bytes, sha256)."""
    outputs = list(outputs)
    for o in outputs:
        fetch(key_path(Path(stage_dir), o["path"], f"{shown(stage_dir)}/{MANIFEST_NAME}"), o["bytes"], o["sha256"])
    if outputs and url_of(stage_dir) is not None and (records := _verified(Path(stage_dir)).parent).is_dir():
        _evict(records)


def _verified(path: Path) -> Path:
    found = _root(path)
    assert found is not None
    return found[0] / VERIFIED / hashlib.sha256(str(url_of(path)).encode()).hexdigest()


def _remember(path: Path, sha256: str) -> None:
    stat = path.stat()
    seen = _verified(path)
    seen.parent.mkdir(exist_ok=True)
    seen.write_text(f"{stat.st_size} {stat.st_mtime_ns} {sha256}\n{path}")


def sync_run(run_dir: Path, suffixes: tuple[str, ...] = (".json", ".jsonl", ".parquet", ".txt")) -> None:
    """For a run on a store, what a reader of its records needs in the mirror: every finished stage's
    manifest and summary, its logs, and its outputs with these suffixes (reports, audit files; not
    shards or weights). Nothing for a local run."""
    url = url_of(run_dir)
    if url is None:
        return
    stages = {key.split("/")[0] for key in storage.objects(url + "/") if key.count("/") >= 1}
    for stage in sorted(stages):
        if "." in stage or not refresh(run_dir / stage / MANIFEST_NAME):
            continue
        manifest = parse_manifest((run_dir / stage / MANIFEST_NAME).read_bytes())
        if manifest is None:  # its reader says so (manifest.read_manifest)
            continue
        wanted = manifest.get("logs", []) + [o for o in manifest["outputs"] if o["path"].endswith(suffixes)]
        refresh(run_dir / stage / SUMMARY_NAME)
        fetch_recorded(run_dir / stage, wanted)


def push(path: Path) -> None:
    """Upload one local file of a mirror (a run's recipe.yaml) to its URL; nothing for a local run."""
    if (url := url_of(path)) is not None:
        put(path, url)


def parse_manifest(data: bytes) -> dict[str, Any] | None:
    """A manifest's content, or None when it is not one kiln writes: not JSON, not an object, or outputs
    (or logs, where there are any) that are not records of a path, a size and a sha256."""
    try:
        found = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(found, dict):
        return None
    fields = {"path": str, "bytes": int, "sha256": str}
    for records in (found.get("outputs"), found.get("logs", [])):
        if not isinstance(records, list) or not all(
            isinstance(o, dict) and all(isinstance(o.get(k), t) for k, t in fields.items()) for o in records
        ):
            return None
    return found


def _listed_by(url: str) -> set[str]:
    """The paths the manifest a stage had on the store before this publish lists (none when there is none,
    or when it is not a manifest kiln writes: then no object beside it is removed, since what it listed is
    unknown)."""
    found = storage.read_bytes(url)
    if found is None:
        return set()
    old = parse_manifest(found[0])
    if old is None:
        log.warning("%s is not a manifest kiln writes; replacing it, and removing none of the objects beside it", url)
        return set()
    return {o["path"] for o in old["outputs"] + old.get("logs", [])}


def publish(final_dir: Path, manifest: Mapping[str, Any], manifest_name: str, partial: Path) -> None:
    """Make a finished stage on the store what its local folder holds (see the module's steps); an
    output this machine does not hold (a task on another machine wrote it) is copied within the store
    from the stage's partial prefix, where that task put it."""
    url = url_of(final_dir)
    if url is None:
        return
    guard(url + "/")
    was = _listed_by(f"{url}/{manifest_name}")
    storage.remove([f"{url}/{manifest_name}"])  # from here on readers see an unfinished stage
    there = storage.objects(url + "/")
    now = {o["path"]: o for o in manifest.get("outputs", []) + manifest.get("logs", [])}
    local = {p.relative_to(final_dir).as_posix(): p for p in final_dir.rglob("*") if p.is_file()}
    local.pop(manifest_name, None)
    # Files other machines stored in a folder this one holds part of (a training state written by ranks on
    # several machines) come along; a folder this machine dropped (curate's work/) does not.
    folders, partial_url = {rel.rpartition("/")[0] for rel in local}, url_of(partial)
    in_partial = storage.objects(f"{partial_url}/")
    elsewhere = [
        rel
        for rel in in_partial
        if rel not in local and rel not in now and "/" in rel and rel.rpartition("/")[0] in folders
    ]
    for rel in sorted(elsewhere):
        key_path(final_dir, rel, f"{partial_url}/")
        storage.copy(f"{partial_url}/{rel}", f"{url}/{rel}")
    for rel in sorted(local.keys() | now.keys()):
        stored = there.get(rel, {}).get("etag")
        # subtle: unchanged only when the stored object is this content, as its ETag says (an S3 ETag is the
        # content's MD5 unless uploaded in parts); a manifest's record alone would keep an object tampered
        # with at the same size, under a fresh manifest (--force would not mend it).
        if stored and stored == (storage.md5_file(local[rel]) if rel in local else in_partial.get(rel, {}).get("etag")):
            continue
        if rel in local:
            put(local[rel], f"{url}/{rel}")
        else:
            storage.copy(f"{partial_url}/{rel}", f"{url}/{rel}")
    storage.remove([f"{url}/{rel}" for rel in sorted(was) if rel not in local and rel not in now and rel in there])
    put(final_dir / manifest_name, f"{url}/{manifest_name}")  # guarded again: the uploads may have taken long
    log.info("%s: published to %s (%d files)", final_dir.name, url, len(local.keys() | now.keys()) + 1)
