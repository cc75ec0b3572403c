"""Where data lives: this machine's disk, or an object store reached through fsspec.

A location is a local path or a URL: `s3://` (AWS and S3-compatible stores such as MinIO or Ceph,
reached at AWS_ENDPOINT_URL when set), `gs://`, `az://`/`abfs://`, `hf://datasets/...` and
`https://`. Credentials and endpoints come the way each library takes them (environment
variables such as AWS_ACCESS_KEY_ID, profiles, the library's own config); a URL that carries
credentials itself is refused, so none is ever written into a manifest or a log. This module is
the only place that asks whether a location is local.
What stages get here: the objects a prefix or glob names, with their sizes; an object opened for
streaming reads (range requests: a Parquet reader fetches its footer and the row groups it reads,
never the whole object); an object's identity for a manifest (size and the store's ETag, or its
checksum, in place of a sha256 that would download it; a web server that gives neither is hashed
through); writing: a whole object put from a file or bytes (visible whole or not at all, as a PUT
is), put only if absent or only over a known version (the conditional writes a lock needs), copied
within the store, removed. A failure is one FatalError naming the URL:
a missing bucket or object, refused credentials, an unreachable endpoint, a refused write, a
connection that keeps dropping (a dropped read is retried where it stopped, with backoff).
Not handled here: which objects a run keeps where (kiln.core.mirror).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import io
import os
import time
from collections.abc import Callable
from typing import IO, Any

from pydantic import Field

from kiln.core.config import Section
from kiln.core.errors import FatalError

SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "hf", "http", "https")
READ_ONLY_SCHEMES = ("hf", "http", "https")  # inputs only: kiln never writes there
RETRIES, RETRY_WAIT_S = 4, 0.5  # a dropped read: opened again after 0.5, 1, 2 and 4 s
# This process's traffic per store (scheme): bytes_read, bytes_written, reopened (dropped reads resumed) and,
# for S3, every API call by operation (GetObject, PutObject, ...) and `sends`, its HTTP attempts: the client's
# own retries are sends less calls. Tasks return what they added (traffic_since), which the stage adds up.
TRAFFIC: dict[str, collections.Counter[str]] = {}


def count(scheme: str, key: str, n: int = 1) -> None:
    TRAFFIC.setdefault(scheme, collections.Counter())[key] += n


def traffic_since(before: dict[str, dict[str, int]] | None = None) -> dict[str, dict[str, int]]:
    """This process's traffic per store since the snapshot `before` (a traffic_since() result), or in all."""
    before = before or {}
    return {
        scheme: {k: n - before.get(scheme, {}).get(k, 0) for k, n in sorted(c.items())}
        for scheme, c in sorted(TRAFFIC.items())
    }


def add_traffic(found: dict[str, dict[str, int]]) -> None:
    """Add another process's traffic (a task's, from its result) to this one's."""
    for scheme, counts in found.items():
        for key, n in counts.items():
            count(scheme, key, n)


def task_traffic(before: dict[str, dict[str, int]]) -> dict[str, Any]:
    """What a task returns of its traffic: the counts since `before` and its process id."""
    return {"pid": os.getpid(), "counts": traffic_since(before)}


def merge_task_traffic(found: dict[str, Any] | None) -> None:
    """Add a task's traffic (task_traffic) to this process's, unless the task ran in this process."""
    if found and found["pid"] != os.getpid():
        add_traffic(found["counts"])


def brief_traffic(before: dict[str, dict[str, int]]) -> str:
    """For a progress bar: each store's requests, megabytes and retries since the snapshot `before`."""
    parts = []
    for scheme, c in traffic_since(before).items():
        if not any(c.values()):
            continue
        calls = api_calls(c)
        retries = retried(c, calls)
        parts.append(
            f"{scheme} {sum(calls.values()):,} req {c.get('bytes_read', 0) / 1e6:,.0f}/"
            f"{c.get('bytes_written', 0) / 1e6:,.0f} MB in/out" + (f" {retries:,} retries" if retries else "")
        )
    return ", ".join(parts)


