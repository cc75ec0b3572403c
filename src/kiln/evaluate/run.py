"""The eval stage: score the trained checkpoint, and the same model before training, per source;
any text, JSONL or Parquet file given with `--data`; and multiple-choice tasks.

"before" rebuilds the untrained model from the train stage's model config and seed (the
trainer's own initialization), or loads the starting checkpoint of a continued run
(train.init_from), so before and after are measured on the same windows with the same settings
whenever eval runs. Device and autocast come from eval.precision
(kiln.model.precision); with the defaults they match the trainer's, and so do the numbers.
A `--data` file is read with curate's readers (wired in by kiln.stages: the format from its
extension, records that cannot be read are counted and named, never scored), each document
encoded with the run's tokenizer and followed by end of document, and scored like a validation
split: per file and per `source` field. A run without token shards (one made by `kiln
import-hf`) is scored on its data files and tasks only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from kiln.core.errors import FatalError
from kiln.core.layout import EVAL, MANIFEST, TOKENIZE, TRAIN, RunLayout
from kiln.core.manifest import Stage, read_manifest, recorded_outputs
from kiln.core.mirror import local_folder, refresh
from kiln.core.storage import as_location, is_file
from kiln.evaluate.choices import read_task, score_task
from kiln.evaluate.config import EvalConfig
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.perplexity import evaluate_model, format_results, validation_scorer
from kiln.model.precision import resolve_precision
from kiln.model.weights import CONFIG, WEIGHTS, load_trained_model
from kiln.text.load import AnyTokenizer, load_tokenizer

# The default window of a run kiln did not train (an import): its whole context, up to this many tokens.
IMPORTED_WINDOW = 2048
# path -> ([(source, text) per readable document], [a line naming each record that could not be read])
ReadFile = Callable[[Path], tuple[list[tuple[str, str]], list[str]]]

log = logging.getLogger("kiln.eval")


class TokenArray:
    """Tokens in memory, scored as a validation split is (kiln.model.perplexity reads `.tokens`)."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = tokens


def score_files(
    model: Any, tokenizer: AnyTokenizer, read_file: ReadFile, paths: list[Path], cfg: EvalConfig, amp_dtype: Any
) -> dict[str, Any]:
    """Per file: {"sources": {source: scores}, "all": scores, "documents", "unreadable"}."""
    token_bytes = tokenizer.token_bytes()
    out = {}
    for path in paths:
        docs, unreadable = read_file(path)
        for line in unreadable:
            log.warning("eval: %s", line)
        by_source: dict[str, list[int]] = {}
        for source, text in docs:
            by_source.setdefault(source, []).extend(tokenizer.document(text))
        if not by_source:
            raise FatalError(
                f"{path}: no document to score"
                + (f" ({len(unreadable)} records could not be read; the first: {unreadable[0]})" if unreadable else "")
            )
        arrays = {source: TokenArray(np.asarray(ids, dtype=np.int64)) for source, ids in by_source.items()}
        assert cfg.seq_len is not None
        result = evaluate_model(
            model, arrays, token_bytes, cfg.seq_len, cfg.max_tokens_per_source, cfg.batch_size, amp_dtype
        )  # type: ignore[arg-type]
        out[PurePosixPath(str(path)).name] = result | {"documents": len(docs), "unreadable": len(unreadable)}
    return out


