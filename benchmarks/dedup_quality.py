"""Near-dedup quality: does `kiln curate` put true near-duplicates in one cluster, and only those.

Builds a corpus of about 3,300 documents (benchmarks/dedup_corpus.py): 2,000 bases of a few
hundred words of local text (no two with Jaccard >= 0.5), word-edited variants of 40% of them
at a measured Jaccard spread uniformly over 0.5-1.0, two variants of another 8%, identical copies
of 8% of the bases and 5% of the variants. The true pairs come from brute force over all pairs
with kiln's shingling (5-grams of kiln.text.shingles.shingle_set, digits folded). Then
runs the real `kiln curate` with only exact_dedup and minhash_dedup on (default config: 14 bands
x 8 rows, verified at 0.8), 2 workers, and compares its clusters (near-dup clusters joined with
exact-dup removals) with the truth:
  precision   predicted same-cluster pairs with true Jaccard >= 0.8
  recall_085  true pairs >= 0.85 in one cluster; recall_080 likewise >= 0.8
and per Jaccard bucket: recall, LSH candidates and direct merges next to the S-curve
1-(1-s^8)^14, read from the run's work folder (kept for this: see dedup_corpus.run_kiln).
Ends with: RESULT precision=.. recall_085=.. recall_080=..
Not measured here: speed (benchmarks/minhash_vs_datatrove.py), other shingle sizes or band layouts.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import dedup_corpus as dc
import numpy as np

from kiln.curate.dedup.minhash import s_curve

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache" / "dedup-quality"


def per_bucket(
    truth: tuple[np.ndarray, np.ndarray, np.ndarray], n: int, pairs: np.ndarray, signed: np.ndarray
) -> list[tuple[int, int]]:
    """Per bucket: (true pairs with both documents signed, of them found in `pairs`)."""
    ti, tj, tjac = truth
    found = set((np.minimum(pairs[:, 0], pairs[:, 1]) * n + np.maximum(pairs[:, 0], pairs[:, 1])).tolist())
    is_signed = np.zeros(n, dtype=bool)
    is_signed[signed] = True
    both = is_signed[ti] & is_signed[tj]
    hit = np.fromiter(((a * n + b) in found for a, b in zip(ti.tolist(), tj.tolist())), dtype=bool, count=len(ti))
    rows = []
    for lo, hi in dc.BUCKETS:
        mask = both & (tjac >= lo) & ((tjac < hi) if hi < 1.0 else (tjac <= 1.0))
        rows.append((int(mask.sum()), int(hit[mask].sum())))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bases", type=int, default=2000, help="Base documents before planting.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the chunking, the planting and the shard order.")
    parser.add_argument("--workers", type=int, default=2, help="kiln worker processes (and input files).")
    args = parser.parse_args()
    started = time.perf_counter()
    rng = random.Random(args.seed)
    cfg = dc.DEFAULTS

    bases = dc.base_documents(args.bases, rng)
    docs = dc.plant(bases, rng)
    kinds = {k: sum(d.kind == k for d in docs) for k in ("base", "variant", "copy", "variant_copy")}
    print(
        f"corpus: {len(docs)} documents ({', '.join(f'{v} {k}' for k, v in kinds.items())}), "
        f"{sum(len(d.text.encode()) for d in docs) / 1e6:.1f} MB; built in {time.perf_counter() - started:.0f} s"
    )
    measured = np.array([d.measured for d in docs if d.kind == "variant"])
    print(
        "planted variants by measured Jaccard to their base: "
        + " ".join(f"{lo:.2f}:{int(((measured >= lo) & (measured < hi)).sum())}" for lo, hi in dc.BUCKETS)
    )

    sets = [d.sets for d in docs]
    t0 = time.perf_counter()
    truth = dc.true_pairs(sets, min(lo for lo, _ in dc.BUCKETS))
    n = len(docs)
    print(
        f"brute force: {len(truth[0])} pairs with Jaccard >= 0.5 among {n * (n - 1) // 2:,} "
        f"({time.perf_counter() - t0:.1f} s); "
        f">= 0.8: {int((truth[2] >= cfg.threshold).sum())}"
    )

    input_dir = CACHE / "input"
    dc.write_jsonl_shards(docs, input_dir, args.workers, rng)
    run = dc.run_kiln(
        str(input_dir / "*.jsonl"), CACHE / "runs", args.workers, ("exact_dedup", "minhash_dedup"), keep_work=True
    )
    counts = run.manifest["counts"]
    print(
        f"kiln curate: {run.seconds:.1f} s, {counts['docs_in']} in, {counts['docs_out']} kept, removed "
        f"{counts['removed']}"
    )
    print(f"  minhash: {', '.join(f'{k}={v}' for k, v in counts['minhash'].items() if not isinstance(v, dict))}")

    index_of = {d.id: i for i, d in enumerate(docs)}
    labels = dc.kiln_labels(run, index_of)
    s = dc.score(labels, sets, truth)
    work = dc.kept_work_pairs(run.stage, index_of)
    direct = None
    if work is not None:
        candidates, verified, kiln_jac, signed = work
        mine = np.fromiter(
            (dc.jaccard(sets[a], sets[b]) for a, b in verified.tolist()), dtype=np.float64, count=len(verified)
        )
        mismatch = int((np.abs(mine - kiln_jac) > 1e-12).sum())
        print(
            f"direct merges (verified pairs): {len(verified)}, min true Jaccard "
            f"{mine.min() if len(mine) else float('nan'):.4f}, "
            f"below 0.7: {int((mine < 0.7).sum())}, whose Jaccard differs between kiln and this brute force: {mismatch}"
        )
        cand_rows = per_bucket(truth, n, candidates, signed)
        direct = per_bucket(truth, n, verified, signed)
        below_07 = int((mine < 0.7).sum())
    else:
        # without the work folder only the removed documents' Jaccard to their keeper is known
        near = [r["value"] for r in run.removed if r["step"] == "minhash_dedup"]
        below_07 = None
        print(
            "verified pairs not accessible; min jaccard_to_kept of near-dup removals: "
            f"{min(near) if near else float('nan'):.4f}"
        )
    chained = sum(1 for r in run.removed if r["step"] == "minhash_dedup" and r["value"] < cfg.threshold)
    print(
        f"predicted same-cluster pairs: {s.predicted_pairs}, chain pairs (same cluster, true Jaccard < "
        f"{cfg.threshold}): {s.chain_pairs}, "
        f"min true Jaccard of a predicted pair: {s.min_predicted_jaccard:.4f}; near-dup removals below "
        f"{cfg.threshold} to their keeper: {chained}"
    )
    print(f"true pairs: {s.true_counts[0.85]} >= 0.85, {s.true_counts[0.8]} >= 0.8")

    print(
        f"recall by true Jaccard bucket. S-curve 1-(1-s^{cfg.rows})^{cfg.bands} = chance of becoming an LSH "
        "candidate, at the bucket's"
        " mid-point and averaged over its pairs (the fair figure to set beside the candidate rate: S is convex "
        "over most of 0.5-0.8);"
        " candidate and direct columns count pairs whose two documents were both signed, i.e. not removed by "
        "exact dedup first"
    )
    print(
        f"  {'bucket':<10} {'true pairs':>10} {'one cluster':>12} {'recall':>7} {'S mid':>6} {'S mean':>7} "
        f"{'candidate':>10} {'direct merge':>13}"
    )
    tjac = truth[2]
    for k, (lo, hi, total, same) in enumerate(s.by_bucket):
        in_bucket = tjac[(tjac >= lo) & ((tjac < hi) if hi < 1.0 else (tjac <= 1.0))]
        mid, mean = (
            s_curve((lo + hi) / 2, cfg.bands, cfg.rows),
            s_curve(in_bucket, cfg.bands, cfg.rows).mean() if len(in_bucket) else float("nan"),
        )
        line = (
            f"  {lo:.2f}-{hi:.2f} {total:>10} {same:>12} {same / total if total else float('nan'):>7.3f} {mid:>6.3f} "
            f"{mean:>7.3f}"
        )
        if direct is not None:
            (signed_pairs, cand), (_, merged) = cand_rows[k], direct[k]
            line += (
                f" {cand / signed_pairs if signed_pairs else float('nan'):>10.3f} "
                f"{merged / signed_pairs if signed_pairs else float('nan'):>13.3f}"
            )
        print(line)
    if below_07 is not None:
        print(f"pairs below 0.7 merged directly: {below_07} (must be 0)")
    goals = {"recall_085 >= 0.95": s.recall[0.85] >= 0.95, "precision >= 0.98": s.precision >= 0.98}
    print(
        "goals: "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in goals.items())
        + f"; whole run {time.perf_counter() - started:.0f} s"
    )
    print(f"RESULT precision={s.precision:.3f} recall_085={s.recall[0.85]:.3f} recall_080={s.recall[0.8]:.3f}")


if __name__ == "__main__":
    main()
