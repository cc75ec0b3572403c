"""Training tokens/s of kiln's trainer against a plain PyTorch loop and Hugging Face's Llama, same work.

Four measurements train the recipe's model shape (default: the demo's 5M-parameter decoder,
without its QK-norm, which LlamaForCausalLM lacks) on the same token batches, in the same precision, with the same
optimizer:
  kiln    kiln.train.loop.train(), the train stage's own step path (collator, loss, clipping,
          AdamW, lr schedule, metrics.jsonl, TensorBoard, the progress bar), on the run's token
          shards through kiln's sampler and collator; tokens/s from its metrics.jsonl; eager,
          with kiln's default train.fused_loss (the cross-entropy through the output layer in
          chunks, kiln.train.loss.fused_lm_loss).
  kiln_compiled  the same with train.compile=true (the blocks and the loss's chunks through
          torch.compile; kiln's default on cuda, one --set away on a CPU).
  torch   a Llama-style decoder written below (nn.RMSNorm, rotate-half RoPE, SwiGLU, GQA through
          SDPA's enable_gqa) in a plain loop: forward, fp32 cross-entropy, backward, clipping, AdamW.
  hf      transformers.LlamaForCausalLM (SDPA attention, no KV cache) in the same plain loop.
All start from kiln's initial weights for train.seed and read the batches kiln's collator
draws (the references get them drawn beforehand, so they pay nothing for data): their losses
agree, which shows they did the same computation. AdamW with kiln's betas, eps, weight decay on
matrices and the lr schedule of kiln.train.schedule; one optimizer step is train.global_batch_tokens.
Each measurement is a fresh model: `--warmup` untimed steps (compilation included), then `--steps`
timed ones. The four take turns, in a rotating order, `--repeats` times, so load from other processes falls on all of
them alike; the best of the repeats counts. On a CUDA device kiln also trains the gpt2-124m and
llama-1b presets (bf16, torch.compile) and MFU is printed against the GPU's dense bf16 peak.
The references run eager, as written: neither has a compile switch of its own.
Ends with: RESULT kiln_tokens_per_s=.. kiln_compiled_tokens_per_s=.. torch_tokens_per_s=..
hf_tokens_per_s=.. ratio_vs_fastest=.. (kiln's faster variant over the faster reference)
ratio_eager_vs_fastest=.. ratio_vs_torch=.. ratio_vs_hf=.. params=.. [mfu=.. mfu_gpt2_124m=..
mfu_llama_1b=..] (MFU only where the device's peak is known; mfu is kiln's on the recipe's model).
Not compared: other objectives than plain next-token prediction, Muon, several processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch import nn

from kiln.core.layout import RunLayout
from kiln.core.manifest import read_manifest
from kiln.mix.sampler import build_sampler
from kiln.model.batch import BatchSource
from kiln.model.config import ModelConfig, ScoringConfig, count_params, flops_per_token, get_preset
from kiln.model.hf import hf_config, to_hf_state
from kiln.model.init import build_model
from kiln.model.precision import Precision
from kiln.recipe import Recipe, load_recipe
from kiln.text.tokenizer import KilnTokenizer
from kiln.train.collate import build_collator
from kiln.train.config import OptimConfig, TrainConfig
from kiln.train.loop import train
from kiln.train.monitor import device_peak_flops
from kiln.train.objectives import token_ids
from kiln.train.optim import FUSED_ADAMW_DEVICES
from kiln.train.parts import TrainData, Validation, build_precision
from kiln.train.schedule import lr_at

IMPLEMENTATIONS = ("kiln", "kiln_compiled", "torch", "hf")
# CUDA only: kiln alone on the two presets, bf16 and compiled; (seq_len, micro-batch rows,
# tokens per optimizer step): micro-batches of 64K and 16K tokens fit one 80 GB H100 without
# activation checkpointing (gpt2-124m peaks at 25 GB). Its MFU on an H100 was
# 40.9% with 64 rows against 40.2% with 32 (its matmuls are narrow, 768 wide; 128 rows added no more).
PRESET_RUNS = {"gpt2-124m": (1024, 64, 262144), "llama-1b": (2048, 8, 131072)}

Step = list[tuple[torch.Tensor, torch.Tensor]]  # one optimizer step: (input ids, targets) per micro-batch


@dataclass(frozen=True)
class Measurement:
    tokens_per_s: float  # over the timed steps
    loss: float  # training loss of the last step (nats/token)


# --- data: kiln's own stream ----------------------------------------------------------------


def batch_source(recipe: Recipe, cfg: TrainConfig) -> BatchSource:
    """The BatchSource the train stage builds: kiln's sampler over the run's token shards, the objective's collator."""
    layout = RunLayout(recipe.run_dir)
    return build_collator(
        build_sampler(layout.token_shards, recipe.mix, cfg.seq_len),
        cfg,
        token_ids(KilnTokenizer.load(layout.tokenizer_json)),
    )


