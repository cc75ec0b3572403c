"""Pipeline parallelism through torchrun on the CPU (gloo), on the tiny preset: the layouts (GPipe,
1F1B, interleaved 1F1B) train as one process does with the same global batch, 10 steps, losses
within 1e-4 relative; the bubble measured is GPipe's (p - 1) / (m + p - 1). GPipe trains the model
untied; interleaved 1F1B x tp 2 trains it with tied embeddings (the first and last stage each hold
the matrix and sum their gradients) and QK-norm (the gains replicated over tp); and a state saved
by a context-parallel group of that model resumes under pipeline stages, whose state resumes under
FSDP2 x tensor parallelism.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from launches import (
    assert_same_losses,
    assert_same_weights,
    assert_states_as_planned,
    command,
    copy_run,
    kill_after,
    launch,
    run,
    step_records,
    write_recipe,
)

from kiln.core.errors import ConfigError
from kiln.model.config import ModelConfig, count_params
from kiln.model.init import build_model
from kiln.model.kv_cache import KVCache
from kiln.train.mesh import check_pipeline
from kiln.train.parallel import ParallelConfig
from kiln.train.pipeline_parallel import StageModel, balance_layers, micro_batch_count

STEPS = 10
UNTIED = "{preset: tiny, max_seq_len: 64, tie_embeddings: false}"
TIED_QK = "{preset: tiny, max_seq_len: 64, tie_embeddings: true, qk_norm: true}"  # as the demo recipe's model
PROBE = (
    "train.probe_every=10",
    "eval.probe.max_new_tokens=8",
)  # after the last step: the probe set's document losses and greedy continuations


def stage_params(cfg: ModelConfig, counts: list[int]) -> list[int]:
    """Each stage's parameters, counted from the model's own parameter count."""
    block = (count_params(cfg, False) - cfg.d_model) // cfg.n_layers
    embedding = cfg.vocab_size * cfg.d_model  # type: ignore[operator]
    return [
        c * block + (embedding if s == 0 else 0) + (embedding + cfg.d_model if s == len(counts) - 1 else 0)
        for s, c in enumerate(counts)
    ]


def test_stages_are_balanced_by_parameters_worked_by_hand() -> None:
    # tiny untied with a 16,384-token vocabulary: a block holds 196,864 weights, the embedding and
    # the output layer 2,097,152 each, about 10.7 blocks. Over 3 stages of 8 layers the middle one
    # takes every layer it can: [1, 6, 1] leaves 2.29M, 1.18M and 2.29M; moving a layer to either
    # end would make that end 2.49M.
    cfg = ModelConfig(preset="tiny", vocab_size=16384, n_layers=8, tie_embeddings=False)
    assert balance_layers(cfg, 3) == [1, 6, 1]
    assert stage_params(cfg, [1, 6, 1]) == [2_294_016, 1_181_184, 2_294_144]
    assert balance_layers(ModelConfig(preset="tiny", vocab_size=64, tie_embeddings=False), 2) == [
        2,
        2,
    ]  # a small vocabulary: halves


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 9), stages=st.integers(1, 4), vocab=st.sampled_from([64, 1024, 8192, 65536]))
def test_the_balance_is_the_best_contiguous_split(layers: int, stages: int, vocab: int) -> None:
    if stages > layers:
        return
    cfg = ModelConfig(preset="tiny", vocab_size=vocab, n_layers=layers, tie_embeddings=False)
    counts = balance_layers(cfg, stages)
    assert sum(counts) == layers and len(counts) == stages and min(counts) >= 1
    every = [
        [b - a for a, b in zip((0, *cuts), (*cuts, layers), strict=True)]
        for cuts in itertools.combinations(range(1, layers), stages - 1)
    ]
    assert max(stage_params(cfg, counts)) == min(max(stage_params(cfg, c)) for c in every)


def test_what_a_pipeline_cannot_take_is_refused_with_the_reason() -> None:
    untied = ModelConfig(preset="tiny", tie_embeddings=False)
    check_pipeline(untied, ParallelConfig(pp=2), {"clm": False})
    check_pipeline(
        ModelConfig(preset="tiny"), ParallelConfig(pp=2), {"clm": False}
    )  # tied: the first and last stage each hold the matrix
    with pytest.raises(
        ConfigError, match=r"parallel.pp_layers \[3, 2\] must give each of the 2 stages at least one layer, 4 in all"
    ):
        check_pipeline(untied, ParallelConfig(pp=2, pp_layers=[3, 2]), {"clm": False})
    with pytest.raises(ConfigError, match=r"train.objective mlm, prefix_lm: a stage builds plain causal attention"):
        check_pipeline(untied, ParallelConfig(pp=2), {"clm": False, "mlm": True, "prefix_lm": True})
    with pytest.raises(ConfigError, match=r"parallel.sequence_parallel"):
        check_pipeline(untied, ParallelConfig(pp=2, tp=2, sequence_parallel=True), {"clm": False})
    check_pipeline(
        untied,
        ParallelConfig(pp=2, pp_layers=[1, 1, 1, 1], pp_schedule="interleaved_1f1b", pp_stages_per_rank=2),
        {"clm": False},
    )  # 4 stages of one layer
    with pytest.raises(
        ConfigError,
        match=(
            r"interleaved_1f1b takes turns between the stages of "
            r"a rank: set parallel.pp_stages_per_rank to 2 or more"
        ),
    ):
        check_pipeline(untied, ParallelConfig(pp=2, pp_schedule="interleaved_1f1b"), {"clm": False})
    with pytest.raises(
        ConfigError,
        match=r"parallel.pp_stages_per_rank=2: only pp_schedule: interleaved_1f1b runs several stages per rank",
    ):
        check_pipeline(untied, ParallelConfig(pp=2, pp_stages_per_rank=2), {"clm": False})
    with pytest.raises(
        ConfigError, match=r"model.n_layers \(4\) is below the 6 stages \(parallel.pp x parallel.pp_stages_per_rank\)"
    ):
        check_pipeline(
            untied, ParallelConfig(pp=2, pp_schedule="interleaved_1f1b", pp_stages_per_rank=3), {"clm": False}
        )
    with pytest.raises(ConfigError, match=r"parallel.pp_layers \[2, 2\] must give each of the 4 stages"):
        check_pipeline(
            untied,
            ParallelConfig(pp=2, pp_layers=[2, 2], pp_schedule="interleaved_1f1b", pp_stages_per_rank=2),
            {"clm": False},
        )


def test_a_tied_embedding_is_held_by_the_first_and_the_last_stage_under_one_process_names() -> None:
    # 3 stages of the tied tiny model: the first looks ids up, the last keeps the embedding as its
    # output matrix (one parameter, named as one process names it), the middle holds neither.
    cfg = ModelConfig(preset="tiny", vocab_size=64, max_seq_len=64)
    first, middle, last = (
        StageModel(build_model(cfg, 0, "cpu"), layers, s == 0, s == 2) for s, layers in enumerate(({0}, {1, 2}, {3}))
    )
    assert first.lm_head is None and middle.embed is None and middle.lm_head is None
    assert last.lm_head.weight is last.embed.weight and torch.equal(
        last.embed.weight, first.embed.weight
    )  # the same initial weights
    assert [n for n, _ in last.named_parameters() if not n.startswith("blocks.")] == ["embed.weight", "norm.weight"]
    assert {"embed.weight", "lm_head.weight"} <= last.state_dict().keys()  # as one process's state holds them


def test_stages_built_from_the_models_modules_compute_what_the_model_computes() -> None:
    # Two ranks of the interleaved layout on one process: rank A holds stages 0 and 2 (layers 0, 2),
    # rank B stages 1 and 3, each with its own KV cache, as StagesInTurn runs them. Taken in turn
    # they give the Transformer's own logits bit for bit, for scoring and for a prefill and a
    # decoding step with padded rows (positions, valid_BT, last_only).
    cfg = ModelConfig(preset="tiny", vocab_size=64, max_seq_len=32, qk_norm=True)
    model = build_model(cfg, 0, "cpu").eval()
    a, b = StageModel(model, {0, 2}, True, False), StageModel(model, {1, 3}, False, True)
    turns = [(a, range(0, 1)), (b, range(1, 2)), (a, range(2, 3)), (b, range(3, 4))]

    def in_turn(ids: torch.Tensor, caches: dict | None = None, **kwargs: Any) -> torch.Tensor:
        x = ids
        for stage, layers in turns:
            x = stage(x, layers, **kwargs, **({"cache": caches[id(stage)]} if caches else {}))
        return x

    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, :3] = False  # a left-padded row
    positions = (valid.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        assert torch.equal(in_turn(ids), model(ids))
        whole, caches = KVCache(cfg.n_layers, 16), {id(a): KVCache(cfg.n_layers, 16), id(b): KVCache(cfg.n_layers, 16)}
        step = {"positions_BT": positions, "valid_BT": valid, "last_only": True}
        assert torch.equal(in_turn(ids, caches, **step), model(ids, cache=whole, **step))
        after = {"positions_BT": positions[:, -1:] + 1, "last_only": True}
        assert torch.equal(in_turn(ids[:, :1], caches, **after), model(ids[:, :1], cache=whole, **after))
    assert all(c.length == whole.length == 13 for c in caches.values())  # each rank's cache advanced once per pass


def test_micro_batch_counts_worked_by_hand() -> None:
    assert micro_batch_count(16, 4, 2, "1f1b") == (4, "1f1b")  # 4 of the largest size given
    assert micro_batch_count(2, 2, 4, "1f1b") == (2, "gpipe")  # fewer rows than stages: one each
    assert micro_batch_count(2, 2, 4, "interleaved_1f1b") == (2, "interleaved_1f1b")  # one round of 2
    assert micro_batch_count(10, 2, 4, "interleaved_1f1b") == (
        5,
        "interleaved_1f1b",
    )  # 5 is 1 round of 4 and 1 over, allowed
    assert micro_batch_count(10, 2, 2, "interleaved_1f1b") == (
        10,
        "interleaved_1f1b",
    )  # 5 would be 2 rounds and 1 over: 10 make 5 rounds of 2
    assert micro_batch_count(5, 1, 2, "interleaved_1f1b") == (
        5,
        "looped_bfs",
    )  # 5 micro-batches of 1 make no whole rounds of 2


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 48),
    largest=st.integers(1, 16),
    pp=st.integers(2, 4),
    kind=st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"]),
)
def test_a_step_splits_into_equal_micro_batches_each_schedule_takes(
    rows: int, largest: int, pp: int, kind: str
) -> None:
    largest = min(largest, rows)
    m, runs = micro_batch_count(rows, largest, pp, kind)
    assert rows % m == 0 and rows // m <= largest  # equal micro-batches, none larger than the largest given
    fits = [d for d in range(1, rows + 1) if rows % d == 0 and rows // d <= largest]
    if kind == "interleaved_1f1b":
        takes = [d for d in fits if d % max(1, d // pp) == 0]  # a whole number of rounds of micro-batches
        full = [d for d in takes if d >= pp]  # else one round of fewer than pp, as many as fit
        assert (runs, m) == ((kind, min(full) if full else max(takes)) if takes else ("looped_bfs", min(fits)))
    else:
        assert (runs, m) == ((kind, min(d for d in fits if d >= pp)) if max(fits) >= pp else ("gpipe", rows))


@pytest.fixture(scope="module")
def single(tokenized_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("single_untied")
    return launch(tokenized_run, root, 1, steps=STEPS, model=UNTIED), root


@pytest.fixture(scope="module")
def single_tied(tokenized_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("single_tied_qk")
    return launch(tokenized_run, root, 1, *PROBE, steps=STEPS, model=TIED_QK), root


@pytest.mark.slow
@pytest.mark.cores  # the two stages overlap only on cores no other test is using
def test_two_stages_with_gpipe_match_one_process_and_idle_as_the_schedule_says(
    single: tuple[list, Path], tokenized_run: Path, tmp_path: Path
) -> None:
    # 2 stages, 4 micro-batches of 4 rows per step (as one process accumulates them): GPipe idles
    # each stage (2 - 1) / (4 + 2 - 1) = 20% of a step.
    one, one_root = single
    two = launch(tokenized_run, tmp_path, 2, "parallel.pp=2", "parallel.pp_schedule=gpipe", steps=STEPS, model=UNTIED)
    assert_same_losses(two, one, STEPS)
    bubble = sorted(r["pipeline_bubble"] for r in two[1:])  # the first step builds the schedule
    # Measured medians: 0.23 and 0.24 on idle cores; 0.37 with another test process on the same 2
    # cores, whose preemptions read as idle time. The bound holds both and no schedule without a
    # bubble (0) or with stages run one after another (0.5).
    assert 0.1 < bubble[len(bubble) // 2] < 0.45, bubble
    assert_same_weights(tmp_path, one_root)  # both stages' weights, gathered
    manifest = json.loads((tmp_path / "runs" / "run" / "train" / "manifest.json").read_text())
    assert manifest["counts"]["parallel"]["pp"] == 2
    assert_states_as_planned(manifest, 0.02)  # the stages are balanced to within one layer's norms
    assert manifest["counts"]["val_after"]["all"]["loss"] == pytest.approx(
        json.loads((one_root / "runs" / "run" / "train" / "manifest.json").read_text())["counts"]["val_after"]["all"][
            "loss"
        ],
        rel=1e-4,
    )


@pytest.mark.slow
@pytest.mark.xdist_group("pipeline_tied")  # one worker: single_tied is trained once
def test_tensor_and_interleaved_pipeline_parallel_with_fsdp2_match_one_process(
    single_tied: tuple[list, Path], tokenized_run: Path, tmp_path: Path
) -> None:
    # 4 processes: 2 ranks of 2 stages each (interleaved 1F1B; the 4 layers one per stage, rank 0
    # holding layers 0 and 2, rank 1 layers 1 and 3) x tp 2, FSDP2 over the one data rank of each.
    # The model is tied: rank 0's embedding and rank 1's copy (vocabulary-split over tp, as DTensors)
    # sum their gradients every step, and the grad norm counts the matrix once; with QK-norm each tp
    # rank's gain gradient covers its 2 of the 4 heads and is summed over the pair. Validation and the
    # probe set's decoding (a KV cache of each rank's heads, normed) run the 4 stages in turn over the 2 ranks.
    one, one_root = single_tied
    four = launch(
        tokenized_run,
        tmp_path,
        4,
        "parallel.pp=2",
        "parallel.pp_schedule=interleaved_1f1b",
        "parallel.pp_stages_per_rank=2",
        "parallel.tp=2",
        *PROBE,
        steps=STEPS,
        model=TIED_QK,
    )
    assert_same_losses(four, one, STEPS)
    assert all(0 <= r["pipeline_bubble"] < 1 for r in four)
    val = [
        json.loads((root / "runs" / "run" / "train" / "manifest.json").read_text())["counts"]["val_after"]["all"][
            "loss"
        ]
        for root in (tmp_path, one_root)
    ]
    assert val[0] == pytest.approx(val[1], rel=1e-4)
    probes = [
        next(
            json.loads(line)["probe"]
            for line in (root / "runs" / "run" / "train" / "metrics.jsonl").read_text().splitlines()
            if '"probe"' in line
        )
        for root in (tmp_path, one_root)
    ]
    assert probes[0]["generations"] == probes[1]["generations"] and probes[0]["generations"]
    assert all(
        probes[0]["documents"][d]["loss"] == pytest.approx(r["loss"], rel=1e-4)
        for d, r in probes[1]["documents"].items()
    )
    assert_same_weights(tmp_path, one_root)  # the tied matrix once, gathered from the two stages


@pytest.mark.slow
@pytest.mark.xdist_group("pipeline_tied")  # one worker: single_tied is trained once
def test_a_state_resumes_across_context_pipeline_and_tensor_parallel_layouts(
    single_tied: tuple[list, Path], tokenized_run: Path, tmp_path: Path
) -> None:
    # States every 2 steps, keyed by parameter name whatever the layout, of the tied QK-norm model.
    # A context-parallel group of 2 (every rank holds every layer, sharded over the group) killed
    # once step 4 is logged; resumed by 2 pipelines of 2 stages, FSDP2 over their 2 data ranks (4
    # processes), the first stage loading the tied matrix as its embedding and the last as its
    # output layer, the two summing their shards' gradients, each writing its own layers and their
    # optimizer states in the background, killed once step 7 is logged; resumed on 4 processes,
    # FSDP2 over 2 data ranks x tp 2 with sequence parallelism (head-split and vocabulary-split
    # matrices, the q/k norm gains replicated), which load the matrix the two stages wrote once.
    # Micro-batches of 4 rows throughout (the same recipe, so the same stage): the cp group takes 4
    # per step, each data rank of the other layouts 2 (of 2 rows, twice as many, the test took 44 s alone, not 34).
    one, one_root = single_tied
    runs_dir = tmp_path / "runs"
    copy_run(tokenized_run, runs_dir)
    recipe = write_recipe(tmp_path, STEPS, 4, TIED_QK)
    metrics = runs_dir / "run" / "train.partial" / "metrics.jsonl"
    kill_after(command(recipe, 2, "parallel.cp=2", "train.checkpoint.every=2"), metrics, 4)
    stages = kill_after(
        command(
            recipe,
            4,
            "parallel.pp=2",
            "parallel.dp_shard=2",
            "train.checkpoint.every=2",
            "train.checkpoint.async_save=true",
        ),
        metrics,
        7,
    )
    assert int(stages.split("resuming after step ")[1].split()[0]) in (2, 4)
    assert "mesh pp 2 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 1 over 4 processes" in stages
    done = run(
        command(
            recipe,
            4,
            "parallel.dp_shard=2",
            "parallel.tp=2",
            "parallel.sequence_parallel=true",
            "train.checkpoint.every=2",
        )
    )
    assert 6 <= int(done.stderr.split("resuming after step ")[1].split()[0]) < STEPS  # a state the 2 stages wrote
    assert "mesh pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2 over 4 processes" in done.stderr
    assert_same_losses(step_records(runs_dir), one, STEPS)
    assert_same_weights(tmp_path, one_root)
    assert_states_as_planned(json.loads((runs_dir / "run" / "train" / "manifest.json").read_text()), 0.01)
