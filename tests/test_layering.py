"""The package layering docs/architecture.md's layout section describes, checked on the source with `ast`.

Stage packages (curate, tokenize, mix, train, evaluate, plan, report) may import from the shared
layers (core, text, model) and from their own modules, never from another stage's modules; the
shared layers import no stage, and core imports neither text nor model. Files between stages
(manifests, shards, checkpoints) are the contract; the top-level modules (cli, verbs, stages,
demo, recipe, sweep, ...) wire stages together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kiln

SRC = Path(kiln.__file__).parent
STAGES = ("curate", "tokenize", "mix", "train", "evaluate", "plan", "report")
# What each shared layer may import besides itself.
SHARED = {"core": set(), "text": {"core"}, "model": {"core", "text"}}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every kiln import in the file, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(("kiln", *path.relative_to(SRC).with_suffix("").parts[:-1]))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from kiln.x import y` may name a module y: count it as an import of kiln.x.y too.
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return [(line, m) for line, m in found if m == "kiln" or m.startswith("kiln.")]


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (parts[1] in STAGES or parts[1] in SHARED) else None


def offending_edges() -> list[str]:
    edges = []
    for path in sorted(SRC.rglob("*.py")):
        own = layer(".".join(("kiln", *path.relative_to(SRC).with_suffix("").parts)))
        if own is None:
            continue  # kiln/cli.py, verbs.py, stages.py, recipe.py, ...: the wiring above the stages
        allowed = {own} | (SHARED[own] if own in SHARED else set(SHARED))
        reported = set()  # one edge per import statement (its module, not each name it imports)
        for line, module in imports(path):
            target = layer(module)
            if target is not None and target not in allowed and line not in reported:
                reported.add(line)
                edges.append(f"{path.relative_to(SRC.parent)}:{line} imports {module} ({own} -> {target})")
    return edges


def test_no_stage_imports_another_stage_and_shared_layers_import_no_stage() -> None:
    edges = offending_edges()
    assert not edges, "imports across the layering:\n  " + "\n  ".join(edges)


def test_curate_dedup_imports_nothing_from_curate_steps() -> None:
    # dedup holds the data structures (n-gram index, Bloom filter) that steps build on: steps import dedup, never back.
    dedup = sorted((SRC / "curate" / "dedup").rglob("*.py"))
    edges = sorted(
        {
            f"{p.relative_to(SRC.parent)}:{line}"
            for p in dedup
            for line, m in imports(p)
            if m.startswith("kiln.curate.steps")
        }
    )
    assert not edges, "curate/dedup imports curate/steps at:\n  " + "\n  ".join(edges)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from kiln.train.loop import train\n", ["kiln.train.loop", "kiln.train.loop.train"]),
        ("from . import shards\n", ["kiln.curate", "kiln.curate.shards"]),
        ("import kiln.model.config as c\n", ["kiln.model.config"]),
    ],
)
def test_imports_are_read_with_relative_ones_resolved(tmp_path: Path, source: str, expected: list[str]) -> None:
    # A file placed as if it were kiln/curate/x.py, so relative imports resolve against kiln.curate.
    fake = SRC / "curate" / "_layering_probe.py"
    fake.write_text(source)
    try:
        assert [m for _, m in imports(fake)] == expected
    finally:
        fake.unlink()


def test_an_upward_import_is_reported_with_its_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = SRC / "core" / "_layering_probe.py"
    probe.write_text("from kiln.train.checkpoint import save_checkpoint\n")
    try:
        edges = offending_edges()
    finally:
        probe.unlink()
    assert any("kiln/core/_layering_probe.py:1 imports kiln.train.checkpoint (core -> train)" in e for e in edges)
