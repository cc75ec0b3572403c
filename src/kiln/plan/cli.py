"""Argument parsing and dispatch for `kiln plan <subcommand>` (the CLI layer).

kiln.verbs declares each subcommand, naming its flags here (`<name>_arguments`) and the function
that computes it (`<name>`: parsed arguments -> result and its table format); run_plan prints one.
Each subcommand prints a table, or with --json one JSON object whose
fields docs/planning.md lists with their units (`kiln plan --json SUBCOMMAND` works too). `kiln plan`
with no subcommand (the recipe's own compute) is kiln.commands', since it reads a whole recipe.
A subcommand's errors are reported as `kiln plan SUBCOMMAND: error: ...`, exit 2.
Numbers accept 7e9, 7B, 1.4T, 500K or 70M, and negative ones (`--flops -1e23`) parse so that
the module can reject them by name. Not handled here: any computation (each lives in its own
kiln.plan module) or checks of values (the modules raise ConfigError naming the input).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
DEFAULT_SEQ_LEN = 2048  # tokens, for --params without a preset


def number(text: str) -> float:
    """'7e9', '7B', '1.4T', '500k' -> float."""
    s = text.strip().replace("_", "").replace(",", "")
    scale = SUFFIXES.get(s[-1:].lower(), 1.0)
    if scale != 1.0:
        s = s[:-1]
    try:
        value = float(s) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (examples: 7e9, 7B, 1.4T, 500K)") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


class PlanParser(argparse.ArgumentParser):
    """A subcommand's parser: negative numbers such as -1e23 or -7B are values, not options, and
    --help shows each real default (HelpFormatter).

    argparse only treats -5 and -.5 as numbers; everything else after a dash looked like an
    unknown option, so `--flops -1e23` failed with "expected one argument" before the module
    could say "must be above 0". No kiln plan option name starts with a digit, so this is safe.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "formatter_class": HelpFormatter})
        self._negative_number_matcher = re.compile(r"^-(\d[\d_,]*\.?\d*|\.\d+)(e[+-]?\d+)?[kmbt]?$", re.IGNORECASE)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows `(default: X)` only for real defaults; options whose default is None or off say theirs in words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _json(p: argparse.ArgumentParser, inherit: bool = True) -> None:
    # subtle: `kiln plan` has its own --json; a subcommand's default would overwrite the parent's
    # True (`kiln plan --json flops ...`), so subcommands leave the attribute unset unless given.
    p.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if inherit else False,
        help="Print one JSON object (fields in docs/planning.md) instead of the table.",
    )


def _model(p: argparse.ArgumentParser, shape: bool) -> None:
    from kiln.model.presets import PRESETS

    p.add_argument("--params", type=number, help="Parameters N (e.g. 7e9 or 7B).")
    p.add_argument(
        "--preset", choices=list(PRESETS), help="A kiln model preset (kiln.model.presets); its exact counts are used."
    )
    if shape:
        p.add_argument("--layers", type=int, help="Transformer layers, with --params (for activations and pp).")
        p.add_argument("--hidden", type=int, help="Hidden size d_model, with --params.")
        p.add_argument("--heads", type=int, help="Attention heads, with --params (tp must divide them).")


def _gpu(p: argparse.ArgumentParser, memory: bool) -> None:
    from kiln.plan.hardware import GPUS

    names = ", ".join(f"{k} ({g.peak_flops / 1e12:g} TFLOP/s, {g.memory_gb:g} GB)" for k, g in GPUS.items())
    p.add_argument(
        "--gpu",
        choices=list(GPUS),
        default=None,
        help=f"GPU preset, dense bf16 peak and memory: {names}. Default: h100"
        + ("." if memory else ", unless --peak-tflops alone describes another GPU."),
    )
    if memory:
        p.add_argument(
            "--gpu-memory-gb", type=float, help="Memory of one GPU in GB (1e9 bytes); overrides the preset's."
        )
    else:
        p.add_argument(
            "--peak-tflops",
            type=float,
            help="Peak TFLOP/s of one GPU; overrides the preset's (e.g. 1000 for a round H100 figure).",
        )


def flops_arguments(p: argparse.ArgumentParser) -> None:
    _model(p, shape=False)
    p.add_argument("--tokens", type=number, required=True, help="Training tokens D.")
    p.add_argument(
        "--seq-len",
        type=int,
        help="Sequence length T (default: the preset's max_seq_len; with --params, needed for the attention term).",
    )
    p.add_argument("--layers", type=int, help="Layers L, with --params (not --preset), for the attention term.")
    p.add_argument(
        "--d-attn",
        type=int,
        help="Attention width H*Q (heads x head dim), with --params (not --preset), for the attention term.",
    )
    _json(p)


