"""A small curated run shared by the tokenize stage tests: real text, built once per session."""

from __future__ import annotations

import pydoc_data.topics
import shutil
import sysconfig
from pathlib import Path

import pytest

from kiln.curate.config import CurateConfig, InputConfig

# These tests are about tokens, not filtering: the prose rules would drop Python docs topics
# (curly braces, short lines) and cut license lines shared by many files. Normalization, PII,
# length limits and exact dedup still run.
ONLY_BASIC_STEPS = {
    step: {"enabled": False}
    for step in ("line_dedup", "language", "gopher_repetition", "gopher_quality", "c4", "fineweb", "code_quality")
}
from kiln.curate.run import run as curate


@pytest.fixture(scope="session")
def curated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~700 KB of real text as files (40 stdlib modules, 50 Python docs topics), curated into <tmp>/run.

    Ids are relative to each glob's folder, so they (and the held-out split) do not depend on
    where pytest puts its temporary folders. Tests copy this run before adding stages to it.
    """
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    (root / "code").mkdir()
    (root / "prose").mkdir()
    for p in [p for p in sorted(stdlib.glob("*.py")) if 2_000 < p.stat().st_size < 20_000][:40]:
        shutil.copy(p, root / "code" / p.name)
    for name in sorted(pydoc_data.topics.topics)[:50]:
        (root / "prose" / f"{name}.txt").write_text(pydoc_data.topics.topics[name], encoding="utf-8")
    cfg = CurateConfig(
        inputs=(
            InputConfig(source="code", format="text", path=str(root / "code" / "*.py")),
            InputConfig(source="prose", format="text", path=str(root / "prose" / "*.txt")),
        ),
        shard_mb=0.1,
        executor={"workers": 1},
        **ONLY_BASIC_STEPS,
    )
    curate(cfg, root / "run")
    return root / "run"
