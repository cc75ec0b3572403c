"""Corpora with planted near-duplicates, their true pairs by brute force, and precision/recall of clusters.

Shared by benchmarks/dedup_quality.py and benchmarks/minhash_vs_datatrove.py. The pieces:
- `local_texts`: text already on this machine (pydoc topics, README/changelog/copyright files under
  /usr/share/doc, /usr/share/common-licenses, docstrings of the standard library's modules).
- `base_documents`: that text cut into documents of a few hundred words, normalized as kiln
  normalizes (so every tool reads the text kiln shingles), minus near-duplicates of each other.
- `plant`: word-level variants of some bases at a measured Jaccard spread uniformly over
  0.5-1.0, exact copies of bases and variants, and bases with two variants (small clusters).
- `true_pairs`: every pair of documents whose Jaccard of shingle sets reaches a floor, by an
  exhaustive inverted index (shingle -> documents), with kiln's own shingling.
- `score`: precision and recall of predicted clusters against those pairs, by Jaccard bucket.
- `run_kiln`: the real `kiln curate` with only the dedup steps asked for, and its clusters.
Not handled here: datatrove (benchmarks/minhash_vs_datatrove.py runs it in its own virtualenv).
"""

from __future__ import annotations

import ast
import gzip
import json
import random
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from kiln.curate.config import CurateConfig
from kiln.curate.dedup.minhash import MinHashConfig, jaccard
from kiln.curate.steps.normalize import normalize_text
from kiln.text.shingles import shingle_set, words

DEFAULTS = MinHashConfig()  # ngram, fold_digits, threshold, bands, rows: whatever kiln runs by default
BUCKETS = [(0.5 + 0.05 * i, 0.55 + 0.05 * i) for i in range(10)]  # 0.50-0.55 ... 0.95-1.00 (the last one includes 1.0)


def shingles(text: str) -> np.ndarray:
    """The shingle set kiln signs and verifies for this text (sorted distinct uint64)."""
    return shingle_set(text, DEFAULTS.ngram, DEFAULTS.fold_digits)


# ---------------------------------------------------------------------------------------------
# local text


def read_local_file(path: Path) -> str | None:
    """A file's text (.gz unpacked), or None for binary, unreadable or non-UTF-8 files."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\x00" in raw[:8192]:
        return None  # binary
    text = raw.decode("utf-8", errors="replace")
    return None if text.count("\ufffd") > len(text) // 100 else text


def _docstrings(path: Path) -> str | None:
    """A module's docstrings (module, classes, functions), one paragraph each, in source order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    found = [ast.get_docstring(n) for n in nodes]
    return "\n\n".join(d for d in found if d) or None


def local_texts() -> Iterator[tuple[str, str, str]]:
    """(name, source, text) of local files, round-robin over the sources so any prefix mixes them."""
    streams: list[Iterator[tuple[str, str, str]]] = []

    def pydoc_topics() -> Iterator[tuple[str, str, str]]:
        try:
            from pydoc_data.topics import topics
        except ImportError:
            return
        for name, text in sorted(topics.items()):
            yield f"pydoc/{name}", "pydoc", text

    def files(root: str, source: str, pattern: re.Pattern[str]) -> Iterator[tuple[str, str, str]]:
        base = Path(root)
        for path in sorted(base.rglob("*")) if base.is_dir() else []:
            if (
                pattern.search(path.name.lower())
                and path.is_file()
                and not path.is_symlink()
                and (text := read_local_file(path))
            ):
                yield f"{source}:{path.relative_to(base)}", source, text

    def stdlib() -> Iterator[tuple[str, str, str]]:
        root = Path(sysconfig.get_paths()["stdlib"])
        for path in sorted(root.rglob("*.py")):
            if (
                "site-packages" not in path.parts
                and "test" not in path.parts
                and "tests" not in path.parts
                and (text := _docstrings(path))
            ):
                yield f"docstrings:{path.relative_to(root)}", "docstrings", text

    doc_names = re.compile(r"^(readme|changelog|changes|news|history|copyright|authors)|\.(txt|md|rst)(\.gz)?$")
    streams = [
        pydoc_topics(),
        files("/usr/share/doc", "doc", doc_names),
        files("/usr/share/common-licenses", "license", re.compile(".")),
        stdlib(),
    ]
    while streams:
        for stream in list(streams):
            item = next(stream, None)
            if item is None:
                streams.remove(stream)
            else:
                yield item


