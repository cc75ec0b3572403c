"""A stage of a run whose location is on an object store (kiln.core.mirror through kiln.core.manifest.Stage),
against the S3 API of a server on localhost (tests/conftest.py): published with its manifest last, read back on
a machine with an empty mirror, checked against its recorded sha256, locked against a second run, and never
deleting an object kiln did not write."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import Field

from kiln.core.config import Section
from kiln.core.errors import FatalError
from kiln.core.manifest import Stage, read_manifest, recorded_outputs
from kiln.core.mirror import mirror_of, url_of

s3fs = pytest.importorskip("s3fs")


class Thing(Section):
    """A stage's settings: how many output files it writes."""

    files: int = Field(default=2, description="output files")


@pytest.fixture
def runs(s3_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket's runs_dir URL; the mirror's cache under tmp_path/cache."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    bucket = f"runs-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem().mkdir(bucket)
    return f"s3://{bucket}/runs"


def make(run_dir: Path, files: int = 2, seed: str = "a", force: bool = False) -> dict:
    """Run stage `thing`: `files` outputs under out/, each 1 kB of text depending on `seed`."""
    stage = Stage(run_dir, "thing", {"thing": Thing(files=files)}, inputs=[])
    if done := stage.up_to_date(force):
        return done
    stage.begin()
    outputs = []
    for i in range(files):
        path = stage.dir / "out" / f"part-{i}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"{seed}{i}" * 500)
        outputs.append(path)
    return stage.finish(outputs, {"files": files}, f"{files} files")


def test_a_stage_is_published_and_read_back_on_a_machine_with_an_empty_mirror(
    runs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = mirror_of(runs) / "r"
    assert url_of(run_dir / "thing" / "out") == f"{runs}/r/thing/out"
    manifest = make(run_dir)
    fs = s3fs.S3FileSystem()
    prefix = runs.removeprefix("s3://") + "/r/thing/"
    assert sorted(p.removeprefix(prefix) for p in fs.find(prefix)) == [
        "manifest.json",
        "out/part-0.txt",
        "out/part-1.txt",
        "summary.txt",
    ]
    assert json.loads(fs.cat(prefix + "manifest.json")) == manifest
    # What the stage asked of the store is counted: its lock, its unfinished attempt's marker, its reads.
    assert manifest["store_traffic"]["s3"]["PutObject"] >= 2 and manifest["store_traffic"]["s3"]["bytes_written"] > 0
    assert "store s3://: " in (run_dir / "thing" / "summary.txt").read_text()
    assert not fs.exists(runs.removeprefix("s3://") + "/r/thing.lock")  # released

    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "other"))  # another machine: nothing local
    other = mirror_of(runs) / "r"
    assert other != run_dir and not (other / "thing").exists()
    assert make(other) == manifest  # up to date from the store's manifest, without its outputs
    assert not (other / "thing" / "out").exists()
    paths = recorded_outputs(other / "thing", "out")  # what a later stage reads: fetched and checked
    assert [p.read_text() for p in paths] == [f"a{i}" * 500 for i in range(2)]


def test_an_object_changed_on_the_store_is_named_and_a_stale_copy_is_fetched_again(
    runs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = mirror_of(runs) / "r"
    make(run_dir)
    fs = s3fs.S3FileSystem()
    key = runs.removeprefix("s3://") + "/r/thing/out/part-1.txt"
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "other"))
    other = mirror_of(runs) / "r"
    # A mirror copy of the right size but other content (an earlier attempt's): replaced by the store's.
    stale = other / "thing" / "out" / "part-0.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("b0" * 500)
    fs.pipe(key, ("c1" * 500).encode())  # the same size, another content
    with pytest.raises(FatalError, match=rf"s3://{key}: its content \(sha256 \w+\) is not what its stage's manifest"):
        recorded_outputs(other / "thing", "out")
    assert stale.read_text() == "a0" * 500 and not (other / "thing" / "out" / "part-1.txt").exists()


def test_a_redone_stage_removes_only_the_objects_its_old_manifest_listed(runs: str) -> None:
    run_dir = mirror_of(runs) / "r"
    make(run_dir, files=3)
    fs = s3fs.S3FileSystem()
    prefix = runs.removeprefix("s3://") + "/r/thing/"
    fs.pipe(prefix + "notes.txt", b"a user's own file")
    manifest = make(run_dir, files=1)  # another config: redone, writing one file
    assert manifest["counts"] == {"files": 1}
    assert sorted(p.removeprefix(prefix) for p in fs.find(prefix)) == [
        "manifest.json",
        "notes.txt",
        "out/part-0.txt",
        "summary.txt",
    ]
    assert read_manifest(run_dir / "thing") == manifest


