"""Bytes per GPU for training: weights, gradients, optimizer states and activations.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", Section 3.1 and Figure 1): mixed-precision Adam
keeps 2 bytes of bf16/fp16 weights + 2 bytes of gradients + 12 bytes of fp32 optimizer state
(master weights, momentum, variance) = 16 bytes per parameter. Tensor (tp) and pipeline (pp)
parallelism split the parameters first (N / (tp * pp) per GPU); ZeRO then shards over the
data-parallel degree Nd:
  stage 0 (DDP)      2 + 2 + 12            bytes per local parameter
  stage 1            2 + 2 + 12 / Nd       (optimizer states sharded)
  stage 2            2 + (2 + 12) / Nd     (and gradients)
  stage 3 (FSDP)     (2 + 2 + 12) / Nd     (and weights)
The paper's worked example, 7.5B parameters on Nd = 64: 120, 31.4, 16.6 and 1.9 GB per GPU.
Pure fp32 training is 4 + 4 + 8 (weights, gradients, Adam moments) = 16 bytes as well.
subtle: with m > 1 micro-batches per step (gradient accumulation) the stage-2 saving holds only
if gradients are reduce-scattered after every micro-batch (m times the gradient traffic), and
stage 3 re-gathers the weights for every micro-batch; kiln.plan.layout prices that traffic.

Activations per transformer layer follow Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Table 2, with s sequence length, b micro-batch,
h hidden size, a heads, t tensor-parallel degree, 16-bit activations (doubled for fp32):
  no recompute                      s*b*h*(34 + 5*a*s/h)            (t = 1)
    tensor parallel                 s*b*h*(10 + 24/t + 5*a*s/(h*t))
    tensor + sequence parallel      s*b*h*(34/t + 5*a*s/(h*t))
  selective recompute               s*b*h*(10 + 24/t), or 34/t with sequence parallel
  full recompute                    s*b*h*2  (each layer's input only)
The 5*a*s/h term is attention's s x s scores (softmax output, its dropout mask). kiln's model
calls PyTorch SDPA, whose flash and memory-efficient kernels never store them (they recompute
them in backward), so with attention="flash" (the default) that term is dropped and selective
recompute saves nothing more; attention="eager" keeps Korthikanti's term. At s = 4096 for
llama-7b the term is 5*32*4096/4096 = 160 against 34, a 5.7x difference.
Full recompute also holds one layer's activations while that layer is recomputed, costed like
no recompute with the same attention (with flash: the selective formula, no scores).
Korthikanti's formula is derived for GPT blocks; kiln's SwiGLU blocks are of the same order.
With 1F1B pipelining the first stage holds min(pp, micro-batches) micro-batches of its L/pp
layers, i.e. L layers' worth at most; where pp does not divide L (kiln balances uneven stages),
the stage with the most layers, ceil(L/pp), is the one priced.
Context parallelism (cp, kiln.train.context_parallel) splits each sequence over cp GPUs: a GPU
holds the activations of s/cp positions, plus, in every layer it does not recompute, the keys and
values it gathered from the whole window for backward, 2 x 2 x s*b*h/t bytes less its own share
(priced at full width: a grouped-query model's are narrower). kiln shards the states of a
context-parallel group with FSDP2 over dp x cp, so ZeRO 2 or 3 there, and runs cp with pp = 1.
"Fits" leaves `headroom` (default 10%) of the GPU free for what is not counted here: the output
logits (s*b*V*4 bytes on the last stage), communication buffers, allocator fragmentation and
the CUDA context. Not handled here: activation offload, and replicated key/value heads when tp
exceeds a grouped-query model's n_kv_heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.core.errors import ConfigError
from kiln.model.config import ModelConfig, count_params
from kiln.plan.checks import require_at_least, require_choice, require_fraction, require_positive
from kiln.plan.report import count, fixed, table

GB = 1e9  # bytes; GPU memory is sold in these units
# Bytes per parameter for (weights, gradients, optimizer states) with Adam (ZeRO paper, Section 3.1).
STATE_BYTES = {"bf16": (2, 2, 12), "fp16": (2, 2, 12), "fp32": (4, 4, 8)}
ACTIVATION_SCALE = {"bf16": 1, "fp16": 1, "fp32": 2}  # Korthikanti's coefficients assume 2-byte activations
CHECKPOINTING = ("none", "selective", "full")
ATTENTION = ("flash", "eager")  # flash: SDPA's fused kernels (kiln's model); eager: scores materialised
DEFAULT_HEADROOM = 0.1  # share of GPU memory left for logits, NCCL buffers, fragmentation, CUDA context
# The largest vocabulary a plausible model has (Gemma: 256K), for the params-vs-shape sanity check.
MAX_VOCAB = 262_144


@dataclass(frozen=True)
class Shape:
    """What memory planning needs of a model; layers, width and heads are all known or all None."""

    params: float
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Shape:
        return cls(float(count_params(cfg)), cfg.n_layers, cfg.d_model, cfg.n_heads)

    @property
    def known(self) -> bool:
        return None not in (self.n_layers, self.d_model, self.n_heads)


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def check_checkpointing(checkpointing: str) -> None:
    require_choice("activation_checkpointing", checkpointing, CHECKPOINTING)


def check_shape(shape: Shape) -> None:
    """params above 0; layers, width and heads all given (each at least 1) or none."""
    require_positive("params", shape.params, "model parameters, e.g. 7e9")
    dims = {
        "n_layers (--layers)": shape.n_layers,
        "d_model (--hidden)": shape.d_model,
        "n_heads (--heads)": shape.n_heads,
    }
    given = [k for k, v in dims.items() if v is not None]
    if given and len(given) < len(dims):
        raise ConfigError(
            "the model's shape needs all of n_layers (--layers), d_model (--hidden) and n_heads (--heads), or "
            f"none of them; got only {', '.join(given)}"
        )
    for name, value in dims.items():
        if value is not None:
            require_at_least(name, value, 1, "a dimension of the model")


def shape_warnings(shape: Shape) -> list[str]:
    """A warning when params is far from what the shape implies (activations use the shape, states use params)."""
    if not shape.known:
        return []
    assert shape.n_layers is not None and shape.d_model is not None
    # 4 d^2 of attention and 8 d^2 of MLP per layer (GPT's 4d MLP, or SwiGLU at 8/3 d); grouped-query
    # attention or a narrow MLP bring it to about a third of that, embeddings add up to 2 * V * d.
    blocks = 12 * shape.n_layers * shape.d_model**2
    low, high = blocks / 3, 2 * blocks + 2 * MAX_VOCAB * shape.d_model
    if low <= shape.params <= high:
        return []
    return [
        f"params = {shape.params:.3g} is {shape.params / blocks:.3g}x the {blocks:.3g} that n_layers = "
        f"{shape.n_layers} and d_model = {shape.d_model} "
        f"imply (12 x layers x d_model^2, plus embeddings up to {2 * MAX_VOCAB * shape.d_model:.3g}); model "
        "states use params, activations the shape: check --params, --layers and --hidden"
    ]


def check_layout(shape: Shape, dp: int, tp: int, pp: int, zero: int) -> None:
    """Reject degrees the model cannot be split by, naming the valid ones."""
    check_shape(shape)
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        require_at_least(name, value, 1, "a parallel degree; 1 means not split")
    if zero not in (0, 1, 2, 3):
        raise ConfigError(
            f"zero = {zero} is not a ZeRO stage; choose 0 (DDP), 1 (optimizer states), 2 (+ gradients) or 3 (+ "
            "weights, = FSDP full sharding)"
        )
    if shape.n_heads is not None and shape.n_heads % tp:
        raise ConfigError(
            f"tp = {tp} does not divide n_heads = {shape.n_heads}: tensor parallelism splits whole attention "
            f"heads; valid tp: {', '.join(map(str, divisors(shape.n_heads)))}"
        )
    if shape.n_layers is not None and pp > shape.n_layers:
        raise ConfigError(
            f"pp = {pp} exceeds n_layers = {shape.n_layers}: each pipeline stage holds at least one layer; valid "
            f"pp: 1 to {shape.n_layers}"
        )


def check_context(seq_len: int, cp: int, pp: int, zero: int) -> None:
    """Reject a context-parallel degree kiln cannot run, with the reason."""
    require_at_least("cp", cp, 1, "a parallel degree; 1 means not split")
    if cp == 1:
        return
    if seq_len % (2 * cp):
        raise ConfigError(
            f"cp = {cp} needs seq_len = {seq_len} to split into 2 x cp = {2 * cp} equal chunks (each GPU holds "
            f"two); valid cp: {', '.join(str(k) for k in divisors(seq_len) if seq_len % (2 * k) == 0)}"
        )
    if pp > 1:
        raise ConfigError(f"cp = {cp} with pp = {pp}: kiln runs context parallelism without pipeline stages; use pp 1")
    if zero < 2:
        raise ConfigError(
            f"cp = {cp} with zero = {zero}: kiln shards a context-parallel group's states with FSDP2 (ZeRO 2 or 3 "
            "over dp x cp)"
        )


def model_state_bytes(
    params: float, dp: int, tp: int, pp: int, zero: int, precision: str = "bf16"
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) in bytes on one GPU."""
    w, g, o = STATE_BYTES[precision]
    local = params / (tp * pp)
    return (
        w * local / (dp if zero >= 3 else 1),
        g * local / (dp if zero >= 2 else 1),
        o * local / (dp if zero >= 1 else 1),
    )


