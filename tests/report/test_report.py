"""The run report on the miniature demo run (tests/conftest.py), on a run in progress, on damaged
files and on a synthetic run of a million steps; and the page in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from minidemo import OVERRIDES
from synthetic import write_run

from kiln.cli import main
from kiln.core.layout import audit_sample
from kiln.curate.steps.decontaminate import build_report as build_decontamination_report
from kiln.model.config import ModelConfig
from kiln.report.build import build_sections, watch
from kiln.report.run_files import Hooks, scan_run
from kiln.report_hooks import build_report
from kiln.train.config import TrainConfig
from kiln.train.parallel import ParallelConfig
from kiln.train_plan import plan_estimate

pytestmark = pytest.mark.slow  # the session's miniature demo run, a million-step run, a browser

SECTIONS = (
    "lineage",
    "funnel",
    "removals",
    "duplicates",
    "languages",
    "decontamination",
    "tokenizer",
    "mixture",
    "training",
    "evaluation",
    "samples",
    "throughput",
)
ARTIFACTS = Path(os.environ.get("KILN_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))


def section_html(page: str, sid: str) -> str:
    start = page.index(f'<section id="{sid}"')
    return page[start : page.index("</section>", start)]


@pytest.fixture(scope="module")
def report(demo_run: dict[str, Any]) -> dict[str, Any]:
    page_path = demo_run["run_dir"] / "report" / "index.html"  # the demo writes it last
    return {**demo_run, "page_path": page_path, "page": page_path.read_text(encoding="utf-8")}


def test_the_demo_writes_its_report_and_prints_the_path(report: dict[str, Any]) -> None:
    assert report["summary"]["report"] == str(report["page_path"])
    assert f"report: {report['page_path']}" in report["stdout"]
    for sid in SECTIONS:
        assert f'<section id="{sid}"' in report["page"], sid
    assert '<p class="missing">' not in report["page"]  # every stage finished: nothing shown as absent


def test_funnel_and_evaluation_agree_with_the_manifests(report: dict[str, Any]) -> None:
    page, m = report["page"], report["manifests"]
    counts = m["curate"]["counts"]
    assert f"{counts['docs_in']:,} documents in" in section_html(page, "funnel")
    for source, t in counts["per_source"].items():
        assert f'<td>{source}</td><td class="num">{t["docs_in"]:,}</td><td class="num">{t["docs_out"]:,}</td>' in page
    after = m["eval"]["counts"]["after"]["all"]
    assert f"{after['bpb']:,.4g}" in section_html(page, "evaluation")
    planned = section_html(page, "throughput")
    rss = m["train"]["counts"]["max_rss_mb"]  # since training started, not the demo process's whole life
    assert (
        100 < rss < 4096
        and f"the process&#x27;s peak resident memory was {rss / 1024:.2f} GiB" in planned
        and "GB (dp=1 tp=1 pp=1, ZeRO 0, fp32" in planned
    )
    lineage = section_html(page, "lineage")
    assert m["train"]["fingerprint"][:12] in lineage and m["curate"]["fingerprint"][:12] in lineage


def test_lineage_lists_the_stages_in_the_order_the_run_made_them(report: dict[str, Any]) -> None:
    # The order is kiln.verbs' (the demo's); the rows used to follow the folders' names: curate, eval, export,
    # generate...
    lineage = section_html(report["page"], "lineage")
    rows = [
        lineage.index(f"<tr><td>{stage}</td>")
        for stage in ("curate", "tokenizer", "tokenize", "train", "eval", "generate", "export")
    ]
    assert rows == sorted(rows)


def test_removed_examples_carry_their_explanation(report: dict[str, Any]) -> None:
    removals = section_html(report["page"], "removals")
    ids = re.findall(r"\$ kiln curate --run demo --explain &#x27;([^&]+)&#x27;", removals)
    assert ids, "no example was explained"
    assert all(f"{i} (source " in removals for i in ids)  # explain's own first line, not an error
    assert "explain failed" not in removals


def test_languages_come_from_the_kept_documents(report: dict[str, Any]) -> None:
    per_source = report["manifests"]["curate"]["counts"]["per_source"]
    english = sum(t["stats"].get("language:en", 0) for t in per_source.values())
    assert 0 < english <= sum(t["docs_out"] for t in per_source.values())
    assert f"en {per_source['prose']['stats']['language:en']:,}" in section_html(report["page"], "languages")


def test_removed_examples_are_shown_redacted(report: dict[str, Any], tmp_path: Path) -> None:
    run = tmp_path / "demo"
    shutil.copytree(report["run_dir"] / "curate", run / "curate")
    sample = next((run / "curate" / "audit" / "samples").glob("*/*.jsonl"))
    entry = json.loads(sample.read_text().splitlines()[0])
    secret = "Write to maria.lopez@fastmail.fm or call +1 415-555-2671; card 4111 1111 1111 1111."
    sample.write_text(json.dumps({**entry, "id": "aaa-planted", "text": secret}) + "\n" + sample.read_text())
    page = build_report(run).read_text()
    assert "maria.lopez@fastmail.fm" not in page and "4111 1111 1111 1111" not in page
    assert "Write to &lt;EMAIL&gt; or call" in page


def test_a_run_in_progress_shows_what_exists_and_when_it_was_built(report: dict[str, Any], tmp_path: Path) -> None:
    run = tmp_path / "demo"
    for stage in ("curate", "tokenizer", "tokenize"):
        shutil.copytree(report["run_dir"] / stage, run / stage)
    partial = run / "train.partial"
    partial.mkdir()
    (partial / "in_progress.json").write_text("{}")
    lines = (report["run_dir"] / "train" / "metrics.jsonl").read_text().splitlines()[:25]
    (partial / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 24, "loss": 5.')  # a line cut mid-write
    steps = sum('"loss_by_source"' in line for line in lines)
    (run / "train.lock").write_text(json.dumps({"host": "here", "pid": os.getpid()}))  # the trainer holds its stage
    page = build_report(run).read_text()
    assert "; train in progress" in page and re.search(r"built \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page)
    training = section_html(page, "training")
    assert (
        f"Training in progress: {steps} steps so far" in training
        and "1 line(s) of metrics.jsonl are not JSON records" in training
        and "<polyline" in training
    )
    assert "No evaluation yet" in section_html(page, "evaluation")
    (run / "train.lock").unlink()  # the trainer died without finishing
    assert f"Training interrupted: {steps} steps so far" in build_report(run).read_text()


def test_damaged_files_are_named_not_raised(report: dict[str, Any], tmp_path: Path) -> None:
    run = tmp_path / "demo"
    for stage in ("curate", "tokenizer"):
        shutil.copytree(report["run_dir"] / stage, run / stage)
    (run / "tokenizer" / "report.json").write_text("{not json")
    (run / "curate" / "clusters.parquet").write_bytes(b"PAR1 truncated")
    (run / "eval").mkdir()
    (run / "eval" / "manifest.json").write_text("")
    page = build_report(run).read_text()
    assert "report.json: not readable as JSON" in page and "manifest.json: not readable as JSON" in page
    assert "clusters.parquet could not be read" in section_html(page, "duplicates") and "<svg" in section_html(
        page, "removals"
    )
    assert (
        f"{report['manifests']['tokenize']['counts']['train_tokens']:,}" not in page
    )  # nothing invented for stages absent
    assert [s.id for s in build_sections(scan_run(run), Hooks())] == list(SECTIONS)
    (run / "curate" / "removed.parquet").write_bytes(b"PAR1 truncated")  # any other failure costs its sections only
    page = build_report(run).read_text()
    assert (
        "This section could not be built: ArrowInvalid" in section_html(page, "languages")
        and "Byte-level BPE" not in page
        and "report.json: not readable" in page
    )


def test_decontamination_findings_multiple_choice_accuracy_and_a_vocabulary_sweep_are_shown(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    for stage in ("curate", "tokenizer", "tokenize", "train"):
        shutil.copytree(report["run_dir"] / stage, runs / "demo" / stage)
    removed = pq.read_table(runs / "demo" / "curate" / "removed.parquet").to_pylist()[:3]
    index = {
        "mode": "exact",
        "ngram": 13,
        "action": "remove",
        "fold_digits": False,
        "sets": [{"name": "mmlu", "items": 100, "items_too_short": 2, "ngrams": 5000}],
    }
    rows = [{"set": "mmlu", "item": 7, "id": r["id"], "source": r["source"]} for r in removed]
    (runs / "demo" / "curate" / "audit" / "decontamination.json").write_text(
        json.dumps(build_decontamination_report(index, rows))
    )
    task = tmp_path / "py_choices.jsonl"
    task.write_text(
        "".join(
            json.dumps({"context": c, "choices": ch, "label": 0}) + "\n"
            for c, ch in [("import", [" os", " the"]), ("def main(", ["):", " cat"]), ("for i in", [" range", " mat"])]
        )
    )
    assert (
        main(
            [
                "eval",
                "--task",
                str(task),
                "--set",
                f"runs_dir={runs}",
                *(f"--set={o}" for o in OVERRIDES if o.startswith("eval.")),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "train-tokenizer",
                "--sweep",
                "384",
                "--set",
                f"runs_dir={runs}",
                *(f"--set={o}" for o in OVERRIDES if o.startswith(("tokenizer.", "curate."))),
            ]
        )
        == 0
    )
    capsys.readouterr()
    page = build_report(runs / "demo").read_text()
    found = section_html(page, "decontamination")
    assert (
        '<td>mmlu</td><td class="num">100</td><td class="num">2</td><td class="num">1</td><td class="num">3</td>'
        in found
    )
    assert all(
        f"{r['id']} (source {r['source']}) was removed by step" in found for r in removed
    )  # each holder with its explanation
    accuracy = json.loads((runs / "demo" / "eval" / "manifest.json").read_text())["counts"]["tasks"]["py_choices"]
    assert f'<td>py_choices</td><td class="num">3</td><td class="num">{accuracy["acc"]:,.4g}</td>' in section_html(
        page, "evaluation"
    )
    sweep = json.loads((runs / "demo" / "tokenizer-sweep" / "manifest.json").read_text())["counts"]["bytes_per_token"]
    assert f'<td class="num">384</td><td class="num">{sweep["384"]:,.4g}</td>' in section_html(page, "tokenizer")


def test_odd_source_and_reason_names_keep_their_examples(tmp_path: Path) -> None:
    run = write_run(tmp_path / "odd", steps=20, sources=2, eval_every=10, windows=2)
    manifest_path = run / "curate" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    per_source = manifest["counts"]["per_source"]
    per_source["web[1]*"] = {**per_source.pop("source000"), "removed": {"odd:r[1]**": 2}}
    manifest["counts"]["removed"] = dict(
        sum((Counter(t["removed"]) for t in per_source.values()), Counter())
    )  # curate's totals, kept consistent
    manifest_path.write_text(json.dumps(manifest))
    sample = audit_sample(run / "curate", "web[1]*", "odd:r[1]**")
    sample.parent.mkdir(parents=True)
    sample.write_text(
        json.dumps(
            {
                "id": "doc<1>",
                "source": "web[1]*",
                "step": "odd",
                "reason": "odd:r[1]**",
                "value": 3.0,
                "threshold": 5.0,
                "text": "<b>bold</b> text",
            }
        )
        + "\n"
    )
    removals = section_html(build_report(run).read_text(), "removals")
    assert "doc&lt;1&gt;" in removals and "&lt;b&gt;bold&lt;/b&gt; text" in removals and "3 (limit 5)" in removals


def test_the_planner_column_follows_the_runs_layout() -> None:
    manifest = {
        "config": {"train": TrainConfig(seq_len=256, micro_batch_size=4).model_dump(mode="json")},
        "model": ModelConfig(
            vocab_size=1024, d_model=128, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=256
        ).model_dump(mode="json"),
        "counts": {"processes": 2, "device": "cpu", "flops_per_token": 1000, "tokens_trained": 10**6},
    }
    sharded, replicated = (
        plan_estimate(ParallelConfig(dp_shard=2), manifest),
        plan_estimate(ParallelConfig(dp_replicate=2, dp_shard=1), manifest),
    )
    assert (
        "ZeRO 3" in sharded["layout"]
        and "ZeRO 0" in replicated["layout"]
        and sharded["memory_gb"] < replicated["memory_gb"]
    )
    assert sharded["train_flops"] == 10**9 and "needs a GPU's dense peak" in sharded["time_note"]
    # A run that recorded its mesh is planned as it ran, whatever the recipe's section says now.
    manifest["counts"]["parallel"] = {"dp_replicate": 1, "dp_shard": 1, "tp": 2}
    split = plan_estimate(ParallelConfig(dp_shard=2), manifest)
    assert "dp=1 tp=2 pp=1, ZeRO 0" in split["layout"] and split["memory_gb"] < replicated["memory_gb"]


def test_a_million_steps_and_a_hundred_sources_make_a_small_page_quickly(tmp_path: Path) -> None:
    run = write_run(tmp_path / "big", steps=1_000_000, sources=100)
    t0 = time.perf_counter()
    page_path = build_report(run)
    seconds = time.perf_counter() - t0
    size = page_path.stat().st_size
    assert size < 3 * 2**20, size  # measured 0.24 MB
    assert seconds < 60, seconds  # measured 4 s on 2 idle cores
    page = page_path.read_text()
    assert "step 333333: loss spike" in page and "step 666666: loss is nan" in page  # both rollbacks marked
    assert (
        "s at 40% MFU (kiln plan&#x27;s default)" in page and "NVIDIA H100 80GB HBM3 x 8" in page
    )  # the planner's time where the peak is known
    assert page.count("<tr>") < 2000 and 'data-page="20"' in page  # tables page themselves


def test_report_verb_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--run", "nowhere", "--set", f"runs_dir={tmp_path}"]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["report", "--run", "x", "--watch", "0", "--set", f"runs_dir={tmp_path}"]) == 2
    assert "--watch 0" in capsys.readouterr().err
    run = write_run(tmp_path / "small", steps=20, sources=2, eval_every=10, windows=2)
    assert main(["report", "--run", "small", "--set", f"runs_dir={tmp_path}"]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report" / "index.html")


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium, installed here when missing (as root, with apt-get); else a skip that says why."""
    path = shutil.which("chromium")
    if path is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, timeout=900)
        path = shutil.which("chromium")
    if path is None:
        pytest.skip("no chromium and it could not be installed (needs root and apt-get with Debian's package lists)")
    return path


