"""What is applied to the model from outside: activation checkpointing, torch.compile, and data
parallelism through torchrun (the `parallel` section, the process group, DDP or FSDP2).

`torchrun --nproc-per-node N -m kiln train ...` (or `kiln train --nproc N`, which execs it) starts
N processes with RANK, WORLD_SIZE and LOCAL_RANK set; each joins one process group (gloo on the
CPU, nccl on CUDA, one GPU per process by LOCAL_RANK). The data-parallel ranks form a mesh of
`dp_replicate` x `dp_shard`: the model is replicated with DDP when only dp_replicate > 1, sharded
with FSDP2 (`fully_shard` on every block and then the root, a mixed-precision policy for the
compute dtype and reductions in fp32, optional CPU offload) over dp_shard, both (HSDP) when both
exceed 1. Every rank builds the same initial weights from the seed before wrapping.
DDP and FSDP2 average gradients over the ranks; the loop's loss is each rank's share of the
global token sum, so it is multiplied by the world size before backward (`grad_scale`).
Order, as torchtitan applies them: activation checkpointing, then compile, then FSDP2 or DDP.
Not handled here: tensor, pipeline or context parallelism (the 3D-parallelism issue), saving
states (kiln.train.resume writes them sharded; the consolidated checkpoint gathers to rank 0).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from pydantic import Field, field_validator
from torch import nn

from kiln.core.config import Section
from kiln.core.errors import ConfigError
from kiln.core.ranks import world_size


class ParallelConfig(Section):
    dp_replicate: int = Field(default=1, ge=1, description="Data-parallel replicas (DDP, or the replicated dimension of HSDP).")
    dp_shard: int = Field(default=-1, ge=-1, description="Ranks each replica's parameters, gradients and optimizer state are sharded over (FSDP2); -1 means all ranks left after dp_replicate.")
    cpu_offload: bool = Field(default=False, description="FSDP2: keep sharded parameters, gradients and optimizer state in CPU memory between uses.")

    @field_validator("dp_shard")
    @classmethod
    def _not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("dp_shard is 0; give a positive number of ranks or -1 for all remaining ranks")
        return value

    def layout(self, world: int) -> tuple[int, int]:
        """(replicas, shards) for `world` processes; a ConfigError when they do not multiply to it."""
        shard = world // self.dp_replicate if self.dp_shard == -1 else self.dp_shard
        if self.dp_replicate * shard != world:
            raise ConfigError(f"parallel.dp_replicate ({self.dp_replicate}) x parallel.dp_shard ({self.dp_shard}) must equal the {world} processes torchrun started; set dp_shard=-1 to take the rest")
        return self.dp_replicate, shard


@dataclass
class DataParallel:
    rank: int
    world: int
    replicate: int
    shard: int
    device: torch.device
    mesh: Any = None  # torch DeviceMesh ("dp_replicate", "dp_shard") when world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over ranks, in place (a collective: every rank calls it)."""
        if self.world > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast(self, value: Any) -> Any:
        """Rank 0's value on every rank (a collective)."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group (before the interpreter exits: gloo's threads abort the process otherwise)."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier()  # no rank tears its connections down while another still uses them
            dist.destroy_process_group()

    @property
    def grad_scale(self) -> float:
        """What the loss is multiplied by so that DDP's and FSDP2's mean over ranks is the sum."""
        return float(self.world)


def init_data_parallel(cfg: ParallelConfig, device: torch.device) -> DataParallel:
    """Join torchrun's process group (if started by torchrun) and lay the ranks out as cfg says."""
    world = world_size()
    if world == 1:
        return DataParallel(0, 1, 1, 1, device)
    replicate, shard = cfg.layout(world)  # before any collective: a bad layout fails on every rank alike
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (replicate, shard), mesh_dim_names=("dp_replicate", "dp_shard"))
    return DataParallel(dist.get_rank(), world, replicate, shard, device, mesh)


def parallelize(model: nn.Module, dp: DataParallel, cfg: ParallelConfig, compute_dtype: torch.dtype | None) -> nn.Module:
    """The model wrapped for data parallelism: itself (one process), FSDP2 (in place) or DDP."""
    if dp.world == 1:
        return model
    if dp.shard > 1:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mesh = dp.mesh if dp.replicate > 1 else dp.mesh["dp_shard"]  # a 2-D mesh makes it HSDP
        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        offload = CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy()
        for block in model.blocks:  # type: ignore[union-attr]
            fully_shard(block, mesh=mesh, mp_policy=policy, offload_policy=offload)
        fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=offload)  # the root: embedding, final norm, output
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[dp.device.index] if dp.device.type == "cuda" else None)


# Selective activation checkpointing keeps what is expensive to recompute (matrix products and
# attention) and recomputes the rest (norms, activations, RoPE, residual adds).
SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _save_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: nn.Module, mode: str, every: int) -> None:
    """Wrap every `every`-th block's forward in torch.utils.checkpoint (in place: parameter names stay)."""
    if mode == "none":
        return
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    extra = {"context_fn": partial(create_selective_checkpoint_contexts, _save_matmuls)} if mode == "selective" else {}
    for i, block in enumerate(model.blocks):  # type: ignore[union-attr, arg-type]
        if i % every == 0:
            block.forward = partial(checkpoint, block.forward, use_reentrant=False, **extra)


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block in place (Module.compile keeps parameter names, so checkpoints do not change)."""
    for block in model.blocks:  # type: ignore[union-attr]
        block.compile()


def unwrap(model: nn.Module) -> nn.Module:
    """The Transformer inside a DDP wrapper (FSDP2 shards in place, so the model is itself)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer, dp: DataParallel) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full model and optimizer states on the CPU of rank 0 (a collective; empty on other ranks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)
