"""The `parallel` recipe section: how torchrun's processes split into degrees, and the data ranks they make.

The degrees, whose product must be the world size: `dp_replicate` (DDP replicas, or HSDP's
replicated dimension), `dp_shard` (FSDP2; -1 takes the ranks the others leave), `cp` (context
parallel), `tp` (tensor parallel), `pp` (pipeline stages). The ranks of one tensor-parallel group,
of one context-parallel group and the stages of one pipeline train on the same rows, so the batch
arithmetic of kiln.train.config counts data ranks (world / (tp x pp x cp)), not processes.
Declared apart from the mesh, which imports torch: the recipe validates this section, and
`kiln curate`, `kiln tokenize` and `--help` never import torch.
Not handled here: the DeviceMesh and each rank's place in it, what a layout cannot split
(kiln.train.mesh); applying the layout to the model (kiln.train.distributed).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from kiln.core.config import Section
from kiln.core.errors import ConfigError
from kiln.core.ranks import world_size


class ParallelConfig(Section):
    dp_replicate: int = Field(
        default=1, ge=1, description="Data-parallel replicas (DDP, or the replicated dimension of HSDP)."
    )
    dp_shard: int = Field(
        default=-1,
        ge=-1,
        description=(
            "Ranks each replica's parameters, gradients and optimizer state are sharded over (FSDP2); -1 means all "
            "ranks left after the other degrees."
        ),
    )
    tp: int = Field(
        default=1,
        ge=1,
        description=(
            "Tensor-parallel degree: each block's attention heads and feed-forward width, and the vocabulary, split "
            "over this many consecutive ranks (keep it within a node)."
        ),
    )
    cp: int = Field(
        default=1,
        ge=1,
        description=(
            "Context-parallel degree: each window's positions split over this many ranks, which gather each layer's "
            "keys and values (long windows; kiln.train.context_parallel)."
        ),
    )
    pp: int = Field(
        default=1,
        ge=1,
        description=(
            "Pipeline ranks: the layer stack split into stages over this many ranks (one each, or pp_stages_per_rank "
            "interleaved), across nodes if need be (kiln.train.pipeline_parallel)."
        ),
    )
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        default="1f1b",
        description=(
            "With pp > 1: gpipe (every micro-batch forward, then every one backward), 1f1b (one forward, one "
            "backward: the same bubble, fewer activations in flight), or interleaved_1f1b (pp_stages_per_rank stages "
            "on each rank, taken in turn: a bubble that many times smaller, as many more sends)."
        ),
    )
    pp_stages_per_rank: int = Field(
        default=1,
        ge=1,
        description=(
            "With pp > 1: pipeline stages each rank holds (interleaved_1f1b takes 2 or more): rank r holds stages r, "
            "r + pp, r + 2 pp, ..."
        ),
    )
    pp_layers: list[int] | None = Field(
        default=None,
        description=(
            "With pp > 1: layers per stage, e.g. [3, 5] (pp x pp_stages_per_rank of them); None balances the stages "
            "by parameter count (the first also holds the embedding, the last the output layer)."
        ),
    )
    sequence_parallel: bool = Field(
        default=False,
        description=(
            "With tp > 1: the norms and residual stream between blocks hold 1/tp of the sequence on each rank (less "
            "activation memory; the same values)."
        ),
    )
    reshard_after_forward: bool = Field(
        default=True,
        description=(
            "FSDP2: free each block's gathered weights after its forward and gather them again for backward (ZeRO-3); "
            "false keeps them until backward (ZeRO-2's weight memory, one all-gather fewer per micro-batch)."
        ),
    )
    cpu_offload: bool = Field(
        default=False,
        description="FSDP2: keep sharded parameters, gradients and optimizer state in CPU memory between uses.",
    )

    @field_validator("dp_shard")
    @classmethod
    def _not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("dp_shard is 0; give a positive number of ranks or -1 for all remaining ranks")
        return value

    @property
    def same_rows(self) -> int:
        """Ranks that train on the same rows (tp x pp x cp): the world divided by the data ranks."""
        return self.tp * self.pp * self.cp

    def degrees(self, world: int) -> dict[str, int]:
        """Every dimension's degree for `world` processes (dp_shard=-1 resolved); a ConfigError naming
        the degrees and the world size when their product is not the world size."""
        fixed = self.dp_replicate * self.same_rows
        shard = world // fixed if self.dp_shard == -1 else self.dp_shard
        degrees = {
            "pp": self.pp,
            "dp_replicate": self.dp_replicate,
            "dp_shard": max(shard, 1),
            "cp": self.cp,
            "tp": self.tp,
        }
        product = math.prod(degrees.values())
        if product != world or (self.dp_shard == -1 and world % fixed):
            named = " x ".join(f"parallel.{k} ({self.dp_shard if k == 'dp_shard' else v})" for k, v in degrees.items())
            fix = (
                "set dp_shard=-1 to take the rest"
                if self.dp_shard != -1
                else f"the world size must be a multiple of pp x dp_replicate x cp x tp = {fixed}"
            )
            raise ConfigError(f"{named} must multiply to the world size, the {world} processes torchrun started; {fix}")
        return degrees

    def layout(self, world: int) -> tuple[int, int]:
        """(replicas, shards) of data parallelism for `world` processes."""
        d = self.degrees(world)
        return d["dp_replicate"], d["dp_shard"]


def data_ranks(parallel: dict[str, Any] | None) -> int:
    """The data-parallel ranks (world / (tp x pp x cp)) a recipe's raw `parallel` section
    gives for this launch; the world size where the section is invalid (its own error says why)."""
    if world_size() == 1:
        return 1
    try:
        same = ParallelConfig.model_validate(parallel or {}).same_rows
    except ValidationError:
        return world_size()
    return world_size() // same if world_size() % same == 0 else world_size()
