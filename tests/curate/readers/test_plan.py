"""kiln.curate.readers.plan: listing inputs, the fair byte cap, and cutting tasks."""

from __future__ import annotations

import logging
import os
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from kiln.core.errors import FatalError
from kiln.curate.readers import CAP_SEED, InputConfig, plan_reads, task_paths
from kiln.curate.readers.builtin import DOC_NAME_PATTERNS
from kiln.curate.readers.files import glob_root
from kiln.curate.readers.plan import list_units


def make_files(folder: Path, n: int, size: int, prefix: str = "f") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"{prefix}{i:03d}.txt"
        line = f"document {i} of {folder.name}. "
        p.write_text((line * (size // len(line) + 1))[:size])
        paths.append(p)
    return paths


def text_input(source: str | None, pattern: Path | str) -> InputConfig:
    return InputConfig(source=source, format="text", path=str(pattern))


def planned(tasks) -> list:
    return [u for t in tasks for u in t.units]


def hash_order_prefix(units, budget: int) -> set[str]:
    """Reference: greedy fill in order of the id hash (what the cap documents)."""
    chosen, used = set(), 0
    for u in sorted(units, key=lambda u: xxhash.xxh3_64_intdigest(u.name.encode(), seed=CAP_SEED)):
        if used + u.size <= budget:
            chosen.add(u.name)
            used += u.size
    return chosen


# --- listing ------------------------------------------------------------------------------------


def test_list_units_text_files(tmp_path):
    paths = make_files(tmp_path / "web", 3, 100)
    (tmp_path / "web" / "sub").mkdir()
    deep = tmp_path / "web" / "sub" / "deep.txt"
    deep.write_text("deep")
    units = list_units(text_input("web", tmp_path / "web" / "**" / "*.txt"))
    assert [u.path for u in units] == sorted(str(p) for p in [*paths, deep])
    # ids are relative to the folder before the first wildcard, so moving the data keeps them
    assert [u.name for u in units] == sorted(
        f"web/{Path(p).relative_to(tmp_path / 'web').as_posix()}" for p in [*paths, deep]
    )
    assert "web/sub/deep.txt" in {u.name for u in units}
    assert [u.size for u in units] == [100, 100, 100, 4]
    assert all(u.key is None and u.format == "text" for u in units)


@pytest.mark.parametrize(
    ("pattern", "root"),
    [
        ("data/*.txt", "data"),
        ("/abs/data/**/*.md", "/abs/data"),
        ("*.txt", "."),
        ("data/one.txt", "data"),
        ("a/b[0-9]/*.txt", "a"),
    ],
)
def test_glob_root(pattern, root):
    assert glob_root(pattern) == Path(root)


def test_folder_path_reads_recursively_and_explicit_format_filters(tmp_path):
    ds = tmp_path / "my-dataset"
    (ds / "data").mkdir(parents=True)
    for name in ("data/a.jsonl", "data/b.jsonl.zst", "data/c.parquet", "README.md", ".hidden.jsonl"):
        (ds / name).write_bytes(b"")
    auto = list_units(InputConfig(path=str(ds)))
    assert [(u.name, u.format) for u in auto] == [
        (f"my_dataset_{xxhash.xxh64_hexdigest(b'my-dataset')[:8]}/README.md", "text"),
        ("data/data/a.jsonl", "jsonl"),
        ("data/data/b.jsonl.zst", "jsonl"),
        ("data/data/c.parquet", "parquet"),
    ]  # source from each file's folder (sanitized), ids relative to the folder given
    assert [u.name for u in list_units(InputConfig(path=str(ds), format="jsonl", source="web"))] == [
        "web/data/a.jsonl",
        "web/data/b.jsonl.zst",
    ]


def test_builtin_ids_are_those_of_the_original_reader():
    # the original reader's rule, written out: the demo's shards and cap sample depend on it
    root = Path(sysconfig.get_paths()["stdlib"])
    expected = {
        f"code/{p.relative_to(root).as_posix()}"
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and p.is_file()
    }
    units = list_units(InputConfig(source="code", format="stdlib_code"))
    assert {u.name for u in units} == expected and all(u.source == "code" for u in units)
    assert "code/json/decoder.py" in expected

    from pydoc_data import topics

    prose = list_units(InputConfig(format="pydoc_topics"))  # no source: the demo's name for it
    assert {u.name for u in prose} == {f"prose/{k}" for k in topics.topics}
    assert all(u.key == u.name.removeprefix("prose/") and u.size == len(topics.topics[u.key].encode()) for u in prose)


def test_usr_share_doc_ids_and_names(tmp_path):
    root = tmp_path / "doc"
    for rel in ("pkg/README", "pkg/changelog.Debian.gz", "pkg/copyright", "pkg/data.bin", "other/NEWS.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    units = list_units(InputConfig(source="docs", format="usr_share_doc", path=str(root)))
    assert sorted(u.name for u in units) == [
        "docs/other/NEWS.md",
        "docs/pkg/README",
        "docs/pkg/changelog.Debian.gz",
        "docs/pkg/copyright",
    ]
    assert "readme*" in DOC_NAME_PATTERNS


def test_missing_builtin_root_is_skipped_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="kiln.curate"):
        assert list_units(InputConfig(source="docs", format="usr_share_doc", path=str(tmp_path / "nope"))) == []
    assert "does not exist" in caplog.text


# --- the cap ------------------------------------------------------------------------------------


def test_small_source_keeps_all_and_large_takes_the_rest(tmp_path):
    make_files(tmp_path / "small", 3, 100)  # 300 bytes
    make_files(tmp_path / "large", 20, 100)  # 2000 bytes
    inputs = (text_input("large", tmp_path / "large" / "*.txt"), text_input("small", tmp_path / "small" / "*.txt"))
    units = planned(plan_reads(inputs, 1000, 10**9))
    small = [u for u in units if u.source == "small"]
    large = [u for u in units if u.source == "large"]
    assert len(small) == 3  # 300 < its fair share of 500: all of it
    assert len(large) == 7  # the 700 bytes the small source left
    assert sum(u.size for u in units) == 1000
    assert {u.name for u in large} == hash_order_prefix(list_units(inputs[0]), 700)
    assert planned(plan_reads(inputs, 1000, 10**9)) == units  # deterministic


def test_equal_sources_split_the_cap_evenly(tmp_path):
    make_files(tmp_path / "a", 10, 100)
    make_files(tmp_path / "b", 10, 100)
    inputs = (text_input("a", tmp_path / "a" / "*.txt"), text_input("b", tmp_path / "b" / "*.txt"))
    sources = [u.source for u in planned(plan_reads(inputs, 600, 10**9))]
    assert sources.count("a") == 3 and sources.count("b") == 3


def test_three_sources_water_filling(tmp_path):
    make_files(tmp_path / "tiny", 1, 50)  # 50
    make_files(tmp_path / "mid", 4, 100)  # 400
    make_files(tmp_path / "big", 30, 100)  # 3000
    inputs = tuple(text_input(s, tmp_path / s / "*.txt") for s in ("big", "mid", "tiny"))
    units = planned(plan_reads(inputs, 1500, 10**9))
    used = {s: sum(u.size for u in units if u.source == s) for s in ("tiny", "mid", "big")}
    # tiny: min(50, 1500 // 3) = 50; mid: min(400, 1450 // 2) = 400; big: 1050 -> 10 files of 100
    assert used == {"tiny": 50, "mid": 400, "big": 1000}


def test_no_cap_or_a_cap_above_the_total_takes_everything(tmp_path):
    paths = make_files(tmp_path / "web", 5, 100)
    for cap in (None, 10**9):
        assert [u.path for u in planned(plan_reads((text_input("web", tmp_path / "web" / "*.txt"),), cap, 10**9))] == [
            str(p) for p in paths
        ]


def test_a_unit_too_big_for_the_share_is_skipped_not_the_rest(tmp_path):
    make_files(tmp_path / "web", 6, 100)
    big = tmp_path / "web" / "big.txt"
    big.write_text("x" * 450)
    units = planned(plan_reads((text_input("web", tmp_path / "web" / "*.txt"),), 400, 10**9))
    assert str(big) not in {u.path for u in units}
    assert len(units) == 4 and sum(u.size for u in units) == 400


def test_a_container_too_big_for_the_share_is_read_as_a_prefix(tmp_path):
    (tmp_path / "web").mkdir()
    big = tmp_path / "web" / "big.jsonl"
    big.write_bytes(b'{"text": "x"}\n' * 100)  # 1400 bytes
    tasks = plan_reads((InputConfig(source="web", path=str(big)),), 500, 10**9)
    assert [(u.path, u.max_bytes, u.size) for u in planned(tasks)] == [(str(big), 500, 500)]
    assert tasks[0].size == 500


def test_an_input_matching_no_file_is_an_error(tmp_path):
    make_files(tmp_path / "other", 2, 10)
    inputs = (
        text_input("other", tmp_path / "other" / "*.txt"),
        text_input("web", tmp_path / "nowehre" / "*.txt"),
    )  # a typo
    with pytest.raises(FatalError, match=r"curate.inputs\[1\].path: .*nowehre.* matches no file"):
        plan_reads(inputs, 10**6, 10**9)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FatalError, match=r"inputs\[0\]"):
        plan_reads((InputConfig(path=str(tmp_path / "empty")),), None, 10**9)


def test_a_missing_builtin_corpus_is_skipped_not_an_error(tmp_path, caplog):
    make_files(tmp_path / "web", 2, 10)
    inputs = (
        InputConfig(format="usr_share_doc", path=str(tmp_path / "no_docs_here")),
        text_input("web", tmp_path / "web" / "*.txt"),
    )
    with caplog.at_level(logging.WARNING, logger="kiln.curate"):
        units = planned(plan_reads(inputs, None, 10**9))
    assert [u.source for u in units] == ["web", "web"] and "does not exist" in caplog.text


def test_overlapping_inputs_read_each_file_once(tmp_path, caplog):
    paths = make_files(tmp_path / "web", 3, 10)
    inputs = (
        text_input("first", tmp_path / "web" / "f00[01].txt"),
        text_input("second", tmp_path / "web" / "*.txt"),
        text_input("third", paths[0]),
    )
    with caplog.at_level(logging.WARNING, logger="kiln.curate"):
        tasks = plan_reads(inputs, None, 10**9)
    assert [(u.source, Path(u.path).name) for u in planned(tasks)] == [
        ("first", "f000.txt"),
        ("first", "f001.txt"),
        ("second", "f002.txt"),
    ]
    assert (
        "input 1" in caplog.text and "2 of its 3 files are already planned" in caplog.text and "input 2" in caplog.text
    )
    # one file through a link and through its own name: still once (paths are resolved)
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "same.txt").symlink_to(paths[2])
    units = planned(
        plan_reads(
            (text_input("web", tmp_path / "web" / "*.txt"), text_input("link", tmp_path / "link" / "*.txt")),
            None,
            10**9,
        )
    )
    assert len(units) == 3 and all(u.source == "web" for u in units)


def test_planned_paths_are_absolute_and_ids_stay_relative(tmp_path, monkeypatch):
    make_files(tmp_path / "data" / "web", 2, 10)
    monkeypatch.chdir(tmp_path)
    units = planned(
        plan_reads(
            (text_input("web", "data/web/*.txt"), InputConfig(source="docs", format="text", path="data")), None, 10**9
        )
    )
    assert [u.path for u in units] == [str(tmp_path.resolve() / "data" / "web" / f"f00{i}.txt") for i in range(2)]
    assert [u.name for u in units] == [
        "web/f000.txt",
        "web/f001.txt",
    ]  # the folder input's copies were dropped as repeats
    [unit] = planned(plan_reads((InputConfig(source="docs", format="text", path="data"),), None, 10**9))[:1]
    assert unit.name == "docs/web/f000.txt" and Path(unit.path).is_absolute()


# --- cutting tasks ------------------------------------------------------------------------------


def test_one_document_files_are_grouped_by_source_up_to_shard_bytes(tmp_path):
    make_files(tmp_path / "a", 5, 100)
    make_files(tmp_path / "b", 2, 100)
    tasks = plan_reads((text_input(None, tmp_path / "*" / "*.txt"),), None, 250)
    assert [(t.index, t.input_index, [u.name for u in t.units], t.size) for t in tasks] == [
        (0, 0, ["a/a/f000.txt", "a/a/f001.txt"], 200),
        (1, 0, ["a/a/f002.txt", "a/a/f003.txt"], 200),
        (2, 0, ["a/a/f004.txt"], 100),
        (3, 0, ["b/b/f000.txt", "b/b/f001.txt"], 200),  # a new source starts a new task
    ]
    assert task_paths(tasks[0]) == [str(tmp_path / "a" / "f000.txt"), str(tmp_path / "a" / "f001.txt")]


def test_containers_are_one_task_each_and_parquet_splits_by_row_groups(tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "a.jsonl").write_bytes(b'{"text": "x"}\n' * 10)
    table = pa.table({"text": [f"row {i} " * 50 for i in range(100)]})
    pq.write_table(table, tmp_path / "web" / "b.parquet", row_group_size=10)
    meta = pq.read_metadata(tmp_path / "web" / "b.parquet")
    group_bytes = [
        sum(meta.row_group(i).column(j).total_compressed_size for j in range(meta.num_columns)) for i in range(10)
    ]
    tasks = plan_reads((InputConfig(source="web", path=str(tmp_path / "web")),), None, 2 * max(group_bytes) + 1)
    assert [t.units[0].format for t in tasks] == ["jsonl"] + ["parquet"] * 5
    parquet_units = [t.units[0] for t in tasks[1:]]
    assert [u.row_groups for u in parquet_units] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert [u.first_row for u in parquet_units] == [0, 20, 40, 60, 80]
    assert sum(u.size for u in parquet_units) == sum(group_bytes)
    assert task_paths(tasks[1]) == [str(tmp_path / "web" / "b.parquet")]


def test_plans_do_not_depend_on_anything_but_inputs_cap_and_shard_bytes(tmp_path):
    make_files(tmp_path / "web", 30, 100)
    inputs = (text_input("web", tmp_path / "web" / "*.txt"),)
    first = plan_reads(inputs, 2000, 300)
    os.utime(tmp_path / "web" / "f000.txt")  # touching a file changes nothing
    assert plan_reads(inputs, 2000, 300) == first