def api_calls(counts: dict[str, int]) -> dict[str, int]:
    """The store's API calls among a store's traffic counts (named by operation: GetObject, PutObject, ...)."""
    return {k: n for k, n in counts.items() if k[0].isupper() and n}


def retried(counts: dict[str, int], calls: dict[str, int]) -> int:
    """HTTP attempts beyond one per call (the client's own retries), and reads reopened after a drop."""
    return max(counts.get("sends", 0) - sum(calls.values()), 0) + counts.get("reopened", 0)


def describe_traffic(found: dict[str, dict[str, int]]) -> list[str]:
    """One line per store: requests by kind, bytes each way, retries."""
    lines = []
    for scheme, c in found.items():
        calls = api_calls(c)
        retries = retried(c, calls)
        kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(calls.items(), key=lambda kv: -kv[1]))
        requests = f"{sum(calls.values()):,} requests ({kinds})" if calls else "requests not counted"
        lines.append(
            f"store {scheme}://: {requests}, {c.get('bytes_read', 0) / 1e6:,.1f} MB read, "
            f"{c.get('bytes_written', 0) / 1e6:,.1f} MB written, {retries:,} retries"
        )
    return lines


class StorageConfig(Section):
    """How to reach object stores, beside what the environment says (never credentials: those come from the
    environment, a profile or the machine's role, and a recipe that names one is refused as an unknown key)."""

    # where and how safely, not what: no result changes
    NOT_HASHED = frozenset({"endpoint_url", "region", "profile", "anonymous", "lock_seconds"})

    endpoint_url: str | None = Field(
        default=None,
        description="S3-compatible store's endpoint (MinIO, Ceph, R2), as AWS_ENDPOINT_URL; None: the environment's.",
    )
    region: str | None = Field(default=None, description="S3 region, as AWS_DEFAULT_REGION; None: the environment's.")
    profile: str | None = Field(
        default=None, description="A named profile of the AWS config files, as AWS_PROFILE; None: the environment's."
    )
    anonymous: bool = Field(default=False, description="Read public S3 buckets without credentials.")
    lock_seconds: float | None = Field(
        default=None,
        ge=1,
        description=(
            "Seconds a stage's lock on a store lives unless renewed (its holder renews it every third of that); a "
            "run stopped or cut off for longer loses the stage to the next run and stops writing; None: "
            "KILN_LOCK_SECONDS, else 120."
        ),
    )


def configure(cfg: StorageConfig) -> None:
    """Apply a recipe's storage section to this process and the processes it starts: the environment
    variables the S3 client reads (a Ray cluster's other nodes take theirs from their own environment)."""
    for var, value in (("AWS_ENDPOINT_URL", cfg.endpoint_url), ("AWS_DEFAULT_REGION", cfg.region)):
        if value:
            os.environ[var] = value
    if cfg.profile:
        os.environ["AWS_PROFILE"] = cfg.profile
    if cfg.anonymous:
        os.environ["KILN_S3_ANONYMOUS"] = "1"
    if cfg.lock_seconds:
        os.environ["KILN_LOCK_SECONDS"] = str(cfg.lock_seconds)
    _filesystem.cache_clear()


def is_url(location: object) -> bool:
    """Whether `location` names an object store (a URL of SCHEMES), not a local path."""
    scheme, sep, _ = str(location).partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def as_location(value: str | os.PathLike[str]) -> Any:
    """A location as given on the command line or in a recipe: a URL stays a string (a Path would fold its
    `//`), anything else becomes a Path."""
    from pathlib import Path

    return str(value) if is_url(value) else Path(value)


def read_text(location: Any) -> str:
    """A small file's or object's whole text (UTF-8): FileNotFoundError or UnicodeDecodeError as a local
    file raises them."""
    if not is_url(location):
        with open(location, encoding="utf-8") as f:
            return f.read()
    found = read_bytes(str(location))
    if found is None:
        raise FileNotFoundError(location)
    return found[0].decode("utf-8")


