"""Harmful-content filters: what they remove of planted unsafe documents and of clean text, how fast they run,
and what they cost the default curation pipeline.

Removal (tests/curate/safety_measure.py): planted adult spam, abusive comments and gambling spam in en, fr, de
and es (tests/curate/safety_corpus.py, `--per-kind` documents of each kind and language, seed 2) among clean
text of this machine (/usr/share/doc, pydoc topics, program messages in en, fr, de, es: `--clean-mb`, the half
not trained on), curated by the default URL and bad-words steps and a classifier trained by
`kiln quality train-labels` on seed 1's planted documents and the other clean half (removing at P >= 0.5).
Speed: each step over the held-out documents, one core, best of `--repeats` (bad words with its word split,
which the pipeline shares with the Gopher rules). Cost: `kiln curate` of the demo recipe's corpus
(`--demo-mb`, one worker) with the default steps against the same run with the URL word lists and bad words off,
best of `--repeats` each, alternating; and what bad words removed there (clean text).
Ends with: RESULT planted_removed=.. clean_removed=.. url_mb_s=.. bad_words_mb_s=.. classifier_mb_s=..
default_mb_s=.. without_mb_s=.. throughput_ratio=..
Usage: .venv/bin/python benchmarks/safety_filters.py [--per-kind 40] [--clean-mb 8] [--demo-mb 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "curate"), str(HERE.parent / "tests")]

from safety_measure import measure  # noqa: E402

from kiln.cli import main  # noqa: E402
from kiln.core.docshards import list_shards, read_shard  # noqa: E402
from kiln.curate.audit import Ledger  # noqa: E402
from kiln.curate.steps.bad_words import BadWords, BadWordsConfig  # noqa: E402
from kiln.curate.steps.labels import ClassifiersConfig, LabelFilters  # noqa: E402
from kiln.curate.steps.url import URLFilter, URLFilterConfig  # noqa: E402


def best_seconds(run: object, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best


def step_speeds(stage: Path, model: Path, repeats: int) -> dict[str, float]:
    """MB/s of each step over the held-out documents as curate read them (meta.url and meta.language set)."""
    docs = [d for p in list_shards(stage / "shards") for d in read_shard(p)]
    mb = sum(len(d.text.encode()) for d in docs) / 1e6
    url, words = URLFilter(URLFilterConfig()), BadWords(BadWordsConfig())
    classifier = LabelFilters(ClassifiersConfig(models={"unsafe": {"model": str(model)}}))

    def fresh() -> list:
        return [d.with_text(d.text + " ") for d in docs]  # no cached words or scores from an earlier pass

    def url_pass() -> None:
        list(url.process(docs, Ledger()))

    def words_pass() -> None:
        list(words.process(fresh(), Ledger()))

    def classifier_pass() -> None:
        batch = fresh()
        classifier.prepare(batch)
        list(classifier.process(batch, Ledger()))

    return {
        name: round(mb / best_seconds(run, repeats), 2)
        for name, run in (("url", url_pass), ("bad_words", words_pass), ("classifier", classifier_pass))
    }


def pipeline_speed(root: Path, demo_mb: float, repeats: int) -> tuple[float, float]:
    """MB/s of `kiln curate --recipe demo` with the default steps, and with the URL word lists and bad words off."""
    common = ["--set", f"curate.max_total_mb={demo_mb}", "--set", "curate.executor.workers=1", "--force"]
    without = ["--set", "curate.url_filter.shipped_words=false", "--set", "curate.bad_words.enabled=false"]
    times: dict[str, float] = {"default": float("inf"), "without": float("inf")}
    for _ in range(repeats):
        for name, extra in (("default", []), ("without", without)):
            args = ["curate", "--recipe", "demo", "--set", f"runs_dir={root}/speed-{name}", *common, *extra]
            t0 = time.perf_counter()
            assert main(args) == 0
            times[name] = min(times[name], time.perf_counter() - t0)
    return demo_mb / times["default"], demo_mb / times["without"]


def bad_words_on_demo(root: Path) -> tuple[int, int]:
    """(documents bad words removed, documents that reached it) in the default run of the demo's corpus."""
    manifest = json.loads((root / "speed-default" / "demo" / "curate" / "manifest.json").read_text())
    reached = removed = 0
    for tally in manifest["counts"]["per_source"].values():
        rows = list(tally["funnel"].items())  # in chain order: the row before is what reached the step
        for (_, before), (name, after) in zip(rows, rows[1:]):
            if name == "prose/bad_words":
                reached += before["docs"]
                removed += before["docs"] - after["docs"]
    return removed, reached


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-kind", type=int, default=40)
    parser.add_argument("--clean-mb", type=float, default=8.0)
    parser.add_argument("--demo-mb", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kiln-safety-"))
    found = measure(root, args.per_kind, args.clean_mb)
    planted, clean = found["planted_removed"] / found["planted"], found["clean_removed"] / found["clean"]
    model = root / "runs" / "held" / "quality" / "labels" / "unsafe"
    speeds = step_speeds(found["stage"], model, args.repeats)
    default, without = pipeline_speed(root, args.demo_mb, args.repeats)
    print(f"planted unsafe removed: {found['planted_removed']} of {found['planted']} ({planted:.1%})")
    print("  by kind: " + ", ".join(f"{k} {v:.1%}" for k, v in found["by_kind"].items()))
    print("  by language: " + ", ".join(f"{k} {v:.1%}" for k, v in found["by_language"].items()))
    print("  by step: " + ", ".join(f"{k} {v}" for k, v in sorted(found["by_reason"].items())))
    print(f"clean removed: {found['clean_removed']} of {found['clean']} ({clean:.2%}) {found['clean_reasons']}")
    heldout = found["classifier_heldout"]
    print(f"classifier held out: precision {heldout['precision']:.3f}, recall {heldout['recall']:.3f}")
    print("step speed (MB/s, one core): " + ", ".join(f"{k} {v}" for k, v in speeds.items()))
    print(f"default pipeline: {default:.2f} MB/s; without the URL word lists and bad words: {without:.2f} MB/s")
    removed, reached = bad_words_on_demo(root)
    print(f"demo corpus ({args.demo_mb:g} MB): bad words removed {removed} of the {reached} documents reaching it")
    print(
        f"RESULT planted_removed={planted:.4f} clean_removed={clean:.4f} url_mb_s={speeds['url']} "
        f"bad_words_mb_s={speeds['bad_words']} classifier_mb_s={speeds['classifier']} default_mb_s={default:.2f} "
        f"without_mb_s={without:.2f} throughput_ratio={default / without:.3f}"
    )


if __name__ == "__main__":
    main_()
