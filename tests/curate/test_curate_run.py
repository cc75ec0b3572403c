"""kiln.curate.run end to end on text_files inputs: dedup, ledger, quarantine, workers, skip-or-redo."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kiln.core.errors import FatalError
from kiln.core.manifest import MANIFEST
from kiln.curate.config import CurateConfig, InputConfig
from kiln.curate.run import run
from kiln.curate.shards import list_shards, read_shard
from kiln.curate.steps import normalize_text

WORDS = (
    "the kiln furnace clay glaze potter wheel fire heat slowly carefully morning evening village river "
    "market bread stone window garden winter summer ancient modern history letter answer question "
    "remember careful quiet bright yellow orange shadow mountain travel across between during without "
    "because although whenever water season harvest wooden basket silver copper"
).split()


def paragraph(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
        out.append(" ".join(words).capitalize() + rng.choice([".", ".", "!", "?"]))
    return " ".join(out)


def prose(seed: int, paragraphs: int = 4) -> str:
    rng = random.Random(seed)
    return "\n\n".join(paragraph(rng, rng.randint(3, 6)) for _ in range(paragraphs)) + "\n"


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    """Two sources of prose with planted duplicates, one short file, one binary, one Latin-1 file."""
    web, books = tmp_path / "in" / "web", tmp_path / "in" / "books"
    web.mkdir(parents=True)
    books.mkdir(parents=True)
    for i in range(14):
        (web / f"page{i:02d}.txt").write_text(prose(i))
    for i in range(8):
        (books / f"chapter{i:02d}.txt").write_text(prose(100 + i, paragraphs=8))
    shared = prose(999)
    (web / "shared.txt").write_text(shared)
    (books / "shared.txt").write_text(shared)  # same text in both sources
    # same as page03 once normalized (CRLF, trailing spaces, extra blank lines)
    (web / "copy_of_page03.txt").write_bytes(prose(3).replace("\n", "   \r\n").replace("\r\n\r\n", "\r\n\r\n\r\n\r\n").encode())
    (web / "short.txt").write_text("Too short to keep.")
    (web / "binary.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)) * 4)
    (web / "latin1.txt").write_bytes(prose(55).replace("kiln", "kiln\xe9").encode("latin-1"))
    return {"web": web, "books": books}


def config(corpus: dict[str, Path], **overrides) -> CurateConfig:
    fields = dict(
        inputs=(
            InputConfig(source="web", reader="text_files", path=str(corpus["web"] / "*.txt")),
            InputConfig(source="books", reader="text_files", path=str(corpus["books"] / "*.txt")),
        ),
        shard_mb=0.004,  # about four prose files per shard: several shards per source
        workers=1,
    )
    fields.update(overrides)
    return CurateConfig(**fields)


def doc_id(source: str, path: Path) -> str:
    """Ids are relative to the glob's folder: every input here is <folder>/*.txt."""
    return f"{source}/{path.name}"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def curated(stage_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """{shard file name: [(id, text), ...]} in file order."""
    return {p.name: [(d.id, d.text) for d in read_shard(p)] for p in list_shards(stage_dir / "shards")}


def test_curate_run(tmp_path, corpus):
    web, books = corpus["web"], corpus["books"]
    manifest = run(config(corpus), tmp_path / "run")
    stage_dir = tmp_path / "run" / "curate"
    assert json.loads((stage_dir / MANIFEST).read_text()) == manifest

    # exact duplicates: the smallest id survives, across sources and within one
    shared_books, shared_web = doc_id("books", books / "shared.txt"), doc_id("web", web / "shared.txt")
    copy03, page03 = doc_id("web", web / "copy_of_page03.txt"), doc_id("web", web / "page03.txt")
    assert shared_books < shared_web and copy03 < page03
    removed = read_jsonl(stage_dir / "audit" / "removed.jsonl")
    dedup = [r for r in removed if r["reason"] == "exact_dedup:duplicate"]
    assert sorted(dedup, key=lambda r: r["id"]) == [
        {"id": page03, "source": "web", "reason": "exact_dedup:duplicate", "kept_id": copy03},
        {"id": shared_web, "source": "web", "reason": "exact_dedup:duplicate", "kept_id": shared_books},
    ]
    assert [r for r in removed if r["reason"] != "exact_dedup:duplicate"] == [
        {"id": doc_id("web", web / "short.txt"), "source": "web", "reason": "length:too_short"}
    ]
    assert [r["id"] for r in removed] == sorted(r["id"] for r in removed)

    # the binary file is quarantined and the run went on
    [quarantined] = read_jsonl(stage_dir / "audit" / "quarantined.jsonl")
    assert quarantined["id"] == doc_id("web", web / "binary.txt")
    assert quarantined["source"] == "web"
    assert quarantined["error"].startswith("read:binary: ")

    # what is in the shards: every other file, normalized, under its own source
    shards = curated(stage_dir)
    kept = {i: t for docs in shards.values() for i, t in docs}
    gone = {page03, shared_web, doc_id("web", web / "short.txt"), doc_id("web", web / "binary.txt")}
    expected_files = {doc_id(s, p): p for s in ("web", "books") for p in corpus[s].glob("*.txt")}
    assert set(kept) == set(expected_files) - gone
    for i, text in kept.items():
        raw = expected_files[i].read_bytes().decode("utf-8", errors="replace")
        assert text == normalize_text(raw)
    assert "kiln\ufffd" in kept[doc_id("web", web / "latin1.txt")]
    assert all(name.startswith(("web-", "books-")) and name.endswith(".jsonl.zst") for name in shards)
    assert all(i.startswith(name.split("-")[0] + "/") for name, docs in shards.items() for i, _ in docs)
    assert len([n for n in shards if n.startswith("web-")]) >= 3

    # the ledger balances per source and in total
    counts = manifest["counts"]
    per = counts["per_source"]
    for source, t in per.items():
        assert t["docs_in"] == t["docs_out"] + sum(t["removed"].values()) + t["quarantined"], source
        assert t["docs_out"] == sum(1 for i in kept if i.startswith(source + "/"))
        assert t["bytes_out"] == sum(len(kept[i].encode()) for i in kept if i.startswith(source + "/"))
    assert per["web"] == {
        "docs_in": 19,
        "docs_out": 15,
        "bytes_in": per["web"]["bytes_in"],
        "bytes_out": per["web"]["bytes_out"],
        "invalid_utf8_docs": 1,
        "removed": {"exact_dedup:duplicate": 2, "length:too_short": 1},
        "quarantined": 1,
    }
    assert per["books"]["docs_in"] == per["books"]["docs_out"] == 9
    assert counts["docs_in"] == 28 and counts["docs_out"] == 24 and counts["quarantined"] == 1
    assert counts["removed"] == {"exact_dedup:duplicate": 2, "length:too_short": 1}

    # the manifest lists every shard and both audit files, and every input it read
    outputs = {o["path"] for o in manifest["outputs"]}
    assert outputs == {f"shards/{n}" for n in shards} | {"audit/removed.jsonl", "audit/quarantined.jsonl"}
    assert {i["path"] for i in manifest["inputs"]} == {str(p) for p in expected_files.values()}
    assert "removed by reason: exact_dedup:duplicate=2, length:too_short=1" in (stage_dir / "summary.txt").read_text()


def test_same_output_with_one_and_two_workers(tmp_path, corpus):
    one = run(config(corpus, workers=1), tmp_path / "one")
    two = run(config(corpus, workers=2), tmp_path / "two")
    shards_one, shards_two = curated(tmp_path / "one" / "curate"), curated(tmp_path / "two" / "curate")
    assert len(shards_one) >= 4
    assert shards_one == shards_two  # same names, same documents in the same order
    for name in ("removed.jsonl", "quarantined.jsonl"):
        assert (tmp_path / "one" / "curate" / "audit" / name).read_bytes() == (tmp_path / "two" / "curate" / "audit" / name).read_bytes()
    assert one["counts"] == two["counts"]
    assert one["outputs"] == two["outputs"]  # same bytes and sha256, file by file


def test_rerun_is_skipped_and_force_or_changes_redo(tmp_path, corpus):
    run_dir = tmp_path / "run"
    stage_dir = run_dir / "curate"
    first = run(config(corpus), run_dir)
    manifest_bytes = (stage_dir / MANIFEST).read_bytes()
    marker = stage_dir / "marker"
    marker.write_text("begin() would delete me")

    again = run(config(corpus), run_dir)
    assert again == first and again["finished_at"] == first["finished_at"]
    assert (stage_dir / MANIFEST).read_bytes() == manifest_bytes
    assert marker.exists()

    forced = run(config(corpus), run_dir, force=True)
    assert not marker.exists()
    assert forced["counts"] == first["counts"] and forced["outputs"] == first["outputs"]

    marker.write_text("x")
    stricter = run(config(corpus, min_chars=1300), run_dir)
    assert not marker.exists()
    assert stricter["config"]["curate"]["min_chars"] == 1300
    assert stricter["counts"]["removed"]["length:too_short"] > first["counts"]["removed"]["length:too_short"]
    assert stricter["counts"]["docs_out"] < first["counts"]["docs_out"]

    marker.write_text("x")
    (corpus["books"] / "chapter00.txt").write_text(prose(12345, paragraphs=8))  # an input changed
    run(config(corpus, min_chars=1300), run_dir)
    assert not marker.exists()


def test_no_exact_dedup_keeps_duplicates(tmp_path, corpus):
    counts = run(config(corpus, exact_dedup=False), tmp_path / "run")["counts"]
    assert "exact_dedup:duplicate" not in counts["removed"]
    assert counts["docs_out"] == 26


def test_file_over_max_file_mb_is_quarantined(tmp_path, corpus):
    big = corpus["books"] / "huge.txt"
    big.write_text(prose(7, paragraphs=200))
    assert big.stat().st_size > 20_000
    manifest = run(config(corpus, max_file_mb=0.02), tmp_path / "run")
    quarantined = read_jsonl(tmp_path / "run" / "curate" / "audit" / "quarantined.jsonl")
    assert {q["id"]: q["error"].split(":")[0] + ":" + q["error"].split(":")[1] for q in quarantined} == {
        doc_id("books", big): "read:too_large",
        doc_id("web", corpus["web"] / "binary.txt"): "read:binary",
    }
    assert manifest["counts"]["per_source"]["books"]["quarantined"] == 1


def test_no_inputs_is_fatal(tmp_path):
    cfg = CurateConfig(inputs=(InputConfig(source="web", reader="text_files", path=str(tmp_path / "none" / "*.txt")),), workers=1)
    with pytest.raises(FatalError, match="no input documents found"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "curate").exists()


def test_corrupt_gzip_is_quarantined_and_the_run_goes_on(tmp_path, corpus):
    import gzip

    good = gzip.compress(prose(77).encode())
    damaged = good[:20] + bytes(b ^ 0xFF for b in good[20:-8]) + good[-8:]  # valid header, broken deflate data
    (corpus["web"] / "damaged.txt.gz").write_bytes(damaged)
    (corpus["web"] / "fine.txt.gz").write_bytes(good)
    cfg = config(corpus).model_copy(update={"inputs": (InputConfig(source="web", reader="text_files", path=str(corpus["web"] / "*")),)})
    manifest = run(cfg, tmp_path / "run")
    quarantined = {q["id"]: q["error"] for q in read_jsonl(tmp_path / "run" / "curate" / "audit" / "quarantined.jsonl")}
    assert quarantined["web/damaged.txt.gz"].startswith("read:io_error:")
    kept = {doc_id for docs in curated(tmp_path / "run" / "curate").values() for doc_id, _ in docs}
    assert "web/fine.txt.gz" in kept
    web = manifest["counts"]["per_source"]["web"]
    assert web["docs_in"] == web["docs_out"] + sum(web["removed"].values()) + web["quarantined"]


def test_worker_count_does_not_redo(tmp_path, corpus):
    first = run(config(corpus, workers=1), tmp_path / "run")
    again = run(config(corpus, workers=2), tmp_path / "run")
    assert again["finished_at"] == first["finished_at"]  # shards do not depend on workers: nothing to redo
