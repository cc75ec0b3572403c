"""A stage's lock on an object store, and the fence that keeps a run which lost it from writing.

The lock is an object beside the stage, `<stage>.lock`: {host, pid, since, expires, token}. It is
taken by a create-only write (the store decides between two takers), renewed by its holder every
third of its lifetime (`storage.lock_seconds`, 120 s), taken over once past its expiry (its holder
died, froze or lost the store), at once when its holder was a process of this machine that is gone,
and when it is not a lock record at all (garbage, a list, an expiry that is not a number: named in a
warning). It is released on every exit of the process that holds it (atexit), so a run that stops
with an error leaves no lock for others to wait out.

Fencing: a holder frozen past its expiry (SIGSTOP, a paused VM, a long GC) wakes up believing it
still holds the lock, while another run has taken it over and works in the same partial prefix.
So every write kiln makes under a stage's prefixes (`<stage>/`, `<stage>.partial/`, ...) first calls
`guard(url)`: the holder's process checks that its lock was confirmed within half its lifetime,
else confirms it by renewing it on the store (a conditional write over its own version), and stops
with a FatalError when that fails; a task in another process or on another machine carries the
holder's token (`fenced(fn)`, `adopt(tokens)`) and reads the lock before each write, stopping when
the token there is another run's. What this leaves: a single write already under way when its
writer froze (an upload longer than half the lifetime, then a freeze) can still land.
Not handled here: the objects themselves (kiln.core.storage), the local `<stage>.lock` file of a
run on this machine's disk (kiln.core.manifest).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from kiln.core import storage
from kiln.core.errors import FatalError

LOCK_SECONDS = 120.0  # a lock not renewed for this long is stale (KILN_LOCK_SECONDS, storage.lock_seconds)
FENCES: dict[str, str] = {}  # lock URL -> the token of the run this process's tasks work for (adopt())
T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("kiln.core")


def lock_seconds() -> float:
    said = os.environ.get("KILN_LOCK_SECONDS")
    try:
        seconds = float(said) if said else LOCK_SECONDS
    except ValueError:
        seconds = 0.0
    if not seconds >= 1:
        raise FatalError(f"KILN_LOCK_SECONDS={said!r}: not a number of seconds of at least 1; unset it for 120")
    return seconds


def process_alive(pid: Any) -> bool:
    """Whether a process of this machine with that id is running (a lock's holder)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    # A killed process nobody has reaped yet (a zombie) still answers signal 0, but holds nothing.
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def parse_record(data: bytes) -> dict[str, Any] | None:
    """A lock object's record, or None when it is not one kiln writes (not JSON, not an object, an
    expiry that is not a number)."""
    try:
        record = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("expires"), int | float):
        return None
    return record


def covers(lock_url: str, url: str) -> bool:
    """Whether `url` lies under a prefix of the stage that lock guards (`<stage>/`, `<stage>.partial/`, ...)."""
    stage = lock_url.removesuffix(".lock")
    return url.startswith((stage + "/", stage + "."))


