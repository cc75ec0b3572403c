"""Tokenizer encoding speed: kiln's encoder against Hugging Face `tokenizers` and tiktoken, same text, same BPE.

Text: the local-text corpus of benchmarks/curate_vs_datatrove.py (>= 50 MB, cached as
benchmarks/.cache/corpus-55mb.jsonl), `--copies` times over (each copy's ids suffixed), dealt
into `--files` JSONL files (kiln tokenize runs one task per curated shard, and curate makes
shards per input file), through `kiln curate` with only normalization and length limits (the
quality filters would keep 2 MB of this man-page-heavy text, exact dedup one copy), then a
byte-level BPE of `--vocab` tokens trained on it by `kiln train-tokenizer` (both cached in
benchmarks/.cache/runs/tokenize-speed and redone only when kiln changes them).
On every distinct curated text (one copy), one thread each (per-core figures; RAYON_NUM_THREADS=1 holds
`tokenizers` to one thread):
  kiln       KilnTokenizer.encode_batch, what each `kiln tokenize` worker runs
  hf         tokenizers.Tokenizer.encode_batch on the stage's tokenizer.json
  tiktoken   tiktoken.Encoding built here from the same vocabulary (mergeable ranks) and pre-split regex
best of `--repeats`, then checks that all three give the same ids for every document. Then the
whole `kiln tokenize` stage on all copies (read shards, encode, write and join token shards)
with 1 and with 2 worker processes, to show throughput scaling with workers; the copies make
the work long enough that starting the worker processes (about 0.8 s) does not hide it.
Ends with: RESULT kiln_mb_s=.. hf_mb_s=.. tiktoken_mb_s=.. ratio_vs_fastest=.. ids_identical=.. stage_1w_mb_s=..
stage_2w_mb_s=..
Not measured here: Ray (same tasks as the process pool), decoding.
"""

from __future__ import annotations

import os