def chinchilla_arguments(p: argparse.ArgumentParser) -> None:
    from kiln.plan.hardware import DEFAULT_MFU

    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--flops", type=number, help="Training compute budget in FLOPs.")
    budget.add_argument("--usd", type=number, help="Dollar budget for GPU time (needs --usd-per-gpu-hour).")
    budget.add_argument(
        "--params", type=number, help="A fixed model size: the tokens and compute for which it is optimal."
    )
    p.add_argument(
        "--fit",
        choices=["rule20", "hoffmann", "epoch"],
        default="rule20",
        help=(
            "rule20: 20 tokens per parameter; hoffmann / epoch: the parametric loss with Hoffmann et al. 2022's or "
            "Besiroglu et al. 2024's coefficients (also predicts the loss)."
        ),
    )
    _gpu(p, memory=False)
    p.add_argument(
        "--mfu",
        type=float,
        default=DEFAULT_MFU,
        help="Model FLOPs utilisation, the fraction of peak achieved (0 < mfu <= 1).",
    )
    p.add_argument("--gpus", type=int, default=1, help="GPUs training in parallel, for the days.")
    p.add_argument("--usd-per-gpu-hour", type=number, help="Price of one GPU for one hour (USD).")
    _json(p)


def inference_aware_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--inference-tokens",
        type=number,
        required=True,
        help="Tokens the model will process over its lifetime at inference.",
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--loss", type=float, help="Target loss in nats/token.")
    target.add_argument(
        "--flops", type=number, help="Target: the loss of the compute-optimal model for this training budget."
    )
    target.add_argument("--params", type=number, help="Target: the loss of the Chinchilla-optimal model of this size.")
    p.add_argument("--fit", choices=["hoffmann", "epoch"], default="epoch", help="Coefficients of the parametric loss.")
    _json(p)


def memory_arguments(p: argparse.ArgumentParser) -> None:
    _model(p, shape=True)
    p.add_argument("--dp", type=int, default=1, help="Data-parallel degree (ZeRO shards over it).")
    p.add_argument("--tp", type=int, default=1, help="Tensor-parallel degree (must divide the heads).")
    p.add_argument("--pp", type=int, default=1, help="Pipeline-parallel degree (must divide the layers).")
    p.add_argument(
        "--cp",
        type=int,
        default=1,
        help=(
            "Context-parallel degree: each sequence split over this many GPUs (seq_len must split into 2 x cp chunks; "
            "ZeRO 2 or 3)."
        ),
    )
    p.add_argument(
        "--zero",
        type=int,
        default=0,
        help="ZeRO stage: 0 (DDP), 1 (optimizer), 2 (+ gradients), 3 (+ weights; = FSDP full shard).",
    )
    _micro(p)
    p.add_argument(
        "--activation-checkpointing",
        choices=["none", "selective", "full"],
        default="none",
        help="Activation recompute (with flash attention selective stores the same as none).",
    )
    p.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Megatron sequence parallelism with tp > 1.",
    )
    _attention(p)
    _gpu(p, memory=True)
    _json(p)


def layout_arguments(p: argparse.ArgumentParser) -> None:
    _model(p, shape=True)
    p.add_argument("--gpus", type=int, required=True, help="GPUs in all.")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (tp stays inside one).")
    _micro(p)
    p.add_argument(
        "--global-batch",
        type=int,
        help=(
            "Sequences per optimizer step (default: 4 x pp micro-batches per data-parallel rank, 1 without a pipeline)."
        ),
    )
    p.add_argument("--tp", type=int, help="Fix the tensor-parallel degree.")
    p.add_argument("--pp", type=int, help="Fix the pipeline-parallel degree.")
    p.add_argument(
        "--cp",
        type=int,
        help="Fix the context-parallel degree (by default 1 unless sequences do not fit whole without full recompute).",
    )
    p.add_argument("--zero", type=int, help="Fix the ZeRO stage.")
    p.add_argument(
        "--activation-checkpointing",
        choices=["none", "selective", "full"],
        help=(
            "Fix the activation recompute (default: the cheapest that fits: none, selective with eager attention, "
            "then full)."
        ),
    )
    _attention(p)
    _gpu(p, memory=True)
    _json(p)