# ---------------------------------------------------------------------------------------------
# documents


@dataclass
class Doc:
    """One document of a planted corpus. `base` is the index of the base it was made from (itself for a base)."""

    id: str
    source: str
    text: str
    base: int
    kind: str  # base, variant, copy (of a base), variant_copy
    target: tuple[float, float] | None = None  # a variant's target Jaccard bucket to its base
    measured: float | None = None  # a variant's Jaccard to its base, as kiln shingles
    edits: int = 0
    sets: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]

    def record(self) -> dict:
        return {"id": self.id, "text": self.text, "source": self.source}


def _units(text: str, max_words: int) -> Iterator[str]:
    """Paragraphs; one longer than max_words is cut at line ends, and a line longer than that at words."""
    for para in re.split(r"\n\s*\n", text):
        if len(para.split()) <= max_words:
            yield para
            continue
        for line in para.split("\n"):
            tokens = line.split()
            for k in range(0, len(tokens), max_words):
                yield " ".join(tokens[k : k + max_words]) if len(tokens) > max_words else line


def chunks(text: str, rng: random.Random, min_words: int, max_words: int) -> Iterator[str]:
    """Runs of whole paragraphs of about uniform(min_words, max_words) words each; a short tail is dropped."""
    target, paragraphs, count = rng.randint(min_words, max_words), [], 0
    for para in _units(text, max_words):
        n = len(para.split())
        if n == 0:
            continue
        paragraphs.append(para.strip("\n"))
        count += n
        if count >= target:
            yield "\n\n".join(paragraphs)
            target, paragraphs, count = rng.randint(min_words, max_words), [], 0
    if count >= min_words:
        yield "\n\n".join(paragraphs)


def base_documents(
    count: int, rng: random.Random, min_words: int = 150, max_words: int = 600, per_file: int = 4
) -> list[Doc]:
    """`count` documents of local text (fewer if the machine has less), no two with Jaccard >= 0.5.
    At most `per_file` documents come from one file, so no file's style dominates."""
    candidates: list[Doc] = []
    seen_texts: set[str] = set()
    for name, source, text in local_texts():
        if len(candidates) >= count * 1.4 + 200:  # room for what the near-duplicate check drops
            break
        for k, piece in enumerate(chunks(normalize_text(text), rng, min_words, max_words)):
            if k == per_file:
                break
            piece = normalize_text(piece)
            if piece in seen_texts or len(words(piece)) < min_words // 2:
                continue
            seen_texts.add(piece)
            candidates.append(Doc(f"{name}#{k}", source, piece, -1, "base", sets=shingles(piece)))
    # Drop near-duplicate bases: license texts and changelog boilerplate repeat across packages.
    i, j, _ = true_pairs([d.sets for d in candidates], 0.5)
    dropped = np.zeros(len(candidates), dtype=bool)
    for a, b in zip(i.tolist(), j.tolist()):  # sorted by a: keep the earlier of each pair
        if not dropped[a] and not dropped[b]:
            dropped[b] = True
    kept = [d for d, gone in zip(candidates, dropped) if not gone][:count]
    for index, d in enumerate(kept):
        d.base = index
    return kept


# ---------------------------------------------------------------------------------------------
# planted duplicates