# Before anything imports `tokenizers`: its thread pool is sized once, on first use.
os.environ["RAYON_NUM_THREADS"] = os.environ["RAYON_RS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import tiktoken  # noqa: E402
from curate_vs_datatrove import build_corpus  # noqa: E402

from kiln.core.docshards import list_shards, read_shard  # noqa: E402
from kiln.recipe import load_recipe  # noqa: E402
from kiln.text.tokenizer import SPLIT_PATTERN, KilnTokenizer, token_to_bytes  # noqa: E402
from kiln.tokenize.encode import run as tokenize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
CORPUS = CACHE / "corpus-55mb.jsonl"
RUNS = CACHE / "runs"
NAME = "tokenize-speed"
FILTERS_OFF = [
    f"curate.{step}.enabled=false"
    for step in (
        "line_dedup",
        "language",
        "gopher_repetition",
        "gopher_quality",
        "c4",
        "fineweb",
        "code_quality",
        "pii",
        "exact_dedup",
        "minhash_dedup",
    )
]


def deal(files: int, copies: int) -> Path:
    """`copies` of the corpus (ids suffixed #k) dealt line by line into `files` JSONL files."""
    folder = CACHE / f"tokenize-speed-input-{files}x{copies}"
    if not folder.exists():
        tmp = folder.with_suffix(".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        outs = [(tmp / f"part-{i:03d}.jsonl").open("w", encoding="utf-8") for i in range(files)]
        n = 0
        for copy in range(copies):
            with CORPUS.open(encoding="utf-8") as lines:
                for line in lines:
                    record = json.loads(line)
                    record["id"] = f"{record['id']}#{copy}"
                    outs[n % files].write(json.dumps(record, ensure_ascii=False) + "\n")
                    n += 1
        for out in outs:
            out.close()
        tmp.rename(folder)
    return folder


def prepare(vocab: int, files: int, copies: int) -> Path:
    """Curate the corpus and train the tokenizer with the kiln command (each skipped when current)."""
    if not CORPUS.exists():
        print(f"building {CORPUS} (once)", flush=True)
        build_corpus(CORPUS, 55)
    kiln = [sys.executable, "-m", "kiln", "-q"]
    common = ["--run", NAME, "--set", f"runs_dir={RUNS}"]
    subprocess.run(
        [
            *kiln,
            "curate",
            "--input",
            str(deal(files, copies)),
            *common,
            *(a for o in FILTERS_OFF for a in ("--set", o)),
        ],
        check=True,
    )
    subprocess.run(
        [
            *kiln,
            "train-tokenizer",
            "--recipe",
            "demo",
            "--set",
            f"name={NAME}",
            "--set",
            f"runs_dir={RUNS}",
            "--set",
            f"tokenizer.vocab_size={vocab}",
        ],
        check=True,
    )
    return RUNS / NAME


def tiktoken_twin(tok: KilnTokenizer) -> tiktoken.Encoding:
    """tiktoken loaded with the vocabulary of tokenizer.json: each token's bytes ranked by its id."""
    ranks = {token_to_bytes(t): i for t, i in tok.hf.get_vocab().items() if t not in tok.specials}
    return tiktoken.Encoding("bench", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=tok.specials)


def best(fn: Callable[[], list[list[int]]], repeats: int) -> tuple[float, list[list[int]]]:
    times, ids = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ids = fn()
        times.append(time.perf_counter() - t0)
    return min(times), ids


def stage_mb_s(run_dir: Path, workers: int, nbytes: int) -> float:
    recipe = load_recipe("demo", [f"name={NAME}", f"runs_dir={RUNS}", f"tokenize.executor.workers={workers}"])
    t0 = time.perf_counter()
    tokenize(recipe.tokenize, run_dir, force=True)
    return nbytes / 1e6 / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vocab", type=int, default=32768, help="Vocabulary size of the tokenizer all three encoders use."
    )
    parser.add_argument("--repeats", type=int, default=3, help="Timed passes per encoder; the best counts.")
    parser.add_argument("--files", type=int, default=16, help="JSONL files the corpus is dealt into before curation.")
    parser.add_argument("--copies", type=int, default=4, help="Copies of the corpus the tokenize stage encodes.")
    args = parser.parse_args()
    run_dir = prepare(args.vocab, args.files, args.copies)
    tok = KilnTokenizer.load(run_dir / "tokenizer" / "tokenizer.json")
    all_texts = [d.text for s in list_shards(run_dir / "curate" / "shards") for d in read_shard(s)]
    stage_bytes = sum(len(t.encode("utf-8")) for t in all_texts)
    texts = list(dict.fromkeys(all_texts))
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    shards = len(list_shards(run_dir / "curate" / "shards"))
    print(
        (
            f"{len(texts):,} distinct curated documents, {nbytes / 1e6:.1f} MB ({stage_bytes / 1e6:.1f} MB in "
            f"{shards} shards with the copies); vocabulary {tok.vocab_size:,}"
        ),
        flush=True,
    )

    enc = tiktoken_twin(tok)
    runs = {
        "kiln": lambda: tok.encode_batch(texts),
        "hf": lambda: [e.ids for e in tok.hf.encode_batch(texts, add_special_tokens=False)],
        "tiktoken": lambda: [enc.encode_ordinary(t) for t in texts],
    }
    speed, ids = {}, {}
    for name, fn in runs.items():
        seconds, ids[name] = best(fn, args.repeats)
        speed[name] = nbytes / 1e6 / seconds
        print(f"  {name:<9} {speed[name]:7.2f} MB/s per core ({seconds:.2f} s)", flush=True)
    identical = ids["kiln"] == ids["hf"] == ids["tiktoken"]
    if not identical:
        differ = sum(a != b or a != c for a, b, c in zip(ids["kiln"], ids["hf"], ids["tiktoken"], strict=True))
        print(f"  ids differ on {differ} of {len(texts)} documents", flush=True)
    fastest = max(speed["hf"], speed["tiktoken"])
    print(f"kiln tokenize, end to end on {stage_bytes / 1e6:.0f} MB:", flush=True)
    stage = {w: stage_mb_s(run_dir, w, stage_bytes) for w in (1, 2)}
    for w, mb_s in stage.items():
        print(f"  {w} worker{'s' if w > 1 else ''}: {mb_s:.2f} MB/s", flush=True)
    print(
        f"RESULT kiln_mb_s={speed['kiln']:.2f} hf_mb_s={speed['hf']:.2f} tiktoken_mb_s={speed['tiktoken']:.2f} "
        f"ratio_vs_fastest={speed['kiln'] / fastest:.3f} ids_identical={int(identical)} "
        f"stage_1w_mb_s={stage[1]:.2f} stage_2w_mb_s={stage[2]:.2f}"
    )
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
