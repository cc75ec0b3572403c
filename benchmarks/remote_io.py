"""Curating from an object store against curating from disk, and the train loader on token shards kept in a store.

Builds the ≥50 MB JSONL corpus of `curate_vs_datatrove.py` (local text), starts an S3-compatible server on
localhost (moto's standalone server, in this process, as the test suite does) and puts the corpus in a bucket.
Then `kiln curate` (its default steps, 2 workers) three times, in turns:

  local     corpus and run on disk
  s3        corpus read from the bucket (range reads through kiln.core.storage), run on disk
  s3_run    corpus and run in the bucket (runs_dir=s3://...: tasks store their files there, the stage publishes)

and reports documents/s of each, their ratios to `local`, and the requests each made (from the stage's
manifest: store_traffic). Then the loader: a tokenizer and token shards are made from the local run's curated
output, the run's stages are put in the bucket, and a machine with an empty cache reads them the way `kiln train`
does (the manifest's shards fetched into the mirror and checked, then memory-mapped): the fetch time, and the
sampler's tokens/s from that mirror against the local shards. The loader waits only for the fetch, once, before
step 1; its share of a training run is that time over the run's time at `--train-tokens-s` (the demo's CPU speed,
benchmarks/README.md) for `--train-tokens` tokens.
Ends with: RESULT local_docs_s=.. s3_docs_s=.. ratio=.. get_requests=.. s3_run_docs_s=.. run_ratio=..
loader_local_tokens_s=.. loader_store_tokens_s=.. fetch_s=.. data_wait_share=..
Not measured: a remote store's latency and bandwidth (the server is on this machine; moto is slower per request
than S3 itself, so the ratios here are a floor for the client's own cost), multi-node runs (tests cover them).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
KILN = Path(sys.executable).with_name("kiln")


def serve() -> tuple[object, dict[str, str]]:
    """moto's S3 server on a free localhost port, and the environment a client needs to reach it."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(env)
    return server, env