def run(cfg: EvalConfig, run_dir: Path, force: bool = False, read_file: ReadFile | None = None) -> dict[str, Any]:
    """read_file: how `--data` files are read (kiln.stages passes curate's readers); needed only with eval.data."""
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    trained = read_manifest(layout.stage(TRAIN))
    train_cfg = trained["config"].get("train")  # None for a run `kiln import-hf` made
    ckpt, tok_path = layout.checkpoint, layout.tokenizer_json
    # eval.seq_len None means the window the checkpoint was trained with (not the recipe's
    # current train.seq_len), or an imported model's whole context; the resolved window is what gets hashed.
    cfg = cfg.model_copy(
        update={
            "seq_len": cfg.seq_len
            or (
                train_cfg["seq_len"]
                if train_cfg
                else min(ModelConfig.model_validate(trained["model"]).max_seq_len, IMPORTED_WINDOW)
            )
        }
    )
    has_shards = refresh(layout.token_shards / MANIFEST)  # a run in a store: read there, not in the mirror
    data, tasks = [as_location(d) for d in cfg.data], [as_location(t) for t in cfg.tasks]  # files or a store's objects
    for path in data:
        if not is_file(path):
            raise FatalError(f"eval.data: {path} is not a file (give each text, JSONL or Parquet file)")
    for key, paths in (("eval.data", data), ("eval.tasks", tasks)):
        names = [PurePosixPath(str(p)).name for p in paths]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise FatalError(f"{key}: two files named {twice[0]} (results are keyed by file name); rename one")
    if not has_shards and not data and not tasks:
        raise FatalError(
            f"{run_dir}: no token shards to validate on (no tokenize stage); give files with --data or tasks with "
            "--task"
        )
    val_shards = [p for p in recorded_outputs(layout.token_shards) if p.name.startswith("val.")] if has_shards else []
    inputs = [ckpt / WEIGHTS, ckpt / CONFIG, tok_path, *val_shards, *data, *tasks]
    stage = Stage(run_dir, EVAL, {"eval": cfg}, inputs, upstream=[TOKENIZE, TRAIN] if has_shards else [TRAIN])
    if done := stage.up_to_date(
        force,
        lambda m: (
            f"val bpb {m['counts']['after']['all']['bpb']:.3f}" if "after" in m["counts"] else "data and tasks scored"
        ),
    ):
        return done
    precision = resolve_precision(cfg.precision, "eval")
    model = load_trained_model(ckpt, precision.device)
    if cfg.seq_len > model.cfg.max_seq_len:
        raise FatalError(
            f"eval.seq_len {cfg.seq_len} exceeds the checkpoint's max_seq_len {model.cfg.max_seq_len}; lower "
            "eval.seq_len"
        )
    task_items = {task_name(t): read_task(t) for t in tasks}  # a bad line stops here, before any work
    if data and read_file is None:
        raise FatalError("eval.data needs a file reader; run `kiln eval` (kiln.stages wires curate's readers in)")
    stage.begin()
    counts: dict[str, Any] = {}
    summary = []
    if has_shards:
        score = validation_scorer(run_dir, cfg, precision.amp_dtype)
        counts["after"] = after = score(model)
        start = train_cfg.get("init_from") if train_cfg else None
        if train_cfg:
            counts["before"] = before = score(
                load_trained_model(local_folder(start), precision.device)
                if start
                else build_model(ModelConfig.model_validate(trained["model"]), train_cfg["seed"], precision.device)
            )
            summary.append(
                f"after training:\n{format_results(after)}\nbefore training "
                f"({f'the starting checkpoint {start}' if start else 'same initialization'}):\n{format_results(before)}"
            )
        else:
            summary.append(f"validation:\n{format_results(after)}")
    tokenizer = load_tokenizer(tok_path)
    if data:
        assert read_file is not None
        counts["data"] = score_files(model, tokenizer, read_file, data, cfg, precision.amp_dtype)
        for name, r in counts["data"].items():
            unreadable = f", {r['unreadable']} records unreadable" if r["unreadable"] else ""
            summary.append(f"{name} ({r['documents']:,} documents{unreadable}):\n{format_results(r)}")
    if task_items:
        counts["tasks"] = {
            name: score_task(model, tokenizer, items, cfg.task_delimiter, cfg.batch_size, precision.amp_dtype)
            for name, items in task_items.items()
        }
        summary.append(format_tasks(counts["tasks"]))
    return stage.finish([], counts, "\n".join(summary))


def task_name(path: Path | str) -> str:
    return PurePosixPath(str(path)).name.removesuffix(".jsonl")


def format_tasks(tasks: dict[str, Any]) -> str:
    lines = [
        (
            f"{'task':<16} {'items':>6} {'acc':>7} {'acc_norm_char':>14} {'acc_norm_token':>15}   (zero-shot multiple "
            "choice)"
        )
    ]
    lines += [
        f"{name:<16} {r['items']:>6} {r['acc']:>7.4f} {r['acc_norm_char']:>14.4f} {r['acc_norm_token']:>15.4f}"
        for name, r in tasks.items()
    ]
    return "\n".join(lines)
