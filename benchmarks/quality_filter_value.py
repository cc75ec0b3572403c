"""Does the quality classifier pick better training data? Two identical small models, one trained
on documents the classifier filter kept, one on a random sample of the same size, compared by
validation bits per byte on held-out reference text.

On the demo corpus (the demo recipe's inputs and curation): the reference source is `prose`
(Python's documentation topics); the candidate pool is the curated `docs` source
(/usr/share/doc: READMEs, changelogs, copyright files, manuals), the other prose-branch source.
1. `kiln curate --recipe demo` (the pool); `kiln quality train-classifier` and `train-lm` in a
   run whose inputs are the demo's prose and docs sources, with `quality.reference_source=prose`
   (negatives and the corpus sample: raw docs documents).
2. The classifier filter (the real curate step, `top_fraction` of the model's corpus sample)
   over the pool: the filtered set. The random set: the pool in a seeded shuffled order, cut at
   the filtered set's size in bytes (the last document cut at a line).
3. One run holds both sets and the raw reference documents the classifier held out (never
   trained on; quality.classifier.heldout_fraction=0.3 here, as the source is small), so both
   models share one tokenizer: curate (steps off), train-tokenizer, tokenize, then `kiln train`
   + `kiln eval` twice with the same model, seed and steps, `mix.weights` naming only the set
   being trained on. The reference documents' ids are chosen so the tokenize
   stage puts all of them in the validation split.
Also measures the perplexity filter's speed: the curate step over the curated prose-branch text
in 2 worker processes, MB/s per core.
Ends with: RESULT filtered_bpb=.. random_bpb=.. classifier_auc=.. ppl_mb_s=..
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kiln.core.docshards import list_shards, read_shard, shard_source
from kiln.core.document import Document
from kiln.core.split import is_heldout
from kiln.curate.audit import Ledger
from kiln.curate.quality.sample import read_selection, reference_and_corpus, select
from kiln.curate.steps.chain import groups, run_documents
from kiln.curate.steps.quality import ClassifierFilter, ClassifierFilterConfig, PerplexityConfig, PerplexityFilter
from kiln.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / ".cache" / "quality-value"
VAL_FRACTION = 0.1  # tokenize.val_fraction and tokenizer.heldout_fraction of the comparison run
HELDOUT = 0.3  # quality.classifier.heldout_fraction: the prose source is small, and what is held out is the yardstick
# The quality models' run: the demo's two prose-branch sources, so the classifier's negatives (and
# the corpus sample its top fraction is taken of) are raw docs, the source the filter chooses from.
MODEL_INPUTS = [
    {"source": "prose", "format": "pydoc_topics", "code": False},
    {"source": "docs", "format": "usr_share_doc", "code": False},
]
QUALITY = [
    "name=models",
    "curate.inputs=" + json.dumps(MODEL_INPUTS),
    "quality.reference_source=prose",
    f"quality.classifier.heldout_fraction={HELDOUT}",
]
COMMON = ["--recipe", "demo", "--set", f"runs_dir={WORK}"]


def kiln(*args: str) -> None:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kiln", "-q", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"kiln {' '.join(args[:2])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(
        (
            f"  kiln {args[0]}{' ' + args[1] if not args[1].startswith('-') else ''}: "
            f"{time.perf_counter() - started:.0f} s"
        ),
        flush=True,
    )


def curated(run: str, source: str) -> list[Document]:
    return [
        d
        for shard in list_shards(WORK / run / "curate" / "shards")
        if shard_source(shard) == source
        for d in read_shard(shard)
    ]


def nbytes(docs: list[Document]) -> int:
    return sum(len(d.text.encode("utf-8")) for d in docs)


def random_sample(pool: list[Document], target: int, seed: int) -> list[Document]:
    """Documents of `pool` in a seeded order until `target` bytes, the last one cut at a line
    (whole lines, at most `target` bytes in all), so both training sets are the same size."""
    sample, size = [], 0
    for doc in random.Random(seed).sample(pool, len(pool)):
        room = target - size
        if room <= 0:
            break
        data = doc.text.encode("utf-8")
        if len(data) > room:
            cut = data[:room].rfind(b"\n")
            if cut <= 0:
                break
            doc = doc.with_text(data[:cut].decode("utf-8"))
        sample.append(doc)
        size += len(doc.text.encode("utf-8"))
    return sample


def val_id(base: str) -> str:
    """An id derived from `base` that the tokenize stage puts in the validation split."""
    k = 0
    while not is_heldout(f"{base}#{k}", VAL_FRACTION):
        k += 1
    return f"{base}#{k}"


def write_jsonl(path: Path, docs: list[Document], ids: list[str]) -> None:
    path.write_text(
        "".join(json.dumps({"id": i, "text": d.text}, ensure_ascii=False) + "\n" for d, i in zip(docs, ids)),
        encoding="utf-8",
    )


def _score(args: tuple[str, list[Document]]) -> float:
    """Seconds the curate step takes over `docs` as curate's filter phase runs it (groups of
    documents, kiln.curate.steps.chain), its model loaded before the clock starts."""
    step, ledger = PerplexityFilter(PerplexityConfig(enabled=True), Path(args[0])), Ledger(0)
    started = time.perf_counter()
    for group in groups(args[1]):
        run_documents(group, [step], ledger, "prose")
    return time.perf_counter() - started


def perplexity_speed(folder: Path, docs: list[Document], workers: int = 2) -> float:
    """MB/s per core of the perplexity curate step over `docs` split over `workers` processes."""
    parts = [docs[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_score, [(str(folder), p[:1]) for p in parts]))  # start the workers, import numpy
        started = time.perf_counter()
        list(pool.map(_score, [(str(folder), p) for p in parts]))
        wall = time.perf_counter() - started
    return nbytes(docs) / 1e6 / wall / workers


def heldout_reference() -> list[Document]:
    """The reference documents the classifier held out, as its stage read them (raw, normalized)."""
    recipe = load_recipe("demo", [f"runs_dir={WORK}", *QUALITY])
    ref_inputs, only, _, _ = reference_and_corpus(recipe.quality, recipe.curate)
    budget = recipe.quality.classifier.max_train_mb
    docs = read_selection(
        select(ref_inputs, budget, recipe.quality.seed, only=only), budget, recipe.curate, "reference"
    )
    return [d for d in docs if is_heldout(d.id, HELDOUT)]


def reference_bpb(run_args: list[str], train_set: str, steps: int) -> float:
    """Train on `train_set` only, evaluate; the reference source's validation bits per byte."""
    settings = [*run_args, "--set", "mix.weights=" + json.dumps({train_set: 1.0}), "--set", f"train.steps={steps}"]
    kiln("train", *settings)
    kiln("eval", *settings)
    counts = json.loads((WORK / "value" / "eval" / "manifest.json").read_text())["counts"]
    return float(counts["after"]["sources"]["ref"]["bpb"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--top-fraction",
        type=float,
        default=0.3,
        help="The classifier filter's top_fraction (share of its corpus sample kept).",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=300,
        help="Training steps of each model (demo model and batch: 4,096 tokens a step).",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the random sample.")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    quality = [*COMMON, *(a for setting in QUALITY for a in ("--set", setting))]
    print("1. curate the demo corpus, train the quality models", flush=True)
    kiln("curate", *COMMON, "--set", "name=pool")
    kiln("quality", "train-classifier", *quality)
    kiln("quality", "train-lm", *quality)
    report = json.loads((WORK / "models" / "quality" / "classifier" / "report.json").read_text())
    auc = report["heldout"]["auc"]
    print(f"  classifier held out: {report['heldout']}", flush=True)

    pool = curated("pool", "docs")
    step = ClassifierFilter(
        ClassifierFilterConfig(enabled=True, top_fraction=args.top_fraction), WORK / "models" / "quality" / "classifier"
    )
    filtered = list(step.process(pool, Ledger(0)))
    target = nbytes(filtered)
    sample = random_sample(pool, target, args.seed)
    size = nbytes(sample)
    reference = heldout_reference()
    print(
        f"2. pool: {len(pool)} curated documents of the docs source ({nbytes(pool) / 1e6:.2f} MB); filter kept "
        f"{len(filtered)} ({target / 1e6:.2f} MB, cutoff {step.cutoff:.3f}); "
        f"random sample {len(sample)} ({size / 1e6:.2f} MB), "
        f"{len({d.id for d in sample} & {d.id for d in filtered})} in both; "
        f"reference validation: {len(reference)} raw prose documents held out by the classifier "
        f"({nbytes(reference) / 1e6:.2f} MB)",
        flush=True,
    )

    data = WORK / "value-data"
    data.mkdir(exist_ok=True)
    write_jsonl(data / "filtered.jsonl", filtered, [f"filtered:{d.id}" for d in filtered])
    write_jsonl(data / "random.jsonl", sample, [f"random:{d.id}" for d in sample])
    write_jsonl(data / "ref.jsonl", reference, [val_id(f"ref:{d.id}") for d in reference])
    inputs = [
        {"path": str(data / f"{name}.jsonl"), "source": name, "code": False} for name in ("filtered", "random", "ref")
    ]
    off = [
        "url_filter",
        "line_dedup",
        "language",
        "gopher_repetition",
        "gopher_quality",
        "c4",
        "fineweb",
        "pii",
        "length",
        "exact_dedup",
        "minhash_dedup",
    ]
    value = [
        *COMMON,
        "--set",
        "name=value",
        "--set",
        "curate.inputs=" + json.dumps(inputs),
        *(a for name in off for a in ("--set", f"curate.{name}.enabled=false")),
        "--set",
        f"tokenize.val_fraction={VAL_FRACTION}",
        "--set",
        f"tokenizer.heldout_fraction={VAL_FRACTION}",
        "--set",
        "tokenizer.vocab_size=4096",
    ]
    print("3. one run with both sets: curate, tokenizer, tokenize; then train and evaluate each model", flush=True)
    for verb in ("curate", "train-tokenizer", "tokenize"):
        kiln(verb, *value)
    results = {}
    for name in ("filtered", "random"):
        results[name] = reference_bpb(value, name, args.steps)
        print(f"  trained on {name}: reference validation {results[name]:.4f} bits/byte", flush=True)

    prose = curated("pool", "docs") + curated("pool", "prose")
    ppl_mb_s = perplexity_speed(WORK / "models" / "quality" / "lm", prose)
    print(
        f"4. perplexity filter (the curate step): {nbytes(prose) / 1e6:.2f} MB of curated prose-branch text, 2 "
        f"processes: {ppl_mb_s:.2f} MB/s per core (goal: 2)"
    )
    verdict = "lower" if results["filtered"] < results["random"] else "NOT lower"
    print(
        f"filtered data gives {verdict} reference bits/byte: {results['filtered']:.4f} vs {results['random']:.4f} "
        f"({100 * (1 - results['filtered'] / results['random']):.1f}%)"
    )
    print(
        f"RESULT filtered_bpb={results['filtered']:.4f} random_bpb={results['random']:.4f} "
        f"classifier_auc={auc:.4f} ppl_mb_s={ppl_mb_s:.2f}"
    )


if __name__ == "__main__":
    main()