def activation_bytes_per_layer(
    seq_len: int,
    micro_batch: int,
    d_model: int,
    n_heads: int,
    tp: int = 1,
    sequence_parallel: bool = True,
    checkpointing: str = "none",
    attention: str = "flash",
) -> float:
    """Korthikanti et al. 2022, Table 2: bytes one transformer layer keeps for backward (16-bit)."""
    check_checkpointing(checkpointing)
    require_choice("attention", attention, ATTENTION)
    sbh = seq_len * micro_batch * d_model
    sp = sequence_parallel and tp > 1
    stored = 34 / tp if sp else 10 + 24 / tp  # everything but the scores
    scores = 5 * n_heads * seq_len / (d_model * tp) if attention == "eager" else 0.0  # flash never stores them
    if checkpointing == "full":
        return 2.0 * sbh
    if checkpointing == "selective":
        return sbh * stored
    return sbh * (stored + scores)


def plan_memory(
    shape: Shape,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    zero: int = 0,
    micro_batch: int = 1,
    seq_len: int = 2048,
    precision: str = "bf16",
    checkpointing: str = "none",
    sequence_parallel: bool = True,
    gpu_memory_gb: float = 80.0,
    micro_batches: int | None = None,
    attention: str = "flash",
    headroom: float = DEFAULT_HEADROOM,
    cp: int = 1,
) -> dict[str, Any]:
    """Memory per GPU (GB = 1e9 bytes) and whether it fits in (1 - headroom) of the GPU; activations need the model's
    shape.

    micro_batches is the number per optimizer step and pipeline; None assumes at least pp, so
    the first stage holds pp of them in flight. cp: context-parallel degree (dp counts data ranks only).
    """
    check_layout(shape, dp, tp, pp, zero)
    require_choice("precision", precision, tuple(STATE_BYTES))
    check_checkpointing(checkpointing)
    require_choice("attention", attention, ATTENTION)
    require_at_least("micro_batch", micro_batch, 1, "sequences per forward pass per GPU")
    require_at_least("seq_len", seq_len, 1, "tokens per sequence")
    if micro_batches is not None:
        require_at_least("micro_batches", micro_batches, 1, "micro-batches per optimizer step")
    require_positive("gpu_memory_gb", gpu_memory_gb, "one GPU's memory in GB, e.g. 80")
    require_fraction("headroom", headroom, "the share of GPU memory kept free, e.g. 0.1")
    check_context(seq_len, cp, pp, zero)
    weights, grads, optimizer = model_state_bytes(shape.params, dp * cp, tp, pp, zero, precision)
    states = weights + grads + optimizer

    activations = None
    if shape.known:
        assert shape.n_layers is not None and shape.d_model is not None and shape.n_heads is not None
        in_flight = pp if micro_batches is None else min(pp, micro_batches)

        # With cp, the keys and values gathered from the other GPUs' positions (2 tensors of 2 bytes).
        gathered = 4 * seq_len * micro_batch * shape.d_model / tp * (1 - 1 / cp)

        def per_layer(ck: str) -> float:
            own = activation_bytes_per_layer(
                seq_len // cp, micro_batch, shape.d_model, shape.n_heads, tp, sequence_parallel, ck, attention
            )  # type: ignore[arg-type]
            return own + (gathered if ck != "full" else 0.0)

        activations = per_layer(checkpointing) * -(-shape.n_layers // pp) * in_flight  # the stage with the most layers
        if checkpointing == "full":
            # subtle: backward recomputes one layer at a time, whose activations then coexist with
            # the checkpoints; with flash attention that layer stores no scores either.
            activations += per_layer("none")
        activations *= ACTIVATION_SCALE[precision]
    total = states + (activations or 0.0)
    usable_gb = gpu_memory_gb * (1 - headroom)
    warnings = shape_warnings(shape)
    if pp > 1 and zero >= 2:
        warnings.append(
            f"ZeRO-{zero} with pp = {pp}: kiln's FSDP2 keeps a pipeline stage's weights and gradients whole until "
            "the step's last micro-batch (ZeRO-1's memory); plan --zero 1 with pp > 1"
        )
    return {
        "params": shape.params,
        "gpus": dp * tp * pp * cp,
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "zero": zero,
        "precision": precision,
        "micro_batch": micro_batch,
        "seq_len": seq_len,
        "activation_checkpointing": checkpointing,
        "attention": attention,
        "sequence_parallel": sequence_parallel and tp > 1,
        "params_per_gpu": shape.params / (tp * pp),
        "weights_gb": weights / GB,
        "grads_gb": grads / GB,
        "optimizer_gb": optimizer / GB,
        "model_states_gb": states / GB,
        "activations_gb": None if activations is None else activations / GB,
        "total_gb": total / GB,
        "gpu_memory_gb": gpu_memory_gb,
        "headroom": headroom,
        "usable_gb": usable_gb,
        "fits": total / GB <= usable_gb,
        "warnings": warnings,
    }


def format_memory(r: dict[str, Any]) -> str:
    context = f" cp={r['cp']}" if r["cp"] > 1 else ""
    rows = [
        ("parameters", count(r["params"])),
        (
            "layout",
            (
                f"dp={r['dp']} tp={r['tp']} pp={r['pp']}{context} ({r['gpus']} GPU{'s' if r['gpus'] != 1 else ''}), "
                f"ZeRO stage {r['zero']}, {r['precision']}"
            ),
        ),
        ("parameters per GPU (after tp, pp)", count(r["params_per_gpu"])),
        ("weights (GB per GPU)", fixed(r["weights_gb"])),
        ("gradients (GB per GPU)", fixed(r["grads_gb"])),
        ("optimizer states (GB per GPU)", fixed(r["optimizer_gb"])),
        ("model states (GB per GPU)", fixed(r["model_states_gb"])),
        (
            "activations (GB per GPU)",
            "n/a (give --preset or --layers, --hidden, --heads)"
            if r["activations_gb"] is None
            else (
                f"{fixed(r['activations_gb'])} (micro-batch {r['micro_batch']} x {r['seq_len'] // r['cp']} tokens, "
                f"checkpointing {r['activation_checkpointing']}, {r['attention']} attention)"
            ),
        ),
        ("total (GB per GPU)", fixed(r["total_gb"])),
        (
            "fits",
            f"{'yes' if r['fits'] else 'no'} ({fixed(r['usable_gb'])} GB usable of {r['gpu_memory_gb']:g} GB per GPU)",
        ),
    ]
    notes = ["activations not included in the total"] if r["activations_gb"] is None else []
    notes.append(
        f"usable = GPU memory less {r['headroom']:.0%} headroom for the output logits, communication buffers, "
        "fragmentation and the CUDA context (--headroom)"
    )
    if r["attention"] == "flash" and r["activation_checkpointing"] == "selective":
        notes.append(
            "with flash attention selective recompute saves nothing: the kernel already recomputes the attention "
            "scores in backward"
        )
    if r["zero"] >= 2:
        notes.append(
            "ZeRO-2/3 shard gradients only if they are reduce-scattered after every micro-batch (m x the gradient "
            "traffic with m micro-batches per step); ZeRO-3 also re-gathers the weights for every micro-batch"
        )
    return table(rows, notes, warnings=r["warnings"])