def checkpoint_interval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--write-minutes", type=float, required=True, help="Minutes one checkpoint blocks training.")
    p.add_argument("--mtbf-minutes", type=float, help="Mean time between failures of the whole job, in minutes.")
    p.add_argument("--gpus", type=int, help="GPUs in the job (with --failures-per-gpu-day, instead of --mtbf-minutes).")
    p.add_argument(
        "--failures-per-gpu-day", type=float, help="Failures per GPU per day (e.g. 5.5e-4 for one per GPU per 5 years)."
    )
    p.add_argument("--restart-minutes", type=float, default=0.0, help="Minutes to restart and reload after a failure.")
    _json(p)


def fit_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--runs", type=Path, nargs="+", help="Run directories, or folders of them (e.g. runs/demo/sweep).")
    src.add_argument("--csv", type=Path, help="CSV with columns params, tokens, loss (and optionally name).")
    p.add_argument(
        "--param-count",
        choices=["non_embedding", "total"],
        default="non_embedding",
        help=(
            "Which parameter count of kiln runs is N: non_embedding (Kaplan et al.; at sweep scale embeddings are "
            "most of the model) or total (Hoffmann et al.)."
        ),
    )
    p.add_argument(
        "--target-params",
        type=number,
        help="Predict the loss at this N, in the fit's own count (with --target-tokens).",
    )
    p.add_argument("--target-tokens", type=number, help="Predict the loss at this D (with --target-params).")
    p.add_argument("--bootstrap", type=int, default=100, help="Bootstrap resamples for the intervals (0 for none).")
    p.add_argument(
        "--starts", type=int, default=8, help="L-BFGS starts: the best of Hoffmann's 4,500-point initialisation grid."
    )
    p.add_argument("--seed", type=int, default=0, help="Seed of the bootstrap.")
    p.add_argument("--plot", type=Path, help="Write a PNG (.png) of the runs and fitted curves here.")
    _json(p)


def _attention(p: argparse.ArgumentParser) -> None:
    from kiln.plan.memory import ATTENTION, DEFAULT_HEADROOM

    p.add_argument(
        "--attention",
        choices=list(ATTENTION),
        default="flash",
        help=(
            "flash: fused SDPA kernels (kiln's model) never store the s x s attention scores; eager: they are stored "
            "(Korthikanti's 5as/h term)."
        ),
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=DEFAULT_HEADROOM,
        help=(
            "Share of each GPU's memory kept free for logits, communication buffers, fragmentation and the CUDA "
            "context; fits means total <= (1 - headroom) x memory."
        ),
    )


def _micro(p: argparse.ArgumentParser) -> None:
    p.add_argument("--micro-batch", type=int, default=1, help="Sequences per forward pass per GPU.")
    p.add_argument(
        "--seq-len",
        type=int,
        help=f"Sequence length in tokens (default: the preset's max_seq_len, else {DEFAULT_SEQ_LEN}).",
    )
    p.add_argument(
        "--precision",
        choices=["bf16", "fp16", "fp32"],
        default="bf16",
        help="bf16/fp16: mixed precision (2+2+12 bytes/param); fp32: 4+4+8.",
    )


def _shape(args: argparse.Namespace) -> tuple[Any, int]:
    """The model's Shape and the default sequence length, from --preset or --params [+ shape flags]."""
    from kiln.core.errors import ConfigError
    from kiln.model.config import get_preset
    from kiln.plan.memory import Shape

    shape_flags = {k: getattr(args, k) for k in ("layers", "hidden", "heads") if getattr(args, k, None) is not None}
    if (args.preset is None) == (args.params is None):
        raise ConfigError("give exactly one of --params N or --preset NAME")
    if args.preset is not None:
        if shape_flags:
            raise ConfigError(f"--{', --'.join(shape_flags)} only go with --params; a preset has its own shape")
        cfg = get_preset(args.preset)
        return Shape.from_config(cfg), cfg.max_seq_len
    return Shape(args.params, args.layers, args.hidden, args.heads), DEFAULT_SEQ_LEN


def _seq_len(args: argparse.Namespace, default: int) -> int:
    # subtle: `args.seq_len or default` would turn --seq-len 0 into the default; 0 must reach the check.
    return default if args.seq_len is None else args.seq_len


def flops(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[dict[str, Any]], str]]:
    from kiln.plan.flops import count_flops, format_flops

    return count_flops(args.tokens, args.params, args.preset, args.seq_len, args.layers, args.d_attn), format_flops


