"""Near-dedup at a million documents: time and peak memory per phase of `kiln curate`.

Generates `--docs` documents (default 1,000,000) of `--words` words each, drawn from a Zipf
distribution over a synthetic vocabulary, in `--files` JSONL files (one read task each). A
tenth of them are planted copies: half exact, half with a few words substituted (Jaccard of
5-gram shingles around 0.85-0.95). Then runs the real `kiln curate` with exact and MinHash
dedup only (the other steps off), 2 workers, and prints for every phase its seconds and the
peak resident memory of the processes that ran it (from the manifest's `phases`), next to the
estimate kiln logged before the near-dedup phases, and the peak of the largest process of the
whole run (driver or worker). The goal: every process under 4 GB.
Ends with: RESULT docs=.. docs_s=.. max_rss_mb=.. near_duplicates=..
Not measured here: the quality filters (curate_vs_datatrove.py) or dedup accuracy (dedup_quality.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
OFF = ("language", "line_dedup", "gopher_repetition", "gopher_quality", "c4", "fineweb", "pii", "url_filter")


def generate(path: Path, docs: int, words: int, files: int, seed: int = 0) -> list[Path]:
    """`files` JSONL files with `docs` documents in all; 5% exact and 5% near copies of earlier ones."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i:x}" for i in range(50_000)])
    path.mkdir(parents=True, exist_ok=True)
    outs = [path / f"part-{i:03d}.jsonl" for i in range(files)]
    if all(p.is_file() for p in outs) and (path / "done").is_file():
        return outs
    handles = [open(p, "w", encoding="utf-8") for p in outs]
    recent: list[str] = []
    for i in range(docs):
        roll = rng.random()
        if roll < 0.05 and recent:
            text = recent[rng.integers(len(recent))]
        elif roll < 0.10 and recent:
            tokens = recent[rng.integers(len(recent))].split()
            for at in rng.integers(0, len(tokens), size=max(1, len(tokens) // 80)):
                tokens[at] = "edit" + str(rng.integers(1_000_000))
            text = " ".join(tokens)
        else:
            text = " ".join(vocab[np.minimum(rng.zipf(1.3, size=words), len(vocab)) - 1])
            if len(recent) < 10_000:
                recent.append(text)
            else:
                recent[rng.integers(len(recent))] = text
        handles[i % files].write(json.dumps({"id": f"doc{i}", "text": text}) + "\n")
    for h in handles:
        h.close()
    (path / "done").write_text("ok")
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--words", type=int, default=80)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    t0 = time.perf_counter()
    files = generate(CACHE / f"dedup-scale-{args.docs}x{args.words}", args.docs, args.words, args.files)
    mb = sum(f.stat().st_size for f in files) / 1e6
    print(
        f"corpus: {args.docs:,} documents, {mb:,.0f} MB in {len(files)} files (generated or reused in "
        f"{time.perf_counter() - t0:.0f} s)"
    )

    run = f"dedup-scale-{args.docs}"
    runs = CACHE / "kiln-runs"
    cmd = [
        str(Path(sys.executable).with_name("kiln")),
        "-q",
        "curate",
        "--run",
        run,
        "--force",
        "--set",
        f"curate.executor.workers={args.workers}",
    ]
    for f in files:
        cmd += ["--input", str(f)]
    for step in OFF:
        cmd += ["--set", f"curate.{step}.enabled=false"]
    runs.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=runs)
    wall = time.perf_counter() - started
    # the largest process of the run: kiln's driver or any pool worker it waited for
    max_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    manifest = json.loads((runs / "runs" / run / "curate" / "manifest.json").read_text())
    near = manifest["counts"]["minhash"]
    estimate = near["memory_estimate_mb"]
    print(f"\nkiln curate: {wall:.1f} s, {args.docs / wall:,.0f} docs/s, {mb / wall:.2f} MB/s; workers={args.workers}")
    print(f"  {'phase':<12} {'seconds':>8} {'peak RSS MB':>12} {'estimate MB':>12}")
    for phase, row in manifest["phases"].items():
        est = f"{estimate[phase]:>12,.0f}" if phase in estimate else f"{'':>12}"
        print(f"  {phase:<12} {row['seconds']:>8.1f} {row['max_rss_mb']:>12,.0f} {est}")
    removed = manifest["counts"]["removed"]
    print(f"  removed: {json.dumps(removed)}")
    print(
        f"  minhash: signed {near['signed']:,}, candidates {near['candidates']:,}, verified {near['verified']:,}, "
        f"clusters {near['clusters']:,}, largest {near['largest_cluster']}"
    )
    print(f"  largest process (driver or worker): {max_rss_mb:,.0f} MB (goal: under 4,000 MB)")
    print(
        f"RESULT docs={args.docs} docs_s={args.docs / wall:.1f} max_rss_mb={max_rss_mb:.0f} "
        f"near_duplicates={removed.get('minhash_dedup:near_duplicate', 0)}"
    )


if __name__ == "__main__":
    main()
