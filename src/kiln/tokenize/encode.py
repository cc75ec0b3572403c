"""The tokenize stage: curated shards -> per-source token shards, train and validation.

Every document is encoded whole between its model's boundaries (kiln's: followed by
`<|endoftext|>`; an imported model's: its bos where it has one, then its eos); a document goes to validation
when its id hash falls under tokenize.val_fraction (the same rule the tokenizer used for its
held-out text). With tokenize.fim, a share of the train split's documents is rearranged for
fill-in-the-middle (kiln.text.fim) before encoding; validation documents never are, and a third
split, val_fim, holds every validation document of the FIM sources rearranged, for the
trainer's fill-in-the-middle validation loss. Two phases:
1. encode: one task per curated shard on the executor (a local process pool or Ray), each
   writing `.parts/<shard>/{train,val}.{bin,idx,scores.npy}`, `val_ids.txt` and, last, `stats.json`, its
   completion marker. An interrupted run resumes: finished tasks are not redone.
2. join: per source and split, the parts are appended in shard order into
   `<source>/{train,val}.{bin,idx,scores.npy}` and `<source>/val_ids.txt` (the validation documents' ids
   in order); then `.parts/` is removed.
A run on a store (kiln.core.mirror): a task may run on any machine. Its paths are then places in
the run's mirror, which each machine resolves to its own; it fetches its curated shard and the
tokenizer (checked against their recorded sha256), and stores its part's files, `stats.json` last,
so a re-run on any machine keeps the finished parts. The join runs where the stage was started.
Each split's stats also count documents, tokens and bytes per language (`languages`: curate's
meta.language, else `code` for a code document, else `und`), which the mixture weights languages by
(mix.language_alpha) and validation groups its figures by.
Output does not depend on the worker count. Memory per worker is one batch of documents plus
the tokenizer, whatever the corpus size; the join copies in fixed-size chunks. Disk holds the
tokens twice while the join runs.
Not handled here: mixing or packing into sequences (kiln.mix), the tokenizers themselves (kiln.text.load).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from kiln.core.atomic import write_atomically
from kiln.core.docshards import SUFFIX, read_shard, shard_source
from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.core.executors import build_executor
from kiln.core.executors.local import ThreadExecutor
from kiln.core.layout import CURATE, SHARDS, SUMMARY, TOKENIZE, TOKENIZER, RunLayout
from kiln.core.manifest import Stage, read_manifest, recorded_outputs
from kiln.core.mirror import fetch, local_path, place, pull, push_files, url_of
from kiln.core.split import is_heldout
from kiln.core.storage import brief_traffic, merge_task_traffic, task_traffic, traffic_since
from kiln.core.store_lock import fenced
from kiln.core.tokenshards import DOC_SCORES, SCORES_SUFFIX, TokenShard, TokenShardWriter, doc_scores, dtype_for
from kiln.text.code import doc_is_code
from kiln.text.engines import Flat, packed
from kiln.text.fim import FimCut, draw_cut, fim_ids
from kiln.text.load import AnyTokenizer, load_tokenizer
from kiln.text.tokenizer import META_NAME, file_hash
from kiln.tokenize.config import FimConfig, TokenizeConfig

log = logging.getLogger("kiln.tokenize")
SPLITS = ("train", "val")
DONE = "stats.json"
COUNTS = ("docs", "tokens", "bytes", "fim_docs")  # per split; beside them, `languages`
UNDETERMINED = "und"  # ISO 639's code for a document whose language curation did not set


@dataclass(frozen=True)
class EncodeTask:
    shard: str
    out: str
    tokenizer: str
    tokenizer_hash: str  # part of the cache key: a retrained tokenizer at the same path is a new one
    val_fraction: float
    dtype: str
    batch_docs: int
    fim: FimConfig | None = None
    # A run on a store: the mirror's URL (shard, out and tokenizer are then paths within it, kiln.core.mirror)
    # and the (bytes, sha256) of the shard and of the tokenizer's two files, checked when fetched.
    mirror: str | None = None
    records: tuple[tuple[int, str], ...] = ()

    def path(self, name: str) -> Path:
        """This machine's path for the task's `shard`, `out` or `tokenizer`."""
        given = getattr(self, name)
        return local_path((self.mirror, given)) if self.mirror else Path(given)


_loaded: dict[tuple[str, str], AnyTokenizer] = {}
# perf: a worker process takes about 0.25 s to start (spawn and imports), as long as encoding a
# dozen MB; a corpus under this many bytes per worker is encoded by threads of the stage's own
# process (the encoders release the GIL while they encode). Measured on the demo corpus (26 MB)
# with 2 workers: 40 MB/s with two processes, 66 MB/s with two threads.
INLINE_BYTES_PER_WORKER = 32_000_000


def tokenizer_for(path: str, file_hash: str) -> AnyTokenizer:
    """One tokenizer per process (the stage's own, which runs the tasks of one worker, and each worker's), loaded
    on its first task (about 0.15 s for 32k tokens)."""
    # perf: splintr's batch call runs on Rayon's global pool, sized from RAYON_NUM_THREADS on its first use (the
    # encoder's check at load); the stage parallelises across worker processes, which inherit this, so one
    # thread each unless the environment says otherwise.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    if (path, file_hash) not in _loaded:
        _loaded[(path, file_hash)] = load_tokenizer(Path(path))
    return _loaded[(path, file_hash)]


def selected(ids: np.ndarray, lengths: np.ndarray, keep: np.ndarray) -> Flat:
    """The documents of a flat batch where keep (one bool per document) is set."""
    return ids[np.repeat(keep, lengths)], lengths[keep]


def document_language(doc: Document) -> str:
    """The language a document counts in: curate's meta.language, else `code` for code, else `und`.

    Never guessed here: lid.176 on every document would cost more than encoding it.
    """
    language = doc.meta.get("language")
    if isinstance(language, str) and language:
        return language
    return "code" if doc_is_code(doc, None) else UNDETERMINED


def split_stats() -> dict[str, Any]:
    return {**dict.fromkeys(COUNTS, 0), "languages": {}}


def bounded(ids: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int) -> Flat:
    """Each document of a flat batch between the model's boundaries: bos first where it has one, eos last.

    Hand-worked: ids [5 6 7], lengths [2 1], bos 1, eos 0 -> [1 5 6 0 1 7 0], lengths [4 3]."""
    lengths = lengths + (1 if bos is None else 2)
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.int64)
    content = np.ones(out.size, dtype=bool)
    content[ends - 1] = False
    out[ends - 1] = eos  # the document boundary, by id
    if bos is not None:
        content[ends - lengths] = False
        out[ends - lengths] = bos
    out[content] = ids
    return out, lengths


class PartWriter:
    """The train and validation shards of one task (and, with FIM, val_fim), filled batch by batch."""

    def __init__(self, out: Path, tokenizer: AnyTokenizer, val_fraction: float, dtype: np.dtype, fim: FimConfig | None):
        self.out, self.tokenizer, self.val_fraction, self.fim = out, tokenizer, val_fraction, fim
        self.splits = splits_for(fim)
        self.writers = {split: TokenShardWriter(out / split, tokenizer.vocab_size, dtype) for split in self.splits}
        self.stats = {split: split_stats() for split in self.splits}
        self.val_ids = open(out / "val_ids.txt", "w", encoding="utf-8")
        self.scores: dict[str, list[list[float]]] = {split: [] for split in self.splits}

    def fim_cut(self, doc: Document, rate: float) -> FimCut | None:
        fim = self.fim
        if fim is None or (fim.sources is not None and doc.source not in fim.sources):
            return None
        return draw_cut(doc.text, doc.id, fim.seed, rate, fim.spm_rate)

    def encode(self, doc: Document, cut: FimCut) -> list[int]:
        assert self.tokenizer.fim_ids is not None, "run() stops first when the vocabulary has no FIM tokens"
        return fim_ids(cut, self.tokenizer.encode, *self.tokenizer.fim_ids)

    def add(self, batch: list[Document]) -> None:
        in_val = np.array([is_heldout(d.id, self.val_fraction) for d in batch], dtype=bool)
        # Train documents are rearranged at tokenize.fim.rate; validation documents never are.
        cuts = [
            None if val else self.fim_cut(d, self.fim.rate if self.fim else 0.0)
            for d, val in zip(batch, in_val, strict=True)
        ]
        rearranged = np.array([cut is not None for cut in cuts], dtype=bool)
        if rearranged.any():
            ids, lengths = packed(
                [
                    self.tokenizer.encode(d.text) if cut is None else self.encode(d, cut)
                    for d, cut in zip(batch, cuts, strict=True)
                ]
            )
        else:
            # perf: flat arrays straight from the encoder, no Python int per token (was a third of the stage's
            # time on the demo corpus with tiktoken's lists).
            ids, lengths = self.tokenizer.encode_flat([d.text for d in batch])
        self.write("train", batch, ids, lengths, ~in_val, rearranged)
        self.write("val", batch, ids, lengths, in_val, rearranged)
        val = [d for d, v in zip(batch, in_val, strict=True) if v]
        self.val_ids.write("".join(f"{d.id}\n" for d in val))
        if "val_fim" in self.splits:
            # Every validation document of a FIM source, rearranged: the trainer scores its middles.
            picked = [(d, cut) for d in val if (cut := self.fim_cut(d, 1.0)) is not None]
            ids, lengths = packed([self.encode(d, cut) for d, cut in picked])
            every = np.ones(len(picked), dtype=bool)
            self.write("val_fim", [d for d, _ in picked], ids, lengths, every, every)

    def write(
        self,
        split: str,
        docs: list[Document],
        ids: np.ndarray,
        lengths: np.ndarray,
        keep: np.ndarray,
        rearranged: np.ndarray,
    ) -> None:
        """Append the documents where keep is set (ids, lengths: the flat batch of all of docs) to a split,
        each between the model's boundaries; rearranged marks the ones FIM rearranged."""
        if not keep.any():
            return
        picked = [d for d, k in zip(docs, keep, strict=True) if k]
        flat, lengths = bounded(*selected(ids, lengths, keep), self.tokenizer.bos_id, self.tokenizer.eot_id)
        self.writers[split].add_many(flat, lengths)
        self.scores[split] += [doc_scores(d.meta) for d in picked]
        stats = self.stats[split]
        n_bytes = [len(d.text.encode("utf-8")) for d in picked]
        stats["docs"] += len(picked)
        stats["tokens"] += int(lengths.sum())
        stats["bytes"] += sum(n_bytes)
        stats["fim_docs"] += int(rearranged[keep].sum())
        for d, n_tokens, b in zip(picked, lengths.tolist(), n_bytes, strict=True):
            counted = stats["languages"].setdefault(document_language(d), {"docs": 0, "tokens": 0, "bytes": 0})
            counted["docs"] += 1
            counted["tokens"] += n_tokens
            counted["bytes"] += b

    def close(self) -> None:
        for split, writer in self.writers.items():
            writer.close()
            np.save(
                self.out / (split + SCORES_SUFFIX),
                np.array(self.scores[split], dtype=np.float32).reshape(-1, len(DOC_SCORES)),
            )
        self.val_ids.close()


