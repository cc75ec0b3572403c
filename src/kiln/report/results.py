"""Report sections from the stages' manifests: the recipe and lineage, the tokenizer report, the
evaluation table and generated text.

Lineage follows each manifest's `upstream` fingerprints, so the model shows the exact tokenizer,
token shards and curated data it came from, and curate shows its raw inputs.
Not handled here: curation (kiln.report.curation) and training curves (kiln.report.training).
"""

from __future__ import annotations

import json
from typing import Any

from kiln.core.layout import EVAL, EXPORT, GENERATE, TOKENIZER, TOKENIZER_SWEEP, TRAIN
from kiln.report.html import MB, Section, details, missing, para, pre, table
from kiln.report.run_files import RunFiles, in_stage_order

INPUTS_SHOWN = 10
SAMPLES_SHOWN = 10


def json_line(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def short(fingerprint: str | None) -> str:
    return (fingerprint or "")[:12]


def lineage(run: RunFiles, order: tuple[str, ...] = ()) -> Section:
    """The resolved recipe, a row per stage (finished or not) in the run's stage order, where the
    model comes from, and curate's raw inputs."""
    recipe = run.root / "recipe.yaml"
    parts = [
        details(
            "recipe.yaml (the resolved recipe of the last stage run)",
            pre(recipe.read_text(encoding="utf-8", errors="replace")),
        )
        if recipe.is_file()
        else para("No recipe.yaml in the run directory yet.", "missing")
    ]
    rows = []
    for stage in in_stage_order(run.manifests.keys() | run.running.keys(), order):
        m = run.manifests.get(stage)
        if m is None:
            rows.append([stage, run.state(stage), "", "", "", None, ""])
            continue
        inputs = m.get("inputs", [])
        rows.append(
            [
                stage,
                f"finished; a new attempt is {run.state(stage)}" if stage in run.running else "finished",
                short(m.get("fingerprint")),
                ", ".join(f"{u} {short(f)}" for u, f in m.get("upstream", {}).items()),
                f"{len(inputs):,} files, {sum(i.get('bytes', 0) for i in inputs) / MB:,.1f} MB",
                m.get("wall_seconds"),
                m.get("finished_at", ""),
            ]
        )
    parts.append(
        table(["stage", "state", "fingerprint", "upstream", "inputs", "wall s", "finished"], rows)
        if rows
        else missing("No stage has run in this directory yet.")
    )
    model = next((s for s in (EXPORT, TRAIN) if s in run.manifests), None)
    if model:
        parts.append("<h3>Where the model comes from</h3>" + pre("\n".join(trace(run, model))))
    if curate := run.manifests.get("curate"):
        inputs = curate.get("inputs", [])
        listed = [[i["path"], i.get("bytes"), short(i.get("sha256"))] for i in inputs[:INPUTS_SHOWN]]
        parts.append(
            "<h3>Raw inputs of curation</h3>"
            + table(["file", "bytes", "sha256"], listed)
            + (
                para(
                    (
                        f"... and {len(inputs) - INPUTS_SHOWN:,} more files, each with its size and sha256 in "
                        "curate/manifest.json."
                    ),
                    "note",
                )
                if len(inputs) > INPUTS_SHOWN
                else ""
            )
        )
    if run.problems:
        parts.append(para("Unreadable files: " + "; ".join(run.problems), "missing"))
    return Section("lineage", "".join(parts))


def trace(run: RunFiles, stage: str, depth: int = 0, shown: set[str] | None = None) -> list[str]:
    """One line per stage, indented by how far upstream it is; a stage already expanded above is named, not repeated."""
    shown = set() if shown is None else shown
    m = run.manifests.get(stage)
    if m is None:
        return [f"{'  ' * depth}{stage} (no manifest)"]
    line = f"{'  ' * depth}{stage} {short(m.get('fingerprint'))}"
    if stage in shown:
        return [f"{line}  (above)"]
    shown.add(stage)
    lines = [
        f"{line}  ({len(m.get('inputs', []))} inputs, config {short(m.get('config_hash'))}, {m.get('finished_at', '')})"
    ]
    for upstream, recorded in m.get("upstream", {}).items():
        now = run.manifests.get(upstream, {}).get("fingerprint")
        if now and now != recorded:
            lines.append(f"{'  ' * (depth + 1)}{upstream} {short(recorded)} (redone since: now {short(now)})")
        else:
            lines += trace(run, upstream, depth + 1, shown)
    return lines


def tokenizer(run: RunFiles) -> Section:
    report = run.read_json(run.stage_dir(TOKENIZER) / "report.json") if TOKENIZER in run.manifests else None
    if report is None:
        return Section("tokenizer", missing("No tokenizer report yet (kiln train-tokenizer)."))
    held = report["heldout"]
    if held is None:  # a corpus too small for heldout_fraction to leave a document out
        return Section("tokenizer", missing("No held-out documents at this heldout_fraction: nothing measured."))
    # The manifest keeps the training time (report.json did, before kiln kept outputs free of timings).
    seconds = run.manifests[TOKENIZER].get("train_seconds", report.get("train_seconds"))
    headers = ["", "documents", "bytes/token", "tokens/word", "fertility", "split words"]

    def row(name: str, r: dict[str, Any]) -> list[object]:
        split = r.get("split_word_fraction")
        return [
            name,
            r["docs"],
            r["bytes_per_token"],
            r["tokens_per_word"],
            r["fertility"],
            "" if split is None else f"{split:.1%}",
        ]  # None: no words (e.g. only symbols)

    body = para(
        f"Byte-level BPE, vocabulary {held['vocab_size']:,} ({held['special_tokens']} special tokens, "
        f"{held['merges']:,} merges), trained on {report['sample_docs']:,} documents "
        f"({report['sample_bytes'] / MB:,.1f} MB) in {seconds} s; measured on held-out documents."
    )
    body += "<h3>Per source</h3>" + table(
        headers, [row("all", held["all"]), *(row(s, r) for s, r in held["per_source"].items())]
    )
    body += "<h3>Per language</h3>" + table(headers, [row(lang, r) for lang, r in held["per_language"].items()])
    if sweep := run.manifests.get(TOKENIZER_SWEEP):
        bpt = sweep["counts"]["bytes_per_token"]
        body += "<h3>Vocabulary sweep</h3>" + table(
            ["vocabulary", "bytes/token (held out)"], [[int(v), b] for v, b in bpt.items()]
        )
    return Section("tokenizer", body)


def evaluation(run: RunFiles) -> Section:
    m = run.manifests.get(EVAL)
    if m is None:
        return Section(
            "evaluation",
            missing(f"Evaluation is {run.state(EVAL)}." if EVAL in run.running else "No evaluation yet (kiln eval)."),
        )
    counts = m["counts"]
    parts = []
    if after := counts.get("after"):
        before = counts.get("before") or {}
        rows = []
        for source, r in [*after["sources"].items(), ("all", after["all"])]:
            b = before.get("sources", {}).get(source) if source != "all" else before.get("all")
            rows.append(
                [source, b["loss"] if b else None, r["loss"], b["bpb"] if b else None, r["bpb"], r.get("tokens")]
            )
        parts.append(
            table(
                [
                    "source",
                    "loss before (untrained)",
                    "loss after",
                    "bits/byte before",
                    "bits/byte after",
                    "tokens scored",
                ],
                rows,
            )
        )
        if languages := after.get("languages"):
            parts.append(per_language(languages, before.get("languages") or {}))
    if data := counts.get("data"):
        parts.append(
            "<h3>Other files</h3>"
            + table(
                ["file or source", "loss", "bits/byte", "tokens"],
                [[name, r.get("loss"), r.get("bpb"), r.get("tokens")] for name, r in data.items()],
            )
        )
    if tasks := counts.get("tasks"):
        parts.append(
            "<h3>Multiple choice (zero-shot)</h3>"
            + table(
                ["task", "items", "accuracy", "acc (char-normalized)", "acc (token-normalized)", "stderr of accuracy"],
                [
                    [n, r["items"], r["acc"], r["acc_norm_char"], r["acc_norm_token"], r["stderr"]["acc"]]
                    for n, r in tasks.items()
                ],
            )
        )
    else:
        parts.append(para("No multiple-choice task was run (eval.tasks, or kiln eval --task FILE).", "note"))
    return Section("evaluation", "".join(parts))


def per_language(after: dict[str, Any], before: dict[str, Any]) -> str:
    """The validation figures per language (kiln.model.perplexity): bits per byte is the measure that compares
    across languages, whose tokenizer costs differ."""
    rows = [
        [
            lang,
            before.get(lang, {}).get("bpb"),
            r["bpb"],
            r["loss"],
            r.get("bytes"),
            r.get("tokens"),
            ", ".join(r.get("sources", [])),
        ]
        for lang, r in after.items()
    ]
    return (
        "<h3>Per language</h3>"
        + para(
            "Each language sums its sources' scored nats and bytes (a source of several languages split by its "
            "validation tokens' shares); bits per byte compare across languages, losses per token do not.",
            "note",
        )
        + table(
            ["language", "bits/byte before", "bits/byte after", "loss after", "bytes scored", "tokens", "sources"], rows
        )
    )


def samples(run: RunFiles, probes: list[dict[str, Any]]) -> Section:
    parts = []
    if m := run.manifests.get(GENERATE):
        c = m["counts"]
        parts.append(
            para(f"{c['new_tokens']:,} new tokens at {c['tokens_per_s']:,} tokens/s for {c['prompts']} prompt(s).")
        )
        path = run.stage_dir(GENERATE) / "samples.jsonl"
        records = [
            r
            for line in (path.read_text(encoding="utf-8").splitlines()[:SAMPLES_SHOWN] if path.is_file() else [])
            if (r := json_line(line)) is not None
        ]
        if records:
            parts.append(
                table(
                    ["prompt", "completion", "new tokens", "finish"],
                    [[r["prompt"], r["completion"], r["new_tokens"], r["finish_reason"]] for r in records],
                )
            )
        else:
            parts.append(pre(c["sample"]))
    if probes:
        last = probes[-1]
        parts.append(
            f"<h3>Probe set at step {last['step']:,}</h3>"
            + table(["prompt", "completion"], [[g["prompt"], g["completion"]] for g in last.get("generations", [])])
        )
    return Section("samples", "".join(parts) or missing("No generation yet (kiln generate, or train.probe_every)."))
