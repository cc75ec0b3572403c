"""The parallel layout: one DeviceMesh over every rank, each rank's place in it, and what a layout
cannot split.

torchrun starts WORLD_SIZE processes; the `parallel` recipe section (kiln.train.parallel) splits
them into degrees whose product must be the world size: `dp_replicate`, `dp_shard`, `cp` (context
parallel: each window's positions split, kiln.train.context_parallel), `tp` (tensor parallel,
kiln.train.tensor_parallel), `pp` (pipeline stages, kiln.train.pipeline_parallel). One DeviceMesh
carries every dimension, in the order ("pp", "dp_replicate", "dp_shard", "cp", "tp"): tp
innermost, so a tensor-parallel group is made of consecutive ranks, which torchrun places on one
node (its fast links), cp next to it (it gathers keys and values every layer); pipeline stages
outermost, so they span the nodes and pass only activations between them. Every dimension is in
the mesh even at degree 1, so the code slices it by name alike.
Data: the ranks of one tensor-parallel group, of one context-parallel group, and the stages of one
pipeline train on the same rows. The data rank is the (dp_replicate, dp_shard) coordinate
flattened, and the batch arithmetic of kiln.train.config counts data ranks (world / (tp x pp x
cp)), not processes.
What a layout cannot split is checked here (`check_layout`): fp16 and Muon
with split weights, heads and widths tp does not divide, lengths cp or sequence parallelism do not
divide, pipeline stages without a layer or with rows a stage cannot mask.
Not handled here: applying the layout to the model (kiln.train.distributed, tensor_parallel,
context_parallel, pipeline_parallel).
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from kiln.core.errors import ConfigError
from kiln.core.ranks import world_size
from kiln.model.config import ModelConfig
from kiln.train.config import TrainConfig
from kiln.train.parallel import ParallelConfig

log = logging.getLogger("kiln.train")

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


# The layouts a model and its training can take: each check names the keys, the values and the fix.
# check_layout runs them all before any process starts (kiln train --nproc) and on every rank.


def check_layout(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    parallel: ParallelConfig,
    degrees: dict[str, int],
    amp_dtype: torch.dtype | None,
) -> None:
    """A ConfigError for a layout (`degrees`, ParallelConfig.degrees) this model and training cannot
    take. It reads no data, so `kiln train --nproc N` runs it before starting any process (and each
    rank again)."""
    split = degrees["dp_shard"] > 1 or degrees["tp"] > 1 or degrees["pp"] > 1 or degrees["cp"] > 1
    if amp_dtype == torch.float16 and split:
        raise ConfigError(
            "train.precision.dtype=fp16 skips a step when any gradient overflows, which ranks holding parts of "
            "the model cannot agree on; use bf16 with FSDP2, tensor or pipeline parallelism, or DDP "
            "(parallel.dp_shard=1, parallel.tp=1, parallel.pp=1, parallel.cp=1)"
        )
    if cfg.optim.name == "muon" and split:
        layout = " x ".join(f"{name} {degree}" for name, degree in degrees.items())
        raise ConfigError(
            f"train.optim.name=muon orthogonalises whole matrices, and parallel ({layout}) splits them over "
            f"ranks; use DDP (parallel.dp_replicate={math.prod(degrees.values())}, parallel.dp_shard=1, "
            "parallel.tp=1, parallel.pp=1, parallel.cp=1) or adamw"
        )
    tp, pp, cp = degrees["tp"], degrees["pp"], degrees["cp"]  # parallel's own: only dp_shard is resolved
    if cfg.precision.dtype == "fp8" and tp > 1:
        raise ConfigError(
            f"train.precision.dtype=fp8 converts whole linear layers, and parallel.tp ({tp}) splits them over ranks; "
            "use fp8 with FSDP2 or DDP (parallel.tp=1), or bf16 with tensor parallelism"
        )
    check_tensor_parallel(model_cfg, tp)
    if tp > 1 and parallel.sequence_parallel:
        check_sequence_parallel(tp, cfg.seq_lens, cfg.probe_every)
    if cp > 1:
        check_context_parallel(cp, cfg.seq_lens, pp, tp if parallel.sequence_parallel else 1)
    check_pipeline(model_cfg, parallel, {o: cfg.masks_documents(o) for o in cfg.objectives})


def check_tensor_parallel(cfg: ModelConfig, tp: int) -> None:
    """A ConfigError, with the reason, for a model tp ranks cannot split evenly."""
    if tp == 1:
        return
    problems = []
    if cfg.n_heads % tp:
        problems.append(
            f"model.n_heads ({cfg.n_heads}) is not a multiple of parallel.tp ({tp}): each rank computes whole "
            "query heads"
        )
    if cfg.kv_heads % tp:
        problems.append(
            f"model.n_kv_heads ({cfg.kv_heads}) is not a multiple of parallel.tp ({tp}): each rank holds whole "
            "key/value heads for its query heads (grouped-query attention splits only when tp divides the "
            "key/value heads)"
        )
    if cfg.hidden % tp:
        problems.append(f"the feed-forward width ({cfg.hidden}) is not a multiple of parallel.tp ({tp})")
    if cfg.z_loss:
        problems.append(
            "model.z_loss: its log-normaliser needs every vocabulary shard's logits; set it to 0 or train with tp = 1"
        )
    if problems:
        raise ConfigError(f"parallel.tp={tp} cannot split this model: " + "; ".join(problems))


def check_sequence_parallel(tp: int, lengths: list[int], probe_every: int | None) -> None:
    """A ConfigError, with the reason, for training that sequence parallelism cannot split: each
    rank holds 1/tp of the positions, so every training length must divide by tp; decoding one
    position at a time (the probe set's continuations) cannot be split at all."""
    problems = [
        f"train.seq_len (and seq_len_schedule) {n} is not a multiple of parallel.tp ({tp})" for n in lengths if n % tp
    ]
    if probe_every:
        problems.append(
            "train.probe_every: the probe's continuations decode one position at a time, which 1/tp of the "
            "positions per rank cannot hold; drop train.probe_every or parallel.sequence_parallel"
        )
    if problems:
        raise ConfigError("parallel.sequence_parallel splits the positions over the tp ranks: " + "; ".join(problems))


def check_context_parallel(cp: int, lengths: list[int], pp: int, sequence_parallel_tp: int = 1) -> None:
    """A ConfigError, with the reason, for training that cp ranks cannot split.

    sequence_parallel_tp: the tensor-parallel degree sequence parallelism splits each rank's
    positions over (1 without it)."""
    problems = [
        (
            f"train.seq_len (and seq_len_schedule) {n} is not a multiple of 2 x parallel.cp ({2 * cp}): each rank "
            "holds two of 2 x cp equal chunks of every window"
        )
        for n in lengths
        if n % (2 * cp)
    ]
    problems += [
        (
            f"train.seq_len (and seq_len_schedule) {n}: each rank's {n // cp} positions are not a multiple of "
            f"parallel.tp ({sequence_parallel_tp}), which sequence parallelism splits them over"
        )
        for n in lengths
        if n % (2 * cp) == 0 and (n // cp) % sequence_parallel_tp
    ]
    if pp > 1:
        problems.append(
            f"parallel.pp={pp}: pipeline stages pass fixed-shape hidden states and carry no attention mask "
            "between them; use cp with pp = 1"
        )
    if problems:
        raise ConfigError(f"parallel.cp={cp} cannot split this training: " + "; ".join(problems))


def check_pipeline(cfg: ModelConfig, parallel: ParallelConfig, objectives: dict[str, bool]) -> None:
    """A ConfigError, with the reason, for a model or rows that parallel.pp ranks of
    parallel.pp_stages_per_rank stages cannot take (kiln.train.pipeline_parallel).

    objectives: each training objective -> whether its rows mask documents."""
    pp, layers, schedule, per_rank = parallel.pp, parallel.pp_layers, parallel.pp_schedule, parallel.pp_stages_per_rank
    if pp == 1:
        return
    problems = []
    stages = pp * per_rank
    if schedule == "interleaved_1f1b" and per_rank < 2:
        problems.append(
            "parallel.pp_schedule=interleaved_1f1b takes turns between the stages of a rank: set "
            "parallel.pp_stages_per_rank to 2 or more"
        )
    if schedule != "interleaved_1f1b" and per_rank > 1:
        problems.append(
            f"parallel.pp_stages_per_rank={per_rank}: only pp_schedule: interleaved_1f1b runs several stages per rank"
        )
    if layers is not None and (len(layers) != stages or sum(layers) != cfg.n_layers or min(layers) < 1):
        problems.append(
            f"parallel.pp_layers {layers} must give each of the {stages} stages at least one layer, "
            f"{cfg.n_layers} in all"
        )
    elif cfg.n_layers < stages:
        problems.append(
            f"model.n_layers ({cfg.n_layers}) is below the {stages} stages (parallel.pp x "
            "parallel.pp_stages_per_rank): every stage needs a layer"
        )
    unfit = sorted(o for o, masked in objectives.items() if o not in ("clm", "fim") or masked)
    if unfit:
        problems.append(
            f"train.objective {', '.join(unfit)}: a stage builds plain causal attention over 0..T-1 itself, so "
            "rows must be clm or fim without document masking (train.document_masking: false)"
        )
    if parallel.sequence_parallel and parallel.tp > 1:
        problems.append(
            "parallel.sequence_parallel: stages pass whole hidden states to each other; set it to false with pp > 1"
        )
    if problems:
        raise ConfigError(f"parallel.pp={pp} cannot split this run: " + "; ".join(problems))


@dataclass
class Ranks:
    """This process's place in the layout, and the collectives the loop needs."""

    rank: int  # global rank; 0 writes the run's files
    world: int
    degrees: dict[str, int]  # MESH_DIMS -> degree
    device: torch.device
    mesh: Any = None  # the DeviceMesh over MESH_DIMS (None with one process)
    data_group: Any = (
        None  # process group of the ranks with this rank's pp, cp and tp coordinates (the data-parallel ranks)
    )
    dp_pp_group: Any = None  # the data ranks of every pipeline stage (this rank's tp coordinate)
    shard_mesh: Any = None  # what FSDP2 shards over: dp_shard (x cp, flattened), after dp_replicate under HSDP

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def replicate(self) -> int:
        return self.degrees["dp_replicate"]

    @property
    def shard(self) -> int:
        return self.degrees["dp_shard"]

    @property
    def tp(self) -> int:
        return self.degrees["tp"]

    @property
    def pp(self) -> int:
        return self.degrees["pp"]

    @property
    def cp(self) -> int:
        return self.degrees["cp"]

    @property
    def stage(self) -> int:
        """This rank's pipeline stage (its "pp" coordinate)."""
        return self.mesh.get_local_rank("pp") if self.mesh is not None else 0

    @property
    def stage_group(self) -> Any:
        """The process group of this rank's pipeline: one rank per stage (with pp > 1)."""
        return self.mesh["pp"].get_group()

    @property
    def cp_group(self) -> Any:
        """The process group of this rank's context-parallel group (with cp > 1)."""
        return self.mesh["cp"].get_group()

    @property
    def data_world(self) -> int:
        """Ranks that read different rows (the data-parallel ranks)."""
        return self.replicate * self.shard

    @property
    def data_rank(self) -> int:
        """This rank's index among the data-parallel ranks: which rows it reads."""
        if self.mesh is None:
            return 0
        return self.mesh.get_local_rank("dp_replicate") * self.shard + self.mesh.get_local_rank("dp_shard")

    def all_sum(self, tensor: torch.Tensor, stages: bool = False) -> torch.Tensor:
        """The element-wise sum over the data-parallel ranks, in place (a collective: every rank
        calls it). Ranks of one tensor- or context-parallel group hold the same rows, so they are counted once;
        so are the pipeline stages, unless `stages` (what only the last stage holds, zeros on the
        others: its losses)."""
        if stages and self.pp > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.dp_pp_group)
        elif self.data_world > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.data_group)
        return tensor

    def any(self, flag: bool) -> bool:
        """Whether `flag` is set on any rank (a collective over all of them)."""
        if self.world == 1:
            return flag
        box = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(box, op=dist.ReduceOp.SUM)
        return bool(box.item())

    def gather(self, value: Any) -> list[Any]:
        """Every rank's value, in rank order, on every rank (a collective)."""
        if self.world == 1:
            return [value]
        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value)
        return values

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
        """What the loss is multiplied by so that DDP's and FSDP2's mean over data ranks is the sum
        (FSDP2 averages over dp_shard x cp: a context-parallel group's ranks each hold a share of the loss)."""
        return float(self.data_world * self.cp)

    def loss_context(self) -> AbstractContextManager[Any]:
        """Around forward and backward: tensor parallelism's vocabulary-parallel cross-entropy."""
        if self.tp == 1:
            return nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def describe(self) -> str:
        return " x ".join(f"{name} {self.degrees[name]}" for name in MESH_DIMS)


