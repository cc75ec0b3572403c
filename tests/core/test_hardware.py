"""kiln.core.hardware's memory side: MemAvailable read from /proc/meminfo, a container's cgroup
limit taking precedence when it leaves less, and the one-line refusal naming both sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.core.errors import FatalError
from kiln.core.hardware import available_memory, check_memory

MEMINFO = (
    "MemTotal:       24683656 kB\nMemFree:        19805008 kB\nMemAvailable:   22597668 kB\nBuffers:          120000 "
    "kB\n"
)


def test_available_memory_is_meminfos_memavailable(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO)
    assert available_memory(tmp_path / "meminfo", tmp_path / "no-cgroup") == 22597668 * 1024


def test_a_cgroup_limit_that_leaves_less_wins(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("8589934592\n")  # an 8 GiB container, 3 GiB of it in use
    (cgroup / "memory.current").write_text("3221225472\n")
    assert available_memory(tmp_path / "meminfo", cgroup) == 5 * 2**30
    (cgroup / "memory.max").write_text("max\n")  # no limit: the host's figure
    assert available_memory(tmp_path / "meminfo", cgroup) == 22597668 * 1024


def test_without_meminfo_the_free_pages_are_counted(tmp_path: Path) -> None:
    found = available_memory(tmp_path / "no-meminfo", tmp_path / "no-cgroup")
    assert found is not None and found > 0
    assert available_memory() > 0  # this machine's own  # type: ignore[operator]


def test_check_memory_names_what_needs_how_much_and_what_is_there() -> None:
    check_memory("a model", 1e9, 2e9, "this machine", "use less")
    check_memory("a model", 1e15, None, "this machine", "use less")  # unknown: not checked
    with pytest.raises(
        FatalError, match=r"^a model needs 1,500.0 GB of memory and this machine has 2.5 GB available; use less$"
    ):
        check_memory("a model", 1.5e12, 2.5e9, "this machine", "use less")