class StoreLock:
    """A stage's lock object on the store (see the module's docstring). `take` gives the lock this
    process already holds (an attempt that failed earlier in it) rather than a second one."""

    held: dict[str, StoreLock] = {}  # this process's, by URL

    @classmethod
    def take(cls, url: str, what: str) -> StoreLock:
        if url not in cls.held:
            lock = cls(url, what)
            lock.acquire()
            if not cls.held:  # the first lock this process holds (again): released at its exit, however it exits
                atexit.unregister(release_all)
                atexit.register(release_all)
            cls.held[url] = lock
        return cls.held[url]

    def __init__(self, url: str, what: str):
        self.url, self.what = url, what
        self.token = secrets.token_hex(8)
        self.etag: str | None = None
        self.lost = False
        self.confirmed = 0.0  # time.monotonic() of the last write of the lock that the store accepted
        self._renewing = threading.Lock()  # the renewal thread and guard() never write the lock at once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _mine(self, holder: Mapping[str, Any] | None) -> bool:
        return holder is not None and holder.get("token") == self.token

    def _record(self) -> bytes:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return json.dumps({**me, "expires": time.time() + lock_seconds(), "token": self.token}).encode()

    def acquire(self) -> None:
        while self.etag is None:
            started = time.monotonic()
            try:
                storage.write_bytes(self.url, self._record(), create=True)
            except storage.Conflict:
                found = storage.read_bytes(self.url)
                if found is None:
                    continue  # released between our two requests
                holder = parse_record(found[0])
                if holder is None:
                    why = f"it is not a lock record kiln writes ({found[0][:60]!r})"
                else:
                    dead = holder.get("host") == socket.gethostname() and not process_alive(holder.get("pid"))
                    if holder["expires"] > time.time() and not dead:
                        raise FatalError(
                            f"{self.what}: {self.url} is held by pid {holder.get('pid')} on {holder.get('host')} since "
                            f"{holder.get('since')} (until {time.strftime('%H:%M:%S', time.gmtime(holder['expires']))} "
                            "UTC unless renewed); wait for that run to finish"
                        ) from None
                    state = "no longer running" if dead else "expired"
                    why = f"left by pid {holder.get('pid')} on {holder.get('host')} ({state})"
                log.warning("%s: taking over %s, %s", self.what, self.url, why)
                try:
                    storage.write_bytes(self.url, self._record(), replace=found[1])
                except storage.Conflict:
                    continue  # another run took it over first: look again
            # Its version, for renewing (and a check where writes are unconditional).
            found = storage.read_bytes(self.url)
            if found is not None and self._mine(parse_record(found[0])):
                self.etag, self.confirmed = found[1], started
        self._thread = threading.Thread(target=self._renew_every, daemon=True, name="kiln-store-lock")
        self._thread.start()

    def _renew(self) -> None:
        """Write the lock again over its own version, extending its expiry; a refusal means another run
        took it over: lost, said once, and every guard() stops from then on."""
        with self._renewing:
            if self.lost:
                return
            started = time.monotonic()
            try:
                # subtle: read first: a lock another run took over and then released is gone, and some stores
                # (moto) create the object under a conditional write that names a version of a missing one.
                found = storage.read_bytes(self.url)
                if found is None or found[1] != self.etag:
                    raise storage.Conflict(f"{self.url} is {'gone' if found is None else 'held by another run'}")
                storage.write_bytes(self.url, self._record(), replace=self.etag)
                found = storage.read_bytes(self.url)
                if found is None or not self._mine(parse_record(found[0])):
                    raise storage.Conflict(self.url)
                self.etag, self.confirmed = found[1], started
            except (storage.Conflict, FatalError) as e:
                self.lost = True
                log.error("%s: lost %s (%s); this run stops writing and will not publish", self.what, self.url, e)

    def _renew_every(self) -> None:
        while not self._stop.wait(lock_seconds() / 3):
            self._renew()
            if self.lost:
                return

    def guard(self) -> None:
        """Before a write under the stage: stop unless the lock is still this run's. A confirmation older
        than half the lifetime (the process was frozen, or the store unreachable) is renewed first."""
        if not self.lost and time.monotonic() - self.confirmed > lock_seconds() / 2:
            self._renew()
        if self.lost:
            raise FatalError(
                f"{self.what}: the lock {self.url} was lost while the stage ran (this process was stopped or cut off "
                f"for over {lock_seconds():.0f} s, and another run may have taken it over); this run stopped writing "
                "and published nothing: check for that run, then run again"
            )

    def release(self) -> None:
        if StoreLock.held.get(self.url) is self:
            del StoreLock.held[self.url]
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        found = storage.read_bytes(self.url)
        if found is not None and found[1] == self.etag and not self.lost:
            storage.remove([self.url])
        self.etag = None


def release_all() -> None:
    """Release every lock this process holds (at exit, whatever the exit: an error, an interrupt)."""
    for lock in list(StoreLock.held.values()):
        try:
            lock.release()
        except FatalError as e:  # the store is unreachable: the lock expires on its own
            log.warning("%s: could not release %s (%s); it expires on its own", lock.what, lock.url, e)


def leave_to_expire() -> None:
    """Stop renewing this process's locks and leave them on the store, where they expire on their own: the tasks
    of a run that detached from its Slurm arrays still write under their tokens, and the next run of the stage
    (which first waits for those arrays) takes them over once this process is gone."""
    for lock in list(StoreLock.held.values()):
        lock._stop.set()
    StoreLock.held.clear()


def tokens() -> dict[str, str]:
    """The tokens of the locks this process holds or works under, for the tasks it hands out."""
    return {**FENCES, **{url: lock.token for url, lock in StoreLock.held.items()}}


def adopt(found: Mapping[str, str]) -> None:
    """Work under these locks' tokens (a task's process, a training rank on another machine)."""
    FENCES.clear()
    FENCES.update(found)


def _run_fenced(found: dict[str, str], fn: Callable[[T], R], task: T) -> R:
    adopt(found)
    return fn(task)


def fenced(fn: Callable[[T], R]) -> Callable[[T], R]:
    """`fn` as a task that writes only while the locks this process holds are still its run's, in
    whatever process or machine runs it (the tokens travel with the task)."""
    return functools.partial(_run_fenced, tokens(), fn)


def guard_held(url: str) -> None:
    """After writing `url`: stop when a lock this process holds over it was lost meanwhile (no store read while
    the lock's last confirmation is fresh, so a write costs no extra request)."""
    for lock_url, lock in list(StoreLock.held.items()):
        if covers(lock_url, url):
            lock.guard()


def guard(url: str) -> None:
    """Before writing `url`: stop when a lock guarding it was lost by the run this process works for."""
    for lock_url, token in tokens().items():
        if not covers(lock_url, url):
            continue
        if (lock := StoreLock.held.get(lock_url)) is not None:
            lock.guard()
            continue
        found = storage.read_bytes(lock_url)
        holder = parse_record(found[0]) if found is not None else None
        if holder is None or holder.get("token") != token:
            who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "no run"
            raise FatalError(
                f"{url}: the run this task works for no longer holds {lock_url} ({who} holds it now); "
                "this task stops without writing"
            )
