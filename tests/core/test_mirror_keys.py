"""No object key, recorded path or store URL places a file outside the folder kiln keeps it in
(kiln.core.mirror.key_path, which every download goes through): arbitrary keys by hypothesis, and hostile
objects put into a bucket of the S3 server on localhost (tests/conftest.py) by hand, as anyone who may
write to the bucket could."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln.core.errors import FatalError
from kiln.core.manifest import recorded_outputs
from kiln.core.mirror import copy_of, key_path, local_path, mirror_of, pull

s3fs = pytest.importorskip("s3fs")

parts = st.one_of(st.sampled_from(["", ".", "..", "...", "a", "b.txt", "..a", "a..", " ", "\0"]), st.text(max_size=6))
keys = st.lists(parts, min_size=1, max_size=6).map("/".join)


def inside(path: Path, root: Path) -> bool:
    return os.path.abspath(path).startswith(os.path.abspath(root) + os.sep)


@given(keys)
def test_any_key_is_refused_or_lands_strictly_inside_its_root(key: str) -> None:
    root = Path("/srv/cache/stores/0123/run/train")
    try:
        path = key_path(root, key, "s3://b/runs/run/train/")
    except FatalError as e:
        assert "s3://b/runs/run/train/" in str(e)
        return
    assert inside(path, root)
    assert Path(os.path.abspath(path)) == path  # nothing left to fold: the path is the one written


@given(key=keys, run=st.text(alphabet="abc-/.", min_size=1, max_size=12))
def test_a_place_from_any_machine_stays_inside_this_machines_mirror(
    key: str, run: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    os.environ["KILN_CACHE"] = str(tmp_path_factory.getbasetemp() / "cache")
    try:
        url = f"s3://bucket/{run}"
        try:
            root = mirror_of(url)
        except FatalError:
            assert any(p in ("", ".", "..") for p in run.rstrip("/").split("/"))
            return
        try:
            path = local_path((url, key))
        except FatalError:
            return
        assert path == root or inside(path, root)
    finally:
        del os.environ["KILN_CACHE"]


HOSTILE = ["../../../../../../../../../../{escape}", "a/../../../../../../../../../{escape}", "a//b", "./c"]


@pytest.fixture
def bucket(s3_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    name = f"keys-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem().mkdir(name)
    return name


def put(bucket: str, key: str, body: bytes = b"ESCAPED\n") -> None:
    """An object put with the S3 API as it is (s3fs would fold the `..`)."""
    import boto3

    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_key_in_a_runs_prefix_is_refused_by_pull_and_writes_nothing_outside(
    bucket: str, hostile: str, tmp_path: Path
) -> None:
    escape = tmp_path / "outside" / f"ESCAPED-{uuid.uuid4().hex[:6]}.txt"
    key = hostile.format(escape=str(escape).lstrip("/"))
    put(bucket, f"runs/p4/train.partial/checkpoints/step-0000999/{key}")
    folder = mirror_of(f"s3://{bucket}/runs") / "p4" / "train.partial"
    with pytest.raises(FatalError, match=r"so it would land outside the folder kiln keeps it in"):
        pull(folder, ["checkpoints/*"])
    assert not escape.exists()
    assert not any(p.is_file() for p in tmp_path.glob("**/ESCAPED*"))


def test_a_hostile_key_under_a_model_prefix_is_refused_by_import_copies(bucket: str, tmp_path: Path) -> None:
    escape = tmp_path / "outside" / "ESCAPED.txt"
    put(bucket, "model/config.json", b"{}")
    put(bucket, "model/sub/../../../../../../../../../../../" + str(escape).lstrip("/"))
    with pytest.raises(FatalError, match=rf"s3://{bucket}/model/: .* would land outside"):
        copy_of(f"s3://{bucket}/model")
    assert not escape.exists()


def test_a_manifest_recording_a_path_outside_its_stage_is_refused(bucket: str, tmp_path: Path) -> None:
    escape = tmp_path / "outside" / "ESCAPED.txt"
    manifest = {
        "format": "kiln-manifest v1",
        "outputs": [{"path": "../../../../../../../../../" + str(escape).lstrip("/"), "bytes": 1, "sha256": "0" * 64}],
    }
    put(bucket, "runs/r/curate/manifest.json", json.dumps(manifest).encode())
    with pytest.raises(FatalError, match=r"curate/manifest.json: .* would land outside"):
        recorded_outputs(mirror_of(f"s3://{bucket}/runs") / "r" / "curate")
    assert not escape.exists()