def _edit_plan(n_words: int, rng: random.Random, vocab: Sequence[str], length: int) -> list[tuple[str, float, str]]:
    """`length` random word edits: (kind, position as a fraction of the current length, word)."""
    kinds = ("sub", "sub", "ins", "del")  # substitutions twice as often as inserts or deletes
    return [(rng.choice(kinds), rng.random(), rng.choice(vocab)) for _ in range(length)]


def apply_edits(pieces: list[tuple[str, str]], plan: Sequence[tuple[str, float, str]]) -> str:
    """The text after the edits, on (word, following whitespace) pieces; whitespace is kept where it can be."""
    out = list(pieces)
    for kind, u, word in plan:
        i = min(int(u * len(out)), len(out) - 1)
        if kind == "sub":
            if words(out[i][0]) == words(word):
                word = word + "s"  # a substitution must change the word
            out[i] = (word, out[i][1])
        elif kind == "ins":
            out.insert(i, (word, " "))
        elif len(out) > 1:  # delete, keeping the paragraph break that followed the word
            if i > 0:
                out[i - 1] = (out[i - 1][0], out[i][1] if "\n" in out[i][1] else out[i - 1][1])
            del out[i]
    return "".join(w + s for w, s in out).strip()


def variant_in(
    base: Doc, lo: float, hi: float, rng: random.Random, vocab: Sequence[str]
) -> tuple[str, float, int] | None:
    """A word-edited copy of `base` whose measured Jaccard to it lies in [lo, hi) (hi 1.0: below 1),
    with that Jaccard and the edit count; None when no edit count lands there.
    The first k edits of one random plan are applied, k found by bisection: the Jaccard falls
    (almost monotonically) with k, about (S - 5k) / (S + 5k) for S shingles and 5-grams."""
    pieces = re.findall(r"(\S+)(\s*)", base.text)
    size = len(base.sets)
    k_low = max(1, int(size * (1 - 0.45) / (DEFAULTS.ngram * 1.45)))  # edits that reach about J=0.45
    plan = _edit_plan(len(pieces), rng, vocab, 3 * k_low + 5)
    memo: dict[int, tuple[str, float]] = {}

    def measure(k: int) -> tuple[str, float]:
        if k not in memo:
            text = apply_edits(pieces, plan[:k])
            memo[k] = (text, jaccard(base.sets, shingles(text)))
        return memo[k]

    # smallest k with J(k) < hi
    a, b = 1, len(plan)
    if measure(b)[1] >= hi:
        return None
    while a < b:
        mid = (a + b) // 2
        if measure(mid)[1] < hi:
            b = mid
        else:
            a = mid + 1
    for k in (a, a + 1, a - 1, a + 2):  # J is not strictly monotone: look at the neighbours too
        if 1 <= k <= len(plan):
            text, jac = measure(k)
            if lo <= jac < hi and jac < 1.0 and text != base.text:
                return text, jac, k
    return None


