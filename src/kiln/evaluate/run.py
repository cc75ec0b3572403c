"""The eval stage: score the trained checkpoint, and the same model before training, per source.

"before" rebuilds the untrained model from the train stage's model config and seed (the
trainer's own initialization), or loads the starting checkpoint of a continued run
(train.init_from), so before and after are measured on the same windows with the same settings
whenever eval runs. Device and autocast come from eval.precision
(kiln.model.precision); with the defaults they match the trainer's, and so do the numbers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kiln.core.errors import FatalError
from kiln.core.layout import EVAL, TOKENIZE, TRAIN, RunLayout
from kiln.core.manifest import Stage, read_manifest, recorded_outputs
from kiln.evaluate.config import EvalConfig
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.perplexity import format_results, validation_scorer
from kiln.model.precision import resolve_precision
from kiln.model.weights import CONFIG, WEIGHTS, load_trained_model

log = logging.getLogger("kiln.eval")


def run(cfg: EvalConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    trained = read_manifest(layout.stage(TRAIN))
    # eval.seq_len None means the window the checkpoint was trained with (not the recipe's
    # current train.seq_len); the resolved window is what gets hashed.
    cfg = cfg.model_copy(update={"seq_len": cfg.seq_len or trained["config"]["train"]["seq_len"]})
    ckpt, tok_path = layout.checkpoint, layout.tokenizer_json
    inputs = [ckpt / WEIGHTS, ckpt / CONFIG, tok_path, *(p for p in recorded_outputs(layout.token_shards) if p.name.startswith("val."))]
    stage = Stage(run_dir, EVAL, {"eval": cfg}, inputs, upstream=[TOKENIZE, TRAIN])
    if done := stage.up_to_date(force, lambda m: f"val bpb {m['counts']['after']['all']['bpb']:.3f}"):
        return done
    precision = resolve_precision(cfg.precision, "eval")
    model = load_trained_model(ckpt, precision.device)
    if cfg.seq_len > model.cfg.max_seq_len:
        raise FatalError(f"eval.seq_len {cfg.seq_len} exceeds the checkpoint's max_seq_len {model.cfg.max_seq_len}; lower eval.seq_len")
    stage.begin()
    score = validation_scorer(run_dir, cfg, precision.amp_dtype)
    after = score(model)
    start = trained["config"]["train"].get("init_from")
    before = score(load_trained_model(Path(start), precision.device) if start else build_model(ModelConfig.model_validate(trained["model"]), trained["config"]["train"]["seed"], precision.device))
    summary = f"after training:\n{format_results(after)}\nbefore training ({f'the starting checkpoint {start}' if start else 'same initialization'}):\n{format_results(before)}"
    return stage.finish([], {"after": after, "before": before}, summary)
