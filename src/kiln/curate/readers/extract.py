"""Main text of an HTML page, without navigation, footers and cookie banners, under a time limit.

Two extractors: resiliparse (`extract_plain_text` with its main-content heuristics; C++) and
trafilatura (Python on lxml; often cleaner on articles). Measured on 2,000 Rust documentation
pages (46 KB of HTML each, one core): resiliparse 1.6 ms a page, trafilatura 17 ms. Both keep
paragraph breaks, which the line-based filters downstream rely on, and drop comment sections.

The time limit is a hang guard, not a speed rule: `PageExtractor` runs the extractor in a helper
process (extract_helper.py, started on a task's first page and reused for its other pages), and
a page whose text has not come back within the limit gets the process killed (the next page
starts a new one) and is quarantined as `extract:timeout`. Signals cannot do this: a SIGALRM
handler never runs while resiliparse or lxml is inside C code. Only a page that had to be killed
is a timeout; there is no after-the-fact check, so a slow page that finishes is kept and what is
kept depends on the machine's load only for a page within the limit of hanging (keep the limit
far above the milliseconds a page takes). The extractor is imported and run once on a tiny page
before any page is timed. A helper that crashes (a bug in C code) quarantines its page as
`extract:error` and is restarted. Cost, measured on the 2,000-page crawl above (2 cores, best of
3): resiliparse 573-599 pages/s through the helper against 586-619 in-process, trafilatura 64
against 65 (the code before the helper: 604 and 63). Not handled here: deciding what to do with
the text (page.py); Windows (the pipes are watched with select); a helper hung in C code
outliving a parent killed with SIGKILL.
"""

from __future__ import annotations

import importlib
import os
import select
import struct
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, BinaryIO

from kiln.curate.readers.config import Extractor

# Which function each extractor name runs, as `module:function` (the helper imports it). Tests
# point a name at a deliberately slow or crashing function; nothing else should change this.
EXTRACTORS: dict[str, str] = {
    "resiliparse": "kiln.curate.readers.extract:resiliparse_text",
    "trafilatura": "kiln.curate.readers.extract:trafilatura_text",
}
# Pages sent ahead of the one whose text is awaited: the helper extracts page k while this
# process parses page k+1. perf: with none (one round trip at a time) the 2,000-page crawl ran at
# 522-552 pages/s against 633-638 in-process (0.25 ms a page waiting on the pipe); with one, the
# round trip overlaps the next page's parsing and the gap is within noise (module docstring).
IN_FLIGHT_PAGES = 1
START_TIMEOUT_S = 120.0  # starting the helper (interpreter, imports, warm-up page); not a page's time
REQUEST = struct.Struct("<Q")  # request frame: UTF-8 byte count, then the HTML
REPLY = struct.Struct("<BQ")  # reply frame: status (0 text, 1 error, 2 ready), byte count, then UTF-8


class ExtractTimeout(Exception):
    """The page did not come back within the time limit; the helper process was killed."""


class ExtractFailed(Exception):
    """The extractor raised on the page, its process died, or it could not be started."""


def resiliparse_text(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, preserve_formatting=True, main_content=True, comments=False)


def trafilatura_text(html: str) -> str:
    import trafilatura

    # fast: skip the backup extractors (readability, justext) trafilatura runs when its
    # main pass finds little; 17 instead of 24 ms a page on the pages measured above.
    return trafilatura.extract(html, include_comments=False, fast=True) or ""


