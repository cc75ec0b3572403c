"""A small curated run shared by the tokenize stage tests: real text, built once per session."""

from __future__ import annotations

import pydoc_data.topics
import shutil
import sysconfig
from pathlib import Path

import pytest

from kiln.curate.config import CurateConfig, InputConfig
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
        inputs=(InputConfig(source="code", reader="text_files", path=str(root / "code" / "*.py")), InputConfig(source="prose", reader="text_files", path=str(root / "prose" / "*.txt"))),
        shard_mb=0.1,
        workers=1,
    )
    curate(cfg, root / "run")
    return root / "run"
