"""Tokenizer encoding speed: kiln's encoders against the libraries that read the same vocabularies, same text.

Text: the local-text corpus of benchmarks/curate_vs_datatrove.py (>= 50 MB, cached as
benchmarks/.cache/corpus-55mb.jsonl), `--copies` times over (each copy's ids suffixed), dealt
into `--files` JSONL files (kiln tokenize runs one task per curated shard, and curate makes
shards per input file), through `kiln curate` with only normalization and length limits (the
quality filters would keep 2 MB of this man-page-heavy text, exact dedup one copy), then a
byte-level BPE of `--vocab` tokens trained on it by `kiln train-tokenizer` (both cached in
benchmarks/.cache/runs/tokenize-speed and redone only when kiln changes them).
Two foreign tokenizers of `--vocab` tokens, built with `tokenizers` on a `--train-mb` sample of the
same text and cached in benchmarks/.cache/tokenize-speed-tokenizers/, read as an imported model's:
  byte-level     Llama 3's layout: a regex Split then ByteLevel, ignore_merges, a <|begin_of_text|> template
  sentencepiece  Llama 2's layout: the ▁ normaliser, BPE with byte fallback, a <s> template
On every distinct curated text (one copy), one thread each (per-core figures; RAYON_NUM_THREADS=1
holds splintr and `tokenizers` to one thread), for each tokenizer:
  kiln       the tokenizer's encode_flat over batches of 256 documents, what each `kiln tokenize` worker runs
  splintr    splintr's encode_batch_flat on the same tokenizer.json, same batches (its fastest call)
  tiktoken   tiktoken.Encoding from the same vocabulary and pre-split regex (byte-level kinds only)
  hf         tokenizers.Tokenizer.encode_batch (once: it is the slowest by far)
the others best of `--repeats`; kiln's ids are then checked against `tokenizers`' (and, for kiln's own,
tiktoken's, which define them) on every document. Then the whole `kiln tokenize` stage on all
copies with kiln's own tokenizer (read shards, encode, write and join token shards) with 1 and with
2 worker processes, to show throughput scaling with workers; the copies make the work long enough
that starting the worker processes (about 0.3 s) does not hide it.
Ends with: RESULT kiln_mb_s=.. splintr_mb_s=.. hf_mb_s=.. tiktoken_mb_s=.. ratio_vs_fastest=..
bytelevel_kiln_mb_s=.. bytelevel_fastest_mb_s=.. bytelevel_ratio=.. sp_kiln_mb_s=.. sp_fastest_mb_s=..
sp_ratio=.. ids_identical=.. stage_1w_mb_s=.. stage_2w_mb_s=..  (fastest: the fastest other library)
Not measured here: Ray (same tasks as the process pool), decoding, WordPiece and Unigram tokenizers.
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

import numpy as np  # noqa: E402
import splintr  # noqa: E402
import tiktoken  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from kiln.core.docshards import list_shards, read_shard  # noqa: E402
from kiln.text.byte_level import token_to_bytes  # noqa: E402
from kiln.text.engines import Flat, packed, with_tiktoken  # noqa: E402
from kiln.text.hf_tokenizer import CONFIG, TOKENIZER_JSON, HfTokenizer  # noqa: E402
from kiln.text.tokenizer import SPLIT_PATTERN, KilnTokenizer  # noqa: E402
from kiln.tokenize.encode import run as tokenize  # noqa: E402

# Not imported here: kiln.recipe (it imports torch) and the corpus builder. The stage's worker processes are
# spawned and import this file first, as `kiln tokenize`'s import kiln's light CLI module.
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
CORPUS = CACHE / "corpus-55mb.jsonl"
RUNS = CACHE / "runs"
NAME = "tokenize-speed"
FOREIGN = CACHE / "tokenize-speed-tokenizers"
BATCH = 256  # documents per encode_flat call, tokenize.batch_docs' default
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
        from curate_vs_datatrove import build_corpus

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


def llama3_style(texts: list[str], vocab: int) -> Tokenizer:
    """Byte-level BPE with Llama 3's pre-split (kiln's pattern is its twin) and begin-of-text template."""
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{specials[0]} $A", special_tokens=[(specials[0], tok.token_to_id(specials[0]))]
    )
    return tok


def llama2_style(texts: list[str], vocab: int) -> Tokenizer:
    """SentencePiece-style BPE as Llama 2 ships it: <unk> <s> </s>, 256 byte-fallback tokens, then the merges'
    tokens; no pre-split (the ▁ normaliser marks spaces), a <s> template."""
    spaced = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = Tokenizer(models.BPE())
    trained.normalizer = spaced
    trained.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")  # training words only
    trained.train_from_iterator(texts, trainer=trainers.BpeTrainer(vocab_size=vocab - 259, show_progress=False))
    model = json.loads(trained.to_str())["model"]
    ids = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for token in sorted(model["vocab"], key=model["vocab"].__getitem__):
        ids.setdefault(token, len(ids))
    bpe = models.BPE(
        vocab=ids, merges=[tuple(m) for m in model["merges"]], unk_token="<unk>", byte_fallback=True, fuse_unk=True
    )
    tok = Tokenizer(bpe)
    tok.normalizer = spaced
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


def foreign(kind: str, texts: list[str], vocab: int, train_mb: float) -> HfTokenizer:
    """The byte-level or sentencepiece tokenizer of `vocab` tokens, trained on the first `train_mb` of texts once."""
    path = FOREIGN / f"{kind}-{vocab}-{train_mb:g}mb.json"
    if not path.exists():
        sample, size = [], 0
        for t in texts:
            if size > train_mb * 1e6:
                break
            sample.append(t)
            size += len(t.encode("utf-8"))
        print(f"training the {kind} tokenizer on {size / 1e6:.1f} MB (once)", flush=True)
        build = llama3_style if kind == "byte-level" else llama2_style
        FOREIGN.mkdir(parents=True, exist_ok=True)
        build(sample, vocab).save(str(path))
    roles = {"byte-level": ("<|begin_of_text|>", "<|end_of_text|>"), "sentencepiece": ("<s>", "</s>")}[kind]
    config = json.dumps({"bos_token": roles[0], "eos_token": roles[1]}).encode()
    return HfTokenizer({TOKENIZER_JSON: path.read_bytes(), CONFIG: config}, str(path))


def flat(result: Flat | list[list[int]]) -> Flat:
    return result if isinstance(result, tuple) else packed(result)


def joined(parts: list[Flat]) -> Flat:
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def best(fn: Callable[[], Flat | list[list[int]]], repeats: int) -> tuple[float, Flat | list[list[int]]]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def compare(
    label: str, runs: dict[str, Callable[[], Flat | list[list[int]]]], exact: list[str], nbytes: int, repeats: int
) -> tuple[dict[str, float], bool]:
    """MB/s of each run (hf once, the others best of repeats), and whether kiln's ids equal each of `exact`'s."""
    print(f"{label}:", flush=True)
    speed, ids = {}, {}
    for name, fn in runs.items():
        seconds, out = best(fn, 1 if name == "hf" else repeats)
        speed[name] = nbytes / 1e6 / seconds
        print(f"  {name:<9} {speed[name]:7.2f} MB/s per core ({seconds:.2f} s)", flush=True)
        if name == "kiln" or name in exact:
            ids[name] = flat(out)
    identical = all(
        np.array_equal(ids["kiln"][0], ids[name][0]) and np.array_equal(ids["kiln"][1], ids[name][1]) for name in exact
    )
    if not identical:
        print(f"  kiln's ids differ from {exact}", flush=True)
    return speed, identical


def fastest_other(speed: dict[str, float]) -> float:
    return max(v for k, v in speed.items() if k != "kiln")


def stage_mb_s(run_dir: Path, workers: int, nbytes: int) -> float:
    from kiln.recipe import load_recipe

    recipe = load_recipe("demo", [f"name={NAME}", f"runs_dir={RUNS}", f"tokenize.executor.workers={workers}"])
    t0 = time.perf_counter()
    tokenize(recipe.tokenize, run_dir, force=True)
    return nbytes / 1e6 / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vocab", type=int, default=32768, help="Vocabulary size of every tokenizer (kiln's own and the foreign ones)."
    )
    parser.add_argument("--repeats", type=int, default=3, help="Timed passes per encoder; the best counts.")
    parser.add_argument("--files", type=int, default=16, help="JSONL files the corpus is dealt into before curation.")
    parser.add_argument("--copies", type=int, default=4, help="Copies of the corpus the tokenize stage encodes.")
    parser.add_argument("--train-mb", type=float, default=20.0, help="MB of the text the foreign tokenizers learn.")
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
    batches = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]

    def splintr_flat(tokenizer_json: bytes) -> Callable[[], Flat]:
        sp = splintr.from_json_bytes(tokenizer_json)

        def run() -> Flat:
            parts = []
            for b in batches:
                ids, ends = sp.encode_batch_flat(b)
                parts.append((np.frombuffer(ids, dtype="<u4"), np.diff(np.frombuffer(ends, dtype="<u8"))))
            return joined(parts)

        return run

    enc = tiktoken_twin(tok)
    own, own_same = compare(
        f"kiln's own tokenizer (kiln encodes with {tok.encoder_name})",
        {
            "kiln": lambda: joined([tok.encode_flat(b) for b in batches]),
            "splintr": splintr_flat(tok.hf.to_str().encode()),
            "tiktoken": lambda: [enc.encode_ordinary(t) for t in texts],
            "hf": lambda: [e.ids for e in tok.hf.encode_batch(texts, add_special_tokens=False)],
        },
        ["tiktoken", "hf"],
        nbytes,
        args.repeats,
    )
    kinds, same = {}, [own_same]
    for kind in ("byte-level", "sentencepiece"):
        hf_tok = foreign(kind, texts, args.vocab, args.train_mb)
        runs = {
            "kiln": lambda t=hf_tok: joined([t.encode_flat(b) for b in batches]),
            "splintr": splintr_flat(hf_tok.files[TOKENIZER_JSON]),
            "hf": lambda t=hf_tok: [e.ids for e in t.hf.encode_batch(texts, add_special_tokens=False)],
        }
        twin = with_tiktoken(json.loads(hf_tok.files[TOKENIZER_JSON]), hf_tok.hf)
        if twin is not None:
            runs["tiktoken"] = lambda twin=twin: [twin.encode(t) for t in texts]
        kinds[kind], identical = compare(
            f"{kind} tokenizer, imported (kiln encodes with {hf_tok.encoder_name})", runs, ["hf"], nbytes, args.repeats
        )
        same.append(identical)
    print(f"kiln tokenize, end to end on {stage_bytes / 1e6:.0f} MB:", flush=True)
    stage = {w: stage_mb_s(run_dir, w, stage_bytes) for w in (1, 2)}
    for w, mb_s in stage.items():
        print(f"  {w} worker{'s' if w > 1 else ''}: {mb_s:.2f} MB/s", flush=True)
    bl, sp = kinds["byte-level"], kinds["sentencepiece"]
    print(
        f"RESULT kiln_mb_s={own['kiln']:.2f} splintr_mb_s={own['splintr']:.2f} hf_mb_s={own['hf']:.2f} "
        f"tiktoken_mb_s={own['tiktoken']:.2f} ratio_vs_fastest={own['kiln'] / fastest_other(own):.3f} "
        f"bytelevel_kiln_mb_s={bl['kiln']:.2f} bytelevel_fastest_mb_s={fastest_other(bl):.2f} "
        f"bytelevel_ratio={bl['kiln'] / fastest_other(bl):.3f} sp_kiln_mb_s={sp['kiln']:.2f} "
        f"sp_fastest_mb_s={fastest_other(sp):.2f} sp_ratio={sp['kiln'] / fastest_other(sp):.3f} "
        f"ids_identical={int(all(same))} stage_1w_mb_s={stage[1]:.2f} stage_2w_mb_s={stage[2]:.2f}"
    )
    if not all(same):
        sys.exit(1)


if __name__ == "__main__":
    main()