def one_process(device: torch.device) -> Ranks:
    return Ranks(0, 1, dict.fromkeys(MESH_DIMS, 1), device)


def shard_mesh(mesh: Any, degrees: dict[str, int]) -> Any:
    """The mesh FSDP2 shards over: dp_shard, or with cp > 1 dp_shard x cp flattened into one
    dimension (a context-parallel group holds the same weights); 2-D after dp_replicate (HSDP)."""
    replicate = degrees["dp_replicate"]
    if degrees["cp"] == 1:
        return mesh["dp_replicate", "dp_shard"] if replicate > 1 else mesh["dp_shard"]
    if replicate == 1:
        return mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    flat = mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
    return flat._unflatten(0, (replicate, degrees["dp_shard"] * degrees["cp"]), ("dp_replicate", "dp_shard_cp"))


def init_ranks(cfg: ParallelConfig, device: torch.device) -> Ranks:
    """Join torchrun's process group (if started by torchrun), build the mesh and log this rank's place in it."""
    world = world_size()
    if world == 1:  # one process trains alone whatever the section says (a recipe for a cluster runs on a laptop)
        return one_process(device)
    degrees = cfg.degrees(world)  # before any collective: a bad layout fails on every rank alike
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, tuple(degrees[name] for name in MESH_DIMS), mesh_dim_names=MESH_DIMS)
    data_group = (
        mesh["dp_replicate", "dp_shard"]._flatten("dp").get_group()
    )  # the data ranks of this pp, cp and tp coordinate
    dp_pp_group = (
        mesh["pp", "dp_replicate", "dp_shard"]._flatten("pp_dp").get_group() if degrees["pp"] > 1 else data_group
    )
    ranks = Ranks(dist.get_rank(), world, degrees, device, mesh, data_group, dp_pp_group, shard_mesh(mesh, degrees))
    if ranks.is_main:
        places = {int(r): coordinate for coordinate, r in np.ndenumerate(mesh.mesh.numpy())}
        log.info(
            "train: mesh %s over %d processes; rank (%s): %s",
            ranks.describe(),
            world,
            ", ".join(MESH_DIMS),
            "; ".join(f"{r} {places[r]}" for r in sorted(places)),
        )
    return ranks