def sha256_file(path: Any) -> str:
    """The sha256 of a local file's content."""
    return _digest(path, hashlib.sha256())


def md5_file(path: Any) -> str:
    """The MD5 of a local file's content: an S3 object's ETag when it was put whole (not in parts)."""
    return _digest(path, hashlib.md5(usedforsecurity=False))


def _digest(path: Any, h: Any, chunk: int = 1 << 20) -> str:
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def is_file(location: Any) -> bool:
    """Whether the local file, or the store's object, exists."""
    return exists(str(location)) if is_url(location) else os.path.isfile(location)


@functools.cache
def _filesystem(scheme: str) -> Any:
    import fsspec  # only runs that name a store pay for the import

    options = {"anon": True} if scheme == "s3" and os.environ.get("KILN_S3_ANONYMOUS") else {}
    try:
        fs = fsspec.filesystem(scheme, **options)
    except ImportError as e:
        raise FatalError(
            f"{scheme}:// locations need fsspec's {scheme} filesystem ({e}); install it (s3fs, gcsfs, adlfs or "
            "huggingface_hub)"
        ) from None
    if scheme == "s3":  # every API call and HTTP attempt of the client, counted (TRAFFIC)
        fs.connect()
        fs.s3.meta.events.register("before-call.s3", lambda model, **_: count("s3", model.name))
        fs.s3.meta.events.register("before-send.s3", lambda **_: count("s3", "sends"))
    return fs


def filesystem(url: str) -> tuple[Any, str]:
    """(the fsspec filesystem of the URL's scheme, the URL without its scheme)."""
    scheme, _, rest = url.partition("://")
    if "@" in rest.split("/", 1)[0]:
        raise FatalError(f"{url.split('@')[-1]}: a URL with credentials in it; give them through the environment")
    return _filesystem(scheme.lower()), (url if scheme.lower() in ("http", "https") else rest)


def failure(url: str, e: BaseException) -> FatalError:
    """One line naming the URL and what the store said."""
    text = str(e) or type(e).__name__
    if isinstance(e, FileNotFoundError):
        what = "no such bucket or object"
    elif isinstance(e, PermissionError) or "AccessDenied" in text or "InvalidAccessKeyId" in text:
        what = "access refused (check the credentials in the environment or profile)"
    elif "connect" in text.lower() or "Could not connect" in text:
        what = "the store cannot be reached (check AWS_ENDPOINT_URL or the network)"
    else:
        what = "the store failed"
    return FatalError(f"{url}: {what}: {text}")


def listing(pattern: str) -> list[tuple[str, int]]:
    """(URL, size) of every object `pattern` names, sorted: one object, every object under a prefix,
    or a glob (`s3://bucket/cc/2024-10/*.warc.gz`, `**` for any depth). Names starting with a dot
    are left out, as local globs leave them."""
    fs, path = filesystem(pattern)
    scheme = pattern.partition("://")[0]
    try:
        if any(c in path for c in "*?["):
            found = fs.glob(path, detail=True)
        elif fs.isfile(path):
            found = {path: fs.info(path)}
        else:
            found = fs.find(path, detail=True)
        # A glob in a bucket that is not there matches nothing, quietly: say which it is.
        if not found and scheme not in ("http", "https") and not fs.exists(path.split("/", 1)[0]):
            raise FileNotFoundError(f"no bucket {scheme}://{path.split('/', 1)[0]}")
    except Exception as e:  # each library raises its own kinds; the URL and its message say what happened
        raise failure(pattern, e) from None
    return sorted(
        (f"{scheme}://{name}" if scheme not in ("http", "https") else name, int(info.get("size") or 0))
        for name, info in found.items()
        if info.get("type") != "directory" and not any(part.startswith(".") for part in name.split("/"))
    )


