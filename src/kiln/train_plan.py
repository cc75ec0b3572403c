"""The planner's figures for a kiln training run: `kiln train --dry-run`, and the estimate the
report sets beside a finished run.

Both turn kiln's layout (kiln.train.mesh's degrees) into the planner's terms
(kiln.plan.layout.planner_layout) and ask kiln.plan.memory for the memory per rank; this is the
one place the train and plan stages meet. Not handled here: the planner's formulas (kiln.plan),
the dry run's own batch and mixture tables (kiln.train.run.dry_run).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from kiln.core.errors import KilnError
from kiln.core.layout import RunLayout

if TYPE_CHECKING:
    from kiln.recipe import Recipe


def dry_run_train(recipe: Recipe) -> str:
    """`kiln train --dry-run`: size, FLOPs, batch, the planner's memory per device, the time to
    finish at a measured throughput, and the planned data mixture phase by phase. Trains nothing."""
    import torch

    from kiln.core.ranks import world_size
    from kiln.mix.sampler import build_sampler
    from kiln.model.precision import resolve_precision
    from kiln.plan.memory import format_memory
    from kiln.train.run import dry_run, format_dry_run

    t, parallel = recipe.train, recipe.parallel
    d = dry_run(
        recipe.model, t, partial(build_sampler, RunLayout(recipe.run_dir).token_shards, recipe.mix), recipe.run_dir
    )
    amp = resolve_precision(t.precision, "train").amp_dtype
    precision = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[amp]
    degrees = parallel.degrees(world_size()) if world_size() > 1 else None
    memory = layout_memory(
        d["model"],
        degrees,
        parallel.reshard_after_forward,
        parallel.sequence_parallel,
        t.micro_batch_size,
        t.seq_len,
        precision,
        t.activation_checkpointing,
    )
    layout = ", ".join(f"{k} {v}" for k, v in degrees.items()) if degrees else "one process"
    return format_dry_run(d) + f"\n\nmemory per rank ({layout}; kiln plan memory):\n" + format_memory(memory)


def layout_memory(
    model: Any,
    degrees: dict[str, int] | None,
    reshard_after_forward: bool,
    sequence_parallel: bool,
    micro_batch: int,
    seq_len: int,
    precision: str,
    checkpointing: str,
) -> dict[str, Any]:
    """The planner's memory per rank (kiln plan memory) for a kiln layout (kiln.train.mesh's degrees;
    None: one process), in the planner's terms by kiln.plan.layout.planner_layout."""
    from kiln.plan.layout import planner_layout
    from kiln.plan.memory import Shape, plan_memory

    layout = planner_layout(degrees or {"dp_replicate": 1, "dp_shard": 1}, reshard_after_forward)
    return plan_memory(
        Shape.from_config(model),
        **layout,
        micro_batch=micro_batch,
        seq_len=seq_len,
        precision=precision,
        checkpointing=checkpointing,
        sequence_parallel=sequence_parallel,
    )


def plan_estimate(parallel: Any, manifest: dict[str, Any]) -> dict[str, Any]:
    """The planner's memory per device and training FLOPs for a finished train stage (its manifest),
    and its time at the default MFU where the device's dense peak is known."""
    from kiln.core.hardware import peak_flops_of
    from kiln.model.config import ModelConfig
    from kiln.model.precision import dtype_on
    from kiln.plan.hardware import DEFAULT_MFU

    t, counts = manifest["config"]["train"], manifest["counts"]
    world = counts.get("processes", 1)
    degrees = counts.get("parallel")  # recorded since tensor parallelism
    if degrees is None:
        degrees = recorded_degrees(parallel, world)
    device = str(counts.get("device", "cpu"))
    # The run's device ("cuda:0"), not this machine's.
    precision = dtype_on(t["precision"]["dtype"], device.split(":")[0])
    precision = "bf16" if precision == "fp8" else precision  # fp8 keeps bf16's states; its saved activations are fewer
    model = ModelConfig.model_validate(manifest["model"])
    memory = layout_memory(
        model,
        degrees,
        parallel.reshard_after_forward,
        parallel.sequence_parallel,
        t["micro_batch_size"],
        t["seq_len"],
        precision,
        t["activation_checkpointing"],
    )
    flops = counts["flops_per_token"] * counts["tokens_trained"]
    peak = peak_flops_of(str(counts.get("device_name", ""))) if device.startswith("cuda") else None
    time_note = (
        f"{flops / (peak * world * DEFAULT_MFU):,.0f} s at {DEFAULT_MFU:.0%} MFU (kiln plan's default)"
        if peak
        else "needs a GPU's dense peak (a CPU has none in the planner's table)"
    )
    layout = (
        f"dp={memory['dp']} tp={memory['tp']} pp={memory['pp']}, ZeRO {memory['zero']}, "
        f"{precision}, micro-batch {t['micro_batch_size']} x {t['seq_len']}"
    )
    return {
        "memory_gb": memory["total_gb"],
        "layout": layout,
        "train_flops": flops,
        "flops_per_token": counts["flops_per_token"],
        "time_note": time_note,
    }


def recorded_degrees(parallel: Any, world: int) -> dict[str, int]:
    """The layout of a run whose manifest predates tensor parallelism (no `parallel` count): the
    recipe's section laid out data ranks alone."""
    try:
        return {**dict(zip(("dp_replicate", "dp_shard"), parallel.layout(world), strict=True)), "tp": 1}
    except KilnError:  # the recipe now asks for another layout than the run had
        return {"dp_replicate": world, "dp_shard": 1, "tp": 1}
