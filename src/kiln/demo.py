"""`kiln demo`: every stage of kiln.verbs' demo order on one recipe, then `<run>/summary.json`.

Each stage is skipped when current (its manifest says so); a stage whose inputs changed is redone,
and so are the stages after it. The summary is read from the stages' manifests: documents kept
and removed, the tokenizer's bytes per token, the model's size and tokens, validation loss and
bits per byte before and after training, a sample, the exported folder, and what the corpus
files did since the last demo. The model must visibly learn: a loss that fell less than
MIN_LOSS_DROP ends the summary with a warning.
Not handled here: the stages themselves (kiln.stages), the HTML page (kiln.report_hooks builds
it; a page that fails costs no finished stage).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from kiln.core.errors import FatalError
from kiln.core.layout import CURATE, EXPORT, RunLayout
from kiln.core.mirror import push, refresh
from kiln.recipe import Recipe
from kiln.report_hooks import build_report
from kiln.stages import run_stage
from kiln.verbs import DEMO_STAGES

log = logging.getLogger("kiln")

# The model must visibly learn: final validation loss at least this fraction below step 0's.
MIN_LOSS_DROP = 0.30


def corpus_files(curate_dir: Path) -> dict[str, dict[str, Any]]:
    """The files a finished curate stage read, path -> {bytes, sha256} (its manifest's inputs); {} before any."""
    path = Path(curate_dir) / "manifest.json"
    return {i["path"]: i for i in json.loads(path.read_text())["inputs"]} if refresh(path) else {}


def corpus_changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the demo read this time against the last time: the files and bytes, and which changed, came or went."""
    changed = sorted(p for p in before.keys() & after.keys() if before[p] != after[p])
    added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    since = None
    if before:
        since = {
            "changed": len(changed),
            "added": len(added),
            "removed": len(removed),
            "examples": (changed + added + removed)[:5],
        }
    return {"files": len(after), "bytes": sum(i["bytes"] for i in after.values()), "since_last_demo": since}


def run_demo(recipe: Recipe, force: bool = False) -> dict[str, Any]:
    """Every stage in order, each skipped when current; a stage whose inputs changed is redone, and
    so are the stages after it (a finished training run of other data is moved aside, kept)."""
    layout = RunLayout(recipe.run_dir)
    read_before = corpus_files(layout.stage(CURATE))  # what the last demo read, to say what changed since
    manifests = {}
    for verb in DEMO_STAGES:
        try:
            manifests[verb.stage] = run_stage(verb, recipe, force)
        except FatalError as e:
            if verb.stage != EXPORT:
                raise
            log.warning("demo: not exported: %s", e)  # a model option transformers' Llama and Qwen3 lack
    summary = build_summary(manifests)
    # files, sizes and sha256: curate/manifest.json
    summary["corpus"] = corpus_changes(read_before, corpus_files(layout.stage(CURATE)))
    try:  # the page reads the stages' files, not summary.json; a page that fails costs no finished stage
        summary["report"] = str(build_report(recipe.run_dir))
    except Exception as e:  # noqa: BLE001 - reported, and `kiln report` can be run again
        log.warning(
            "demo: the report was not written: %s; run `kiln report --run %s` for the error in full",
            e,
            recipe.run_dir.name,
        )
        summary["report"] = None
    layout.summary_json.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    push(layout.summary_json)
    log.info("demo: summary written to %s", layout.summary_json)
    return summary


def build_summary(m: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The demo's figures from its stages' manifests (stage folder -> manifest)."""
    curated, train = m["curate"]["counts"], m["train"]["counts"]
    before, after = m["eval"]["counts"]["before"], m["eval"]["counts"]["after"]
    summary = {
        "docs_in": curated["docs_in"],
        "docs_out": curated["docs_out"],
        "removed": curated["removed"],
        "quarantined": curated["quarantined"],
        "per_source": {
            s: {k: t[k] for k in ("docs_in", "docs_out", "removed", "quarantined")}
            for s, t in curated["per_source"].items()
        },
        # None: not measured (a tokenizer imported with a model)
        "tokenizer_bytes_per_token": m["tokenizer"]["counts"].get("heldout_bytes_per_token"),
        "train_tokens_available": m["tokenize"]["counts"]["train_tokens"],
        "params": train["params"],
        "tokens_trained": train["tokens_trained"],
        "val_loss_before": before["all"]["loss"],
        "val_loss_after": after["all"]["loss"],
        "val_bpb_before": {**{s: r["bpb"] for s, r in before["sources"].items()}, "all": before["all"]["bpb"]},
        "val_bpb_after": {**{s: r["bpb"] for s, r in after["sources"].items()}, "all": after["all"]["bpb"]},
        "sample": m["generate"]["counts"]["sample"],
        "hf_folder": m["export"]["counts"]["folder"] if "export" in m else None,
        "previous_train_run": train.get("previous_run"),  # a finished run of other inputs or settings, moved aside
    }
    drop = 1 - after["all"]["loss"] / before["all"]["loss"]
    summary["val_loss_drop"] = round(drop, 4)
    summary.update(learned(m["train"], drop))
    return summary


def learned(train_manifest: dict[str, Any], drop: float) -> dict[str, Any]:
    """Whether the model learned, and the figures that say so: the validation loss's drop; for an
    objective other than next-token prediction its own held-out loss; for continued pretraining
    whether this run's own sources gained."""
    train, found = train_manifest["counts"], {}
    objective = train["val_after"].get("objective")
    if objective is not None and train["val_before"]:
        # Not next-token prediction alone: the objective's own held-out loss says whether it learned.
        first = train["val_before"]["objective"]["loss"]
        name = train_manifest["config"]["train"]["objective"]
        found["objective"] = {"name": name, "loss_before": round(first, 5), "loss_after": round(objective["loss"], 5)}
        drop = 1 - objective["loss"] / first
    found["learned"] = drop >= MIN_LOSS_DROP
    if "val_change" in train:  # continued pretraining: it learned if this run's own sources gained
        found["val_change"] = train["val_change"]
        found["learned"] = all(c["change"] < 0 for s, c in train["val_change"].items() if "/" not in s)
    return found


def format_summary(s: dict[str, Any]) -> str:
    """What `kiln demo` prints: the summary, a line per figure."""
    lines = [
        corpus_line(s["corpus"]),
        f"documents: {s['docs_in']:,} in, {s['docs_out']:,} kept, {s['quarantined']} quarantined",
        "removed: " + (", ".join(f"{r}={n}" for r, n in s["removed"].items()) or "none"),
        f"tokenizer: {s['tokenizer_bytes_per_token']} bytes/token on held-out text"
        if s["tokenizer_bytes_per_token"]
        else "tokenizer: bytes/token not measured (no held-out documents)",
        f"model: {s['params']:,} params trained on {s['tokens_trained']:,} tokens",
    ]
    if s.get("previous_train_run"):
        lines.append(f"  the training run before it, of other data or settings, is kept in {s['previous_train_run']}")
    lines.append(
        f"validation loss: {s['val_loss_before']:.3f} -> {s['val_loss_after']:.3f} "
        f"nats/token ({100 * s['val_loss_drop']:.1f}% lower)"
    )
    for source, after in s["val_bpb_after"].items():
        lines.append(f"  bits/byte {source:<6} {s['val_bpb_before'][source]:.3f} -> {after:.3f}")
    if objective := s.get("objective"):
        before, after = objective["loss_before"], objective["loss_after"]
        lines.append(
            f"objective {objective['name']}: held-out loss {before:.3f} -> {after:.3f} nats "
            f"per target token ({1 - after / before:.1%} lower)"
        )
    if change := s.get("val_change"):
        lines.append("validation loss per source, from the starting model (negative: gained; positive: forgotten):")
        lines += [
            f"  {source:<12} {c['before']:.3f} -> {c['after']:.3f} ({c['change']:+.3f})" for source, c in change.items()
        ]
    lines.append(f"sample: {s['sample']!r}")
    if s.get("report"):
        lines.append(f"report: {s['report']} (open it in a browser)")
    if s["hf_folder"]:
        lines.append(f"Hugging Face folder: {s['hf_folder']} (AutoModelForCausalLM.from_pretrained loads it)")
    if not s["learned"] and change:
        lines.append("WARNING: this run's own sources did not all gain; train longer or raise train.optim.lr")
    elif not s["learned"]:
        lines.append(
            f"WARNING: the {'objective' if objective else 'validation'} loss fell less than "
            f"{MIN_LOSS_DROP:.0%}; train longer or raise train.optim.lr"
        )
    return "\n".join(lines)


def corpus_line(corpus: dict[str, Any]) -> str:
    """The first line of the summary: the files read, and what changed since the last demo."""
    since = corpus["since_last_demo"]
    read = (
        f"corpus: {corpus['files']:,} files, {corpus['bytes'] / 1e6:.1f} MB read (each "
        "with its size and sha256 in curate/manifest.json); "
    )
    if since is None:
        return read + "first demo of this run"
    if not any(since[k] for k in ("changed", "added", "removed")):
        return read + "unchanged since the last demo"
    examples = ", ".join(since["examples"][:3])
    return (
        read + f"since the last demo {since['changed']} changed, {since['added']} added, "
        f"{since['removed']} gone (e.g. {examples})"
    )
