"""Pipeline parallelism with `torch.distributed.pipelining`: the layer stack split into stages over
the ranks of the mesh's "pp" dimension (one each, or several interleaved), and a schedule that runs
a step's micro-batches through them.

Stages are balanced by parameter count: the blocks are all alike, the first stage also holds the
embedding and the last the final norm and output layer, and the split of the layers into
contiguous runs minimises the largest stage (`parallel.pp_layers` gives the layers per stage
instead). A rank's stages are a `StageModel` built here from the Transformer's own modules: the
blocks of its stages, the embedding on the first rank only, the final norm and output layer on
the last only (the others are dropped), under the whole model's names, so parameter names, and so
checkpoints, are those of the whole model; it runs one stage's layers as `Transformer.forward`
runs them all (kiln.model.transformer's layer_inputs and output), and the model knows nothing of
stages. A tied embedding (`model.tie_embeddings`) is held twice, as Megatron-LM holds
it: the first stage looks the ids up in it, and the last stage keeps the embedding module too,
unused for lookups, as its output matrix (so its names are one process's: `embed.weight`, and
`lm_head.weight` the same tensor). Every rank builds the same initial weights, so the two copies
start equal; after each step's backward the first and the last stage of each pipeline sum their
gradients (`PipelineSchedule.sum_tied_grads`, a collective between those two ranks), so both take the
same optimizer step and stay equal. The gradient norm counts the matrix once (the last stage's
copy is left out of it); resumable states carry one process's names (DCP writes the two stages'
equal `embed.weight` once), so they load under any layout, and the consolidated checkpoint
stores the matrix once.
The step's micro-batches (train.global_batch_tokens / micro_batch_size per data rank) go through
the schedule `parallel.pp_schedule`: GPipe (every forward, then every backward), 1F1B (one
forward, one backward, in steady state; the same bubble, fewer micro-batches in flight), or
interleaved 1F1B (Narayanan et al. 2021): each rank holds `parallel.pp_stages_per_rank` = v
stages, r, r + pp, r + 2 pp, ... of pp x v, and the schedule takes them in turn, which divides the
bubble by about v at v times the sends. Each stage runs its own layers of the rank's StageModel.
The loss is taken on the last stage, each micro-batch's share of the step's token mean as in the
plain loop; the schedule does not rescale gradients. Each rank times its compute (forward and
backward of its chunks, `TimedStage`: torch's PipelineStage subclassed) against the step's wall
time: the idle share is the bubble, logged per step, (p - 1) / (m + p - 1) in theory for p stages
and m micro-batches of equal cost, (p - 1) / (v m + p - 1) interleaved.
Evaluation and generation run the stages one after another with point-to-point sends (no
schedule), the last stage scores, and its results are sent to every rank.
Rows must be plain causal ones (clm, fim) without document masking: a stage computes its RoPE
positions and causal mask itself from the sequence length (kiln.train.mesh.check_layout refuses others).
Shape legend: B rows, T positions, D model width, V vocabulary.
Not handled here: the zero-bubble schedules (split weight and input gradients).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)
from torch.distributed.tensor import DTensor

from kiln.model.batch import Batch
from kiln.model.config import ModelConfig, count_params
from kiln.model.precision import Precision
from kiln.model.transformer import Transformer, layer_inputs, output
from kiln.train.loss import Loss
from kiln.train.mesh import Ranks

log = logging.getLogger("kiln.train")


def balance_layers(cfg: ModelConfig, stages: int) -> list[int]:
    """Layers per stage, contiguous, minimising the largest stage's parameters: the first stage
    also holds the embedding, the last the final norm and output layer."""
    assert cfg.vocab_size is not None, "resolve vocab_size first"
    n = cfg.n_layers
    block = (
        count_params(cfg.model_copy(update={"n_layers": 1}), include_embeddings=False) - cfg.d_model
    )  # one block's weights
    embedding = cfg.vocab_size * cfg.d_model
    head = cfg.vocab_size * cfg.d_model + cfg.d_model  # output layer and final norm

    def cost(stage: int, count: int) -> int:
        return count * block + (embedding if stage == 0 else 0) + (head if stage == stages - 1 else 0)

    # best[s][i]: the smallest largest stage placing the first i layers on stages 0..s-1.
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):  # stage s - 1 takes layers j..i-1
                load = max(best[s - 1][j], cost(s - 1, i - j))
                if load < best[s][i]:
                    best[s][i], cut[s][i] = load, j
    counts, i = [], n
    for s in range(stages, 0, -1):
        counts.append(i - cut[s][i])
        i = cut[s][i]
    return counts[::-1]


def stage_layers(cfg: ModelConfig, pp: int, override: list[int] | None) -> list[range]:
    """The global layer indices of each stage."""
    counts = override or balance_layers(cfg, pp)
    starts = [sum(counts[:s]) for s in range(pp)]
    return [range(a, a + c) for a, c in zip(starts, counts, strict=True)]


def rank_stages(stages: int, pp: int, rank: int) -> list[int]:
    """The stages rank `rank` of pp holds: rank, rank + pp, ... (the order the interleaved schedule expects)."""
    return list(range(rank, stages, pp))


class StageModel(nn.Module):
    """One rank's pipeline stages of a Transformer, built from its modules: the blocks it holds
    (`held`, layer indices), the embedding on the first rank, the final norm and output layer on the last (with a tied
    embedding the embedding too: it is the output matrix). Parameter names are the whole model's;
    the Transformer's other modules are left to it (once it is dropped, freed)."""

    def __init__(self, model: Transformer, held: set[int], first: bool, last: bool):
        super().__init__()
        self.cfg = model.cfg
        # Registered in the Transformer's order (embedding, blocks, norm, output): parameters come in the same order.
        self.embed = model.embed if first or (last and model.cfg.tie_embeddings) else None
        self.blocks = nn.ModuleDict({key: block for key, block in model.blocks.items() if int(key) in held})
        self.norm = model.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.rope = model.rope

    def set_rope_theta(self, theta: float) -> None:
        """As Transformer.set_rope_theta: the tables and the config (a checkpoint's) follow."""
        self.cfg = self.cfg.model_copy(update={"rope_theta": theta})
        self.rope.fill(self.cfg)

    def forward(
        self, x: torch.Tensor, layers: range | None = None, last_only: bool = False, head: Any = None, **attention: Any
    ) -> Any:
        """One of the rank's stages, `layers` (None: every block it holds, one stage's), as
        Transformer.forward runs the whole stack: it is given ids where it starts at layer 0 and
        hidden states (B, T, D) otherwise, and returns hidden states unless it ends at the last
        layer. attention: Transformer.forward's rule, positions_BT, cache and valid_BT."""
        keys = [key for key in self.blocks if layers is None or int(key) in layers]
        x_BTD = self.embed(x) if keys[0] == "0" else x  # type: ignore[misc]
        inputs = layer_inputs(self.rope, x.shape[1], x_BTD, **attention)
        for key in keys:
            x_BTD = inputs.run(self.blocks[key], int(key), x_BTD)  # type: ignore[arg-type]
        if inputs.cache is not None and keys[-1] == list(self.blocks)[-1]:  # once per pass: after the rank's last block
            inputs.cache.advance(x.shape[1])
        if int(keys[-1]) < self.cfg.n_layers - 1:  # a stage before the last: its hidden states go to the next
            return x_BTD
        if last_only:
            x_BTD = x_BTD[:, -1:]
        return output(x_BTD, self.norm, self.lm_head, self.cfg.logit_softcap, head)  # type: ignore[arg-type]