def test_the_demo_report_renders_in_chromium_with_every_section_and_chart(
    report: dict[str, Any], chromium: str
) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is in the dev extras: pip install -e '.[dev]'"
    )
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(report["page_path"].as_uri())
        found = page.evaluate("""() => Array.from(document.querySelectorAll('section')).map(s => ({
            id: s.id, text: s.innerText.trim().length,
            charts: s.querySelectorAll('svg.chart').length,
            drawn: Array.from(s.querySelectorAll('svg.chart'))
              .map(c => c.querySelectorAll('polyline, circle, rect.bar').length)}))""")
        pager = page.locator(".pager").count()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        browser.close()
    assert errors == []
    assert [s["id"] for s in found] == list(SECTIONS)
    assert all(s["text"] > 40 for s in found), found
    by_id = {s["id"]: s for s in found}
    for sid in ("funnel", "removals", "mixture", "training"):
        assert by_id[sid]["charts"] >= 1 and all(n > 0 for n in by_id[sid]["drawn"]), by_id[sid]
    assert pager >= 1  # the removal reasons table pages
    assert (ARTIFACTS / "report.png").stat().st_size > 50_000


def test_watch_rebuilds_the_page_as_the_run_grows(tmp_path: Path) -> None:
    run = write_run(tmp_path / "small", steps=50, sources=3, eval_every=10, windows=5)
    page = run / "report" / "index.html"
    watch(run, Hooks(), every_s=0.01, rounds=1)
    first = page.read_text()
    with open(run / "train" / "metrics.jsonl", "a", encoding="utf-8") as f:  # the run goes on
        f.write(
            json.dumps(
                {
                    "step": 40,
                    "kind": "rollback",
                    "rollback": {
                        "at_step": 45,
                        "to_step": 40,
                        "reason": "gradient norm is inf",
                        "rows": [7],
                        "sources": ["source001"],
                    },
                }
            )
            + "\n"
        )
    watch(run, Hooks(), every_s=0.01, rounds=2)
    assert "gradient norm is inf" not in first and "step 45: gradient norm is inf" in page.read_text()
    assert [p.name for p in (run / "report").iterdir()] == [
        "index.html"
    ]  # written whole, then renamed: no temporary left