def open_read(location: str, buffer_bytes: int = 1 << 20) -> IO[bytes]:
    """The file or object opened for reading: seekable, buffered in `buffer_bytes` (an object is
    fetched in ranges of that size, 8 MB at least: each request costs a round trip)."""
    if not is_url(location):
        return open(location, "rb", buffering=buffer_bytes)  # noqa: SIM115 - the caller closes it
    fs, path = filesystem(location)
    opener = functools.partial(fs.open, path, "rb", block_size=max(buffer_bytes, 8 << 20))
    try:
        # BufferedReader: fsspec's file lacks readline(limit) and peek, which the readers use on local files.
        return io.BufferedReader(Resumable(location, opener), buffer_bytes)
    except Exception as e:
        raise failure(location, e) from None


class Resumable(io.RawIOBase):
    """An object read over a connection that may drop: a failed read opens the object again where it
    stopped, after a wait that doubles from RETRY_WAIT_S; after RETRIES such failures in a row, a
    FatalError naming the object and the offset. A missing object or refused access is not retried."""

    def __init__(self, url: str, opener: Callable[[], Any]):
        self.url, self.opener = url, opener
        self.file, self.pos = opener(), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        for attempt in range(RETRIES + 1):
            try:
                n = self.file.readinto(buffer)
            except (FileNotFoundError, PermissionError) as e:
                raise failure(self.url, e) from None
            except Exception as e:  # a dropped connection, a timeout: each library raises its own kind
                if attempt == RETRIES:
                    raise FatalError(
                        f"{self.url}: the connection failed {RETRIES + 1} times reading at byte {self.pos:,} ({e}); "
                        "check the network or the store, then run again (finished tasks are kept)"
                    ) from None
                time.sleep(RETRY_WAIT_S * 2**attempt)
                count(self.url.partition("://")[0], "reopened")
                self.file.close()
                self.file = self.opener()
                self.file.seek(self.pos)
                continue
            self.pos += n
            count(self.url.partition("://")[0], "bytes_read", n)
            return n
        raise AssertionError("unreachable")

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = self.file.seek(offset, whence)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        self.file.close()
        super().close()


def identity(url: str) -> dict[str, Any]:
    """What a manifest records of an object: its size and the store's own fingerprint (ETag,
    checksum or modification time), read from its metadata without downloading it."""
    fs, path = filesystem(url)
    try:
        info = fs.info(path)
    except Exception as e:
        raise failure(url, e) from None
    tag = next((info[k] for k in ("ETag", "etag", "md5Hash", "content_md5", "sha256", "mtime") if info.get(k)), None)
    if tag is None:  # a server that names no fingerprint (a plain web server): the content's own hash, read through
        digest = hashlib.sha256()
        with open_read(url) as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return {"path": url, "bytes": int(info.get("size") or 0), "sha256": digest.hexdigest()}
    return {"path": url, "bytes": int(info.get("size") or 0), "etag": str(tag).strip('"')}


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    try:
        return bool(fs.exists(path))
    except Exception as e:
        raise failure(url, e) from None


def check_bucket(url: str) -> None:
    """A FatalError naming the bucket when the one `url` lies in does not exist (a missing object reads as
    missing either way: say which it is)."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() in ("http", "https"):
        return
    bucket = f"{scheme}://{rest.split('/', 1)[0]}"
    if not exists(bucket):
        raise FatalError(f"{url}: no bucket {bucket} (or no access to it); check the URL and the store's endpoint")


class Conflict(Exception):
    """A conditional write found the object there (create only) or changed (replace only)."""


def objects(prefix: str, starting: str = "") -> dict[str, dict[str, Any]]:
    """Every object under `prefix` (a URL ending in `/`) whose name relative to it starts with
    `starting`, by that relative name: {"bytes", "etag"}. Read fresh from the store each time
    (another machine may have written since); on S3 `starting` narrows the listing requests."""
    fs, path = filesystem(prefix)
    root = path.rstrip("/") + "/"
    fs.invalidate_cache()
    try:
        if prefix.startswith("s3://"):
            found = fs.find(root, prefix=starting, detail=True)
        else:
            found = fs.find(root, detail=True) if fs.exists(root.rstrip("/")) else {}
    except FileNotFoundError:
        found = {}
    except Exception as e:
        raise failure(prefix, e) from None
    return {
        name[len(root) :]: {"bytes": int(info.get("size") or 0), "etag": str(info.get("ETag") or "").strip('"')}
        for name, info in found.items()
        if name.startswith(root + starting) and info.get("type") != "directory"
    }


def read_bytes(url: str) -> tuple[bytes, str] | None:
    """The object's content and version tag (its ETag), or None when there is no such object."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    try:
        info = fs.info(path)
        data = fs.cat_file(path)
        count(url.partition("://")[0], "bytes_read", len(data))
        return data, str(info.get("ETag") or info.get("etag") or "").strip('"')
    except FileNotFoundError:
        return None
    except Exception as e:
        raise failure(url, e) from None