def draw_steps(recipe: Recipe, cfg: TrainConfig) -> list[Step]:
    """Every step's micro-batches as kiln's loop draws them (a fresh stream starts at row 0 each time)."""
    batches = batch_source(recipe, cfg)
    steps = []
    for step in range(1, cfg.steps + 1):
        shape = cfg.geometry(step)
        drawn = [batches.next_batch(rows, shape.seq_len, shape.progress) for rows in shape.micro_batches]
        steps.append([(b.input_ids_BT, b.targets_BT) for b in drawn])
    return steps


def benchmark_config(cfg: TrainConfig, steps: int) -> TrainConfig:
    """cfg for a short timed run: no validation before step 1, no resumable states, one lr warmup step."""
    return cfg.model_copy(
        update={
            "steps": steps,
            "eval_at_start": False,
            "eval_every": None,
            "schedule": cfg.schedule.model_copy(update={"warmup_steps": 1, "warmup_fraction": None}),
            "checkpoint": cfg.checkpoint.model_copy(update={"every": None}),
        }
    )


# --- kiln -----------------------------------------------------------------------------------


def measure_kiln(recipe: Recipe, model_cfg: ModelConfig, cfg: TrainConfig, warmup: int) -> Measurement:
    """kiln's train() in a throwaway folder; tokens/s of steps warmup+1.. from its metrics.jsonl.

    Untimed by the metrics: model build, the final validation (a single window here) and checkpoint.
    """
    with tempfile.TemporaryDirectory() as tmp:
        scoring = ScoringConfig(max_tokens_per_source=cfg.seq_len + 1, batch_size=1)
        train(model_cfg, cfg, TrainData(batch_source(recipe, cfg)), Validation(recipe.run_dir, scoring), Path(tmp))
        lines = (Path(tmp) / RunLayout(recipe.run_dir).metrics.name).read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "tokens_per_s" in r]
    # elapsed_s is taken when each step's record is written (after its host sync), so the
    # difference spans exactly the timed steps, everything the loop does between them included.
    seconds = steps[-1]["elapsed_s"] - steps[warmup - 1]["elapsed_s"]
    return Measurement(sum(r["tokens"] for r in steps[warmup:]) / seconds, steps[-1]["loss"])


# --- the plain PyTorch reference ---------------------------------------------------------------
# Shape legend: B batch, T sequence, D d_model, H query heads, K key/value heads, E head dim.


def rope(x_BHTE: torch.Tensor, cos_TE2: torch.Tensor, sin_TE2: torch.Tensor) -> torch.Tensor:
    """Rotate (first half, second half) pairs by each position's angles (Hugging Face's layout)."""
    x1, x2 = x_BHTE.chunk(2, dim=-1)
    return torch.cat((x1 * cos_TE2 - x2 * sin_TE2, x2 * cos_TE2 + x1 * sin_TE2), dim=-1).type_as(x_BHTE)


class RefAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.h, self.k, self.e = cfg.n_heads, cfg.kv_heads, cfg.head_width
        self.wq = nn.Linear(cfg.d_model, self.h * self.e, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.k * self.e, bias=False)
        self.wv = nn.Linear(cfg.d_model, self.k * self.e, bias=False)
        self.wo = nn.Linear(self.h * self.e, cfg.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        q = rope(self.wq(x_BTD).view(B, T, self.h, self.e).transpose(1, 2), cos, sin)
        k = rope(self.wk(x_BTD).view(B, T, self.k, self.e).transpose(1, 2), cos, sin)
        v = self.wv(x_BTD).view(B, T, self.k, self.e).transpose(1, 2)
        y_BHTE = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.k != self.h)
        return self.wo(y_BHTE.transpose(1, 2).reshape(B, T, self.h * self.e))


class RefMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.w_down = nn.Linear(cfg.hidden, cfg.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x_BTD)) * self.w_up(x_BTD))


class RefBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm, self.mlp_norm = (
            nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps),
            nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps),
        )
        self.attn, self.mlp = RefAttention(cfg), RefMLP(cfg)

    def forward(self, x_BTD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x_BTD = x_BTD + self.attn(self.attn_norm(x_BTD), cos, sin)
        return x_BTD + self.mlp(self.mlp_norm(x_BTD))


class RefLlama(nn.Module):
    """Module names follow kiln's, so kiln's state dict loads as it is."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.vocab_size is not None
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(RefBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_width, 2, dtype=torch.float32) / cfg.head_width)
        angles_TE2 = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles_TE2.cos(), persistent=False)
        self.register_buffer("sin", angles_TE2.sin(), persistent=False)

    def forward(self, idx_BT: torch.Tensor) -> torch.Tensor:
        T = idx_BT.shape[1]
        x_BTD = self.embed(idx_BT)
        for block in self.blocks:
            x_BTD = block(x_BTD, self.cos[:T], self.sin[:T])
        return self.lm_head(self.norm(x_BTD))


# --- Hugging Face ----------------------------------------------------------------------------


def hf_llama(cfg: ModelConfig, kiln_state: dict[str, torch.Tensor]) -> transformers.LlamaForCausalLM:
    """LlamaForCausalLM of kiln's shape holding kiln's weights (the config and names `kiln export` writes)."""
    settings = {
        k: v
        for k, v in hf_config(cfg, eot_id=0, pad_id=1).items()
        if k not in ("architectures", "model_type", "torch_dtype")
    }
    # use_cache off: a training loop keeps no KV cache (forward would fill a DynamicCache).
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**settings | {"use_cache": False}, attn_implementation="sdpa")
    )
    missing, unexpected = model.load_state_dict(to_hf_state(kiln_state, cfg), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # a tied head is the embedding
    return model


# --- the references' loop --------------------------------------------------------------------


def adamw(model: nn.Module, o: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW as kiln configures it by default: weight decay on matrices (embedding included), not on norm gains, the
    fused kernel where kiln uses it."""
    params = list(model.parameters())  # a tied weight comes once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=1e-8, fused=device.type in FUSED_ADAMW_DEVICES
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host sync: the clock reads finished work


def measure_reference(
    model: nn.Module,
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    steps: list[Step],
    cfg: TrainConfig,
    precision: Precision,
    warmup: int,
) -> Measurement:
    """A plain training loop: forward, fp32 cross-entropy, backward per micro-batch, then clip and step."""
    device, s = precision.device, cfg.schedule
    model.to(device).train()
    optimizer = adamw(model, cfg.optim, device)
    t0, step_loss = time.perf_counter(), torch.zeros(())
    for step, micro_batches in enumerate(steps, start=1):
        if step == warmup + 1:
            synchronize(device)
            t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(
                step, cfg.optim.lr, cfg.warmup_steps, cfg.steps, s.min_lr_ratio, s.kind, s.decay_fraction
            )
        step_loss = torch.zeros((), device=device)
        for ids_BT, targets_BT in micro_batches:
            ids_BT, targets_BT = ids_BT.to(device, non_blocking=True), targets_BT.to(device, non_blocking=True)
            with precision.autocast():
                logits_BTV = logits_of(ids_BT)
            loss = F.cross_entropy(logits_BTV.float().flatten(0, 1), targets_BT.flatten()) / len(micro_batches)
            loss.backward()
            step_loss += loss.detach()  # no host sync inside the timed steps
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    seconds = time.perf_counter() - t0
    return Measurement(sum(ids.numel() for micro in steps[warmup:] for ids, _ in micro) / seconds, float(step_loss))


# --- the run ---------------------------------------------------------------------------------


def check_comparable(model_cfg: ModelConfig, cfg: TrainConfig) -> None:
    """The references implement plain Llama next-token training with AdamW; stop on anything else."""
    unsupported = {
        "model.activation": model_cfg.activation != "swiglu",
        "model.qk_norm": model_cfg.qk_norm,
        "model.logit_softcap": model_cfg.logit_softcap is not None,
        "model.z_loss": model_cfg.z_loss > 0,
        "train.objective": cfg.objectives.keys() != {"clm"} or cfg.masks_documents("clm"),
        "train.late_position_weight": cfg.late_position_weight > 0,
        "train.optim": cfg.optim.name != "adamw" or not cfg.optim.decay_embeddings or cfg.optim.decay_norms,
        "train.precision.dtype": cfg.precision.dtype == "fp16",
    }
    if any(unsupported.values()):
        raise SystemExit(
            f"the references cannot reproduce {[k for k, v in unsupported.items() if v]}; benchmark a recipe with "
            "kiln's defaults for them"
        )


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight counts once


def compare(
    recipe: Recipe, model_cfg: ModelConfig, args: argparse.Namespace, precision: Precision
) -> dict[str, list[Measurement]]:
    """The four measurements, `--repeats` turns each in a rotating order; their results."""
    cfg = benchmark_config(recipe.train, args.warmup + args.steps)
    check_comparable(model_cfg, cfg)
    steps = draw_steps(recipe, cfg)
    kiln_model = build_model(model_cfg, cfg.seed, "cpu")  # the weights train() starts from
    kiln_state = kiln_model.state_dict()

    def torch_model() -> RefLlama:
        model = RefLlama(model_cfg)
        model.load_state_dict(kiln_state)
        return model

    params = {"kiln": count(kiln_model), "torch": count(torch_model()), "hf": count(hf_llama(model_cfg, kiln_state))}
    print(f"params: {', '.join(f'{k} {n:,}' for k, n in params.items())}")
    assert len(set(params.values())) == 1, f"the three models differ in size: {params}"
    print(
        f"model d={model_cfg.d_model} layers={model_cfg.n_layers} heads={model_cfg.n_heads}/{model_cfg.kv_heads} "
        f"ffn={model_cfg.hidden} vocab={model_cfg.vocab_size} tied={model_cfg.tie_embeddings}; "
        f"{cfg.tokens_per_step:,} tokens/step ({cfg.grad_accum_steps} x {cfg.micro_batch_size} x {cfg.seq_len}); "
        f"{precision.device}, {precision.amp_dtype or torch.float32}, "
        f"{torch.get_num_threads()} threads; {args.warmup} warmup + {args.steps} timed steps, {args.repeats} repeats",
        flush=True,
    )

    def run_torch() -> Measurement:
        model = torch_model()
        return measure_reference(model, model, steps, cfg, precision, args.warmup)

    def run_hf() -> Measurement:
        model = hf_llama(model_cfg, kiln_state)
        return measure_reference(
            model, lambda ids_BT: model(input_ids=ids_BT).logits, steps, cfg, precision, args.warmup
        )

    runs = {
        "kiln": lambda: measure_kiln(recipe, model_cfg, cfg.model_copy(update={"compile": False}), args.warmup),
        "kiln_compiled": lambda: measure_kiln(recipe, model_cfg, cfg.model_copy(update={"compile": True}), args.warmup),
        "torch": run_torch,
        "hf": run_hf,
    }
    results: dict[str, list[Measurement]] = {name: [] for name in IMPLEMENTATIONS}
    for r in range(args.repeats):
        for name in IMPLEMENTATIONS[r % len(IMPLEMENTATIONS) :] + IMPLEMENTATIONS[: r % len(IMPLEMENTATIONS)]:
            m = runs[name]()
            results[name].append(m)
            print(
                f"repeat {r + 1}  {name:<13} {m.tokens_per_s:>10,.0f} tokens/s  last-step loss {m.loss:.4f}", flush=True
            )
    return results


def preset_config(
    recipe: Recipe, seq_len: int, rows: int, tokens: int, device: str = "cuda", **update: Any
) -> TrainConfig:
    """recipe.train for a run of seq_len x rows micro-batches and `tokens` per step: compiled and in bf16
    on CUDA, eager fp32 on a CPU; `update` overrides other keys."""
    return TrainConfig.model_validate(
        {
            **recipe.train.model_dump(),
            "seq_len": seq_len,
            "micro_batch_size": rows,
            "global_batch_tokens": tokens,
            "compile": device == "cuda",
            "precision": {"device": device, "dtype": "bf16" if device == "cuda" else "fp32"},
            **update,
        }
    )


def measure_mfu(
    recipe: Recipe, model_cfg: ModelConfig, cfg: TrainConfig, warmup: int, steps: int, peak: float | None
) -> tuple[Measurement, float | None]:
    """measure_kiln over warmup + steps steps, and its MFU against `peak` (None where the peak is unknown)."""
    m = measure_kiln(recipe, model_cfg, benchmark_config(cfg, warmup + steps), warmup)
    return m, m.tokens_per_s * flops_per_token(model_cfg, cfg.seq_len) / peak if peak else None


def preset_mfu(recipe: Recipe, name: str, args: argparse.Namespace, peak: float) -> float:
    """kiln's trainer on a preset's shape (published vocabulary) in bf16 with torch.compile, on the run's data."""
    seq_len, rows, tokens = PRESET_RUNS[name]
    model_cfg = get_preset(name)
    # A fresh compile, as a run of this preset gets: blocks compiled before for another shape would make
    # torch.compile recompile them with dynamic shapes (gpt2-124m: 38.7% MFU on an H100 against 40.9%).
    torch.compiler.reset()
    m, mfu = measure_mfu(recipe, model_cfg, preset_config(recipe, seq_len, rows, tokens), args.warmup, args.steps, peak)
    assert mfu is not None
    print(
        (
            f"{name}: {count_params(model_cfg):,} params, {tokens:,} tokens/step ({tokens // (rows * seq_len)} x "
            f"{rows} x {seq_len}), bf16, compiled: {m.tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%}"
        ),
        flush=True,
    )
    return mfu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--recipe",
        default="demo",
        help="Recipe whose finished tokenize stage gives the data, and whose model and train sections are measured.",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="Recipe override a.b=v (repeatable), e.g. train.compile=true.",
    )
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        help="train.precision.dtype for all three (default: the recipe's; auto is fp32 on a CPU, bf16 on cuda).",
    )
    parser.add_argument("--steps", type=int, default=10, help="Timed optimizer steps per measurement.")
    parser.add_argument(
        "--warmup", type=int, default=2, help="Untimed steps before them (allocator, kernel selection, compilation)."
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="Measurements of each implementation, taken in turn; the best counts."
    )
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--warmup, --steps and --repeats must be at least 1")
    # The references are plain Llama (LlamaForCausalLM has no QK-norm), so the recipe's model is measured without it.
    recipe = load_recipe(
        args.recipe,
        ["model.qk_norm=false", *args.overrides]
        + ([f"train.precision.dtype={args.precision}"] if args.precision else []),
    )
    if not RunLayout(recipe.run_dir).tokenizer_json.is_file():
        raise SystemExit(
            f"{recipe.run_dir} has no tokenized data; run `kiln demo` (or the recipe's stages up to tokenize) first"
        )
    precision = build_precision(recipe.train)  # also train.threads, for all three alike
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if precision.device.type == "cpu" and load > cores / 2:
        # Measured here: with 2 threads on 2 busy cores, single measurements swung by 2.8x.
        print(
            f"warning: load average {load:.1f} on {cores} cores: other processes compete for the CPU and torch's "
            "threads wait on each other; "
            "figures will scatter (train.threads=1 scatters less)",
            flush=True,
        )
    model_cfg = recipe.model.resolved(read_manifest(RunLayout(recipe.run_dir).token_shards)["counts"]["vocab_size"])

    results = compare(recipe, model_cfg, args, precision)
    best = {name: max(m.tokens_per_s for m in ms) for name, ms in results.items()}
    print(f"{'':<13} {'best':>10} {'median':>10}  tokens/s")
    for name, ms in results.items():
        print(f"{name:<13} {best[name]:>10,.0f} {statistics.median(m.tokens_per_s for m in ms):>10,.0f}")
    fastest = max(best["torch"], best["hf"])
    kiln_best = max(best["kiln"], best["kiln_compiled"])
    last = {name: ms[-1].loss for name, ms in results.items()}
    print(
        "last-step loss of the last repeat (same start weights, same batches): "
        f"{', '.join(f'{n} {v:.5f}' for n, v in last.items())}"
    )
    print(
        f"kiln (faster variant) / torch {kiln_best / best['torch']:.3f}, / hf {kiln_best / best['hf']:.3f}, / "
        f"faster reference {kiln_best / fastest:.3f} "
        f"(goal on a CPU: 1.1); eager kiln / faster reference {best['kiln'] / fastest:.3f}"
    )
    fields = {
        **{f"{name}_tokens_per_s": f"{tps:.1f}" for name, tps in best.items()},
        "ratio_vs_fastest": f"{kiln_best / fastest:.3f}",
        "ratio_eager_vs_fastest": f"{best['kiln'] / fastest:.3f}",
        "ratio_vs_torch": f"{kiln_best / best['torch']:.3f}",
        "ratio_vs_hf": f"{kiln_best / best['hf']:.3f}",
        "params": str(count_params(model_cfg)),
    }
    peak = device_peak_flops(precision.device)
    if peak:
        fields["mfu"] = f"{kiln_best * flops_per_token(model_cfg, recipe.train.seq_len) / peak:.4f}"
        for name in PRESET_RUNS:  # goals on one H100: 45% (gpt2-124m), 50% (llama-1b)
            fields[f"mfu_{name.replace('-', '_')}"] = f"{preset_mfu(recipe, name, args, peak):.4f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
