"""kiln.sweep: grid planning, the shared-stage links, and one real miniature sweep.

The default grid trains for about 20 minutes on 2 CPU cores, so it is checked by hand:
    kiln sweep --recipe demo --sizes 64x2,128x2 --steps 40,80,160
    kiln plan fit --runs runs/demo/sweep --plot runs/demo/sweep/fit.png
test_run_sweep trains 2 sizes x 2 step counts of a d_model 16 model on the stdlib's email
package (a few seconds), through the same run_sweep the CLI calls.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest

from kiln.core.errors import ConfigError
from kiln.model.config import count_params, flops_per_token
from kiln.recipe import load_recipe
from kiln.sweep import (
    format_sweep,
    link_shared_stages,
    parse_sizes,
    parse_steps,
    plan_sweep,
    point_row,
    run_sweep,
    sweep_dir,
)


def test_parse_grid() -> None:
    assert parse_sizes("64x2, 128X4") == [(64, 2), (128, 4)]
    assert parse_steps("100,200") == [100, 200]
    for bad in ("64", "64x", "x2", "4x2", "64x0", ""):
        with pytest.raises(ConfigError, match="sizes"):
            parse_sizes(bad)
    for bad in ("1,2", "ten", ""):
        with pytest.raises(ConfigError, match="steps"):
            parse_steps(bad)


def test_plan_sweep_on_the_demo_recipe() -> None:
    base, points = plan_sweep("demo", [], [(64, 2), (128, 4)], [50, 100, 200])
    assert base.name == "demo" and sweep_dir(base) == Path("runs/demo/sweep")
    assert [p.name for p in points] == [
        "d64-l2-s50",
        "d64-l2-s100",
        "d64-l2-s200",
        "d128-l4-s50",
        "d128-l4-s100",
        "d128-l4-s200",
    ]
    p = points[4]
    assert (p.d_model, p.n_layers, p.n_heads, p.steps) == (128, 4, 4, 100)
    # Each point is the demo recipe with its overrides: its counts are the model config's.
    r = load_recipe("demo", list(p.overrides))
    assert r.train.schedule.warmup_steps == 10 and r.train.eval_at_start is False and r.model.n_kv_heads == 4
    cfg = r.model.resolved(r.tokenizer.vocab_size)
    assert p.params == count_params(cfg)
    assert p.params_non_embedding == count_params(cfg, include_embeddings=False) < p.params
    assert p.tokens == 100 * r.train.tokens_per_step
    assert p.train_flops == flops_per_token(cfg, r.train.seq_len) * p.tokens
    text = format_sweep([point_row(q) for q in points], sweep_dir(base), ran=False)
    assert "6 runs" in text and "dry run" in text and "N (non-embedding)" in text
    # d_model 64 with the demo's 8192-token tied vocabulary: 524,288 of 631,104 parameters (83%) are the embedding.
    assert "embeddings are up to 83% of all parameters" in text


def test_bad_points_fail_before_any_work() -> None:
    with pytest.raises(ConfigError, match="d_model 48 with head_dim 32: d_model must be a multiple of head_dim"):
        plan_sweep("demo", [], [(48, 2)], [50])
    with pytest.raises(ConfigError, match="head_dim even"):
        plan_sweep("demo", [], [(63, 2)], [50], head_dim=21)
    with pytest.raises(ConfigError, match="train.optim.lr"):
        plan_sweep("demo", ["train.optim.lr=fast"], [(64, 2)], [50])


def test_link_shared_stages(tmp_path: Path) -> None:
    base = tmp_path / "runs" / "demo"
    for stage in ("tokenizer", "tokenize"):
        (base / stage).mkdir(parents=True)
        (base / stage / "manifest.json").write_text(stage)
    point = base / "sweep" / "d64-l2-s50"
    link_shared_stages(base, point)
    link_shared_stages(base, point)  # idempotent
    assert (point / "tokenize" / "manifest.json").read_text() == "tokenize"
    assert (point / "tokenizer").is_symlink() and not Path(str((point / "tokenizer").readlink())).is_absolute()
    other = tmp_path / "other"
    (other / "tokenizer").mkdir(parents=True)
    with pytest.raises(ConfigError, match="exists and is not a link"):
        link_shared_stages(base, other)


TINY_RECIPE = """
name: tiny
runs_dir: {runs}
curate:
  inputs:
    - {{source: code, format: text, path: "{data}/*.py"}}
  executor: {{workers: 1}}
  line_dedup: {{enabled: false}}
  language: {{enabled: false}}
  gopher_repetition: {{enabled: false}}
  gopher_quality: {{enabled: false}}
  c4: {{enabled: false}}
  fineweb: {{enabled: false}}
  code_quality: {{enabled: false}}
tokenizer: {{vocab_size: 400, sample_mb: 0.2}}
tokenize: {{val_fraction: 0.2}}
model: {{d_model: 16, n_layers: 1, n_heads: 1, n_kv_heads: 1, max_seq_len: 32}}
train: {{steps: 2, seq_len: 32, micro_batch_size: 4, schedule: {{warmup_steps: 1}}, precision: {{device: cpu}},
        threads: 1}}
eval: {{max_tokens_per_source: 512, batch_size: 8}}
"""


def test_run_sweep(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for src in sorted((Path(sysconfig.get_paths()["stdlib"]) / "email").glob("*.py"))[:12]:
        shutil.copy(src, data / src.name)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_RECIPE.format(runs=json.dumps(str(tmp_path / "runs")), data=data))
    base, points = plan_sweep(str(recipe), [], [(16, 1), (32, 1)], [2, 4], head_dim=16)
    rows = run_sweep(base, str(recipe), [], points)
    assert [r["name"] for r in rows] == ["d16-l1-s2", "d16-l1-s4", "d32-l1-s2", "d32-l1-s4"]
    where = sweep_dir(base)
    for row, point in zip(rows, points):
        run = Path(row["run_dir"])
        assert run.parent == where and (run / "tokenize").is_symlink()
        counts = json.loads((run / "train" / "manifest.json").read_text())["counts"]
        # The point's planned counts are what the trainer recorded.
        assert (counts["params"], counts["params_non_embedding"], counts["tokens_trained"]) == (
            point.params,
            point.params_non_embedding,
            point.tokens,
        )
        assert row["val_loss"] == counts["val_after"]["all"]["loss"] > 0
    # The shared stages ran once, in the base run; a second sweep skips every finished point.
    assert (base.run_dir / "tokenize" / "manifest.json").is_file()
    mtime = (Path(rows[0]["run_dir"]) / "train" / "manifest.json").stat().st_mtime_ns
    assert run_sweep(base, str(recipe), [], points[:1])[0]["val_loss"] == rows[0]["val_loss"]
    assert (Path(rows[0]["run_dir"]) / "train" / "manifest.json").stat().st_mtime_ns == mtime
