"""kiln.curate.readers: planning text_files inputs under a byte cap, and loading one unit."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest
import xxhash

from kiln.core.errors import DocumentError
from kiln.curate.config import InputConfig
from kiln.curate.readers import CAP_SEED, InputUnit, glob_root, list_units, load_unit, plan_inputs


def make_files(folder: Path, n: int, size: int, prefix: str = "f") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"{prefix}{i:03d}.txt"
        line = f"document {i} of {folder.name}. "
        p.write_text((line * (size // len(line) + 1))[:size])
        paths.append(p)
    return paths


def text_input(source: str, pattern: Path | str) -> InputConfig:
    return InputConfig(source=source, reader="text_files", path=str(pattern))


def unit(path: Path, source: str = "web") -> InputUnit:
    return InputUnit(source, f"{source}/{path.name}", str(path), path.stat().st_size)


def hash_order_prefix(units: list[InputUnit], budget: int) -> set[str]:
    """Reference: greedy fill in order of the id hash (what plan_inputs documents)."""
    chosen, used = set(), 0
    for u in sorted(units, key=lambda u: xxhash.xxh3_64_intdigest(u.doc_id.encode(), seed=CAP_SEED)):
        if used + u.size <= budget:
            chosen.add(u.doc_id)
            used += u.size
    return chosen


# --- planning -----------------------------------------------------------------------------------


def test_list_units_text_files(tmp_path):
    paths = make_files(tmp_path / "web", 3, 100)
    (tmp_path / "web" / "sub").mkdir()
    deep = tmp_path / "web" / "sub" / "deep.txt"
    deep.write_text("deep")
    units = list_units(text_input("web", tmp_path / "web" / "**" / "*.txt"))
    assert [u.path for u in units] == sorted(str(p) for p in [*paths, deep])
    # ids are relative to the folder before the first wildcard, so moving the data keeps them
    assert [u.doc_id for u in units] == sorted(f"web/{Path(p).relative_to(tmp_path / 'web').as_posix()}" for p in [*paths, deep])
    assert "web/sub/deep.txt" in {u.doc_id for u in units}
    assert [u.size for u in units] == [100, 100, 100, 4]
    assert all(u.key is None for u in units)


@pytest.mark.parametrize(
    ("pattern", "root"),
    [("data/*.txt", "data"), ("/abs/data/**/*.md", "/abs/data"), ("*.txt", "."), ("data/one.txt", "data"), ("a/b[0-9]/*.txt", "a")],
)
def test_glob_root(pattern, root):
    assert glob_root(pattern) == Path(root)


def test_small_source_keeps_all_and_large_takes_the_rest(tmp_path):
    make_files(tmp_path / "small", 3, 100)  # 300 bytes
    make_files(tmp_path / "large", 20, 100)  # 2000 bytes
    inputs = (text_input("large", tmp_path / "large" / "*.txt"), text_input("small", tmp_path / "small" / "*.txt"))
    planned = plan_inputs(inputs, max_total_bytes=1000)

    small = [u for u in planned if u.source == "small"]
    large = [u for u in planned if u.source == "large"]
    assert len(small) == 3  # 300 < its fair share of 500: all of it
    assert len(large) == 7  # the 700 bytes the small source left
    assert sum(u.size for u in planned) == 1000
    assert {u.doc_id for u in large} == hash_order_prefix(list_units(inputs[0]), 700)
    assert planned == sorted(planned, key=lambda u: (u.source, u.doc_id))
    assert plan_inputs(inputs, max_total_bytes=1000) == planned  # deterministic


def test_equal_sources_split_the_cap_evenly(tmp_path):
    make_files(tmp_path / "a", 10, 100)
    make_files(tmp_path / "b", 10, 100)
    inputs = (text_input("a", tmp_path / "a" / "*.txt"), text_input("b", tmp_path / "b" / "*.txt"))
    planned = plan_inputs(inputs, max_total_bytes=600)
    assert [u.source for u in planned].count("a") == 3
    assert [u.source for u in planned].count("b") == 3


def test_three_sources_water_filling(tmp_path):
    make_files(tmp_path / "tiny", 1, 50)  # 50
    make_files(tmp_path / "mid", 4, 100)  # 400
    make_files(tmp_path / "big", 30, 100)  # 3000
    inputs = tuple(text_input(s, tmp_path / s / "*.txt") for s in ("big", "mid", "tiny"))
    planned = plan_inputs(inputs, max_total_bytes=1500)
    used = {s: sum(u.size for u in planned if u.source == s) for s in ("tiny", "mid", "big")}
    # tiny: min(50, 1500 // 3) = 50; mid: min(400, 1450 // 2) = 400; big: 1050 -> 10 files of 100
    assert used == {"tiny": 50, "mid": 400, "big": 1000}


def test_cap_above_total_takes_everything(tmp_path):
    paths = make_files(tmp_path / "web", 5, 100)
    planned = plan_inputs((text_input("web", tmp_path / "web" / "*.txt"),), max_total_bytes=10**9)
    assert [u.path for u in planned] == [str(p) for p in paths]


def test_a_unit_too_big_for_the_share_is_skipped_not_the_rest(tmp_path):
    make_files(tmp_path / "web", 6, 100)
    big = tmp_path / "web" / "big.txt"
    big.write_text("x" * 450)
    planned = plan_inputs((text_input("web", tmp_path / "web" / "*.txt"),), max_total_bytes=400)
    assert str(big) not in {u.path for u in planned}
    assert len(planned) == 4 and sum(u.size for u in planned) == 400


def test_missing_glob_yields_nothing_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="kiln.curate"):
        cfg = text_input("web", tmp_path / "nowhere" / "*.txt")
        assert list_units(cfg) == []
        make_files(tmp_path / "other", 2, 10)
        planned = plan_inputs((cfg, text_input("other", tmp_path / "other" / "*.txt")), 10**6)
    assert [u.source for u in planned] == ["other", "other"]
    assert any("input web: no files match" in r.getMessage() and "nowhere" in r.getMessage() for r in caplog.records)


# --- loading ------------------------------------------------------------------------------------


def test_load_plain_utf8(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("naïve café — 東京 🙂\n", encoding="utf-8")
    assert load_unit(unit(p), 1000) == ("naïve café — 東京 🙂\n", False)


def test_invalid_utf8_is_replaced_and_flagged(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes("café ok".encode("latin-1") + b" \xff\xfe end")
    text, replaced = load_unit(unit(p), 1000)
    assert replaced is True
    assert text == "caf\ufffd ok \ufffd\ufffd end"


def test_nul_bytes_are_binary(tmp_path):
    p = tmp_path / "image.txt"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(DocumentError) as info:
        load_unit(unit(p), 1000)
    assert str(info.value).startswith("read:binary: ")
    assert str(p) in str(info.value)


def test_file_over_the_cap_is_too_large(tmp_path):
    p = tmp_path / "big.txt"
    p.write_text("a" * 1001)
    with pytest.raises(DocumentError, match=r"^read:too_large: .* is over 1000 bytes"):
        load_unit(unit(p), 1000)
    p.write_text("a" * 1000)  # exactly at the cap is fine
    assert load_unit(unit(p), 1000) == ("a" * 1000, False)


def test_too_large_is_decided_without_reading_the_whole_file():
    # /dev/zero never ends: only a bounded read can return at all.
    endless = InputUnit("web", "web/zero", "/dev/zero", 0)
    with pytest.raises(DocumentError, match="read:too_large"):
        load_unit(endless, 4096)


def test_gzip_is_decompressed(tmp_path):
    p = tmp_path / "notes.txt.gz"
    body = "compressed notes\nsecond line ü\n" * 10
    p.write_bytes(gzip.compress(body.encode()))
    assert load_unit(unit(p), 10_000) == (body, False)


def test_gzip_cap_counts_decompressed_bytes(tmp_path):
    p = tmp_path / "bomb.txt.gz"
    p.write_bytes(gzip.compress(b"a" * 100_000))
    assert p.stat().st_size < 1000
    with pytest.raises(DocumentError, match="read:too_large"):
        load_unit(unit(p), 10_000)


@pytest.mark.parametrize("content", [b"not gzip at all", gzip.compress(b"truncated text " * 50)[:30]])
def test_broken_gzip_is_an_io_error(tmp_path, content):
    p = tmp_path / "broken.txt.gz"
    p.write_bytes(content)
    with pytest.raises(DocumentError, match=r"^read:io_error: "):
        load_unit(unit(p), 10_000)


def test_missing_file_is_an_io_error(tmp_path):
    gone = InputUnit("web", "web/gone", str(tmp_path / "gone.txt"), 10)
    with pytest.raises(DocumentError, match="read:io_error"):
        load_unit(gone, 1000)
