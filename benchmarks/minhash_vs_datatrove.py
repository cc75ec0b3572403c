"""MinHash near-dedup against datatrove: how much faster is `kiln curate`, and does it find the same duplicates.

Corpus: the local-text corpus of benchmarks/curate_vs_datatrove.py (>= 50 MB, built there on first
use and cached as benchmarks/.cache/corpus-55mb.jsonl), normalized as kiln normalizes so both
tools read the same text, plus planted duplicates (benchmarks/dedup_corpus.py): word-edited
variants of 15% of the documents under 20,000 characters at a measured Jaccard spread uniformly
over 0.5-1.0, two variants of another 3%, identical copies of 4% of the documents and 5% of the
variants. Dealt into `--shards` JSONL files. Then, each end to end (interpreter start to exit,
reading the JSONL, writing the kept documents), with 2 worker processes:

  datatrove  MinhashDedupSignature (JsonlReader in front) -> MinhashDedupBuckets -> MinhashDedupCluster
             -> MinhashDedupFilter (JsonlReader in front, JsonlWriter behind, uncompressed), 5-grams,
             14 buckets x 8 hashes, LocalPipelineExecutor with tasks=2 (14 for the buckets, 1 for the
             clusters) and 2 workers, in its own virtualenv (benchmarks/.cache/datatrove-venv)
  kiln       `kiln curate --input <shards>` with only minhash_dedup on (default config: 5-grams,
             14 bands x 8 rows, exact Jaccard verification at 0.8), 2 workers

and reports documents/s of each (the best of `--repeats` alternating runs: on a shared machine
other processes only ever add time) and their ratio, each tool's time per phase or stage, and
for both tools the precision (predicted same-cluster pairs with true Jaccard >= 0.8) and recall
(true pairs >= 0.8 in one cluster) against brute force over all pairs with kiln's shingling
(exhaustive inverted index, no shingle skipped), and per removal the Jaccard to the kept copy.
On this natural corpus, families of boilerplate (gcloud man pages, changelogs) chain into big
clusters, so pair precision is far below removal precision for any connected-components
clustering. datatrove shingles with its own tokenizer and does not verify, so its precision is
expected to be lower; the truth is kiln's definition of a 5-gram.
Ends with: RESULT kiln_docs_s=.. datatrove_docs_s=.. ratio=.. kiln_precision=.. kiln_recall=..
Not measured here: exact dedup, the other curate steps, compressed input.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import subprocess
import time
from pathlib import Path

import dedup_corpus as dc
import numpy as np
from curate_vs_datatrove import build_corpus, datatrove_python

from kiln.curate.dedup.minhash import s_curve
from kiln.curate.steps.normalize import normalize_text

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
WORK = CACHE / "minhash-bench"
MAX_VARIANT_CHARS = 20_000  # editing a longer document to a target Jaccard takes many re-measurements
# datatrove.pipeline.dedup imports its exact-substring steps (tokenizers) and MinHash hashes shingles
# with xxhash by default; neither is a datatrove 0.10.1 requirement, so the shared venv gets them here.
DATATROVE_MINHASH_PINS = ["tokenizers==0.23.3", "xxhash==3.5.0"]  # xxhash 4 refuses str, which datatrove 0.10.1 hashes

_DATATROVE_MINHASH = """
import json, sys, time
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup import (
    MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature,
)
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter

if __name__ == "__main__":  # the executor starts its workers with forkserver, which re-imports this file
    in_dir, work, out_dir, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8)  # field names of datatrove 0.10.1
    stages = {
        "signatures": (LocalPipelineExecutor, dict(
            pipeline=[
                JsonlReader(in_dir, glob_pattern="*.jsonl"),
                MinhashDedupSignature(output_folder=f"{work}/signatures", config=config),
            ],
            tasks=workers, workers=workers)),
        "buckets": (LocalPipelineExecutor, dict(
            pipeline=[
                MinhashDedupBuckets(input_folder=f"{work}/signatures", output_folder=f"{work}/buckets", config=config),
            ],
            tasks=config.num_buckets, workers=workers)),
        # save_cluster_id: 8 bytes per clustered document, so the benchmark can score clusters, not only removals
        "clusters": (LocalPipelineExecutor, dict(
            pipeline=[MinhashDedupCluster(
                input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids", config=config, save_cluster_id=True,
            )],
            tasks=1)),
        "filter": (LocalPipelineExecutor, dict(
            pipeline=[
                JsonlReader(in_dir, glob_pattern="*.jsonl"),
                MinhashDedupFilter(input_folder=f"{work}/remove_ids"),
                JsonlWriter(out_dir, compression=None),
            ],
            tasks=workers, workers=workers)),
    }
    seconds = {}
    for name, (executor, kwargs) in stages.items():
        t0 = time.perf_counter()
        executor(**kwargs, logging_dir=f"{work}/logs/{name}").run()
        seconds[name] = round(time.perf_counter() - t0, 2)
    print("STAGES " + json.dumps(seconds))
