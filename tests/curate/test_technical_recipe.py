"""recipes/technical.yaml: well-formed technical text that the web rules drop is kept, the junk they
target still goes. Both configurations curate the same folder through the real pipeline."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kiln.core.docshards import list_shards, read_shard
from kiln.curate.config import CurateConfig
from kiln.curate.readers import InputConfig
from kiln.curate.run import run
from kiln.recipe import load_recipe

ENTRIES = [
    (
        "2.4.1-1",
        [
            "New upstream release.",
            "Fix a crash when the configuration file is empty (Closes: #1023344).",
            "Build with -O2 on all architectures.",
        ],
    ),
    (
        "2.4.0-2",
        [
            "Install the documentation into /usr/share/doc/libexample.",
            "Update the Standards-Version to 4.6.2, no changes needed.",
        ],
    ),
    (
        "2.4.0-1",
        [
            "New upstream release.",
            "Drop the patch for the old build system; upstream fixed it.",
            "Add a manual page for example-tool(1).",
        ],
    ),
    (
        "2.3.9-3",
        ["Depend on libfoo (>= 1.2.3.4) for the new parser.", "Run the test suite at build time, except on armel."],
    ),
]
CHANGELOG = "\n".join(
    f"libexample ({version}) unstable; urgency=medium\n\n"
    + "".join(f"  * {item}\n" for item in items)
    + f"\n -- Jane Packer <jane@packers.example.org>  Mon, 0{i + 1} Oct 2023 10:12:33 +0200\n"
    for i, (version, items) in enumerate(ENTRIES)
)
API = "\n".join(
    f"{signature}\n    {doc}\n"
    for signature, doc in [
        (
            "read_config(path: str, *, strict: bool = False) -> dict[str, Any]",
            (
                "Read the configuration file at path and return its sections as a dict; raises ValueError for an "
                "unknown key when strict."
            ),
        ),
        (
            "load_defaults() -> dict[str, Any]",
            "The settings used when no file is given, as a fresh dict the caller may change.",
        ),
        (
            "parse_overrides(items: list[str]) -> dict[str, str]",
            "Turn each KEY=VALUE item into an entry; an item without = is an error that names it.",
        ),
        (
            "merge(base: dict, *more: dict) -> dict",
            "A new dict with the keys of every mapping, later ones winning; nested sections merge key by key.",
        ),
        (
            "check_keys(values: Mapping[str, object], known: set[str]) -> None",
            "Raise KeyError listing every key of values that is not in known, sorted.",
        ),
    ]
)
OPTIONS = "OPTIONS\n" + "\n".join(
    f"  -{short}, --{long}\n      {what}\n"
    for short, long, what in [
        ("v", "verbose", "Print each file as it is copied."),
        ("n", "dry-run", "Show what would be done, and do nothing."),
        ("o DIR", "output DIR", "Write the results into DIR instead of the current folder."),
        ("q", "quiet", "Print nothing but errors."),
        ("f", "force", "Overwrite files that already exist in the output folder."),
        ("r", "recursive", "Copy folders and everything in them."),
        ("k", "keep", "Keep the source files after they have been copied."),
        ("t SEC", "timeout SEC", "Give up on a file after SEC seconds."),
    ]
)
README = (
    "Configuration\n\nThe tool reads a JSON file such as the one below from the folder it runs in.\n\n"
    '{\n  "workers": 4,\n  "cache": "/var/cache/example",\n  "retry": {"count": 3, "delay_s": 1.5}\n}\n\n'
    "Each key is optional. The workers key sets how many files are copied at the same time, and the cache key "
    "where the "
    "tool keeps what it has already seen, so that a second run skips those files. The retry section says how "
    "often a copy "
    "that failed is tried again and how long the tool waits in between. When the file is missing, the defaults "
    "are used "
    "and the tool says so once at the start.\n"
)
GOOD = {"changelog": CHANGELOG, "api": API, "options": OPTIONS, "readme": README}

rng = random.Random(7)
JUNK = {
    "gibberish": " ".join(
        "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(rng.randint(3, 9))) for _ in range(300)
    ),
    "keyword_spam": " ".join(
        ["cheap watches", "best cheap watches", "buy cheap watches online", "cheap watches sale"] * 40
    ),
    "html_soup": "\n".join(
        f'<div class="nav-{i}"><ul><li><a href="/p/{i}">{i}</a></li><li><a href="/q/{i}">&raquo;</a></li></ul></div>'
        for i in range(60)
    ),
    "repeated_lines": "\n".join(["Click here to subscribe to our newsletter for weekly updates and offers."] * 30),
    "too_short": "Thanks, that fixed it.",
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "tech"
    root.mkdir()
    for name, text in {**GOOD, **JUNK}.items():
        (root / f"{name}.txt").write_text(text, encoding="utf-8")
    return root


def curate(cfg: CurateConfig, folder: Path, run_dir: Path) -> tuple[set[str], dict[str, str]]:
    cfg = cfg.model_copy(
        update={
            "inputs": (InputConfig(path=str(folder), source="tech"),),
            "executor": cfg.executor.model_copy(update={"workers": 1}),
            "max_total_mb": None,
        }
    )
    run(cfg, run_dir)
    stage = run_dir / "curate"
    kept = {d.id.split("/")[-1].removesuffix(".txt") for p in list_shards(stage / "shards") for d in read_shard(p)}
    removed = {
        r["id"].split("/")[-1].removesuffix(".txt"): r["reason"]
        for r in pq.read_table(stage / "removed.parquet").to_pylist()
    }
    return kept, removed


def test_technical_settings_keep_technical_text_and_still_remove_junk(folder: Path, tmp_path: Path) -> None:
    kept, removed = curate(load_recipe("technical").curate, folder, tmp_path / "technical")
    assert kept == set(GOOD), removed
    assert set(removed) == set(JUNK), removed


def test_the_web_rules_drop_most_of_the_same_technical_text(folder: Path, tmp_path: Path) -> None:
    kept, removed = curate(CurateConfig(), folder, tmp_path / "web")
    assert len(set(GOOD) - kept) >= 3, (kept, removed)
    assert set(JUNK) <= set(removed), removed