def plant(
    bases: list[Doc],
    rng: random.Random,
    variant_frac: float = 0.4,
    two_variant_frac: float = 0.08,
    base_copy_frac: float = 0.08,
    variant_copy_frac: float = 0.05,
) -> list[Doc]:
    """The bases plus planted duplicates:
    - `variant_frac` of the bases get one variant, `two_variant_frac` two (independent edits of
      the base, so the two variants are a less similar pair of their own); each variant's target
      bucket is drawn uniformly from BUCKETS, then a target inside it;
    - `base_copy_frac` of the bases and `variant_copy_frac` of the variants get an identical copy.
    Ids tell the story: `X~v1` is a variant of base X, `X=c1` a copy of X."""
    vocab = sorted({w for d in bases[:500] for w in re.findall(r"[A-Za-z]{3,12}", d.text)})
    order = list(range(len(bases)))
    rng.shuffle(order)
    n_one, n_two = int(variant_frac * len(bases)), int(two_variant_frac * len(bases))
    docs = list(bases)
    variants: list[Doc] = []
    failed = 0
    for position, index in enumerate(order[: n_one + n_two]):
        base = bases[index]
        for v in range(1 if position < n_one else 2):
            lo, hi = BUCKETS[rng.randrange(len(BUCKETS))]
            made = variant_in(base, lo, hi if hi < 1.0 else 1.0, rng, vocab)
            if made is None:  # a short base cannot be edited into (0.95, 1.0): one edit already costs more
                failed += 1
                continue
            text, measured, edits = made
            variants.append(
                Doc(
                    f"{base.id}~v{v + 1}",
                    base.source,
                    text,
                    index,
                    "variant",
                    (lo, hi),
                    measured,
                    edits,
                    shingles(text),
                )
            )
    docs += variants
    for index in rng.sample(range(len(bases)), int(base_copy_frac * len(bases))):
        base = bases[index]
        docs.append(Doc(f"{base.id}=c1", base.source, base.text, index, "copy", sets=base.sets))
    for variant in rng.sample(variants, int(variant_copy_frac * len(variants))):
        docs.append(
            Doc(
                f"{variant.id}=c1",
                variant.source,
                variant.text,
                variant.base,
                "variant_copy",
                variant.target,
                variant.measured,
                variant.edits,
                variant.sets,
            )
        )
    if failed:
        print(f"planting: {failed} variants not made (target bucket out of reach for a short base)")
    return docs