def test_a_live_lock_on_the_store_stops_a_second_run_and_an_expired_one_is_taken_over(
    runs: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = mirror_of(runs) / "r"
    fs = s3fs.S3FileSystem()
    lock = runs.removeprefix("s3://") + "/r/thing.lock"
    holder = {"host": "node-7", "pid": 4242, "since": "2026-11-28T10:00:00Z"}
    fs.pipe(lock, json.dumps({**holder, "expires": time.time() + 60}).encode())
    with pytest.raises(
        FatalError, match=rf"thing: s3://{lock} is held by pid 4242 on node-7 since 2026-11-28T10:00:00Z"
    ):
        make(run_dir)
    assert not fs.exists(runs.removeprefix("s3://") + "/r/thing/manifest.json")
    fs.pipe(lock, json.dumps({**holder, "expires": time.time() - 1}).encode())
    with caplog.at_level(logging.WARNING, logger="kiln.core"):
        assert make(run_dir)["counts"] == {"files": 2}
    assert f"taking over s3://{lock}, left by pid 4242 on node-7 (expired)" in caplog.text
    assert not fs.exists(lock)


def test_a_missing_bucket_is_named(s3_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FatalError, match=r"s3://no-such-bucket-kiln/runs/r/thing.lock: no such bucket or object"):
        make(mirror_of("s3://no-such-bucket-kiln/runs") / "r")


def test_a_read_only_location_as_runs_dir_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiln.core.errors import ConfigError
    from kiln.recipe import load_recipe

    with pytest.raises(ConfigError, match=r"runs_dir 'https://example.org/runs': https:// locations are read only"):
        load_recipe("demo", ["runs_dir=https://example.org/runs"])
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    assert load_recipe("demo", ["runs_dir=s3://bucket/runs"]).run_dir == mirror_of("s3://bucket/runs") / "demo"
    assert url_of(mirror_of("s3://bucket/runs") / "demo") == "s3://bucket/runs/demo"


def test_fetched_files_are_kept_within_kiln_cache_gb_least_recently_used_first(
    runs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from kiln.core import mirror

    make(mirror_of(runs) / "r", files=3)  # three outputs of 1,000 bytes
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "other"))
    stage = mirror_of(runs) / "r" / "thing"
    paths = recorded_outputs(stage, "out")
    records = mirror.mirror_of(runs) / mirror.VERIFIED
    for i, path in enumerate(paths):  # used in this order: part-0 longest ago
        (records / mirror._verified(path).name).touch()
        time.sleep(0.01 * (i + 1))
    monkeypatch.setenv("KILN_CACHE_GB", "0.0000025")  # 2,500 bytes
    monkeypatch.setattr(mirror, "STARTED", time.time() + 1)  # as a later command sees them
    mirror._evict(records)
    assert [p.exists() for p in paths] == [False, True, True] and len(list(records.iterdir())) == 2
    monkeypatch.setattr(mirror, "STARTED", time.time() - 1)  # this command uses all three: none goes
    with caplog.at_level(logging.WARNING, logger="kiln.core"):
        assert [p.read_text() for p in recorded_outputs(stage, "out")] == [f"a{i}" * 500 for i in range(3)]
    assert all(p.exists() for p in paths) and "over KILN_CACHE_GB=0" in caplog.text


