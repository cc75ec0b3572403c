"""The tree is kept in ruff's format and lint (pyproject.toml's [tool.ruff]: lines at most 120
characters, imports sorted, pyflakes), so a change that breaks either fails the suite, not a
reviewer's eye. Run `ruff format src tests benchmarks` and `ruff check --fix src tests benchmarks`
to put a change right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["src", "tests", "benchmarks"]


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_the_tree_is_in_ruffs_format_and_lint(command: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", *command, *TREES], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout[-3000:]}{done.stderr[-1000:]}"