def load_extractor(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def extract_main_text(html: str, extractor: Extractor) -> str:
    """The page's main text ("" when it has none), in this process and without a time limit."""
    return load_extractor(EXTRACTORS[extractor])(html)


@dataclass
class _InFlight:
    payload: bytes
    tag: Any
    sent_at: float


class PageExtractor:
    """One extractor in a helper process, for the pages of one read task (see the module docstring).

    Pipelined: `submit` sends a page and returns the outcomes of earlier pages once more than
    IN_FLIGHT_PAGES are out, oldest first, as (tag, text or exception); `flush` waits for all.
    The exception is ExtractTimeout or ExtractFailed. Which outcomes a call returns depends only
    on the order of calls, never on timing, so the ledger's order is reproducible.
    """

    def __init__(self, extractor: Extractor, timeout_s: float):
        self.extractor, self.timeout_s = extractor, timeout_s
        self.proc: subprocess.Popen | None = None
        self.outbox: deque[memoryview] = deque()  # request bytes not yet taken by the pipe
        self.in_flight: deque[_InFlight] = deque()
        self.last_reply_at = 0.0
        self.last_exit: int | None = None
        self.broken: str | None = None  # why the helper cannot start; every later page gets it

    def submit(self, html: str, tag: Any) -> list[tuple[Any, str | Exception]]:
        self.in_flight.append(_InFlight(html.encode("utf-8", "surrogatepass"), tag, 0.0))
        if self.proc is None and self.broken is None:
            self._start()
        if self.proc is not None:
            self._send(self.in_flight[-1])
        done = []
        while len(self.in_flight) > IN_FLIGHT_PAGES:
            done.append(self._collect())
        return done

    def flush(self) -> list[tuple[Any, str | Exception]]:
        return [self._collect() for _ in range(len(self.in_flight))]

    def close(self) -> None:
        abandoned = bool(self.in_flight)  # the caller stopped early: no page's text is wanted
        self.in_flight.clear()
        self.outbox.clear()
        if self.proc is None:
            return
        if abandoned:
            self._kill()
            return
        proc, self.proc = self.proc, None
        try:
            proc.stdin.close()  # the helper exits at the end of its input
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            proc.stdout.close()

    def __enter__(self) -> PageExtractor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, page: _InFlight) -> None:
        page.sent_at = time.monotonic()
        self.outbox.extend((memoryview(REQUEST.pack(len(page.payload))), memoryview(page.payload)))
        self._write_some()

    def _write_some(self) -> None:
        """Write what the pipe takes now; never blocks (a helper stuck in C code reads nothing)."""
        assert self.proc is not None and self.proc.stdin is not None
        while self.outbox:
            try:
                n = os.write(self.proc.stdin.fileno(), self.outbox[0][: 1 << 20])
            except BlockingIOError:
                return
            except OSError:  # BrokenPipeError: it died; _reply sees the end of its output
                self.outbox.clear()
                return
            self.outbox[0] = self.outbox[0][n:]
            if not self.outbox[0]:
                self.outbox.popleft()

    def _collect(self) -> tuple[Any, str | Exception]:
        """The oldest page's outcome; restarts the helper (re-sending the pages behind it) when it had to die."""
        head = self.in_flight[0]
        if self.proc is None:  # the helper could not be started
            self.in_flight.popleft()
            return head.tag, ExtractFailed(self.broken or "no extractor process")
        # subtle: the helper works FIFO, so it started this page no earlier than it was sent and
        # no earlier than the previous reply arrived: the deadline never cuts a page short.
        deadline = max(head.sent_at, self.last_reply_at) + self.timeout_s
        try:
            status, data = self._reply(max(deadline - time.monotonic(), 0.0))
        except ExtractFailed as e:  # it died on this page (a crash in C code, the OOM killer)
            status, data, outcome = None, b"", e
        else:
            outcome = None
        if status is None:
            if outcome is None:
                self._kill()
                outcome = ExtractTimeout(f"no text after {self.timeout_s:g} s; the extractor process was killed")
            self.in_flight.popleft()
            if self.in_flight:
                self._start()
                if self.proc is not None:
                    for page in self.in_flight:
                        self._send(page)
            return head.tag, outcome
        self.in_flight.popleft()
        self.last_reply_at = time.monotonic()
        if status == 1:
            return head.tag, ExtractFailed(data.decode("utf-8", "replace"))
        return head.tag, data.decode("utf-8", "surrogatepass")

    def _start(self) -> None:
        env = dict(os.environ)
        # The helper imports the extractor by module path, as a spawned multiprocessing child
        # would: it gets this process's sys.path (a test's module, a Ray worker's packages).
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kiln.curate.readers.extract_helper", EXTRACTORS[self.extractor]],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                env=env,
            )
            os.set_blocking(self.proc.stdin.fileno(), False)
        except OSError as e:  # EMFILE (too many open files), ENOMEM, EAGAIN (process limit)
            # subtle: never raise here: the page is already in in_flight, so an error out of
            # submit would have read_task quarantine the unit while the page is quarantined again
            # when flushed. Marked broken, every page in flight gets ExtractFailed exactly once.
            self._kill()
            self.broken = f"cannot start the {self.extractor} extractor process: {type(e).__name__}: {e}"
            return
        try:
            status, data = self._reply(START_TIMEOUT_S)
        except ExtractFailed as e:
            status, data = 1, str(e).encode()
        if status != 2:
            why = "did not start in time" if status is None else data.decode("utf-8", "replace")
            self._kill()
            self.broken = f"cannot start the {self.extractor} extractor process: {why}"

    def _reply(self, timeout_s: float) -> tuple[int | None, bytes]:
        """(status, payload), or (None, b"") when nothing came back in time. EOF raises ExtractFailed."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:  # feed it the pages behind this one while waiting, so it never idles
            writable = [self.proc.stdin] if self.outbox else []
            ready, can_write, _ = select.select([self.proc.stdout], writable, [], max(deadline - time.monotonic(), 0.0))
            if ready:
                break
            if not can_write:
                return None, b""
            self._write_some()
        # the helper writes a whole reply at once once it has it: the rest follows promptly
        header = _read_exactly(self.proc.stdout, REPLY.size)
        data = None if header is None else _read_exactly(self.proc.stdout, REPLY.unpack(header)[1])
        if data is None:
            self._kill()  # reaps it; the next page starts a new one
            raise ExtractFailed(f"the {self.extractor} extractor process died (exit code {self.last_exit})")
        return REPLY.unpack(header)[0], data

    def _kill(self) -> None:
        self.outbox.clear()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.kill()  # SIGKILL: the one signal a process stuck in C code cannot miss
        self.last_exit = proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:  # a write to a dead process may still sit in the buffer
                pass


def write_all(stream: BinaryIO, data: bytes) -> None:
    """Write every byte to an unbuffered pipe (one write call may take only part of a large one)."""
    view = memoryview(data)
    while view:
        view = view[stream.write(view) :]


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        piece = stream.read(left)
        if not piece:
            return None
        parts.append(piece)
        left -= len(piece)
    return b"".join(parts)