def write_jsonl_shards(docs: Sequence[Doc | dict], folder: Path, n_shards: int, rng: random.Random) -> list[Path]:
    """The documents in random order, dealt round-robin into `n_shards` JSONL files (so the copies of
    one text usually land in different files and tasks)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.jsonl"):
        old.unlink()
    order = list(range(len(docs)))
    rng.shuffle(order)
    paths = [folder / f"part-{i:02d}.jsonl" for i in range(n_shards)]
    outs = [p.open("w", encoding="utf-8") for p in paths]
    for k, i in enumerate(order):
        d = docs[i]
        outs[k % n_shards].write(json.dumps(d.record() if isinstance(d, Doc) else d, ensure_ascii=False) + "\n")
    for out in outs:
        out.close()
    return paths


# ---------------------------------------------------------------------------------------------
# brute force


def _pair_codes(members: np.ndarray, n_docs: int) -> np.ndarray:
    """Codes a * n + b (a < b) of all pairs within each row of a (groups, size) array of sorted documents."""
    i, j = np.triu_indices(members.shape[1], k=1)
    return (members[:, i].astype(np.int64) * n_docs + members[:, j]).ravel()


def true_pairs(
    sets: Sequence[np.ndarray],
    min_jaccard: float,
    max_docs_per_shingle: int | None = None,
    chunk_pairs: int = 40_000_000,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair (i < j) whose exact Jaccard of shingle sets is >= min_jaccard, sorted by (i, j),
    as arrays (i, j, jaccard). Exhaustive: a pair with a Jaccard above 0 shares a shingle, and
    every pair sharing one is counted (intersection = the number of shingles they share).
    With `max_docs_per_shingle`, shingles found in more documents are left out of the counting,
    which can only lower a count, so pairs are then re-measured exactly; a pair that shares
    nothing but such shingles would be missed (the caller says so when it uses it)."""
    n = len(sets)
    lengths = np.fromiter((len(s) for s in sets), dtype=np.int64, count=n)
    flat = np.concatenate(sets) if n else np.zeros(0, np.uint64)
    docs = np.repeat(np.arange(n, dtype=np.int64), lengths)
    order = np.argsort(flat, kind="stable")  # stable: documents ascending within a shingle
    flat, docs = flat[order], docs[order]
    starts = np.flatnonzero(np.concatenate(([True], flat[1:] != flat[:-1]))) if n else np.zeros(0, np.int64)
    sizes = np.diff(np.append(starts, len(flat)))
    if max_docs_per_shingle is not None:
        keep = sizes <= max_docs_per_shingle
        starts, sizes = starts[keep], sizes[keep]
    # Counting: pair codes of every shared shingle, reduced to (code, count) whenever a chunk fills.
    partial_codes, partial_counts, pending, pending_len = [], [], [], 0

    def reduce() -> None:
        nonlocal pending, pending_len
        if pending:
            codes, counts = np.unique(np.concatenate(pending), return_counts=True)
            partial_codes.append(codes)
            partial_counts.append(counts)
        pending, pending_len = [], 0

    for size in np.unique(sizes[sizes >= 2]):
        group_starts = starts[sizes == size]
        per_group = size * (size - 1) // 2
        step = max(1, chunk_pairs // per_group)
        for k in range(0, len(group_starts), step):
            members = docs[group_starts[k : k + step, None] + np.arange(size)]
            pending.append(_pair_codes(members, n))
            pending_len += len(pending[-1])
            if pending_len >= chunk_pairs:
                reduce()
    reduce()
    if not partial_codes:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    codes = np.concatenate(partial_codes)
    counts = np.concatenate(partial_counts)
    if len(partial_codes) > 1:
        codes, inverse = np.unique(codes, return_inverse=True)
        counts = np.bincount(inverse.ravel(), weights=counts).astype(np.int64)
    i, j = codes // n, codes % n
    jac = counts / (lengths[i] + lengths[j] - counts)
    if max_docs_per_shingle is not None:
        # counts are lower bounds; an upper bound on J is min/max size: re-measure every pair that could reach the floor
        maybe = np.minimum(lengths[i], lengths[j]) / np.maximum(lengths[i], lengths[j]) >= min_jaccard
        i, j = i[maybe], j[maybe]
        jac = np.fromiter(
            (jaccard(sets[a], sets[b]) for a, b in zip(i.tolist(), j.tolist())), dtype=np.float64, count=len(i)
        )
    keep = jac >= min_jaccard
    return i[keep], j[keep], jac[keep]


# ---------------------------------------------------------------------------------------------
# scoring


def cluster_pairs(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All pairs (i < j) of documents with the same label (label -1: in no cluster)."""
    clustered = np.flatnonzero(labels >= 0)
    order = clustered[np.argsort(labels[clustered], kind="stable")]
    sorted_labels = labels[order]
    starts = (
        np.flatnonzero(np.concatenate(([True], sorted_labels[1:] != sorted_labels[:-1])))
        if len(order)
        else np.zeros(0, np.int64)
    )
    sizes = np.diff(np.append(starts, len(order)))
    a_parts, b_parts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for size in np.unique(sizes[sizes >= 2]):
        members = np.sort(order[starts[sizes == size][:, None] + np.arange(size)], axis=1)
        i, j = np.triu_indices(size, k=1)
        a_parts.append(members[:, i].ravel())
        b_parts.append(members[:, j].ravel())
    return np.concatenate(a_parts), np.concatenate(b_parts)


def union_labels(n: int, edges_a: np.ndarray, edges_b: np.ndarray) -> np.ndarray:
    """Connected components of the edges as labels (-1 for a document on no edge)."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    touched = np.zeros(n, dtype=bool)
    for a, b in zip(edges_a.tolist(), edges_b.tolist()):
        touched[a] = touched[b] = True
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(x) if touched[x] else -1 for x in range(n)], dtype=np.int64)


@dataclass
class Score:
    predicted_pairs: int
    chain_pairs: int  # predicted pairs below the threshold (joined through other members)
    min_predicted_jaccard: float | None
    precision: float
    recall: dict[float, float]  # at each floor: fraction of true pairs >= floor in one cluster
    true_counts: dict[float, int]
    by_bucket: list[tuple[float, float, int, int]]  # (lo, hi, true pairs, of them in one cluster)
    predicted_jaccards: np.ndarray