def chinchilla(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[dict[str, Any]], str]]:
    from kiln.plan.chinchilla import format_size, size_for_budget
    from kiln.plan.hardware import resolve_gpu

    gpu = resolve_gpu(args.gpu, args.peak_tflops)
    return size_for_budget(
        args.fit, gpu, args.mfu, args.gpus, args.flops, args.usd, args.params, args.usd_per_gpu_hour
    ), format_size


def inference_aware(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[dict[str, Any]], str]]:
    from kiln.plan.inference import format_inference, inference_aware
    from kiln.plan.scaling import get_law

    return inference_aware(
        get_law(args.fit), args.inference_tokens, args.loss, args.flops, args.params
    ), format_inference


def memory(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[dict[str, Any]], str]]:
    from kiln.plan.hardware import resolve_gpu
    from kiln.plan.memory import format_memory, plan_memory

    shape, seq_len = _shape(args)
    gpu = resolve_gpu(args.gpu, None, args.gpu_memory_gb)
    r = plan_memory(
        shape,
        args.dp,
        args.tp,
        args.pp,
        args.zero,
        args.micro_batch,
        _seq_len(args, seq_len),
        args.precision,
        args.activation_checkpointing,
        args.sequence_parallel,
        gpu.memory_gb,
        attention=args.attention,
        headroom=args.headroom,
        cp=args.cp,
    )
    return r, format_memory


def layout(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[dict[str, Any]], str]]:
    from kiln.plan.hardware import resolve_gpu
    from kiln.plan.layout import format_layout, propose_layout

    shape, seq_len = _shape(args)
    gpu = resolve_gpu(args.gpu, None, args.gpu_memory_gb)
    r = propose_layout(
        shape,
        args.gpus,
        args.gpus_per_node,
        gpu.memory_gb,
        _seq_len(args, seq_len),
        args.micro_batch,
        args.global_batch,
        args.precision,
        args.tp,
        args.pp,
        args.zero,
        args.activation_checkpointing,
        args.attention,
        args.headroom,
        args.cp,
    )
    return r, format_layout


def checkpoint_interval(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[dict[str, Any]], str]]:
    from kiln.plan.checkpoint_interval import format_interval, plan_interval

    return plan_interval(
        args.write_minutes, args.mtbf_minutes, args.gpus, args.failures_per_gpu_day, args.restart_minutes
    ), format_interval


def fit(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[dict[str, Any]], str]]:
    from kiln.plan.fit import fit_runs, format_fit, read_csv, read_runs

    if args.plot is not None:
        from kiln.plan.fit_plot import check_plot_path

        check_plot_path(args.plot)  # before the fit, so a bad path costs nothing
    runs = read_csv(args.csv) if args.csv is not None else read_runs(args.runs, args.param_count)
    result = fit_runs(runs, args.starts, args.bootstrap, args.seed, args.target_params, args.target_tokens)
    result["param_count"] = None if args.csv is not None else args.param_count
    result["plot"] = None
    if args.plot is not None:
        from kiln.plan.fit_plot import plot_fit

        result["plot"] = str(plot_fit(result, args.plot))

    def fmt(r: dict[str, Any]) -> str:
        return format_fit(r) + (f"\nplot: {r['plot']}" if r["plot"] else "")

    return result, fmt


def run_plan(
    args: argparse.Namespace, compute: Callable[[argparse.Namespace], tuple[Any, Callable[[Any], str]]]
) -> int:
    """Run `kiln plan SUBCOMMAND`: compute is its function (flops, chinchilla, ...).

    A subcommand's KilnError is reported here as `kiln plan SUBCOMMAND: error: ...` (exit 2), the
    same prefix argparse gives its usage errors.
    """
    command = args.plan_command
    from kiln.core.errors import KilnError

    try:
        result, fmt = compute(args)
        require_finite(result)
    except KilnError as e:
        print(f"kiln plan {command}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, allow_nan=False) if args.json else fmt(result))
    return 0


def require_finite(result: Any, where: str = "") -> None:
    """Every number in a result is finite: inputs that overflow (an infinite budget or cost) are
    refused, naming the field, rather than printed as Infinity, which is not JSON."""
    from kiln.core.errors import ConfigError

    if isinstance(result, float) and not math.isfinite(result):
        raise ConfigError(
            f"the inputs overflow: {where or 'the result'} comes out as {result}; give smaller (or larger) values "
            "so every figure fits a float"
        )
    if isinstance(result, dict):
        for key, value in result.items():
            require_finite(value, f"{where}.{key}" if where else str(key))
    elif isinstance(result, list | tuple):
        for i, value in enumerate(result):
            require_finite(value, f"{where}[{i}]")