@pytest.fixture
def reader(runs: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The S3 server checking signatures and policies (moto's IAM checks), with a user that may only read;
    yields the bucket of `runs`. The server and the client's cached connections are restored after."""
    import boto3
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    from kiln.core import storage

    iam = boto3.client("iam")
    iam.create_user(UserName="reader")
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:Get*", "s3:List*", "s3:Head*"], "Resource": "*"}],
    }
    iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    before = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count = 0, 0
    storage._filesystem.cache_clear()
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield runs.removeprefix("s3://").split("/")[0]
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = before
        storage._filesystem.cache_clear()
        s3fs.S3FileSystem.clear_instance_cache()


def test_refused_credentials_and_a_refused_write_are_named(
    reader: str, runs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiln.core import storage

    with pytest.raises(
        FatalError, match=rf"s3://{reader}/runs/r/thing.lock: the store refused the write \(Access Denied\)"
    ):
        make(mirror_of(runs) / "r")  # may read (no manifest there yet), may not write its lock
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAKNOWNKEY0000")
    storage._filesystem.cache_clear()
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(FatalError, match=rf"s3://{reader}/runs/: access refused \(check the credentials"):
        storage.listing(f"s3://{reader}/runs/")


def test_the_recipes_storage_section_reaches_a_store_the_environment_does_not_name(
    runs: str, s3_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiln.core import storage
    from kiln.core.errors import ConfigError
    from kiln.recipe import load_recipe

    make(mirror_of(runs) / "r")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    storage.configure(load_recipe("demo", [f"storage.endpoint_url={s3_store}"]).storage)
    try:
        assert "thing/manifest.json" in storage.objects(f"{runs}/r/")
    finally:
        storage._filesystem.cache_clear()
        s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(ConfigError, match=r"storage.aws_secret_access_key"):
        load_recipe("demo", ["storage.aws_secret_access_key=x"])  # credentials never go in a recipe


def test_force_puts_back_an_object_changed_on_the_store_at_its_own_size(runs: str) -> None:
    run_dir = mirror_of(runs) / "r"
    make(run_dir)
    key, fs = runs.removeprefix("s3://") + "/r/thing/out/part-0.txt", s3fs.S3FileSystem()
    fs.pipe(key, b"X" * 1000)  # part-0.txt is "a0" * 500: the same size
    (run_dir / "thing" / "out" / "part-0.txt").unlink()  # this machine's copy gone: read from the store
    with pytest.raises(FatalError, match=r"part-0.txt: its content .* is not what its stage's manifest recorded"):
        recorded_outputs(run_dir / "thing")
    make(run_dir, force=True)  # what the message advises
    fs.invalidate_cache()
    assert fs.cat(key) == b"a0" * 500
    assert recorded_outputs(run_dir / "thing")[0].read_bytes() == b"a0" * 500


@pytest.mark.parametrize("garbage", [b'{"format": 1, "stage": "tok', b"[1, 2]", b'{"outputs": [{"path": 3}]}'])
def test_a_damaged_manifest_on_the_store_is_named_in_one_line_and_its_own_stage_redoes(
    runs: str, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = mirror_of(runs) / "r"
    make(run_dir)
    s3fs.S3FileSystem().pipe(runs.removeprefix("s3://") + "/r/thing/manifest.json", garbage)
    with pytest.raises(
        FatalError, match=rf"^{runs}/r/thing/manifest.json: not a manifest kiln writes .* rerun the thing"
    ):
        Stage(run_dir, "next", {"thing": Thing()}, inputs=[], upstream=["thing"])
    with caplog.at_level(logging.INFO, logger="kiln"):
        assert make(run_dir, seed="b")["counts"] == {"files": 2}
    assert "redoing because its manifest.json is damaged" in caplog.text


def test_a_missing_bucket_is_named_when_a_stage_reads_from_it(s3_store: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FatalError, match=r"no bucket s3://no-such-bucket-kiln \(or no access to it\)"):
        read_manifest(mirror_of("s3://no-such-bucket-kiln/runs") / "r" / "tokenize")


def test_a_prefix_emptied_on_the_store_is_started_over_not_blocked_by_this_machines_copy(
    runs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = mirror_of(runs) / "r"
    make(run_dir)
    s3fs.S3FileSystem().rm(runs.removeprefix("s3://") + "/r", recursive=True)  # the user starts over
    assert make(run_dir, seed="b")["counts"] == {"files": 2}
    assert s3fs.S3FileSystem().cat(runs.removeprefix("s3://") + "/r/thing/out/part-0.txt") == b"b0" * 500
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # the same bucket name on another server
    assert mirror_of(runs) != run_dir.parent


def test_what_a_verb_fetches_before_its_stage_begins_is_counted_as_that_stages_traffic(
    runs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(mirror_of(runs) / "r", files=3)
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "other"))  # another machine: its mirror holds nothing
    run_dir = mirror_of(runs) / "r"
    inputs = recorded_outputs(run_dir / "thing")  # as train-tokenizer reads curate's shards, before its Stage
    stage = Stage(run_dir, "next", {"thing": Thing()}, inputs=inputs, upstream=["thing"])
    stage.begin()
    traffic = stage.finish([], {}, "nothing")["store_traffic"]["s3"]
    assert traffic["GetObject"] >= 3 and traffic["bytes_read"] >= 3 * 1000, traffic


def test_a_cache_that_is_a_file_or_a_limit_that_is_not_a_number_is_one_line_before_any_work(
    s3_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiln.cli import main

    (tmp_path / "somefile").write_text("")
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "somefile"))
    with pytest.raises(FatalError, match=rf"^KILN_CACHE={tmp_path}/somefile on .*: cannot keep .* \(Not a directory\)"):
        mirror_of("s3://some-bucket/runs")
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_CACHE_GB", "abc")
    assert main(["tokenize", "--set", "runs_dir=s3://some-bucket/runs"]) == 2
    with pytest.raises(FatalError, match=r"^KILN_CACHE_GB='abc': not a positive number of gigabytes"):
        mirror_of("s3://some-bucket/runs")


def test_a_model_prefix_in_a_missing_bucket_is_named_as_such(s3_store: str, tmp_path: Path, monkeypatch) -> None:
    from kiln.core.mirror import copy_of

    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FatalError, match=r"no bucket s3://no-such-bucket-kiln \(or no access to it\)"):
        copy_of("s3://no-such-bucket-kiln/models/llama")