def score(
    labels: np.ndarray,
    sets: Sequence[np.ndarray],
    truth: tuple[np.ndarray, np.ndarray, np.ndarray],
    threshold: float = DEFAULTS.threshold,
    floors: Sequence[float] = (0.85, 0.8),
) -> Score:
    """Precision (predicted same-cluster pairs with true Jaccard >= threshold) and recall (true
    pairs >= each floor that share a cluster) of cluster labels against the brute-force pairs
    (which must hold every pair down to min(BUCKETS) at least)."""
    n = len(labels)
    ti, tj, tjac = truth
    true_of = dict(zip((ti * n + tj).tolist(), tjac.tolist()))
    pa_, pb = cluster_pairs(labels)
    # a predicted pair missing from the truth table is below its floor: measure it exactly
    pj = np.fromiter(
        (true_of.get(a * n + b, None) or jaccard(sets[a], sets[b]) for a, b in zip(pa_.tolist(), pb.tolist())),
        dtype=np.float64,
        count=len(pa_),
    )
    same = (labels[ti] == labels[tj]) & (labels[ti] >= 0)
    recall, counts = {}, {}
    for floor in floors:
        mask = tjac >= floor
        counts[floor] = int(mask.sum())
        recall[floor] = float(same[mask].mean()) if mask.any() else float("nan")
    rows = []
    for lo, hi in BUCKETS:
        mask = (tjac >= lo) & ((tjac < hi) if hi < 1.0 else (tjac <= 1.0))
        rows.append((lo, hi, int(mask.sum()), int(same[mask].sum())))
    good = int((pj >= threshold).sum())
    return Score(
        len(pj),
        len(pj) - good,
        float(pj.min()) if len(pj) else None,
        good / len(pj) if len(pj) else float("nan"),
        recall,
        counts,
        rows,
        pj,
    )