"""


def build(shard_dir: Path, min_mb: float, n_shards: int, seed: int) -> list[dict]:
    """The benchmark corpus as records (id, text, source), written into `n_shards` JSONL files."""
    base_file = CACHE / f"corpus-{min_mb:g}mb.jsonl"
    if not base_file.exists():
        docs, nbytes = build_corpus(base_file, min_mb)
        print(f"built {base_file.name}: {docs} documents, {nbytes / 1e6:.1f} MB of text", flush=True)
    rng = random.Random(seed)
    small, large = [], []
    with base_file.open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            text = normalize_text(record["text"])
            if not text.strip():
                continue
            (small if len(text) <= MAX_VARIANT_CHARS else large).append(
                dc.Doc(record["id"], record["source"], text, -1, "base", sets=dc.shingles(text))
            )
    for index, d in enumerate(small):
        d.base = index
    docs = (
        dc.plant(small, rng, variant_frac=0.15, two_variant_frac=0.03, base_copy_frac=0.04, variant_copy_frac=0.05)
        + large
    )
    dc.write_jsonl_shards(docs, shard_dir, n_shards, rng)
    return [d.record() for d in docs]


def load_shards(shard_dir: Path) -> list[dict]:
    docs = []
    for path in sorted(shard_dir.glob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            docs += [json.loads(line) for line in f]
    return docs


# ---------------------------------------------------------------------------------------------
# datatrove


def datatrove_minhash_python() -> Path:
    """The datatrove virtualenv's python (benchmarks/curate_vs_datatrove.py creates it), with what MinHash needs."""
    python = datatrove_python()
    if (
        subprocess.run(
            [str(python), "-c", 'import tokenizers, xxhash; assert xxhash.VERSION.startswith("3.")'],
            capture_output=True,
        ).returncode
        != 0
    ):
        print(f"installing {' '.join(DATATROVE_MINHASH_PINS)} into {python.parent.parent} (once)", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *DATATROVE_MINHASH_PINS], check=True)
    return python


def run_datatrove(python: Path, shard_dir: Path, workers: int) -> tuple[float, dict[str, float], Path, Path]:
    """Wall seconds of the four datatrove stages (one interpreter, start to exit), each stage's
    seconds, its work and output folders."""
    script = CACHE / "datatrove_minhash.py"
    script.write_text(_DATATROVE_MINHASH)
    work, out = WORK / "datatrove-work", WORK / "datatrove-out"
    subprocess.run(["rm", "-rf", str(work), str(out)], check=True)
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(python), str(script), str(shard_dir), str(work), str(out), str(workers)], capture_output=True, text=True
    )
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"datatrove failed ({done.returncode}):\n{done.stderr[-3000:]}")
    stages = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("STAGES "))[7:])
    return seconds, stages, work, out