def splits_for(fim: FimConfig | None) -> tuple[str, ...]:
    """Token splits the stage writes: train and val, and val_fim (validation documents rearranged) with FIM on."""
    return (*SPLITS, "val_fim") if fim is not None else SPLITS


def encode_shard(task: EncodeTask) -> dict[str, Any]:
    """Encode one curated shard into its part folder; a finished part is returned as it is."""
    out, shard, tok_path = task.path("out"), task.path("shard"), task.path("tokenizer")
    before = traffic_since()
    pull(out, [DONE])  # a run on a store: a part finished on any machine
    if (out / DONE).is_file():
        return {**json.loads((out / DONE).read_text()), "traffic": task_traffic(before)}
    if out.exists():
        shutil.rmtree(out)  # an interrupted task: start it again
    out.mkdir(parents=True)
    for path, (size, sha256) in zip((shard, tok_path, tok_path.with_name(META_NAME)), task.records):
        fetch(path, size, sha256)
    tokenizer = tokenizer_for(str(tok_path), task.tokenizer_hash)
    part = PartWriter(out, tokenizer, task.val_fraction, dtype_for(tokenizer.vocab_size, task.dtype), task.fim)
    batch: list[Document] = []
    for doc in read_shard(shard):
        batch.append(doc)
        if len(batch) >= task.batch_docs:
            part.add(batch)
            batch = []
    if batch:
        part.add(batch)
    part.close()
    stats = {**part.stats, "encoder": tokenizer.encoder_name}
    write_atomically(out / DONE, lambda p: p.write_text(json.dumps(stats)))
    push_files(out, sorted(p for p in out.iterdir() if p.name != DONE) + [out / DONE])
    return {**stats, "traffic": task_traffic(before)}