def removal_jaccards(labels: np.ndarray, removed: np.ndarray, sets: Sequence[np.ndarray]) -> np.ndarray:
    """For each removed document in a cluster, the true Jaccard to its cluster's kept copy (the one
    member not removed). What a removal decision should be judged by: was the text dropped
    because a similar enough one stays?"""
    out = []
    clustered = np.flatnonzero(labels >= 0)
    order = clustered[np.argsort(labels[clustered], kind="stable")]
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    for members in np.split(order, bounds) if len(order) else []:
        keepers = members[~removed[members]]
        assert len(keepers) == 1, f"cluster of {len(members)} documents with {len(keepers)} kept"
        out += [jaccard(sets[m], sets[keepers[0]]) for m in members[removed[members]]]
    return np.array(out, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# kiln

# `kiln curate` with the stage's work folder renamed to work.kept instead of deleted at the end, so
# the verified pairs (work/verify/*.parquet) and the LSH candidates (work/buckets/*.npy) can be
# read afterwards. Only the final clean-up changes; every phase runs as in `kiln curate`.
_KEEP_WORK = """
import shutil, sys, types
from pathlib import Path
import kiln.curate.run as curate_run
from kiln.cli import main

def keep_work(path, *args, **kwargs):
    path = Path(path)
    if path.name == "work":
        shutil.rmtree(path.with_name("work.kept"), ignore_errors=True)
        return path.rename(path.with_name("work.kept"))
    return shutil.rmtree(path, *args, **kwargs)

curate_run.shutil = types.SimpleNamespace(rmtree=keep_work)
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class KilnRun:
    seconds: float  # wall clock, interpreter start to exit
    stage: Path  # runs/<name>/curate
    removed: list[dict]
    clusters: list[dict]
    manifest: dict


def run_kiln(
    input_glob: str, runs_dir: Path, workers: int, steps_on: Sequence[str], keep_work: bool = False
) -> KilnRun:
    """Run `kiln curate` on the input with every step that can be switched off switched off except
    `steps_on` (normalization always runs), `workers` processes; read its audit."""
    subprocess.run(["rm", "-rf", str(runs_dir)], check=True)
    defaults = CurateConfig()
    off = [
        name
        for name in CurateConfig.model_fields
        if hasattr(getattr(defaults, name), "enabled") and name not in steps_on
    ]
    overrides = [
        f"runs_dir={runs_dir}",
        f"curate.executor.workers={workers}",
        "curate.sample_size=0",
        *(f"curate.{name}.enabled=false" for name in off),
    ]
    launcher = ["-c", _KEEP_WORK] if keep_work else ["-m", "kiln"]
    command = [sys.executable, *launcher, "-q", "curate", "--input", input_glob, "--run", "bench"]
    for override in overrides:
        command += ["--set", override]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"kiln curate failed ({done.returncode}):\n{done.stderr[-3000:]}")
    stage = runs_dir / "bench" / "curate"
    return KilnRun(
        seconds,
        stage,
        pq.read_table(stage / "removed.parquet").to_pylist(),
        pq.read_table(stage / "clusters.parquet").to_pylist(),
        json.loads((stage / "manifest.json").read_text()),
    )


def kiln_labels(run: KilnRun, index_of: dict[str, int]) -> np.ndarray:
    """Predicted clusters over document indices: kiln's near-dup clusters joined with its exact
    duplicates (a removed copy is in its kept copy's cluster); -1 for a document in neither."""
    a, b, first = [], [], {}
    for row in run.clusters:
        i = index_of[row["id"]]
        if row["cluster"] in first:
            a.append(first[row["cluster"]])
            b.append(i)
        else:
            first[row["cluster"]] = i
            a.append(i)
            b.append(i)
    for row in run.removed:
        if row["step"] == "exact_dedup":
            a.append(index_of[row["id"]])
            b.append(index_of[row["kept_id"]])
    return union_labels(len(index_of), np.array(a, dtype=np.int64), np.array(b, dtype=np.int64))


def kept_work_pairs(
    stage: Path, index_of: dict[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """From a run with keep_work: (candidate pairs (n, 2), verified pairs (m, 2), kiln's Jaccard of
    each verified pair, signed document indices), in document indices; None without work.kept."""
    work = stage / "work.kept"
    if not work.is_dir():
        return None
    numbers, ids = [], []
    for path in sorted((work / "sign").glob("*.docs.parquet")):
        task = int(path.name.split(".")[0])
        table = pq.read_table(path, columns=["local", "id"])
        numbers.append((np.uint64(task) << np.uint64(32)) | table["local"].to_numpy().astype(np.uint64))
        ids += table["id"].to_pylist()
    numbers_all = np.concatenate(numbers) if numbers else np.zeros(0, np.uint64)
    order = np.argsort(numbers_all)
    numbers_all = numbers_all[order]
    index = np.array([index_of[i] for i in ids], dtype=np.int64)[order]

    def to_index(pairs: np.ndarray) -> np.ndarray:
        return (
            index[np.searchsorted(numbers_all, pairs.astype(np.uint64))] if len(pairs) else np.zeros((0, 2), np.int64)
        )

    candidates = [np.load(p) for p in sorted((work / "buckets").glob("*.npy"))]
    candidates = np.unique(np.concatenate([c for c in candidates if len(c)] or [np.zeros((0, 2), np.uint64)]), axis=0)
    edges = [pq.read_table(p) for p in sorted((work / "verify").glob("*.parquet"))]
    a = np.concatenate([e["a"].to_numpy() for e in edges]) if edges else np.zeros(0, np.uint64)
    b = np.concatenate([e["b"].to_numpy() for e in edges]) if edges else np.zeros(0, np.uint64)
    jac = np.concatenate([e["jaccard"].to_numpy() for e in edges]) if edges else np.zeros(0)
    return to_index(candidates), to_index(np.stack([a, b], axis=1)), jac, np.sort(index)
