"""Training checkpoints: the model's weights (kiln.model.weights) plus `train_state.pt` (optimizer,
step, data-stream and torch RNG state, enough to continue the exact run), swapped in whole. When
they are saved is the `train.checkpoint` section's (kiln.train.config).

`maybe_checkpoint` is what the loop calls after every step: a resumable sharded state every
`every` steps (kiln.train.resume, asynchronous with `async_save`) and the consolidated
checkpoint, the stage's output, after the last step (always synchronous: the stage is done only
once it is on disk).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from kiln.core.atomic import replace_dir
from kiln.model.batch import BatchSource
from kiln.model.transformer import Transformer
from kiln.model.weights import CONFIG, WEIGHTS, write_weights
from kiln.train.distributed import full_state
from kiln.train.mesh import Ranks

# the resumable states' module imports torch.distributed.checkpoint (a second to import): here for annotations only
if TYPE_CHECKING:
    from kiln.train.resume import States

TRAIN_STATE = "train_state.pt"


def save_checkpoint(folder: Path, model: Transformer, train_state: dict[str, Any]) -> list[Path]:
    """Write the checkpoint beside `folder`, then swap it in; a crash keeps the previous one."""

    def write(tmp: Path) -> None:
        write_weights(tmp, model)
        torch.save(train_state, tmp / TRAIN_STATE)

    replace_dir(folder, write)
    return [folder / WEIGHTS, folder / CONFIG, folder / TRAIN_STATE]


def gather_stages(
    model_state: dict[str, Any], optimizer_state: dict[str, Any], ranks: Ranks
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every pipeline stage's full states merged on rank 0 (the stages of rank 0's pipeline send
    theirs; the other pipelines hold copies and send nothing). Empty elsewhere. A tied embedding
    comes from the first and the last stage under the same names (kiln.train.pipeline_parallel),
    equal: it is kept once."""
    import torch.distributed as dist

    if any(ranks.mesh.get_local_rank(dim) for dim in ("dp_replicate", "dp_shard", "cp", "tp")):
        return {}, {}
    group = ranks.stage_group
    parts: list[Any] = [None] * ranks.pp if ranks.is_main else []
    dist.gather_object((model_state, optimizer_state), parts if ranks.is_main else None, dst=0, group=group)
    if not ranks.is_main:
        return {}, {}
    merged_model = {k: v for part, _ in parts for k, v in part.items()}
    if "embed.weight" in parts[-1][0]:  # a tied embedding: the last stage's copy is the first's
        assert torch.equal(parts[0][0]["embed.weight"], parts[-1][0]["embed.weight"]), (
            "the tied embedding's copies on the first and last stage differ"
        )
    merged_state = {k: v for _, part in parts for k, v in part["state"].items()}  # keyed by parameter name
    # A stage has only the groups its parameters fall in (a middle stage has no embedding), so
    # groups are matched by their settings, not by position.
    groups: dict[str, dict[str, Any]] = {}
    for _, part in parts:
        for group in part["param_groups"]:
            settings = repr(sorted((k, v) for k, v in group.items() if k != "params"))
            params = groups.setdefault(settings, dict(group, params=[]))["params"]
            params.extend(name for name in group["params"] if name not in params)  # a tied embedding's copies: once
    return merged_model, {"state": merged_state, "param_groups": list(groups.values())}


class Trained(Protocol):
    """What checkpoints are taken of (kiln.train.parts.TrainParts is one)."""

    @property
    def model(self) -> nn.Module: ...  # as stepped: wrapped for data parallelism, or sharded in place

    @property
    def core(self) -> nn.Module: ...  # the Transformer inside it (a pipeline rank: its stages)

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    @property
    def ranks(self) -> Ranks: ...

    @property
    def states(self) -> States: ...


def maybe_checkpoint(
    trained: Trained,
    step: int,
    last_step: int,
    folder: Path,
    batches: BatchSource,
    resumable: Callable[[], dict[str, Any]],
) -> list[Path] | None:
    """After `step`: a resumable state when trained.states says one is due (`resumable()` gives its
    JSON part), and after the last step the consolidated checkpoint in `folder`; the consolidated
    paths written (on rank 0), else None.

    With several ranks the full model and optimizer states are gathered to rank 0 (a collective)
    and written from there; the optimizer state is then keyed by parameter name.
    """
    states, model, optimizer, ranks = trained.states, trained.model, trained.optimizer, trained.ranks
    if step != last_step:
        if states.due(step):
            states.save(step, model, optimizer, resumable())
        return None
    states.wait()  # a pending asynchronous save completes before the stage can finish
    if ranks.world == 1:
        optimizer_state, weights_of = optimizer.state_dict(), trained.core
    else:
        model_state, optimizer_state = full_state(model, optimizer, every_rank=ranks.pp > 1)
        if ranks.pp > 1:  # each stage holds its own layers: rank 0's pipeline sends them all to it
            model_state, optimizer_state = gather_stages(model_state, optimizer_state, ranks)
        if not ranks.is_main:
            return None
        with torch.random.fork_rng():  # the copy's throwaway initialisation must not move the run's RNG
            weights_of = Transformer(trained.core.cfg)  # a CPU copy holding the gathered weights, for the one writer
        weights_of.load_state_dict(model_state)
    train_state = {
        "step": step,
        "optimizer": optimizer_state,
        "sampler": batches.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    return save_checkpoint(folder, weights_of, train_state)
