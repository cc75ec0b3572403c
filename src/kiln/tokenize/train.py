"""The train-tokenizer stage: learn BPE merges on a sample of the curated shards, then report.

The sample gives each source its share of `tokenizer.sample_mb` by `source_weights` (default:
curated bytes). Within a source it is spread out: shards are picked evenly across the source
(enough to hold about four times its share), and documents in them are taken by a hash of
their id at the rate that fills the share, so the sample is not just the first files read.
Held-out documents (`heldout_fraction`, by id hash) never train; they feed report.py. Translations of
one text (the same `meta.parallel_id`) are held out together, by a hash of that id, so the report has
whole groups to compare languages on.
With `tokenizer.language_alpha`, the sample is then rebalanced across languages (balance.py), and a
tokenizer of the natural mix, trained on the sample before balancing, is measured beside it (not saved).
Same shards and config give the same tokenizer.json, byte for byte.
`--sweep 4096,8192,...` trains one tokenizer per size on the same sample into
`tokenizer-sweep/` and prints the reports side by side; the stage's own tokenizer is untouched.
Not handled here: adding terms to a trained tokenizer (extend.py), encoding (encode.py).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash
from pydantic import Field, ValidationError

from kiln.core.config import Section
from kiln.core.docshards import read_shard, shard_source
from kiln.core.document import Document
from kiln.core.errors import ConfigError, FatalError
from kiln.core.layout import (
    CURATE,
    MANIFEST,
    SHARDS,
    TOKENIZER,
    TOKENIZER_JSON,
    TOKENIZER_META,
    TOKENIZER_SWEEP,
    RunLayout,
)
from kiln.core.manifest import Stage, read_manifest, recorded_outputs
from kiln.core.mirror import refresh, run_path, url_of
from kiln.core.split import is_heldout
from kiln.text.hf_tokenizer import HfTokenizer
from kiln.text.load import load_tokenizer
from kiln.text.tokenizer import KilnTokenizer, train_bpe
from kiln.tokenize.balance import SampledDoc, balance
from kiln.tokenize.config import TokenizerConfig
from kiln.tokenize.report import (
    HeldoutDoc,
    format_balance,
    format_report,
    format_sweep,
    heldout_doc,
    language_of,
    measure,
    measure_text,
    parallel_id,
)

log = logging.getLogger("kiln.tokenizer")
MB = 1_000_000
SPREAD = 4  # a source's sample is drawn from shards holding about this many times its share
PARALLEL_PREFIX = "parallel:"  # a parallel group's split key, apart from any document id


class EmbeddingShape(Section):
    """The model width the report prices the embedding table at (from the recipe's model section)."""

    d_model: int = Field(default=256, ge=1, description="Model width.")
    tied_embeddings: bool = Field(default=False, description="Whether input and output embeddings are one table.")


@dataclass(frozen=True)
class Sample:
    """The texts BPE learns from and their bytes; with language balance, also the natural mix they were drawn
    from and each language's share before and after (balance.py), else `natural` is `texts` and `languages` None."""

    texts: list[str]
    bytes: int
    natural: list[str]
    languages: dict[str, dict[str, Any]] | None = None


@dataclass(frozen=True)
class SourcePlan:
    shards: list[Path]
    rate: float  # probability a held-in document of these shards is taken
    quota: int  # bytes of text to take
    rest: list[Path]  # the source's other shards, read only if the chosen ones fall short


def sample_score(doc_id: str) -> float:
    """Uniform in [0, 1) per id, independent of the held-out split's hash (another seed)."""
    return xxhash.xxh3_64_intdigest(doc_id.encode("utf-8"), seed=1) / 2.0**64


def split_key(doc: Document) -> str:
    """What the held-out split hashes: the document's id, or its parallel group's, so translations stay together."""
    group = parallel_id(doc)
    return doc.id if group is None else f"{PARALLEL_PREFIX}{group}"


def spread(shards: Sequence[Path], n: int) -> list[Path]:
    """n shards evenly spaced across the list (all of them when n >= len), in shard order."""
    if n >= len(shards):
        return list(shards)
    return [shards[int((j + 0.5) * len(shards) / n)] for j in range(n)]


def plan_sample(shards: Sequence[Path], curated_bytes: dict[str, int], cfg: TokenizerConfig) -> dict[str, SourcePlan]:
    weights = cfg.source_weights if cfg.source_weights is not None else {s: float(b) for s, b in curated_bytes.items()}
    unknown = sorted(set(weights) - set(curated_bytes))
    if unknown:
        raise FatalError(
            f"tokenizer.source_weights names {unknown}, which curate kept no text of; sources with text: "
            f"{sorted(curated_bytes)}"
        )
    total_weight = sum(weights.values())
    plans = {}
    for source, weight in sorted(weights.items()):
        if weight <= 0:
            continue
        quota = math.ceil(cfg.sample_mb * MB * weight / total_weight)
        files = [s for s in shards if shard_source(s) == source]
        if not files:
            raise FatalError(
                f"tokenizer: curate's manifest counts text for source {source!r} but its shards folder has none "
                "of its shards; rerun `kiln curate --force`"
            )
        held_in = curated_bytes[source] * (1 - cfg.heldout_fraction)
        per_shard = held_in / len(files)
        chosen = spread(files, math.ceil(SPREAD * quota / per_shard))
        rest = [f for f in files if f not in set(chosen)]
        plans[source] = SourcePlan(chosen, min(1.0, quota / max(per_shard * len(chosen), 1)), quota, rest)
    return plans


def sample_docs(plans: dict[str, SourcePlan], heldout_fraction: float) -> Iterator[Document]:
    for source, plan in plans.items():
        used = 0
        # The spread-out pass; then, when chance left the share short, the documents it skipped
        # in the same shards, then the source's other shards. All in a fixed order: deterministic.
        passes = [
            (plan.shards, 0.0, plan.rate),
            (plan.shards, plan.rate, 1.0),
            (plan.rest, 0.0, 1.0),
        ]  # sample_score ranges
        for shards, low, high in passes:
            for shard in shards:
                for doc in read_shard(shard):
                    if is_heldout(split_key(doc), heldout_fraction) or not low <= sample_score(doc.id) < high:
                        continue
                    used += len(doc.text.encode("utf-8"))
                    yield doc
                    if used >= plan.quota:
                        break
                if used >= plan.quota:
                    break
            if used >= plan.quota or plan.rate >= 1:  # at rate 1 the first pass took everything
                break
        if used < plan.quota:
            log.info(
                "tokenizer: source %s gave %.2f MB of its %.2f MB share (all it has outside the held-out split)",
                source,
                used / MB,
                plan.quota / MB,
            )


def heldout_docs(shards: Sequence[Path], cfg: TokenizerConfig) -> list[HeldoutDoc]:
    """Up to heldout_mb of held-out documents per source, in shard order."""
    out, used = [], {}
    for shard in shards:
        source = shard_source(shard)
        if used.get(source, 0) >= cfg.heldout_mb * MB:
            continue
        for doc in read_shard(shard):
            if is_heldout(split_key(doc), cfg.heldout_fraction):
                out.append(heldout_doc(doc))
                used[source] = used.get(source, 0) + len(doc.text.encode("utf-8"))
                if used[source] >= cfg.heldout_mb * MB:
                    break
    return out


def training_sample(
    run_dir: Path, shards: list[Path], cfg: TokenizerConfig, largest_vocab: int | None = None
) -> Sample:
    """The sample (balanced across languages with cfg.language_alpha); FatalError when it is too small for
    `largest_vocab` (default cfg's)."""
    vocab_size = largest_vocab or cfg.vocab_size
    curate_dir = RunLayout(run_dir).stage(CURATE)
    curated = read_manifest(curate_dir)
    curated_bytes = {s: t["bytes_out"] for s, t in curated["counts"]["per_source"].items() if t["bytes_out"] > 0}
    if not curated_bytes:
        raise FatalError(
            f"tokenizer: curate kept no text in {curate_dir}; see {curate_dir / 'summary.txt'} for where the "
            "documents went"
        )
    docs = list(sample_docs(plan_sample(shards, curated_bytes, cfg), cfg.heldout_fraction))
    natural = [d.text for d in docs]
    texts, languages = natural, None
    if cfg.language_alpha is not None:
        drawn = [SampledDoc(d.id, language_of(d), d.text, len(d.text.encode("utf-8"))) for d in docs]
        balanced, languages = balance(drawn, cfg.language_alpha)
        texts = [d.text for d in balanced]
        log.info(
            "tokenizer: languages balanced at alpha %s: %s",
            cfg.language_alpha,
            ", ".join(f"{k} {v['share_before']:.3f}->{v['share_after']:.3f}" for k, v in languages.items()),
        )
    sample_bytes = sum(len(t.encode("utf-8")) for t in texts)
    # BPE needs enough text to find vocab_size - 256 - specials merges; far less and the vocabulary stays short.
    if sample_bytes < 4 * vocab_size:
        raise FatalError(
            f"tokenizer: the training sample has {len(texts)} documents, {sample_bytes:,} bytes, too little for "
            f"vocab_size {vocab_size:,} "
            f"(needs at least {4 * vocab_size:,} bytes); curate more text, raise tokenizer.sample_mb, or lower "
            "tokenizer.vocab_size"
        )
    return Sample(texts, sample_bytes, natural, languages)


def train_and_measure(
    texts: list[str], vocab_size: int, cfg: TokenizerConfig, heldout: list[HeldoutDoc]
) -> tuple[KilnTokenizer, dict[str, Any]]:
    t0 = time.perf_counter()
    tokenizer = train_bpe(texts, vocab_size, cfg.min_frequency, cfg.specials)
    seconds = time.perf_counter() - t0
    if tokenizer.vocab_size < vocab_size:
        log.warning(
            (
                "tokenizer: the sample held only %d merges seen at least %d times; the vocabulary is %d, not the %d "
                "asked (more text, tokenizer.sample_mb, or a smaller tokenizer.vocab_size)"
            ),
            tokenizer.vocab_size - 256 - len(cfg.specials),
            cfg.min_frequency,
            tokenizer.vocab_size,
            vocab_size,
        )
    report = measure(tokenizer, heldout) if heldout else None
    return tokenizer, {"train_seconds": round(seconds, 2), "heldout": report}


def reuse(cfg: TokenizerConfig, run_dir: Path, force: bool) -> dict[str, Any]:
    """The tokenizer stage with tokenizer.from_run: that run's tokenizer (or the extended one of its
    tokenizer-extended/ folder), copied and checked, as this run's."""
    assert cfg.from_run is not None
    given = run_path(cfg.from_run)  # a run in a store: its place in a mirror
    # A run directory, or a tokenizer folder of one named directly (its tokenizer-extended/).
    direct = (given / TOKENIZER_JSON).is_file() or (url_of(given) is not None and refresh(given / MANIFEST))
    source = given / TOKENIZER_JSON if direct else RunLayout(given).tokenizer_json
    tokenizer = load_tokenizer(source)  # stops on a missing or changed tokenizer
    b = cfg.boundaries
    if b is not None and isinstance(tokenizer, HfTokenizer):
        tokenizer = tokenizer.with_boundaries(b.bos, b.eos, b.pad)
    elif b is not None and (b.bos, b.eos, b.pad) != (None, None, None):
        raise ConfigError(
            f"tokenizer.boundaries: the tokenizer of {cfg.from_run} is kiln's own, whose documents always end with "
            "<|endoftext|>; boundaries apply to an imported model's tokenizer"
        )
    stage = Stage(run_dir, TOKENIZER, {"tokenizer": cfg}, inputs=[source, source.with_name(TOKENIZER_META)])
    if done := stage.up_to_date(force, lambda m: f"vocab {m['counts']['vocab_size']}, from {cfg.from_run}"):
        return done
    stage.begin()
    if isinstance(tokenizer, HfTokenizer):
        outputs = tokenizer.save(stage.dir / TOKENIZER_JSON)  # the folder's files, the boundaries in use
    else:
        outputs = [Path(shutil.copy2(p, stage.dir / p.name)) for p in (source, source.with_name(TOKENIZER_META))]
    # The tokenizer's own measurements, taken on its run's held-out text.
    counts = {**read_manifest(source.parent)["counts"], "vocab_size": tokenizer.vocab_size, "from_run": cfg.from_run}
    return stage.finish(
        outputs,
        counts,
        f"vocab {tokenizer.vocab_size:,}, the tokenizer of {cfg.from_run} (tokenizer.from_run), unchanged\n"
        f"each document: {tokenizer.describe()}",
    )


def run(
    cfg: TokenizerConfig, run_dir: Path, shape: EmbeddingShape | None = None, force: bool = False
) -> dict[str, Any]:
    if cfg.from_run:
        return reuse(cfg, run_dir, force)
    shape = shape or EmbeddingShape()
    shards = recorded_outputs(RunLayout(run_dir).stage(CURATE), SHARDS)
    # The embedding shape only prices the printed report: it is not hashed (a new d_model must not retrain).
    stage = Stage(run_dir, TOKENIZER, {"tokenizer": cfg}, inputs=shards, upstream=[CURATE])
    if done := stage.up_to_date(force, lambda m: f"vocab {m['counts']['vocab_size']}"):
        return done
    stage.begin()
    sample = training_sample(run_dir, shards, cfg)
    texts, sample_bytes = sample.texts, sample.bytes
    log.info(
        "tokenizer: training byte-level BPE, vocab %d, on %d docs (%.1f MB)",
        cfg.vocab_size,
        len(texts),
        sample_bytes / MB,
    )
    heldout = heldout_docs(shards, cfg)
    tokenizer, result = train_and_measure(texts, cfg.vocab_size, cfg, heldout)
    outputs = tokenizer.save(stage.dir / TOKENIZER_JSON)
    # The training time goes in the manifest beside the other timings: report.json, an output, holds only what
    # the same sample and settings always give, so a redone stage with the same result redoes nothing after it.
    report = {"sample_docs": len(texts), "sample_bytes": sample_bytes, "heldout": result["heldout"]}
    extra = {"train_seconds": result["train_seconds"]}
    if sample.languages is not None:
        report["language_balance"] = language_balance(sample, cfg, heldout, extra)
    (stage.dir / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    held = report["heldout"]
    if held is None:
        log.warning("tokenizer: no held-out documents at heldout_fraction %s; nothing measured", cfg.heldout_fraction)
    counts = {
        "vocab_size": tokenizer.vocab_size,
        "sample_docs": len(texts),
        "sample_bytes": sample_bytes,
        # None when no document fell in the held-out fraction (tiny corpora): nothing was measured.
        "heldout_bytes_per_token": held["all"]["bytes_per_token"] if held else None,
        "per_source": {
            s: {k: r[k] for k in ("docs", "bytes", "tokens", "bytes_per_token", "tokens_per_word")}
            for s, r in held["per_source"].items()
        }
        if held
        else {},
    }
    if sample.languages is not None:
        counts["language_alpha"] = cfg.language_alpha
        counts["sample_languages"] = {
            lang: {k: v[k] for k in ("bytes_before", "share_before", "bytes_after", "share_after")}
            for lang, v in sample.languages.items()
        }
    summary = f"trained on {sample_bytes / MB:.1f} MB ({len(texts):,} documents) in {result['train_seconds']:.1f}s\n"
    summary += (
        format_report(held, shape.d_model, shape.tied_embeddings)
        if held
        else f"vocab {tokenizer.vocab_size:,}; no held-out documents, nothing measured"
    )
    if tokenizer.vocab_size < cfg.vocab_size:
        summary += (
            f"\nwarning: {cfg.vocab_size:,} tokens were asked (tokenizer.vocab_size) and the sample gave "
            f"{tokenizer.vocab_size:,}; more text (tokenizer.sample_mb) or a smaller vocabulary"
        )
    if "language_balance" in report:
        summary += "\n" + format_balance(report["language_balance"], held)
    return stage.finish([*outputs, stage.dir / "report.json"], counts, summary, extra=extra)


def language_balance(
    sample: Sample, cfg: TokenizerConfig, heldout: list[HeldoutDoc], extra: dict[str, Any]
) -> dict[str, Any]:
    """Each language's share of the sample before and after balancing, and the held-out figures of a tokenizer
    trained on the natural mix (the sample before balancing, not saved), so the report shows what balancing
    did to each language. Its training time goes to `extra` (the manifest's timings)."""
    assert sample.languages is not None and cfg.language_alpha is not None
    out: dict[str, Any] = {"language_alpha": cfg.language_alpha, "per_language": sample.languages, "natural_mix": None}
    if cfg.language_alpha == 1 or not heldout:  # at 1 the natural mix is the sample: nothing to set beside it
        return out
    log.info("tokenizer: training the natural mix's tokenizer too, for the report")
    t0 = time.perf_counter()
    natural = train_bpe(sample.natural, cfg.vocab_size, cfg.min_frequency, cfg.specials)
    extra["natural_mix_train_seconds"] = round(time.perf_counter() - t0, 2)
    measured, _ = measure_text(natural, heldout)
    out["natural_mix"] = {"vocab_size": natural.vocab_size, **measured}
    return out


def sized(cfg: TokenizerConfig, vocab_size: int) -> TokenizerConfig:
    """cfg at another vocabulary size, validated like the recipe (room for merges)."""
    try:
        return TokenizerConfig.model_validate({**cfg.model_dump(), "vocab_size": vocab_size})
    except ValidationError as e:
        raise ConfigError(f"--sweep {vocab_size}: {e.errors()[0]['msg']}") from None


def sweep(
    cfg: TokenizerConfig, run_dir: Path, sizes: Sequence[int], shape: EmbeddingShape | None = None, force: bool = False
) -> dict[str, Any]:
    """One tokenizer per vocabulary size on one sample, reported side by side, in `tokenizer-sweep/`."""
    shape = shape or EmbeddingShape()
    configs = [sized(cfg, n) for n in sorted(set(sizes))]
    shards = recorded_outputs(RunLayout(run_dir).stage(CURATE), SHARDS)
    stage = Stage(
        run_dir,
        TOKENIZER_SWEEP,
        {"tokenizer": cfg, **{f"vocab_{c.vocab_size}": c for c in configs}},
        inputs=shards,
        upstream=[CURATE],
    )
    if done := stage.up_to_date(force, lambda m: ", ".join(map(str, m["counts"]["vocab_sizes"]))):
        return done
    stage.begin()
    texts = training_sample(run_dir, shards, cfg, max(c.vocab_size for c in configs)).texts
    heldout = heldout_docs(shards, cfg)
    if not heldout:
        raise FatalError(
            f"tokenizer-sweep: no held-out documents at tokenizer.heldout_fraction={cfg.heldout_fraction}; a "
            "sweep has nothing to compare, raise it"
        )
    outputs, reports = [], []
    for c in configs:
        log.info("tokenizer-sweep: training vocab %d", c.vocab_size)
        tokenizer, result = train_and_measure(texts, c.vocab_size, cfg, heldout)
        folder = stage.dir / f"vocab-{c.vocab_size}"
        folder.mkdir()
        outputs += tokenizer.save(folder / TOKENIZER_JSON)
        (folder / "report.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        outputs.append(folder / "report.json")
        reports.append(result["heldout"])
    counts = {
        "vocab_sizes": [c.vocab_size for c in configs],
        "bytes_per_token": {str(r["vocab_size"]): r["all"]["bytes_per_token"] for r in reports},
    }
    return stage.finish(outputs, counts, format_sweep(reports, shape.d_model, shape.tied_embeddings))
