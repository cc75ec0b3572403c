"""The `parallel` section's degrees, checked against the world size before anything starts, and the
data ranks the train section's batch arithmetic counts."""

from __future__ import annotations

import pytest

from kiln.core.errors import ConfigError
from kiln.recipe import load_recipe
from kiln.train.parallel import ParallelConfig, data_ranks


def test_degrees_multiply_to_the_world_size_or_the_message_names_them() -> None:
    assert ParallelConfig().degrees(4) == {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 1}
    assert ParallelConfig(dp_replicate=2).degrees(8) == {
        "pp": 1,
        "dp_replicate": 2,
        "dp_shard": 4,
        "cp": 1,
        "tp": 1,
    }  # HSDP: 2 replicas of 4 shards
    assert ParallelConfig(tp=2, pp=2).degrees(8) == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    assert ParallelConfig(cp=2, tp=2).degrees(8) == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2}
    assert ParallelConfig(dp_shard=1, tp=2).layout(2) == (1, 1)
    with pytest.raises(
        ConfigError,
        match=(
            r"parallel.pp \(1\) x parallel.dp_replicate \(1\) x parallel.dp_shard \(2\) x parallel.cp \(1\) x "
            r"parallel.tp \(2\) must multiply to the world size, the 2 processes torchrun started"
        ),
    ):
        ParallelConfig(dp_shard=2, tp=2).degrees(2)
    with pytest.raises(
        ConfigError,
        match=(
            r"parallel.dp_replicate \(3\) x parallel.dp_shard \(-1\) x parallel.cp \(1\) x parallel.tp \(1\) must "
            r"multiply to the world size, the 2 processes.*a multiple of pp x dp_replicate x cp x tp = 3"
        ),
    ):
        ParallelConfig(dp_replicate=3).degrees(2)
    with pytest.raises(
        ConfigError, match=r"parallel.tp \(4\).*the 6 processes.*a multiple of pp x dp_replicate x cp x tp = 4"
    ):
        ParallelConfig(tp=4).degrees(6)
    with pytest.raises(
        ConfigError, match=r"parallel.cp \(3\).*the 4 processes.*a multiple of pp x dp_replicate x cp x tp = 3"
    ):
        ParallelConfig(cp=3).degrees(4)


def test_the_train_section_counts_data_ranks_not_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 processes with tp=2 read 2 streams of rows: 8192 tokens per step are 2 micro-batches of
    # 16 x 64 on each data rank. Counted per process (4) they would not divide evenly at all.
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert (
        data_ranks({"tp": 2}) == 2
        and data_ranks({"tp": 2, "pp": 2}) == 1
        and data_ranks({"cp": 2}) == 2
        and data_ranks(None) == 4
        and data_ranks({"tp": "many"}) == 4
    )
    sets = ["train.seq_len=64", "train.micro_batch_size=16", "model.max_seq_len=64"]
    recipe = load_recipe(None, ["name=t", "parallel.tp=2", "train.global_batch_tokens=4096", *sets])
    assert (recipe.train.data_ranks, recipe.train.grad_accum_steps, recipe.train.tokens_per_step) == (2, 2, 4096)
    assert recipe.train.model_copy(update={"steps": 5}).data_ranks == 2  # kept by copies
    with pytest.raises(
        ConfigError,
        match=(
            r"global_batch_tokens \(3072\) is not a multiple of micro_batch_size \* seq_len \* data-parallel ranks "
            r"\(16 \* 64 \* 2 = 2048\)"
        ),
    ):
        load_recipe(None, ["name=t", "parallel.tp=2", "train.global_batch_tokens=3072", *sets])
    assert (
        load_recipe(None, ["name=t", "train.global_batch_tokens=4096", *sets]).train.grad_accum_steps == 1
    )  # 4 data ranks
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process trains alone whatever the section says
    assert (
        load_recipe(None, ["name=t", "parallel.tp=2", "train.global_batch_tokens=4096", *sets]).train.grad_accum_steps
        == 4
    )