def kiln(*args: str, env: dict[str, str]) -> float:
    """Run a kiln command; its wall seconds."""
    t0 = time.perf_counter()
    done = subprocess.run([str(KILN), *args], env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"kiln {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def curate(name: str, corpus: str, runs_dir: str, workers: int, env: dict[str, str], *sets: str) -> tuple[float, dict]:
    """`kiln curate` of the corpus into runs_dir/name (`sets`: more overrides); (seconds, manifest)."""
    seconds = kiln(
        "curate",
        "--recipe",
        "demo",
        "--input",
        corpus,
        "--set",
        f"name={name}",
        "--set",
        f"runs_dir={runs_dir}",
        "--set",
        f"curate.executor.workers={workers}",
        "--set",
        "curate.max_total_mb=null",
        *(part for s in sets for part in ("--set", s)),
        "--force",
        env=env,
    )
    if runs_dir.startswith("s3://"):
        import s3fs

        manifest = json.loads(s3fs.S3FileSystem().cat(f"{runs_dir[5:]}/{name}/curate/manifest.json"))
    else:
        manifest = json.loads((Path(runs_dir) / name / "curate" / "manifest.json").read_text())
    return seconds, manifest


def requests(manifest: dict) -> dict[str, int]:
    from kiln.core.storage import api_calls

    return api_calls(manifest.get("store_traffic", {}).get("s3", {}))


def loader_tokens_s(tokenize_dir: Path, rows: int, seq_len: int) -> float:
    """Tokens/s of the train split's sampler drawing `rows` windows (as the train loop asks for them)."""
    from kiln.mix.config import MixConfig
    from kiln.mix.sampler import build_sampler

    sampler = build_sampler(tokenize_dir, MixConfig(seed=0), seq_len)
    t0 = time.perf_counter()
    for _ in range(rows // 64):
        sampler.next_rows([seq_len + 1] * 64)
    return rows * seq_len / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-mb", type=float, default=50.0, help="corpus size, MB of text")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rows", type=int, default=8192, help="windows the loader draws, each way")
    parser.add_argument("--train-tokens", type=float, default=30e6, help="a training run's tokens, for the wait share")
    parser.add_argument("--train-tokens-s", type=float, default=3746, help="its tokens/s (the demo model on 2 cores)")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from curate_vs_datatrove import build_corpus

    corpus = CACHE / f"remote_io_{args.min_mb:g}mb" / "corpus.jsonl"
    if not corpus.is_file():
        docs, nbytes = build_corpus(corpus, args.min_mb)
        print(f"corpus: {docs:,} documents, {nbytes / 1e6:.1f} MB of text -> {corpus}")
    server, env = serve()
    import s3fs

    from kiln.core.manifest import recorded_outputs
    from kiln.core.mirror import mirror_of

    fs = s3fs.S3FileSystem()
    fs.mkdir("bench")
    fs.put_file(str(corpus), "bench/corpus/corpus.jsonl")
    work = CACHE / "remote_io_runs"
    env["KILN_CACHE"] = str(work / "cache")

    local_s, local = curate("local", str(corpus), str(work / "runs"), args.workers, env)
    s3_s, remote = curate("s3", "s3://bench/corpus/corpus.jsonl", str(work / "runs"), args.workers, env)
    run_s, on_store = curate("store", "s3://bench/corpus/corpus.jsonl", "s3://bench/runs", args.workers, env)
    docs = local["counts"]["docs_in"]
    assert remote["counts"]["docs_out"] == local["counts"]["docs_out"] == on_store["counts"]["docs_out"]
    # Document ids name their input (a path here, a URL there), so the shards differ in ids; what was kept does not.
    same = all(remote["counts"][k] == local["counts"][k] for k in ("docs_out", "bytes_out", "removed"))
    for name, seconds, manifest in (("local", local_s, local), ("s3", s3_s, remote), ("s3_run", run_s, on_store)):
        print(f"{name:7} {seconds:7.1f} s  {docs / seconds:8,.0f} docs/s  requests {requests(manifest)}")
    print(f"the same documents kept from disk and from the store: {same}")

    # The loader: token shards of the whole corpus (every curate step off), kept in the bucket, read by a machine
    # with an empty cache.
    from kiln.curate.config import CurateConfig

    steps = [k for k, v in CurateConfig().model_dump().items() if isinstance(v, dict) and v.get("enabled")]
    curate(
        "loader",
        str(corpus),
        str(work / "runs"),
        args.workers,
        env,
        "curate.sources={}",
        *(f"curate.{k}.enabled=false" for k in steps),
    )
    run = work / "runs" / "loader"
    sets = ["--set", "name=loader", "--set", f"runs_dir={work / 'runs'}", "--set", "tokenizer.vocab_size=4096"]
    kiln("train-tokenizer", "--recipe", "demo", *sets, "--force", env=env)
    kiln("tokenize", "--recipe", "demo", *sets, "--force", env=env)
    fs.put(str(run), "bench/runs/loader", recursive=True)
    os.environ["KILN_CACHE"] = str(work / "fresh-cache")
    fresh = mirror_of("s3://bench/runs") / "loader"
    t0 = time.perf_counter()
    fetched = recorded_outputs(fresh / "tokenize")  # what kiln train does first on a machine without the shards
    fetch_s = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in fetched)
    local_tokens_s = loader_tokens_s(run / "tokenize", args.rows, args.seq_len)
    store_tokens_s = loader_tokens_s(fresh / "tokenize", args.rows, args.seq_len)
    train_s = args.train_tokens / args.train_tokens_s
    wait_share = fetch_s / (fetch_s + train_s)
    print(
        f"loader: {size / 1e6:.1f} MB of token shards fetched in {fetch_s:.2f} s; sampler {local_tokens_s:,.0f} "
        f"tokens/s local, {store_tokens_s:,.0f} from the mirror; a {args.train_tokens:,.0f}-token run at "
        f"{args.train_tokens_s:,.0f} tokens/s waits {wait_share:.3%} of its time for data (goal < 5%)"
    )
    server.stop()
    print(
        f"RESULT local_docs_s={docs / local_s:.1f} s3_docs_s={docs / s3_s:.1f} ratio={local_s / s3_s:.3f} "
        f"get_requests={requests(remote).get('GetObject', 0)} s3_run_docs_s={docs / run_s:.1f} "
        f"run_ratio={local_s / run_s:.3f} loader_local_tokens_s={local_tokens_s:.0f} "
        f"loader_store_tokens_s={store_tokens_s:.0f} fetch_s={fetch_s:.3f} data_wait_share={wait_share:.5f}"
    )


if __name__ == "__main__":
    main()
