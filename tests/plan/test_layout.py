"""kiln.plan.layout: proposed layouts fit, follow the stated preferences, and explain themselves."""

from __future__ import annotations

import pytest

from kiln.core.errors import ConfigError
from kiln.model.config import get_preset
from kiln.plan.layout import bubble_fraction, dp_traffic, format_layout, planner_layout, propose_layout, recipe_keys
from kiln.plan.memory import Shape, plan_memory

LLAMA_7B = Shape.from_config(get_preset("llama-7b"))
LLAMA_70B = Shape.from_config(get_preset("llama-70b"))


def test_7b_on_64_gpus_is_pure_data_parallel() -> None:
    # ZeRO-1 states (2 + 2 + 12/64) * 6.74B = 28.2 GB, activations with flash attention
    # 32 * 34 * 4096^2 = 18.25 GB: 46.5 GB of the 72 GB usable, no recompute needed.
    r = propose_layout(LLAMA_7B, gpus=64, seq_len=4096, global_batch=512)
    assert (r["tp"], r["pp"], r["dp"], r["zero"], r["activation_checkpointing"]) == (1, 1, 64, 1, "none")
    assert (
        r["micro_batches"] == 8
        and r["global_batch"] == 512
        and r["bubble_fraction"] == 0
        and r["dp_traffic_vs_ddp"] == 1.0
    )
    assert r["fits"] and r["total_gb"] == pytest.approx(46.47, abs=0.01) and r["usable_gb"] == pytest.approx(72.0)
    assert r["memory"] == plan_memory(LLAMA_7B, 64, 1, 1, 1, 1, 4096, "bf16", "none", True, 80.0, micro_batches=8)
    assert r["reasons"][0] == "tp=1: every GPU holds whole layers; no tensor splitting needed"
    # kiln runs ZeRO-1 as replicas: the warning says what that needs, and the keys say how to run it.
    assert r["warnings"] == [
        (
            "kiln has no ZeRO-1: the recipe keys run replicas (DDP) with full optimizer states, 126.1 GB per GPU, "
            "which does not fit in 72.0 GB; --zero 2 or 3 shards them with FSDP2"
        )
    ]
    assert r["recipe"] == {
        "parallel.pp": 1,
        "parallel.dp_replicate": 64,
        "parallel.dp_shard": 1,
        "parallel.cp": 1,
        "parallel.tp": 1,
        "train.activation_checkpointing": "none",
        "train.micro_batch_size": 1,
        "train.seq_len": 4096,
        "train.global_batch_tokens": 512 * 4096,
    }
    three = propose_layout(LLAMA_7B, gpus=64, seq_len=4096, global_batch=512, zero=3)
    assert (
        three["recipe"] | {"parallel.dp_shard": 64, "parallel.reshard_after_forward": True} == three["recipe"]
        and three["warnings"] == []
    )


def test_eager_attention_needs_selective_recompute() -> None:
    # Eager attention stores 160 sbh of scores per layer more: 132.4 GB without recompute.
    r = propose_layout(LLAMA_7B, gpus=64, seq_len=4096, global_batch=512, attention="eager")
    assert (r["tp"], r["pp"], r["dp"], r["zero"], r["activation_checkpointing"]) == (1, 1, 64, 1, "selective")
    assert r["reasons"][0] == (
        "1 preferred layout does not fit; the closest ahead of this one, tp=1 pp=1 dp=64 ZeRO-1, recompute none, "
        "needs 132.4 GB > 72.0 GB usable"
    )


def test_70b_splits_tensors_inside_a_node() -> None:
    # tp=8 leaves 8.62B parameters per GPU: ZeRO-1 over dp=8 is 2 + 2 + 1.5 bytes each = 47.4 GB,
    # activations 80 * 34/8 * 4096 * 8192 = 11.4 GB: 58.8 of 72 GB. tp=4 would need 95 GB of states.
    r = propose_layout(LLAMA_70B, gpus=64, gpus_per_node=8, seq_len=4096, global_batch=1024)
    assert (r["tp"], r["pp"], r["dp"], r["zero"], r["activation_checkpointing"]) == (8, 1, 8, 1, "none")
    assert r["micro_batches"] == 128 and r["total_gb"] == pytest.approx(58.83, abs=0.01)
    text = format_layout(r)
    assert "tp=8: each layer's matmuls split over 8 GPUs inside one 8-GPU node" in text
    assert (
        "ZeRO-1: optimizer states sharded over dp=8" in text and "58.83 of 72.00 usable (80 less 10% headroom" in text
    )