def datatrove_labels(
    work: Path, out: Path, shard_dir: Path, tasks: int, index_of: dict[str, int]
) -> tuple[np.ndarray, np.ndarray]:
    """datatrove's clusters over document indices and its removed documents (a mask), from its
    `.clusters` files: (document index in
    its task's stream, cluster) as uint32 pairs; task r reads files r, r + tasks, ... in name order.
    Checks that the non-root members are exactly the documents missing from its output."""
    files = sorted(shard_dir.glob("*.jsonl"))
    labels = np.full(len(index_of), -1, dtype=np.int64)
    for rank in range(tasks):
        stream = [json.loads(line)["id"] for path in files[rank::tasks] for line in path.open(encoding="utf-8")]
        path = work / "remove_ids" / f"{rank:06d}.clusters"
        raw = path.read_bytes() if path.exists() else b""
        for doc, cluster in struct.iter_unpack("<2I", raw):
            labels[index_of[stream[doc]]] = cluster
    kept = set()
    for path in sorted(out.rglob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            kept.update(json.loads(line)["id"] for line in f)
    clustered = np.flatnonzero(labels >= 0)
    roots = len(np.unique(labels[clustered]))
    removed = len(index_of) - len(kept)
    assert removed == len(clustered) - roots, (
        f"datatrove removed {removed} documents but its clusters say {len(clustered) - roots}"
    )
    removed_mask = np.ones(len(index_of), dtype=bool)
    removed_mask[[index_of[i] for i in kept]] = False
    return labels, removed_mask


# ---------------------------------------------------------------------------------------------


def without_partner(docs: np.ndarray, truth: tuple[np.ndarray, np.ndarray, np.ndarray], threshold: float) -> int:
    """How many of these documents have no true partner >= threshold anywhere in the corpus."""
    ti, tj, tjac = truth
    has_partner = np.zeros(max(len(docs), int(max(ti.max(initial=0), tj.max(initial=0))) + 1), dtype=bool)
    has_partner[ti[tjac >= threshold]] = True
    has_partner[tj[tjac >= threshold]] = True
    return int((~has_partner[docs]).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--min-mb", type=float, default=55.0, help="Size of the base corpus (MB of text) before planting."
    )
    parser.add_argument("--workers", type=int, default=2, help="Worker processes on each side.")
    parser.add_argument(
        "--shards",
        type=int,
        default=None,
        help="JSONL input files (None: one per worker). kiln runs one task per file.",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the planting and the shard order.")
    parser.add_argument(
        "--rebuild", action="store_true", help="Rebuild the planted corpus even when a cached one exists."
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="Timed runs of each tool (alternating); the best counts."
    )
    parser.add_argument(
        "--only",
        choices=("kiln", "datatrove"),
        default=None,
        help="Time one tool only (the other's figures are then missing).",
    )
    args = parser.parse_args()
    shards = args.shards or args.workers
    cfg = dc.DEFAULTS

    shard_dir = WORK / f"input-{args.min_mb:g}mb-seed{args.seed}-{shards}shards"
    if args.rebuild or not shard_dir.is_dir():
        t0 = time.perf_counter()
        build(shard_dir, args.min_mb, shards, args.seed)
        print(f"built the planted corpus in {time.perf_counter() - t0:.0f} s", flush=True)
    docs = load_shards(shard_dir)
    index_of = {d["id"]: i for i, d in enumerate(docs)}
    n = len(docs)
    mb = sum(len(d["text"].encode("utf-8")) for d in docs) / 1e6
    jsonl_mb = sum(p.stat().st_size for p in shard_dir.glob("*.jsonl")) / 1e6
    planted = {kind: sum(marker in d["id"] for d in docs) for kind, marker in (("variants", "~v"), ("copies", "=c"))}
    print(
        (
            f"corpus: {n} documents, {mb:.1f} MB of text, {jsonl_mb:.1f} MB of JSONL in {shards} files; planted "
            f"{planted['variants']} variants, {planted['copies']} copies"
        ),
        flush=True,
    )

    # Timed runs first, alternating, on a quiet machine; the brute force comes after. With
    # --repeats, each tool's best run counts (other processes only ever add time).
    dt_s = kiln = None
    python = datatrove_minhash_python() if args.only != "kiln" else None
    dt_times, kiln_times = [], []
    for _ in range(args.repeats):
        if python is not None:
            seconds, stages, dt_work, dt_out = run_datatrove(python, shard_dir, args.workers)
            dt_times.append(seconds)
            print(
                f"datatrove: {seconds:.1f} s end to end, {n / seconds:.0f} docs/s, {mb / seconds:.2f} MB/s; stages "
                + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()),
                flush=True,
            )
        if args.only != "datatrove":
            run = dc.run_kiln(str(shard_dir / "*.jsonl"), WORK / "kiln-runs", args.workers, ("minhash_dedup",))
            kiln_times.append(run.seconds)
            print(
                f"kiln:      {run.seconds:.1f} s end to end, {n / run.seconds:.0f} docs/s, {mb / run.seconds:.2f} MB/s",
                flush=True,
            )
            kiln = run if kiln is None or run.seconds < kiln.seconds else kiln
    dt_s = min(dt_times) if dt_times else None
    if args.repeats > 1:
        print(
            f"best of {args.repeats}: "
            + ", ".join(
                f"{name} {min(t):.1f} s (all: {' '.join(f'{x:.1f}' for x in t)})"
                for name, t in (("datatrove", dt_times), ("kiln", kiln_times))
                if t
            )
        )
    if kiln is not None:
        phases = kiln.manifest.get("phases", {})
        accounted = sum(p["seconds"] for p in phases.values())
        print(
            "kiln phases: "
            + ", ".join(f"{name} {p['seconds']:.1f} s ({p['max_rss_mb']:.0f} MB)" for name, p in phases.items())
            + f"; outside the phases (start, planning, audit, manifest): {kiln.seconds - accounted:.1f} s"
        )
        minhash = kiln.manifest["counts"]["minhash"]
        print(f"kiln minhash: {', '.join(f'{k}={v}' for k, v in minhash.items() if not isinstance(v, dict))}")

    t0 = time.perf_counter()
    sets = [dc.shingles(d["text"]) for d in docs]
    truth = dc.true_pairs(sets, min(lo for lo, _ in dc.BUCKETS))
    print(
        f"brute force: {len(truth[0])} pairs >= 0.5, {int((truth[2] >= cfg.threshold).sum())} >= {cfg.threshold} "
        f"(all shingles counted; {time.perf_counter() - t0:.0f} s)",
        flush=True,
    )

    predicted = {}
    if kiln is not None:
        kiln_removed = np.zeros(n, dtype=bool)
        kiln_removed[[index_of[r["id"]] for r in kiln.removed]] = True
        predicted["kiln"] = (dc.kiln_labels(kiln, index_of), kiln_removed)
    if dt_s is not None:
        predicted["datatrove"] = datatrove_labels(dt_work, dt_out, shard_dir, args.workers, index_of)
    print(
        f"precision: of the predicted same-cluster pairs, those with true Jaccard >= {cfg.threshold} (chain "
        "pairs, joined through other"
        " members, count against it); recall: true pairs in one cluster. Per removal: true Jaccard to the "
        "cluster's kept copy."
    )
    results = {}
    for name, (labels, removed) in predicted.items():
        s = dc.score(labels, sets, truth, floors=(0.85, cfg.threshold))
        to_kept = dc.removal_jaccards(labels, removed, sets)
        results[name] = s
        sizes = (
            np.bincount(np.unique(labels[labels >= 0], return_inverse=True)[1])
            if (labels >= 0).any()
            else np.zeros(1, np.int64)
        )
        print(
            f"{name}: precision {s.precision:.4f} ({s.chain_pairs} of {s.predicted_pairs} predicted pairs below "
            f"{cfg.threshold}, min {s.min_predicted_jaccard:.3f}; "
            f"{len(sizes)} clusters, largest {sizes.max()}), recall@0.8 {s.recall[cfg.threshold]:.4f}, "
            f"recall@0.85 {s.recall[0.85]:.4f}"
        )
        print(
            f"  removed {int(removed.sum())}: "
            f"{float((to_kept >= cfg.threshold).mean()) if len(to_kept) else float('nan'):.4f} of them at >= "
            f"{cfg.threshold} to their kept copy, "
            f"{int((to_kept < 0.5).sum())} below 0.5, "
            f"{without_partner(np.flatnonzero(removed), truth, cfg.threshold)} with no true partner >= "
            f"{cfg.threshold} anywhere"
        )
    if results:
        print("recall by true Jaccard bucket (true pairs in one cluster / true pairs); S-curve at the mid-point")
        names = list(results)
        print(f"  {'bucket':<10} {'true pairs':>10} " + " ".join(f"{k:>10}" for k in names) + f" {'S-curve':>8}")
        first = results[names[0]]
        for k, (lo, hi, total, _) in enumerate(first.by_bucket):
            cells = " ".join(
                f"{results[name].by_bucket[k][3] / total if total else float('nan'):>10.3f}" for name in names
            )
            print(f"  {lo:.2f}-{hi:.2f} {total:>10} {cells} {s_curve((lo + hi) / 2, cfg.bands, cfg.rows):>8.3f}")

    kiln_docs_s = n / kiln.seconds if kiln else float("nan")
    dt_docs_s = n / dt_s if dt_s else float("nan")
    ratio = kiln_docs_s / dt_docs_s
    print(f"kiln / datatrove documents/s: {ratio:.2f}x (goal: 10x)")
    k = results.get("kiln")
    print(
        f"RESULT kiln_docs_s={kiln_docs_s:.1f} datatrove_docs_s={dt_docs_s:.1f} ratio={ratio:.2f} "
        f"kiln_precision={k.precision if k else float('nan'):.3f} "
        f"kiln_recall={k.recall[cfg.threshold] if k else float('nan'):.3f}"
    )


if __name__ == "__main__":
    main()
