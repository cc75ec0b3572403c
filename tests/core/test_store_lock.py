"""A stage's lock on a store (kiln.core.store_lock) against the S3 server on localhost (tests/conftest.py):
records that are not locks are taken over, a holder that was frozen past its expiry and overtaken stops at its
next write, a task carrying its run's token stops once another run holds the lock, and a process that exits
with an error releases what it held."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.core import storage, store_lock
from kiln.core.errors import FatalError
from kiln.core.mirror import mirror_of, push_files
from kiln.core.store_lock import StoreLock, adopt, guard

s3fs = pytest.importorskip("s3fs")


@pytest.fixture
def bucket(s3_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_LOCK_SECONDS", "2")
    name = f"locks-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem().mkdir(name)
    yield name
    store_lock.release_all()
    adopt({})


@pytest.mark.parametrize("garbage", [b'{"format": 1, "stage": "tok', b"[1]", b'{"expires": "soon", "pid": 1}', b""])
def test_a_lock_object_that_is_not_a_lock_record_is_named_and_taken_over(
    bucket: str, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    s3fs.S3FileSystem().pipe(f"{bucket}/runs/r/tokenize.lock", garbage)
    with caplog.at_level(logging.WARNING, logger="kiln.core"):
        lock = StoreLock.take(f"s3://{bucket}/runs/r/tokenize.lock", "tokenize")
    assert f"taking over s3://{bucket}/runs/r/tokenize.lock, it is not a lock record kiln writes" in caplog.text
    assert json.loads(s3fs.S3FileSystem().cat(f"{bucket}/runs/r/tokenize.lock"))["token"] == lock.token


@pytest.mark.parametrize("rival_finished", [False, True])
def test_a_holder_frozen_past_its_expiry_and_overtaken_stops_at_its_next_write(
    bucket: str, rival_finished: bool
) -> None:
    url = f"s3://{bucket}/runs/r/train.lock"
    mine = StoreLock.take(url, "train")
    mine._stop.set()  # frozen: no renewals from here on (as under SIGSTOP)
    folder = mirror_of(f"s3://{bucket}/runs") / "r" / "train.partial"
    folder.mkdir(parents=True)
    (folder / "a.txt").write_text("written while the lock was ours")
    push_files(folder, [folder / "a.txt"])
    time.sleep(2.2)
    rival = StoreLock(url, "train")  # another machine's run: the lock has expired, it takes it over
    rival.acquire()
    rival._stop.set()
    if rival_finished:  # and released it: the lock object is gone when the frozen run wakes up
        rival.release()
    (folder / "b.txt").write_text("written after the lock was lost")
    with pytest.raises(FatalError, match=rf"train: the lock {url} was lost while the stage ran"):
        push_files(folder, [folder / "b.txt"])
    assert not s3fs.S3FileSystem().exists(f"{bucket}/runs/r/train.partial/b.txt")
    assert mine.lost
    mine.release()  # leaves the rival's lock in place, or none
    if rival_finished:
        assert not s3fs.S3FileSystem().exists(f"{bucket}/runs/r/train.lock")
    else:
        assert json.loads(s3fs.S3FileSystem().cat(f"{bucket}/runs/r/train.lock"))["token"] == rival.token


def test_a_task_with_its_runs_token_stops_writing_once_another_run_holds_the_lock(bucket: str) -> None:
    url = f"s3://{bucket}/runs/r/curate.lock"
    s3fs.S3FileSystem().pipe(
        url.removeprefix("s3://"), json.dumps({"expires": time.time() + 60, "token": "t1"}).encode()
    )
    adopt({url: "t1"})  # a task of the run holding it: writes go through
    guard(f"s3://{bucket}/runs/r/curate.partial/work/read/00000.done")
    guard(f"s3://{bucket}/runs/r/curate-other/x")  # another stage's prefix: not this lock's business
    s3fs.S3FileSystem().pipe(
        url.removeprefix("s3://"),
        json.dumps({"expires": time.time() + 60, "token": "t2", "pid": 7, "host": "n2"}).encode(),
    )
    with pytest.raises(FatalError, match=rf"no longer holds {url} \(pid 7 on n2 holds it now\); this task stops"):
        guard(f"s3://{bucket}/runs/r/curate.partial/work/read/00001.done")


def test_a_process_that_exits_with_an_error_after_taking_the_lock_releases_it(bucket: str) -> None:
    url = f"s3://{bucket}/runs/r/tokenize.lock"
    code = f"from kiln.core.store_lock import StoreLock; StoreLock.take({url!r}, 'tokenize'); raise SystemExit(2)"
    done = subprocess.run([sys.executable, "-c", code], env=os.environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert not s3fs.S3FileSystem().exists(url.removeprefix("s3://"))


def test_an_upload_in_flight_when_its_holder_froze_and_was_overtaken_is_taken_back(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{bucket}/runs/r/curate.lock"
    mine = StoreLock.take(url, "curate")
    mine._stop.set()  # frozen: no renewals from here on (as under SIGSTOP)
    folder = mirror_of(f"s3://{bucket}/runs") / "r" / "curate.partial"
    folder.mkdir(parents=True)
    (folder / "renames.json").write_text("{}")
    sent = storage.put_file

    def frozen_mid_request(local: str, dst: str) -> None:
        sent(local, dst)  # the request reaches the store, but its process was stopped before it returned,
        time.sleep(2.2)  # past the lock's expiry, while another machine's run took the stage over and finished
        rival = StoreLock(url, "curate")
        rival.acquire()
        rival._stop.set()
        rival.release()

    monkeypatch.setattr(storage, "put_file", frozen_mid_request)
    with pytest.raises(FatalError, match=rf"curate: the lock {url} was lost while the stage ran"):
        push_files(folder, [folder / "renames.json"])
    assert not s3fs.S3FileSystem().exists(f"{bucket}/runs/r/curate.partial/renames.json")  # taken back
    mine.release()