def test_small_gpus_take_a_pipeline_with_zero_1() -> None:
    # The review's case: 70B on 64 A100-40GB. With pp > 1 only ZeRO-1 is considered (what kiln's
    # FSDP2 does with pipeline stages); tp=8 pp=4 ZeRO-1 fits in 33.0 of 36 GB usable, and kiln
    # runs it as FSDP2 over each stage's 2 data ranks.
    r = propose_layout(LLAMA_70B, gpus=64, gpu_memory_gb=40, seq_len=4096)
    assert (r["tp"], r["pp"], r["dp"], r["zero"], r["activation_checkpointing"]) == (8, 4, 2, 1, "none")
    assert r["micro_batches"] == 16 and r["bubble_fraction"] == pytest.approx(3 / 19)
    assert any(
        x.startswith("pp=4: 20 layers per stage across nodes; 16 micro-batches per step leave a 15.8% bubble")
        for x in r["reasons"]
    )
    assert (
        r["recipe"]["parallel.dp_shard"] == 2
        and r["recipe"]["parallel.pp"] == 4
        and not any(w.startswith("kiln has no ZeRO-1") for w in r["warnings"])
    )


def test_zero_2_with_micro_batches_is_priced_and_avoided() -> None:
    # 70B on 16 H200s. One micro-batch per step: ZeRO-2 moves what DDP does, so tp=4 with ZeRO-2 wins.
    one = propose_layout(LLAMA_70B, gpus=16, gpu_memory_gb=141, seq_len=4096, global_batch=4)
    assert (one["tp"], one["dp"], one["zero"], one["micro_batches"], one["dp_traffic_vs_ddp"]) == (4, 4, 2, 1, 1.0)
    assert (
        "ZeRO-2: gradients sharded too; with one micro-batch per step, the same traffic as DDP, needed to fit"
        in one["reasons"]
    )
    # 16 micro-batches: ZeRO-2 would reduce-scatter after each, (16 + 1) / 2 = 8.5x DDP, so tp=8 with ZeRO-1 wins.
    many = propose_layout(LLAMA_70B, gpus=16, gpu_memory_gb=141, seq_len=4096, global_batch=64)
    assert (many["tp"], many["dp"], many["zero"], many["micro_batches"], many["dp_traffic_vs_ddp"]) == (
        8,
        2,
        1,
        32,
        1.0,
    )
    assert dp_traffic(2, 16) == 8.5 and dp_traffic(3, 1) == 1.5 and dp_traffic(3, 4) == 6.0 and dp_traffic(1, 64) == 1.0
    # Asked for, ZeRO-2 with 8 micro-batches says what it costs.
    r = propose_layout(LLAMA_7B, gpus=64, seq_len=4096, global_batch=512, zero=2)
    assert (r["pp"], r["zero"], r["micro_batches"], r["dp_traffic_vs_ddp"]) == (1, 2, 8, 4.5)
    assert (
        "ZeRO-2: gradients sharded too; with 8 micro-batches per step they are reduce-scattered after every "
        "micro-batch (4.5x DDP's data-parallel traffic; keeping full gradients until the step would lose the "
        "memory saved) (as asked)"
    ) in r["reasons"]
    # ZeRO-3 re-gathers weights for each of 128 micro-batches: 192x DDP.
    r = propose_layout(LLAMA_70B, gpus=64, gpu_memory_gb=40, seq_len=4096, global_batch=1024, pp=1)
    assert (r["tp"], r["zero"], r["micro_batches"], r["dp_traffic_vs_ddp"]) == (8, 3, 128, 192.0)
    assert any(
        x.startswith(
            "ZeRO-3 (FSDP full shard): weights sharded too; all-gathered for forward and backward and gradients "
            "reduce-scattered for each of the 128 micro-batches (192.0x"
        )
        for x in r["reasons"]
    )


def test_full_recompute_and_pipeline_only_when_needed() -> None:
    # 70B on 16 H100s with no headroom: even tp=8 leaves 8.6B parameters per GPU (138 GB of
    # states without ZeRO), ZeRO-2/3 are off the table with a pipeline, so the pipeline takes the
    # second node and activations must be recomputed in full: 74.5 GB. With the default 10%
    # headroom (72 GB usable) nothing fits.
    r = propose_layout(LLAMA_70B, gpus=16, seq_len=4096, headroom=0.0)
    assert (r["tp"], r["pp"], r["dp"], r["zero"]) == (8, 2, 1, 0) and r["activation_checkpointing"] == "full"
    assert (
        r["micro_batches"] == 8
        and r["bubble_fraction"] == pytest.approx(1 / 9)
        and r["total_gb"] == pytest.approx(74.49, abs=0.01)
    )
    assert "dp=1: no data parallelism; tp x pp uses every GPU" in r["reasons"] and r["dp_traffic_vs_ddp"] is None
    with pytest.raises(
        ConfigError,
        match=r"the smallest needs 74.5 GB per GPU \(tp=8 pp=1 dp=2 ZeRO-3, recompute full\), above the 72.0 GB usable",
    ):
        propose_layout(LLAMA_70B, gpus=16, seq_len=4096)


