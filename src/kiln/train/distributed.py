"""What is applied to the model from outside: activation checkpointing, torch.compile, and data
parallelism over the mesh of kiln.train.mesh (DDP or FSDP2).

`torchrun --nproc-per-node N -m kiln train ...` (or `kiln train --nproc N`, which checks the layout and starts it)
starts
N processes with RANK, WORLD_SIZE and LOCAL_RANK set; each joins one process group (gloo on the
CPU, nccl on CUDA, one GPU per process by LOCAL_RANK) and the mesh the `parallel` section lays
out. The data ranks are `dp_replicate` x `dp_shard`: the model is replicated with DDP when only
dp_replicate > 1, sharded with FSDP2 (`fully_shard` on every block and then the root, a
mixed-precision policy for the compute dtype and reductions in fp32, optional CPU offload) over
dp_shard, both (HSDP) when both exceed 1. With tensor parallelism the parameters are DTensors
DDP does not take, and a pipeline stage's module is driven by the schedule, so with tp or pp
FSDP2 wraps the model over the data ranks whatever dp_shard is (with dp_shard = 1 that is HSDP
with one shard: replicas, as DDP would keep them). With context parallelism FSDP2 shards over
dp_shard x cp: the ranks of a context-parallel group hold the same weights and each a share of
every window's gradient.
Every rank builds the same initial weights from the seed before anything is split.
DDP and FSDP2 average gradients over the ranks they reduce over; the loop's loss is each rank's
share of the global token sum, so it is multiplied by their number before backward (`Ranks.grad_scale`).
Order, as torchtitan applies them: tensor parallel, activation checkpointing, compile, then FSDP2
or DDP.
Not handled here: the tensor-parallel plan (kiln.train.tensor_parallel), saving states
(kiln.train.resume writes them sharded; the consolidated checkpoint gathers to rank 0).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from kiln.train.mesh import Ranks
from kiln.train.parallel import ParallelConfig


def parallelize(model: nn.Module, ranks: Ranks, cfg: ParallelConfig, compute_dtype: torch.dtype | None) -> nn.Module:
    """The model wrapped for data parallelism: itself (one process), FSDP2 (in place) or DDP."""
    if ranks.world == 1:
        return model
    if ranks.shard > 1 or ranks.tp > 1 or ranks.pp > 1 or ranks.cp > 1:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mesh = ranks.shard_mesh  # a 2-D mesh makes it HSDP
        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        offload = CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy()
        for block in model.blocks.values():  # type: ignore[union-attr, operator]
            fully_shard(
                block,
                mesh=mesh,
                mp_policy=policy,
                offload_policy=offload,
                reshard_after_forward=cfg.reshard_after_forward,
            )
        fully_shard(
            model, mesh=mesh, mp_policy=policy, offload_policy=offload
        )  # the root: embedding, final norm, output
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[ranks.device.index] if ranks.device.type == "cuda" else None)


# Selective activation checkpointing keeps what is expensive to recompute (matrix products, fp8's
# included, and attention, flex attention's included) and recomputes the rest (norms, activations,
# RoPE, residual adds, fp8's casts).
SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_mm.default,
    torch.ops.higher_order.flex_attention,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,  # what SDPA picks on an H100 for causal rows
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
    for key, block in model.blocks.items():  # type: ignore[union-attr, operator]
        if int(key) % every == 0:  # by layer index: a pipeline stage checkpoints the blocks the whole model would
            block.forward = partial(checkpoint, block.forward, use_reentrant=False, **extra)


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block in place (Module.compile keeps parameter names, so checkpoints do not change)."""
    for block in model.blocks.values():  # type: ignore[union-attr, operator]
        block.compile()


def clip_grad_norm(
    parameters: list[nn.Parameter], max_norm: float, stages: Any = None, uncounted: list[nn.Parameter] | None = None
) -> torch.Tensor:
    """Clip gradients to a global 2-norm of max_norm; the norm before clipping, a plain scalar tensor.

    torch.nn.utils.clip_grad_norm_ stacks the per-tensor norms and scales every gradient by one
    factor, which fails when the gradients are DTensors on different meshes (tensor-parallel
    matrices on (dp_shard, tp), replicated norm gains on dp_shard alone). So each mesh's norm is
    made whole (a collective over it), the squares summed, and each mesh's gradients scaled by
    the factor as a replicated DTensor of their own mesh. No host sync. With pipeline stages
    (`stages`: the "pp" process group) each rank holds its stage's parameters only, so the squares
    are summed over the stages too; `uncounted`: parameters that copy another stage's (a tied
    embedding's on the last stage), scaled but left out of the norm, so the matrix counts once.
    """
    from torch.distributed.tensor import DTensor, Replicate

    by_mesh: dict[Any, list[torch.Tensor]] = {}
    counted: dict[Any, list[torch.Tensor]] = {}
    copies = {id(p) for p in uncounted or []}
    for p in parameters:
        if p.grad is not None:
            mesh = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            by_mesh.setdefault(mesh, []).append(p.grad)
            if id(p) not in copies:
                counted.setdefault(mesh, []).append(p.grad)
    norms = [torch.nn.utils.get_total_norm(grads) for grads in counted.values()]
    squares = (
        torch.stack([n.full_tensor() if isinstance(n, DTensor) else n for n in norms]).square().sum()
        if norms
        else torch.zeros(())
    )
    if stages is not None:
        torch.distributed.all_reduce(squares, group=stages)
    total = squares.sqrt()
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for mesh, grads in by_mesh.items():
        torch._foreach_mul_(
            grads,
            factor if mesh is None else DTensor.from_local(factor, mesh, [Replicate()] * mesh.ndim, run_check=False),
        )
    return total


def model_state_bytes(parameters: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of weights, gradients and optimizer states this rank holds: its shards of DTensors,
    counted where they are allocated (call it between the optimizer step and zero_grad)."""
    from torch.distributed.tensor import DTensor

    def held(t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    states = [
        v
        for p in parameters
        for v in optimizer.state.get(p, {}).values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    ]  # not Adam's step counters
    return {
        "weights": sum(held(p) for p in parameters),
        "gradients": sum(held(p.grad) for p in parameters),
        "optimizer": sum(held(s) for s in states),
    }


def unwrap(model: nn.Module) -> nn.Module:
    """The Transformer inside a DDP wrapper (FSDP2 shards in place, so the model is itself)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, every_rank: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full model and optimizer states on the CPU of rank 0 (a collective; empty on other ranks), or
    with every_rank on every rank (a pipeline stage's own parameters, gathered on each of its ranks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=not every_rank)
    states = get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)
    # type: ignore[return-value]
    return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.cpu(), states) if every_rank else states