def tied_group(ranks: Ranks) -> Any:
    """The process group of this rank's pipeline's first and last stage ranks (pp coordinates 0 and
    pp - 1 at this rank's other coordinates); every rank creates every pipeline's group, as
    new_group requires."""
    by_pipeline = ranks.mesh.mesh.movedim(0, -1).reshape(-1, ranks.pp)  # one row per pipeline: its ranks by stage
    mine = None
    for row in by_pipeline.tolist():
        group = dist.new_group([row[0], row[-1]])
        if ranks.rank in row:
            mine = group
    return mine


def micro_batch_count(rows: int, largest: int, pp: int, kind: str) -> tuple[int, str]:
    """How many equal micro-batches a step's rows go through the pipeline in, and with which schedule.

    The fewest that keep each within the largest micro-batch given and number at least pp (fewer
    leave a stage nothing to do, and 1F1B refuses them); interleaved 1F1B also needs them to be a
    multiple of their rounds (m // pp). Where the rows allow no such count (a short batch-size
    warmup step): one row each, through GPipe, or interleaved in one round of fewer than pp; and
    where interleaving can make no whole rounds at all, the fewest that fit through looped BFS
    (GPipe's order over several stages per rank)."""
    fits = [d for d in range(1, rows + 1) if rows % d == 0 and d >= -(-rows // largest)]
    if kind == "interleaved_1f1b":
        turns = [d for d in fits if d % max(1, d // pp) == 0]
        full = [d for d in turns if d >= pp]
        return (min(full) if full else max(turns), kind) if turns else (fits[0], "looped_bfs")
    m = min(d for d in fits if d >= pp or d == rows)
    return m, kind if m >= pp else "gpipe"


@dataclass
class BusyTime:
    """Seconds a rank's stages computed in a step (TimedStage adds to it)."""

    seconds: float = 0.0


class TimedStage(PipelineStage):
    """torch's PipelineStage, adding the seconds it computes (the forward and backward of each
    chunk, not its sends and receives) to `busy`."""

    def __init__(self, busy: BusyTime, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.busy = busy

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super().forward_one_chunk(*args, **kwargs)
        finally:
            # A CPU computes synchronously; on a GPU, synchronize first (not done).
            self.busy.seconds += time.perf_counter() - t0

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super().backward_one_chunk(*args, **kwargs)
        finally:
            self.busy.seconds += time.perf_counter() - t0


class PipelineSchedule:
    """This rank's stages and the schedules that run a step's micro-batches through them.

    The last stage takes the training loss inside its forward (the model's loss head, as the plain
    loop does: data-parallel wrappers see the output matrix used where they expect), one
    micro-batch after another in the order the schedules run them, and outputs each micro-batch's
    loss value; the schedule's loss function passes it on."""

    def __init__(
        self,
        core: StageModel,
        ranks: Ranks,
        schedule: str,
        layers: list[range],
        head: Callable[..., Loss],
        precision: Precision,
    ):
        self.core, self.ranks, self.kind, self.layers, self.head = core, ranks, schedule, layers, head
        self.autocast, self.hidden_dtype = (
            precision.autocast,
            precision.amp_dtype or torch.float32,
        )  # stages pass this dtype
        self.group, self.stages = ranks.stage_group, len(layers)
        self.local = rank_stages(self.stages, ranks.pp, ranks.stage)  # this rank's stages
        self.first, self.last = ranks.stage == 0, self.local[-1] == self.stages - 1  # holds the first stage, the last
        # One stage per rank runs the (FSDP2-wrapped) model itself, so the schedule's gradient-sync
        # handling applies to it; a stage among several, or the last with its loss, runs its layers through it.
        self.modules = [
            StageLayers(core, layers[s], self if s == self.stages - 1 else None)
            if len(self.local) > 1 or s == self.stages - 1
            else core
            for s in self.local
        ]
        self.built: dict[tuple[int, int, int, str], Any] = {}  # (micro-batches, rows, seq_len, kind) -> schedule
        self.micro: list[Batch] = []
        self.step_tokens, self.next = 1, 0
        self.row_stats: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.busy = BusyTime()
        # A tied embedding: the first rank's, or the last rank's copy (the last stage, pp x v - 1, is on
        # rank pp - 1, never rank 0; a rank holding both ends would hold one matrix, nothing to sum).
        # type: ignore[union-attr]
        self.tied = core.embed.weight if core.cfg.tie_embeddings and self.first != self.last else None
        self.tied_group = tied_group(ranks) if core.cfg.tie_embeddings else None
        self.copies = (
            [self.tied] if self.tied is not None and self.last else []
        )  # left out of the gradient norm: the first rank's counts

    def sum_tied_grads(self) -> None:
        """A tied embedding: the first and the last stage each get the sum of both copies'
        gradients, as the one matrix of one process gets both (a collective between the two ranks of
        each pipeline). Their gradients are laid out alike (FSDP2 and tp split both copies by
        vocabulary row the same way), so each rank sums its own shard."""
        if self.tied is None:
            return
        grad = self.tied.grad
        assert grad is not None, "both ends of the pipeline use the tied embedding in every step"
        dist.all_reduce(
            grad.to_local() if isinstance(grad, DTensor) else grad, group=self.tied_group
        )  # to_local: a view, summed in place

    def last_forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        """The last stage on the next micro-batch: its loss value (times the data ranks, which
        FSDP2's mean over them undoes, as in the plain loop)."""
        batch = self.micro[self.next]
        self.next += 1
        loss = self.core(
            x_BTD, head=partial(self.head, batch=batch, step_tokens=self.step_tokens), layers=self.layers[-1]
        )
        self.row_stats.append((loss.row_mean_B, loss.row_tokens_B))
        return loss.value * self.ranks.grad_scale

    def schedule_for(self, micro_batches: int, rows: int, seq_len: int, kind: str) -> Any:
        """The schedule for this shape of step, built on every stage alike when the shape changes
        (only the latest is kept: batch-size warmup changes it every step). Shapes are given
        (static metadata), so no stage runs a trial forward to infer them."""
        key = (micro_batches, rows, seq_len, kind)
        if key not in self.built:
            self.built.clear()
            b, device = rows // micro_batches, self.ranks.device

            # requires_grad: the hidden states between stages carry gradients back (the ids do not).
            def hidden() -> torch.Tensor:
                return torch.empty(
                    b, seq_len, self.core.cfg.d_model, dtype=self.hidden_dtype, device=device, requires_grad=True
                )

            stages = [
                TimedStage(
                    self.busy,
                    module,
                    s,
                    self.stages,
                    device,
                    group=self.group,
                    input_args=torch.zeros(b, seq_len, dtype=torch.long, device=device) if s == 0 else hidden(),
                    output_args=torch.zeros((), device=device) if s == self.stages - 1 else hidden(),
                )
                for s, module in zip(self.local, self.modules, strict=True)
            ]
            # The loss is each micro-batch's share of the step already: no rescaling by the schedule.
            schedule = {
                "gpipe": ScheduleGPipe,
                "1f1b": Schedule1F1B,
                "interleaved_1f1b": ScheduleInterleaved1F1B,
                "looped_bfs": ScheduleLoopedBFS,
            }[kind]
            several = kind in ("interleaved_1f1b", "looped_bfs")  # these take a list of the rank's stages
            self.built[key] = schedule(
                stages if several else stages[0], micro_batches, loss_fn=lambda value, _target: value, scale_grads=False
            )
        return self.built[key]

    def step(self, micro_batches: list[Batch], step_tokens: int) -> tuple[Loss | None, list[float]]:
        """Forward and backward of the step's rows through the pipeline; the last stage's per-row
        losses (None on the other ranks) and each rank's idle share of the pipeline's span (a
        collective). The rank that idles least is the slowest; its idle share is the bubble
        proper, what the schedule leaves empty while the pipeline fills and drains. The others
        also wait on it.

        The rows are split into m equal micro-batches (micro_batch_count)."""
        rows = sum(len(b.input_ids_BT) for b in micro_batches)
        m, kind = micro_batch_count(rows, max(len(b.input_ids_BT) for b in micro_batches), self.ranks.pp, self.kind)
        whole = torch.cat([b.input_ids_BT for b in micro_batches]).to(self.ranks.device)
        schedule = self.schedule_for(m, rows, whole.shape[1], kind)
        if self.last:
            self.micro = [
                Batch(i, t, k, None, s)
                for i, t, k, s in zip(
                    *(
                        torch.cat([getattr(b, f) for b in micro_batches]).to(self.ranks.device).tensor_split(m)
                        for f in ("input_ids_BT", "targets_BT", "loss_mask_BT", "source_B")
                    ),
                    strict=True,
                )
            ]
        self.step_tokens, self.next, self.row_stats, self.busy.seconds = step_tokens, 0, [], 0.0
        t0 = time.perf_counter()
        with self.autocast(), self.ranks.loss_context():
            # The loss is the last stage's output (so no outputs to merge); the target only sets the count.
            if self.first:
                schedule.step(whole, return_outputs=False)
            elif self.last:
                schedule.step(target=torch.zeros(rows, 1), return_outputs=False)
            else:
                schedule.step(return_outputs=False)
        # The stages start together (after the step's collectives) and end apart: each idles for the
        # share of the whole pipeline's span (the latest end) it did not compute.
        timing = torch.tensor([self.busy.seconds, time.perf_counter() - t0], device=self.ranks.device)
        every = [torch.zeros(2, device=self.ranks.device) for _ in range(self.ranks.pp)]
        dist.all_gather(every, timing, group=self.group)
        span = max(float(t[1]) for t in every)
        idle_by_rank = [1 - float(t[0]) / max(span, 1e-9) for t in every]
        if not self.last:
            return None, idle_by_rank
        return Loss(
            torch.zeros(()), torch.cat([m for m, _ in self.row_stats]), torch.cat([t for _, t in self.row_stats])
        ), idle_by_rank


class StageLayers(nn.Module):
    """The module the schedule runs for one stage of several on a rank, or for the last stage: the
    model on that stage's layers, the last with the loss head (PipelineSchedule.last_forward)."""

    def __init__(self, core: StageModel, layers: range, pipeline: PipelineSchedule | None):
        super().__init__()
        self.core, self.layers = core, layers
        self.pipeline = [pipeline] if pipeline else []  # in a list: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pipeline[0].last_forward(x) if self.pipeline else self.core(x, layers=self.layers)


class StagesInTurn(nn.Module):
    """The whole model for evaluation and generation under pipeline parallelism: each of this
    rank's stages in turn, its input received from the rank of the stage before and its output sent
    to the rank of the one after (blocking point-to-point sends over the "pp" group, hidden states
    in fp32). For generation (last_only) the last stage's logits of the last position are broadcast,
    so every rank draws the same next token. For scoring, the ranks without the last stage return
    zeros of the logits' shape (an expanded scalar; the scoring still computes its (B, T, V)
    intermediates on them), so the caller's scoring runs alike on every rank, and
    `last_stage_results` keeps the last stage's."""

    def __init__(self, stage: StageModel, ranks: Ranks, layers: list[range]):
        super().__init__()
        self.stage, self.layers = stage, layers
        self.group = ranks.stage_group
        self.local = rank_stages(len(layers), ranks.pp, ranks.stage)
        self.before = dist.get_global_rank(self.group, (ranks.stage - 1) % ranks.pp)
        self.after = dist.get_global_rank(self.group, (ranks.stage + 1) % ranks.pp)
        self.last = dist.get_global_rank(self.group, ranks.pp - 1)

    @property
    def cfg(self) -> ModelConfig:
        return self.stage.cfg

    def forward(self, idx_BT: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        B, T = idx_BT.shape
        V = self.cfg.vocab_size or 1
        for s in self.local:
            x = idx_BT
            if s > 0:
                x = torch.empty(B, T, self.cfg.d_model, device=idx_BT.device)
                dist.recv(x, src=self.before, group=self.group)
            out = self.stage(x, layers=self.layers[s], **kwargs)
            if s < len(self.layers) - 1:
                dist.send(out.float().contiguous(), dst=self.after, group=self.group)
        holds_last = self.local[-1] == len(self.layers) - 1
        if kwargs.get("last_only"):
            logits_B1V = out.float().contiguous() if holds_last else torch.empty(B, 1, V, device=idx_BT.device)
            dist.broadcast(logits_B1V, src=self.last, group=self.group)
            return logits_B1V
        return out if holds_last else torch.zeros((), device=idx_BT.device).expand(B, T, V)


def last_stage_results(
    scorer: Callable[[nn.Module], dict[str, Any]], ranks: Ranks
) -> Callable[[nn.Module], dict[str, Any]]:
    """A scorer whose results are the last stage's on every rank (a collective over "pp")."""
    group = ranks.stage_group
    last = dist.get_global_rank(group, ranks.pp - 1)

    def score(model: nn.Module) -> dict[str, Any]:
        box = [scorer(model)]
        dist.broadcast_object_list(box, src=last, group=group)
        return box[0]

    return score