def test_documents_removed_as_unsafe_are_shown_masked_with_their_scores(tmp_path: Path) -> None:
    run = write_run(tmp_path / "unsafe", steps=20, sources=1, eval_every=10, windows=2)
    manifest_path = run / "curate" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    [(source, tally)] = manifest["counts"]["per_source"].items()
    tally["removed"] = {"bad_words:listed_word": 1, "classifiers:toxicity.toxic": 1}
    manifest["counts"]["removed"] = dict(tally["removed"])
    manifest_path.write_text(json.dumps(manifest))
    spam = "Free hot videos now! Watch the filthiest clips at no cost."
    for reason, value, threshold in (("bad_words:listed_word", 1.0, None), ("classifiers:toxicity.toxic", 0.97, 0.5)):
        sample = audit_sample(run / "curate", source, reason)
        sample.parent.mkdir(parents=True, exist_ok=True)
        row = {"id": f"{reason}-doc", "source": source, "step": reason.split(":")[0], "reason": reason}
        sample.write_text(json.dumps({**row, "value": value, "threshold": threshold, "text": spam}) + "\n")
    removals = section_html(build_report(run).read_text(), "removals")
    assert "F*** h** v***** n**! W**** t** f******** c**** a* n* c***." in removals
    assert "filthiest" not in removals and "text (masked: removed as unsafe)" in removals
    assert "0.97 (limit 0.5)" in removals