def test_a_small_global_batch_warns_of_the_bubble() -> None:
    # 8 sequences over dp=2: m = 4 micro-batches for 4 stages, a 3/7 = 43% bubble.
    r = propose_layout(LLAMA_70B, gpus=64, gpu_memory_gb=40, seq_len=4096, global_batch=8)
    assert (r["pp"], r["dp"], r["micro_batches"]) == (4, 2, 4) and r["bubble_fraction"] == pytest.approx(3 / 7)
    assert r["warnings"][0] == (
        "pipeline bubble 43%: 4 micro-batches per step for 4 stages; a global batch of 32 sequences (4 x pp "
        "micro-batches per data-parallel rank) brings it to 16%"
    )
    assert "warning: pipeline bubble 43%" in format_layout(r)


def test_bubble_fraction_by_hand() -> None:
    # (p - 1) / (m + p - 1): 4 stages, 16 micro-batches -> 3 / 19.
    assert bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert bubble_fraction(1, 1) == 0


def test_fixed_degrees_are_respected() -> None:
    r = propose_layout(LLAMA_7B, gpus=64, seq_len=4096, tp=2, pp=2, zero=1, checkpointing="none", global_batch=256)
    assert (r["tp"], r["pp"], r["dp"], r["zero"], r["activation_checkpointing"]) == (2, 2, 16, 1, "none")
    assert r["micro_batches"] == 16 and r["bubble_fraction"] == pytest.approx(1 / 17)
    assert "pp=2: 16 layers per stage; 16 micro-batches per step leave a 5.9% bubble" in r["reasons"]  # inside one node
    r = propose_layout(LLAMA_7B, gpus=64, seq_len=4096, tp=1, pp=2, global_batch=256)
    assert "tp=1: no tensor parallelism (as asked); the pipeline splits the model by layers instead" in r["reasons"]
    r = propose_layout(LLAMA_7B, gpus=64, seq_len=4096, zero=3, global_batch=64)  # ZeRO-3 asked: no pipeline offered
    assert (r["pp"], r["zero"], r["dp_traffic_vs_ddp"]) == (1, 3, 1.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": 100}, "gpus = 100 is not a multiple of gpus_per_node = 8.*use 96 or 104"),
        ({"gpus": 64, "tp": 3}, "tp = 3 does not divide gpus = 64; valid tp: 1, 2, 4, 8"),
        ({"gpus": 24, "tp": 16, "gpus_per_node": 24}, "tp = 16 does not divide gpus = 24"),
        ({"gpus": 64, "tp": 16}, "tp = 16 exceeds gpus_per_node = 8"),
        ({"gpus": 64, "pp": 3}, "pp = 3 .*does not divide gpus = 64"),
        ({"gpus": 64, "pp": 64}, "pp = 64 exceeds n_layers = 32"),
        ({"gpus": 12, "gpus_per_node": 12, "tp": 12}, "tp = 12 does not divide n_heads = 32"),
        (
            {"gpus": 64, "tp": 1, "pp": 1, "global_batch": 100},
            "global_batch = 100 is not divisible by dp \\* micro_batch",
        ),
        (
            {"gpus": 1, "seq_len": 4096},
            (
                "no layout of 1 GPU with 80 GB each fits 6.74e\\+09 parameters.*smallest needs 109.5 GB per GPU "
                "\\(tp=1 pp=1 dp=1 ZeRO-0, recompute full\\), above the 72.0 GB usable"
            ),
        ),
        ({"gpus": 0}, "gpus = 0 and gpus_per_node = 8 must both be at least 1"),
        ({"gpus": 8, "checkpointing": "half"}, "activation_checkpointing = 'half' is unknown"),
        (
            {"gpus": 64, "pp": 2, "zero": 2},
            (
                "zero = 2 with pp = 2: kiln's FSDP2 keeps a pipeline stage's weights and gradients whole until the "
                "step's last micro-batch, which is ZeRO-1"
            ),
        ),
        ({"gpus": 8, "headroom": -0.1}, r"headroom = -0.1 must be in \[0, 1\)"),
        ({"gpus": 8, "micro_batch": 0}, "micro_batch = 0 must be at least 1"),
    ],
)
def test_impossible_layouts_say_what_is_valid(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        propose_layout(LLAMA_7B, **kwargs)


def test_a_global_batch_rules_out_data_parallel_degrees_and_says_so() -> None:
    # 100 sequences split over dp ranks: dp = 64, 32, 16 and 8 do not divide it, dp = 4 does.
    r = propose_layout(LLAMA_7B, gpus=64, seq_len=4096, global_batch=100)
    assert r["dp"] == 4 and r["micro_batches"] == 25 and r["global_batch"] == 100
    assert any("global_batch = 100 rules out dp = 64, 32, 16, 8" in x for x in r["reasons"])


def test_layout_needs_the_shape() -> None:
    with pytest.raises(ConfigError, match="needs the model's shape"):
        propose_layout(Shape(7e9), gpus=8)


@pytest.mark.parametrize(
    ("zero", "pp", "dp", "tp", "cp"),
    [
        (3, 1, 8, 2, 1),
        (2, 1, 4, 1, 1),
        (1, 4, 2, 8, 1),
        (0, 1, 8, 1, 1),
        (0, 2, 1, 2, 1),
        (3, 1, 2, 2, 4),
        (2, 1, 1, 1, 2),
    ],
)
def test_the_recipe_keys_read_back_as_the_same_layout(zero: int, pp: int, dp: int, tp: int, cp: int) -> None:
    # kiln's degrees from a layout's keys are planned (dry run, report) as that layout again.
    keys = recipe_keys(
        {
            "zero": zero,
            "pp": pp,
            "dp": dp,
            "tp": tp,
            "cp": cp,
            "activation_checkpointing": "none",
            "micro_batch": 1,
            "global_batch": 8,
        },
        64,
    )
    degrees = {
        "pp": keys["parallel.pp"],
        "dp_replicate": keys["parallel.dp_replicate"],
        "dp_shard": keys["parallel.dp_shard"],
        "cp": keys["parallel.cp"],
        "tp": keys["parallel.tp"],
    }
    assert planner_layout(degrees, keys.get("parallel.reshard_after_forward", True)) == {
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "zero": zero,
    }
    assert keys.get("parallel.sequence_parallel", False) is (
        tp > 1 and pp == 1
    )  # kiln refuses sequence parallelism with pp


def test_sequences_too_long_to_fit_whole_split_over_gpus_before_full_recompute() -> None:
    # llama-7b at 128K positions on 2 nodes of 8 GPUs, micro-batch 1. tp 8 fills a node; with
    # whole sequences its activations alone, 32 layers x 34/8 x 131,072 x 4,096 x 2 B, are 146 GB:
    # only full recompute fits. cp 2 across the nodes halves them and adds each layer's gathered
    # keys and values, 4 x 131,072 x 4,096 / 8 x 1/2 B: 32 x (1.141 + 0.134) = 40.8 GB, with
    # ZeRO-2 states over dp x cp = 2 (842M local parameters: 2 + 14/2 B each) 7.58 GB.
    r = propose_layout(LLAMA_7B, gpus=16, seq_len=131072)
    assert (r["tp"], r["pp"], r["cp"], r["dp"], r["zero"], r["activation_checkpointing"]) == (8, 1, 2, 1, 2, "none")
    assert r["memory"]["activations_gb"] == pytest.approx(40.80, abs=0.01) and r["memory"][
        "model_states_gb"
    ] == pytest.approx(7.58, abs=0.01)
    assert (
        r["recipe"]["parallel.cp"] == 2 and r["recipe"]["parallel.tp"] == 8 and r["recipe"]["train.seq_len"] == 131072
    )
    assert (
        "cp=2: each sequence's 131072 positions split over 2 GPUs (65536 each), which gather every layer's keys "
        "and values; cheaper than full recompute where whole sequences do not fit"
    ) in r["reasons"]
    assert "context parallel (cp)" in format_layout(r)
    assert (
        propose_layout(LLAMA_7B, gpus=16, seq_len=131072, cp=1)["activation_checkpointing"] == "full"
    )  # what whole sequences need
    # At 4K the same GPUs keep whole sequences; cp only where asked, and then ZeRO 2 or 3.
    assert propose_layout(LLAMA_7B, gpus=8, seq_len=4096)["cp"] == 1
    asked = propose_layout(LLAMA_7B, gpus=8, seq_len=4096, cp=2)
    assert asked["cp"] == 2 and asked["zero"] >= 2 and asked["dp"] * asked["tp"] == 4
    with pytest.raises(ConfigError, match=r"cp = 3 needs seq_len = 4096 to split into 2 x cp = 6 equal chunks"):
        propose_layout(LLAMA_7B, gpus=6, seq_len=4096, cp=3)
    with pytest.raises(
        ConfigError, match=r"cp = 2 with zero = 1: kiln shards a context-parallel group's states with FSDP2"
    ):
        propose_layout(LLAMA_7B, gpus=8, seq_len=4096, cp=2, zero=1)