def write_bytes(url: str, data: bytes, *, create: bool = False, replace: str | None = None) -> None:
    """Put `data` as the object at `url`. `create`: only if no object is there; `replace`: only over
    the version with that ETag. Either condition failing raises Conflict (the store checks it, so two
    writers cannot both win: S3 and S3-compatible stores with conditional writes; others check first)."""
    fs, path = filesystem(url)
    condition = {"IfNoneMatch": "*"} if create else {"IfMatch": f'"{replace}"'} if replace else {}
    try:
        if condition and url.startswith("s3://"):
            fs.pipe_file(path, data, **condition)
        else:
            if create and fs.exists(path):
                raise Conflict(url)
            fs.pipe_file(path, data)
        count(url.partition("://")[0], "bytes_written", len(data))
    except Conflict:
        raise
    except Exception as e:
        said = str(e).lower().replace("-", "")
        if condition and any(k in said for k in ("precondition", "412", "conditionalrequestconflict")):
            raise Conflict(url) from None
        raise write_failure(url, e) from None
    finally:
        fs.invalidate_cache(path)


def put_file(local: str, url: str) -> None:
    """Upload the local file to `url` (multipart for a large one; visible only once complete)."""
    fs, path = filesystem(url)
    try:
        fs.put_file(local, path)
    except Exception as e:
        raise write_failure(url, e) from None
    finally:
        fs.invalidate_cache(path)
    count(url.partition("://")[0], "bytes_written", os.path.getsize(local))


def get_file(url: str, local: str) -> str:
    """Download the object to the local path (its folder must exist), through the retrying reader;
    returns the sha256 of what was written."""
    digest = hashlib.sha256()
    with open_read(url, 8 << 20) as src, open(local, "wb") as dst:
        while block := src.read(8 << 20):
            digest.update(block)
            dst.write(block)
    return digest.hexdigest()


def copy(src: str, dst: str) -> None:
    """Copy an object within one store (the store copies it: nothing passes through this machine)."""
    fs, path = filesystem(src)
    try:
        fs.copy(path, filesystem(dst)[1])
    except Exception as e:
        raise write_failure(dst, e) from None
    finally:
        fs.invalidate_cache()


def remove(urls: list[str]) -> None:
    """Delete these objects (each one kiln wrote: callers name them from a manifest or a task's record)."""
    if not urls:
        return
    fs, _ = filesystem(urls[0])
    try:
        fs.rm([filesystem(u)[1] for u in urls])
    except FileNotFoundError:
        pass
    except Exception as e:
        raise write_failure(urls[0], e) from None
    finally:
        fs.invalidate_cache()


def write_failure(url: str, e: BaseException) -> FatalError:
    """A refused write, said as such (read-only credentials and stores are common)."""
    text = str(e) or type(e).__name__
    if isinstance(e, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return FatalError(f"{url}: the store refused the write ({text}); check that the credentials may write there")
    if url.split("://")[0] in READ_ONLY_SCHEMES:
        return FatalError(
            f"{url}: {url.split('://')[0]}:// locations are read only; write the run to s3://, gs:// or az://"
        )
    return failure(url, e)