def join(
    parts: list[Path], folder: Path, vocab_size: int, dtype: np.dtype, splits: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """Append one source's parts, in shard order, into its final shards; returns the summed stats.

    A val_fim split with no documents (a source FIM does not apply to) is not written. The per-language
    counts are left out of a split when a part lacks them (a part an older kiln finished).
    """
    folder.mkdir(exist_ok=True)
    stats = {split: split_stats() for split in splits}
    with open(folder / "val_ids.txt", "wb") as ids_out:
        for part in parts:
            with open(part / "val_ids.txt", "rb") as ids_in:
                shutil.copyfileobj(ids_in, ids_out)
            part_stats = json.loads((part / DONE).read_text())
            for split in splits:
                for key in COUNTS:
                    stats[split][key] += part_stats[split][key]
                add_languages(stats[split], part_stats[split].get("languages"))
    for split in splits:
        if stats[split].get("languages"):
            langs = stats[split]["languages"]
            stats[split]["languages"] = {k: langs[k] for k in sorted(langs, key=lambda k: (-langs[k]["tokens"], k))}
        if split not in SPLITS and not stats[split]["docs"]:
            del stats[split]
            continue
        writer = TokenShardWriter(folder / split, vocab_size, dtype)
        for part in parts:
            # verify=False: the part was written by this stage and sealed by its stats.json
            writer.append(TokenShard(part / split, verify=False))
        writer.close()
        np.save(
            folder / (split + SCORES_SUFFIX),
            np.concatenate([np.load(part / (split + SCORES_SUFFIX)) for part in parts]),
        )
    return stats


def add_languages(into: dict[str, Any], languages: dict[str, dict[str, int]] | None) -> None:
    """Add one part's per-language counts to a split's; a part without them makes the split's unknown."""
    if languages is None or "languages" not in into:
        into.pop("languages", None)
        return
    for lang, counted in languages.items():
        total = into["languages"].setdefault(lang, dict.fromkeys(counted, 0))
        for key, n in counted.items():
            total[key] += n


def task_for(shard: Path, out: Path, tok_path: Path, stage: Stage, tok_hash: str, cfg: TokenizeConfig) -> EncodeTask:
    """The encode task of one curated shard: by absolute paths, or for a run on a store by places in its
    mirror with the records the task checks what it fetches against."""
    common = (tok_hash, cfg.val_fraction, cfg.dtype, cfg.batch_docs, cfg.fim)
    where = place(shard)
    if where is None:
        return EncodeTask(str(shard), str(out), str(tok_path), *common)
    recorded = {i["path"]: (i["bytes"], i["sha256"]) for i in stage.inputs}
    records = tuple(recorded[str(url_of(p))] for p in (shard, tok_path, tok_path.with_name(META_NAME)))
    (_, out_rel), (_, tok_rel) = place(out) or ("", ""), place(tok_path) or ("", "")
    return EncodeTask(where[1], out_rel, tok_rel, *common, mirror=where[0], records=records)


def run(cfg: TokenizeConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    curated = read_manifest(layout.stage(CURATE))
    # A run on a store: the curated shards are fetched by the tasks that encode them, wherever they run; the
    # tokenizer's files (small) here too.
    shards = recorded_outputs(layout.stage(CURATE), SHARDS, fetch=False)
    recorded_outputs(layout.stage(TOKENIZER))
    tok_path = layout.tokenizer_json
    stage = Stage(
        run_dir,
        TOKENIZE,
        {"tokenize": cfg},
        inputs=[*shards, tok_path, tok_path.with_name(META_NAME)],
        upstream=[CURATE, TOKENIZER],
        fetch_inputs=False,
    )
    if done := stage.up_to_date(force, lambda m: f"{m['counts']['train_tokens']:,} train tokens"):
        return done
    if not shards:
        raise FatalError(
            f"tokenize: {layout.curated_shards} holds no curated shards; see {layout.stage(CURATE) / SUMMARY} for "
            "where the documents went"
        )
    total_bytes = sum(t["bytes_out"] for t in curated["counts"]["per_source"].values())
    workers = cfg.executor.workers or os.cpu_count() or 1
    inline = cfg.executor.kind == "local" and workers > 1 and total_bytes < INLINE_BYTES_PER_WORKER * workers
    tok_hash = file_hash(tok_path) + file_hash(tok_path.with_name(META_NAME))  # boundaries live in the meta
    tokenizer = tokenizer_for(str(tok_path), tok_hash)
    if cfg.fim is not None and tokenizer.fim_ids is None:
        raise FatalError(
            f"tokenize.fim: the tokenizer {tok_path} has no fill-in-the-middle tokens (<|fim_prefix|>, "
            "<|fim_middle|>, <|fim_suffix|>); add them with `kiln extend-tokenizer` or drop tokenize.fim"
        )
    dtype = dtype_for(
        tokenizer.vocab_size, cfg.dtype
    )  # a uint16 request for a larger vocabulary stops here, before any work
    # Before the lock and the partial folder: joining a Ray cluster may fail (address, token) or wait for CPUs.
    executor = (
        ThreadExecutor(workers) if inline else build_executor(cfg.executor, "tokenize.executor", str(stage.final_dir))
    )
    try:
        stage.begin(resume=not force)
        parts_dir = stage.dir / ".parts"  # a dot: no source's folder can take its name
        tasks = [task_for(s, parts_dir / s.name.removesuffix(SUFFIX), tok_path, stage, tok_hash, cfg) for s in shards]
        val_docs = train_docs = 0
        stage_traffic = traffic_since()
        encoders: set[str] = set()  # from the tasks: the stage's own tokenizer picks its encoder only when it encodes
        # The bar advances per finished curated shard (each task is one).
        with tqdm(
            total=total_bytes,
            unit="B",
            unit_scale=True,
            desc=f"tokenize ({executor.workers} {'threads' if inline else 'workers'})",
            dynamic_ncols=True,
        ) as bar:
            for stats in executor.imap_unordered(fenced(encode_shard), tasks):
                merge_task_traffic(stats.get("traffic"))
                bar.update(stats["train"]["bytes"] + stats["val"]["bytes"])
                if traffic := brief_traffic(stage_traffic):
                    bar.set_postfix_str(traffic, refresh=False)
                val_docs, train_docs = val_docs + stats["val"]["docs"], train_docs + stats["train"]["docs"]
                encoders.add(stats.get("encoder") or tokenizer.encoder_name)  # none in a part of an older kiln
    finally:
        executor.close()
    if not val_docs:  # before the join, so a rerun with a larger fraction keeps nothing stale
        raise FatalError(
            f"tokenize: no document fell in the validation split at tokenize.val_fraction={cfg.val_fraction} "
            f"({train_docs} documents in all); raise it or curate more documents"
        )
    pull(parts_dir, ["*"])  # a run on a store: the parts tasks on other machines wrote
    per_source: dict[str, dict[str, dict[str, Any]]] = {}
    outputs: list[Path] = []
    for source in sorted({shard_source(s) for s in shards}):
        parts = [t.path("out") for t in tasks if shard_source(t.path("shard")) == source]
        per_source[source] = join(parts, stage.dir / source, tokenizer.vocab_size, dtype, splits_for(cfg.fim))
        outputs += [
            stage.dir / source / f"{split}{ext}"
            for split in per_source[source]
            for ext in (".bin", ".idx", SCORES_SUFFIX)
        ] + [stage.dir / source / "val_ids.txt"]
    shutil.rmtree(parts_dir)
    for source, stats in per_source.items():
        if not stats["val"]["docs"]:
            log.warning(
                "tokenize: source %s has no validation documents at val_fraction %s; it will have no validation loss",
                source,
                cfg.val_fraction,
            )
    counts = {
        "train_tokens": sum(s["train"]["tokens"] for s in per_source.values()),
        "val_tokens": sum(s["val"]["tokens"] for s in per_source.values()),
        "train_docs": sum(s["train"]["docs"] for s in per_source.values()),
        "val_docs": sum(s["val"]["docs"] for s in per_source.values()),
        "fim_docs": sum(s["train"]["fim_docs"] for s in per_source.values()),
        "vocab_size": tokenizer.vocab_size,
        "boundaries": {"bos": tokenizer.bos_id, "eos": tokenizer.eot_id, "pad": tokenizer.pad_id},
        "encoder": ", ".join(sorted(encoders)),
        "dtype": str(dtype),
        "per_source": per_source,
    }
    lines = [
        (
            f"{counts['train_tokens']:,} train and {counts['val_tokens']:,} validation tokens ({counts['dtype']}) "
            f"from {len(shards)} curated shards"
        ),
        f"each document: {tokenizer.describe()}",
    ]
    lines += [
        (
            f"  {s:<10} train {v['train']['tokens']:>12,} tokens / {v['train']['docs']:>6} docs   val "
            f"{v['val']['tokens']:>10,} tokens / {v['val']['docs']:>5} docs"
        )
        for s, v in per_source.items()
    ]
    return stage.finish(outputs, counts, "\n".join(lines))
