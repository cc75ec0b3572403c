"""curate reads its inputs from an object store as from disk: JSONL, text and Parquet objects under
S3 prefixes and globs, through the S3 API of a server started on localhost (tests/conftest.py);
the manifest records each object's size and ETag; a missing bucket or an empty prefix is named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from curate_corpus import prose, write_corpus

from kiln.core.docshards import list_shards, read_shard
from kiln.core.errors import FatalError
from kiln.curate.config import CurateConfig
from kiln.curate.readers import InputConfig
from kiln.curate.run import run

s3fs = pytest.importorskip("s3fs")


def config(web: str, books: str, tables: str) -> CurateConfig:
    return CurateConfig(
        inputs=(InputConfig(path=web), InputConfig(path=books), InputConfig(path=tables, format="parquet")),
        shard_mb=0.01,
        executor={"workers": 1},
    )


def kept(stage_dir: Path) -> dict[str, str]:
    return {d.id: d.text for p in list_shards(stage_dir / "shards") for d in read_shard(p)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, s3_store: str) -> Path:
    """The curate test corpus plus a two-row-group Parquet table, on disk and in bucket `corpus`."""
    root = tmp_path_factory.mktemp("store")
    write_corpus(root)
    (root / "in" / "tables").mkdir()
    table = pa.table({"id": [f"t{i}" for i in range(6)], "text": [prose(3000 + i) for i in range(6)]})
    pq.write_table(table, root / "in" / "tables" / "t.parquet", row_group_size=3)
    fs = s3fs.S3FileSystem()
    fs.mkdir("corpus")
    fs.put(str(root / "in"), "corpus/in", recursive=True)
    return root


def test_curate_reads_objects_of_a_store_as_it_reads_files(corpus: Path, tmp_path: Path) -> None:
    local = config(str(corpus / "in" / "web" / "*.jsonl"), str(corpus / "in" / "books"), str(corpus / "in" / "tables"))
    remote = config("s3://corpus/in/web/*.jsonl", "s3://corpus/in/books", "s3://corpus/in/tables")
    run(local, tmp_path / "local")
    manifest = run(remote, tmp_path / "remote")
    assert kept(tmp_path / "remote" / "curate") == kept(tmp_path / "local" / "curate")
    assert manifest["counts"]["docs_in"] > 50 and any(d.startswith("t") for d in kept(tmp_path / "remote" / "curate"))
    objects = {i["path"]: i for i in manifest["inputs"] if i["path"].startswith("s3://")}
    assert "s3://corpus/in/tables/t.parquet" in objects and all(i["etag"] and i["bytes"] for i in objects.values())
    # Unchanged objects: the stage is current without reading them again; a changed object redoes it.
    assert run(remote, tmp_path / "remote") == manifest
    fs = s3fs.S3FileSystem()
    fs.pipe("corpus/in/books/extra.txt", prose(4242).encode())
    assert run(remote, tmp_path / "remote")["counts"]["docs_in"] == manifest["counts"]["docs_in"] + 1
    fs.rm("corpus/in/books/extra.txt")


def test_a_missing_bucket_and_an_empty_prefix_are_named(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(FatalError, match=r"s3://no-such-bucket/in/\*\.jsonl: no such bucket or object"):
        run(config("s3://no-such-bucket/in/*.jsonl", str(corpus / "in" / "books"), "s3://corpus/in/tables"), tmp_path)
    with pytest.raises(FatalError, match=r"curate.inputs\[0\].path: 's3://corpus/nothing/\*.jsonl' matches no file"):
        run(config("s3://corpus/nothing/*.jsonl", str(corpus / "in" / "books"), "s3://corpus/in/tables"), tmp_path)


def test_a_file_on_a_web_server_is_read_and_fingerprinted_by_its_content(corpus: Path, tmp_path: Path) -> None:
    """https:// (here http:// on localhost): one object per input, no listing; a plain server sends no ETag,
    so the manifest holds the content's sha256, read through."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(corpus / "in"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/web/pages.jsonl"
        cfg = CurateConfig(inputs=(InputConfig(path=url, source="web"),), executor={"workers": 1})
        manifest = run(cfg, tmp_path / "web")
        local = CurateConfig(inputs=(InputConfig(path=str(corpus / "in" / "web" / "pages.jsonl")),))
        run(local.model_copy(update={"executor": cfg.executor}), tmp_path / "local")
        assert kept(tmp_path / "web" / "curate") == kept(tmp_path / "local" / "curate")
        [entry] = [i for i in manifest["inputs"] if i["path"] == url]
        assert entry["sha256"] == hashlib.sha256((corpus / "in" / "web" / "pages.jsonl").read_bytes()).hexdigest()
    finally:
        server.shutdown()


def test_an_evaluation_set_in_a_store_decontaminates_as_a_local_one(corpus: Path, tmp_path: Path) -> None:
    base = config(str(corpus / "in" / "web" / "*.jsonl"), str(corpus / "in" / "books"), str(corpus / "in" / "tables"))
    run(base, tmp_path / "plain")
    planted = " ".join(sorted(kept(tmp_path / "plain" / "curate").values())[0].split()[20:50])  # a kept text's words
    item = json.dumps({"question": planted}) + "\n"
    (tmp_path / "set.jsonl").write_text(item)
    s3fs.S3FileSystem().pipe("corpus/evals/set.jsonl", item.encode())
    found = {}
    for where, path in (("local", str(tmp_path / "set.jsonl")), ("store", "s3://corpus/evals/set.jsonl")):
        settings = {
            **base.model_dump(),
            "decontaminate": {"enabled": True, "eval_sets": [{"path": path, "name": "set"}]},
        }
        manifest = run(CurateConfig.model_validate(settings), tmp_path / where)
        found[where] = {k: n for k, n in manifest["counts"]["removed"].items() if k.startswith("decontaminate")}
    assert found["store"] == found["local"] and sum(found["store"].values()) == 1
    assert any(i["path"] == "s3://corpus/evals/set.jsonl" and i["etag"] for i in manifest["inputs"])
