"""The `train` recipe section: length, batch geometry and seed at the top, one sub-section per concern.

Sub-sections live with the code that reads them: `schedule` (kiln.train.schedule), `rollback`
(kiln.train.rollback), the objective's settings `mlm`, `prefix_lm`, `span_corruption`
(kiln.train.objectives); unless that code imports torch, for the recipe validates every section
and `kiln curate`, `kiln tokenize` and `--help` import no torch. So `optim` (kiln.train.optim) and
`checkpoint` (kiln.train.checkpoint, kiln.train.resume) are declared here, and `precision` in
kiln.model.config (kiln.model.precision; the policy eval and generate share).
`objective` names one objective or weighs several per row. The batch is given in tokens per
optimizer step (`global_batch_tokens`); gradient-accumulation steps follow from it. Keys of
the flat section this replaced fail with the name of their new home.
The data-parallel size in the batch arithmetic is the number of data ranks of the launch: the
processes torchrun started (1 without torchrun) over tp x pp x cp of the recipe's
`parallel` section, which kiln.recipe passes in as the validation context `data_ranks`; a
section validated alone counts every process. So a recipe is checked against the layout it runs
on. Not handled here: the layout itself (kiln.train.parallel, kiln.train.mesh).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from kiln.core.config import Section
from kiln.core.ranks import world_size
from kiln.model.config import TrainPrecisionConfig
from kiln.train.geometry import BatchWarmupConfig, SeqLenPhase, StepGeometry, step_geometry
from kiln.train.objectives import (
    MASKS_DOCUMENTS_BY_DEFAULT,
    MLMConfig,
    Objective,
    PrefixLMConfig,
    SpanCorruptionConfig,
    span_plan,
)
from kiln.train.rollback import RollbackConfig
from kiln.train.schedule import ScheduleConfig, lr_at

# Keys of the flat train section (kiln before sub-sections) -> where they live now.
MOVED = {
    "lr": "train.optim.lr",
    "weight_decay": "train.optim.weight_decay",
    "beta1": "train.optim.beta1",
    "beta2": "train.optim.beta2",
    "grad_clip": "train.optim.grad_clip",
    "warmup_steps": "train.schedule.warmup_steps",
    "min_lr_ratio": "train.schedule.min_lr_ratio",
    "device": "train.precision.device",
    "checkpoint_every": "train.checkpoint.every",
}


class OptimConfig(Section):
    name: Literal["adamw", "muon"] = Field(
        default="adamw",
        description="adamw for every parameter, or muon for the blocks' matrices with AdamW for the rest.",
    )
    lr: float = Field(
        default=3e-3,
        gt=0,
        le=1,
        description=(
            "Peak learning rate after warmup (AdamW's; with muon, of the embeddings, output projection and norms)."
        ),
    )
    weight_decay: float = Field(default=0.1, ge=0, description="Decoupled weight decay on matrices.")
    decay_embeddings: bool = Field(
        default=True, description="Decay the embedding (and an untied output projection) too."
    )
    decay_norms: bool = Field(default=False, description="Decay norm gains too.")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW first-moment decay.")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="AdamW second-moment decay.")
    grad_clip: float | None = Field(default=1.0, gt=0, description="Global gradient-norm clip; None disables it.")
    muon_lr: float = Field(default=0.02, gt=0, le=1, description="Muon's peak learning rate for the blocks' matrices.")
    muon_momentum: float = Field(default=0.95, ge=0, lt=1, description="Muon's (Nesterov) momentum.")
    newton_schulz_steps: int = Field(default=5, ge=1, description="Newton-Schulz iterations per Muon update.")


class CheckpointConfig(Section):
    every: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Save a resumable state (sharded, kiln.train.resume) every this many steps; None saves only the final "
            "checkpoint."
        ),
    )
    keep_last: int = Field(default=2, ge=1, description="Resumable states kept: the newest this many ...")
    keep_every: int | None = Field(
        default=None, ge=1, description="... and every state whose step is a multiple of this."
    )
    async_save: bool = Field(
        default=False,
        description=(
            "Write resumable states from a background thread once they are copied to CPU memory, so training does not "
            "wait for the disk (the next save waits for the previous one)."
        ),
    )


class TrainConfig(Section):
    # None of these changes the trained weights (checkpoint: only when and where they are saved).
    # rollback: only what happens after a fault, and raising max_rollbacks is how a stopped run goes on.
    NOT_HASHED = frozenset(
        {
            "threads",
            "checkpoint",
            "eval_at_start",
            "eval_every",
            "probe_every",
            "activation_checkpointing",
            "checkpoint_every_k_blocks",
            "rollback",
        }
    )
    steps: int = Field(default=300, ge=1, description="Optimizer steps.")
    seq_len: int = Field(default=256, ge=2, description="Tokens per training sequence; at most model.max_seq_len.")
    micro_batch_size: int = Field(
        default=16, ge=1, description="Sequences per forward/backward pass on each data-parallel rank."
    )
    global_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Tokens per optimizer step over all ranks, a multiple of micro_batch_size * seq_len * ranks (the quotient "
            "is the gradient-accumulation steps); None means one micro-batch per rank."
        ),
    )
    seed: int = Field(default=0, description="Seed for initialization.")
    threads: int | None = Field(default=None, ge=1, description="CPU threads for torch; None leaves torch's default.")
    eval_at_start: bool = Field(
        default=True,
        description="Evaluate the untrained model on validation data before step 1 (the 'before' numbers).",
    )
    probe_every: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Also score the probe set (eval.probe: held-out documents and prompts) every this many steps and at the "
            "end, logging each document's loss and the greedy continuations (metrics.jsonl lines with kind probe); "
            "None: never."
        ),
    )
    eval_every: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Also score the validation data per source every this many steps (metrics.jsonl lines with kind "
            "periodic); None: only before and after."
        ),
    )
    optim: OptimConfig = Field(
        default_factory=OptimConfig, description="AdamW: peak learning rate, weight decay, betas, gradient clipping."
    )
    schedule: ScheduleConfig = Field(
        default_factory=ScheduleConfig, description="Learning-rate warmup and cosine decay."
    )
    precision: TrainPrecisionConfig = Field(
        default_factory=TrainPrecisionConfig,
        description="Device and matmul precision (auto: bf16 autocast on cuda, fp32 on cpu; fp8 on FP8 GPUs).",
    )
    attention_kernel: Literal["sdpa", "flex"] | None = Field(
        default=None,
        description=(
            "How attention under a mask (document masking, prefix-LM) is computed: flex (flex attention over the "
            "128 x 128 blocks some query may see, inside the compiled blocks; CUDA only), sdpa (a dense (B, 1, T, "
            "T) mask); None means flex where train.compile is on a CUDA GPU, sdpa elsewhere."
        ),
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig,
        description=(
            "When resumable states are saved besides the checkpoint after the last step, how many are kept, sync or "
            "async."
        ),
    )
    rollback: RollbackConfig = Field(
        default_factory=RollbackConfig,
        description=(
            "On a NaN, Inf or loss spike: roll back to the newest resumable state, skip the rows that faulted, "
            "optionally lower the lr; how many times."
        ),
    )
    objective: Objective | dict[Objective, Annotated[float, Field(ge=0)]] = Field(
        default="clm",
        description=(
            "clm, fim, mlm, prefix_lm or span_corruption; or a mapping of them to weights, one drawn per row "
            "(UL2-style mixing). fim needs tokenize.fim."
        ),
    )
    document_masking: bool | None = Field(
        default=None,
        description=(
            "Keep attention inside each packed document, with RoPE positions restarting per document; None means on "
            "for fim, mlm and prefix_lm, off for clm (span corruption rows are one example each)."
        ),
    )
    mlm: MLMConfig = Field(
        default_factory=MLMConfig, description="Masked-LM selection rate and the 80/10/10 replacement split."
    )
    prefix_lm: PrefixLMConfig = Field(
        default_factory=PrefixLMConfig, description="Prefix-LM: the range of the prefix's share of each document."
    )
    span_corruption: SpanCorruptionConfig = Field(
        default_factory=SpanCorruptionConfig, description="T5 span corruption: noise density and mean span length."
    )
    seq_len_schedule: list[SeqLenPhase] | None = Field(
        default=None,
        description=(
            "Phases [{start: progress, seq_len: N, rope_theta: X}, ...] (the first starts at 0): rows of each phase's "
            "length, tokens per step unchanged; seq_len above is the longest. None: seq_len throughout."
        ),
    )
    batch_warmup: BatchWarmupConfig | None = Field(
        default=None,
        description=(
            "Ramp tokens per step from a share of global_batch_tokens over the first steps (recommended after a "
            "restart); None: full batches from step 1."
        ),
    )
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        default="none",
        description=(
            "Recompute activations in the backward pass to save memory: full (each checkpointed block keeps only its "
            "input), selective (keeps matmul and attention outputs, recomputes the cheap element-wise ops), or none."
        ),
    )
    checkpoint_every_k_blocks: int = Field(
        default=1, ge=1, description="With activation checkpointing: checkpoint every k-th block (1: all)."
    )
    compile: bool | None = Field(
        default=None,
        description=(
            "torch.compile each block and the loss (with train.fused_loss, its per-chunk softmax and gradient); None "
            "means on for cuda, off on cpu (compiling takes longer than a short CPU run)."
        ),
    )
    fused_loss: bool = Field(
        default=True,
        description=(
            "Take the cross-entropy through the output layer in chunks of positions, gradients made in the same pass "
            "(kiln.train.loss.fused_lm_loss): the (B, T, V) logits never exist whole, which saves their memory, and "
            "on a CPU about 5% of a step's time on the demo model; the same loss up to summation order. fp16 training "
            "always takes the plain path."
        ),
    )
    loss_chunk_tokens: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Positions per chunk of the fused loss; None: about 2^23 logits per chunk on a CPU (1,024 positions at an "
            "8K vocabulary, the fastest of 256 to 4,096 on the demo model), 2^28 on a GPU (fewer, larger matmuls for "
            "the output matrix's gradient; 1 GiB of fp32 logits per chunk when eager)."
        ),
    )
    init_from: str | None = Field(
        default=None,
        description=(
            "Continued pretraining: start from this kiln checkpoint folder (model.safetensors + config.json, e.g. "
            "runs/base/train/checkpoint) instead of random weights; the model section must describe the same model, "
            "the tokenizer must be its run's (tokenizer.from_run). The optimizer starts fresh: use a lower optim.lr "
            "and a short schedule.warmup_steps."
        ),
    )
    late_position_weight: float = Field(
        default=0.0,
        ge=0,
        description=(
            "Weight the loss towards later positions of each row: position t counts 1 + w * t / (T - 1), normalised "
            "to mean 1 (long-context training); 0 weighs all alike."
        ),
    )

    _data_ranks: int = PrivateAttr(default=1)

    @model_validator(mode="after")
    def _ranks(self, info: ValidationInfo) -> TrainConfig:
        # Runs before the checks below (validators run in the order they are defined).
        self._data_ranks = (info.context or {}).get("data_ranks") or world_size()
        return self

    @property
    def data_ranks(self) -> int:
        """Ranks that read different rows: processes over the model-parallel degree."""
        return self._data_ranks

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        moved = [f"train.{key} moved to {MOVED[key]}" for key in MOVED if key in data]
        if isinstance(data.get("precision"), str):
            moved.append(f"train.precision is a section now: use train.precision.dtype={data['precision']}")
        if "grad_accum_steps" in data:
            moved.append(
                "train.grad_accum_steps is replaced by train.global_batch_tokens, the tokens per optimizer step "
                "(micro_batch_size * seq_len * grad_accum_steps)"
            )
        if moved:
            raise ValueError("; ".join(moved))
        return data

    @model_validator(mode="after")
    def _flex_on_a_gpu(self) -> TrainConfig:
        if self.attention_kernel == "flex" and self.precision.device == "cpu":
            raise ValueError(
                "attention_kernel flex trains on CUDA only (PyTorch computes no flex attention backward on a CPU) "
                "and precision.device is cpu; use attention_kernel sdpa, or leave it unset"
            )
        if self.attention_kernel == "flex" and self.compile is False:
            raise ValueError(
                "attention_kernel flex runs inside the compiled blocks, and compile is false (uncompiled, flex "
                "attention computes every score of the window); set compile true, or attention_kernel sdpa"
            )
        return self

    @model_validator(mode="after")
    def _objective(self) -> TrainConfig:
        if isinstance(self.objective, dict) and not any(w > 0 for w in self.objective.values()):
            raise ValueError(f"objective weights {self.objective} give no objective a positive weight")
        if "span_corruption" in self.objectives:
            for length in self.seq_lens:
                try:
                    span_plan(length, self.span_corruption)
                except ValueError as e:
                    raise ValueError(
                        f"objective span_corruption: {e}; raise seq_len (and the seq_len_schedule phases)"
                    ) from None
        return self

    @model_validator(mode="after")
    def _phases(self) -> TrainConfig:
        phases = self.seq_len_schedule
        if not phases:
            return self
        starts = [p.start for p in phases]
        if starts[0] != 0 or starts != sorted(set(starts)):
            raise ValueError(f"seq_len_schedule starts {starts} must begin at 0 and increase")
        for p in phases:
            if p.seq_len > self.seq_len or (self.micro_batch_size * self.seq_len) % p.seq_len:
                raise ValueError(
                    f"seq_len_schedule phase at {p.start}: seq_len {p.seq_len} must be at most seq_len "
                    f"({self.seq_len}) and divide micro_batch_size * seq_len "
                    f"({self.micro_batch_size * self.seq_len})"
                )
            if self.tokens_per_step % (p.seq_len * self.data_ranks):
                raise ValueError(
                    f"seq_len_schedule phase at {p.start}: seq_len {p.seq_len} must divide the tokens per step "
                    f"({self.tokens_per_step}) into whole rows on every rank"
                )
        return self

    def geometry(self, step: int) -> StepGeometry:
        """Sequence length, rows and RoPE base of optimizer step `step` (1-based)."""
        return step_geometry(step, self, self.data_ranks)

    @property
    def seq_lens(self) -> list[int]:
        """Every row length training uses: seq_len and the seq_len_schedule phases', ascending."""
        return sorted({self.seq_len, *(p.seq_len for p in self.seq_len_schedule or [])})

    @property
    def objectives(self) -> dict[str, float]:
        """Objective -> weight per row (positive weights only)."""
        if isinstance(self.objective, str):
            return {self.objective: 1.0}
        return {name: w for name, w in self.objective.items() if w > 0}

    def masks_documents(self, objective: str) -> bool:
        return MASKS_DOCUMENTS_BY_DEFAULT[objective] if self.document_masking is None else self.document_masking

    @model_validator(mode="after")
    def _geometry(self) -> TrainConfig:
        if self.schedule.warmup_steps is not None and self.schedule.warmup_steps >= self.steps:
            raise ValueError(
                f"schedule.warmup_steps ({self.schedule.warmup_steps}) must be below steps ({self.steps}); lower "
                "it, or give schedule.warmup_fraction (a share of the steps) instead"
            )
        per_micro_step = self.micro_batch_size * self.seq_len * self.data_ranks
        if self.global_batch_tokens is not None and self.global_batch_tokens % per_micro_step:
            raise ValueError(
                f"global_batch_tokens ({self.global_batch_tokens}) is not a multiple of micro_batch_size * "
                "seq_len * data-parallel ranks"
                f" ({self.micro_batch_size} * {self.seq_len} * {self.data_ranks} = {per_micro_step}); use a "
                "multiple such as"
                f" {max(1, round(self.global_batch_tokens / per_micro_step)) * per_micro_step}"
            )
        return self

    @property
    def warmup_steps(self) -> int:
        """Warmup steps of this run: schedule.warmup_steps, or schedule.warmup_fraction of steps."""
        return self.schedule.warmup(self.steps)

    def lr(self, step: int) -> float:
        """The schedule's learning rate at optimizer step `step` (1-based), before any rollback's lowering."""
        s = self.schedule
        return lr_at(step, self.optim.lr, self.warmup_steps, self.steps, s.min_lr_ratio, s.kind, s.decay_fraction)

    @property
    def stable_until(self) -> int | None:
        """wsd: the last step at the peak lr, where a finished run can be extended from (kiln.train.extend); else
        None."""
        return self.schedule.stable_until(self.steps)

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches each rank accumulates per optimizer step."""
        return (self.global_batch_tokens or self.micro_batch_size * self.seq_len * self.data_ranks) // (
            self.micro_batch_size * self.seq_len * self.data_ranks
        )

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step over all ranks."""
        return self.micro_batch_size * self.seq_len * self.data_ranks * self.grad_accum_steps
