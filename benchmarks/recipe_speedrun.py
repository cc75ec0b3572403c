"""Steps kiln's default recipe needs to match a GPT-2-style baseline at equal parameters.

The baseline, written here: a GPT-2 decoder (learned absolute positions, pre-norm LayerNorm with
biases, GELU MLP of 4 x d_model, multi-head attention through SDPA with is_causal, biases on every
linear, input and output embeddings tied), GPT-2's init (std 0.02, residual projections scaled by
1/sqrt(2 x layers), position table std 0.01), AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1
on every 2-D tensor, none on biases and LayerNorm gains), the recipe's warmup + cosine to 10%
(kiln.train.schedule.lr_at with the recipe's warmup in steps, whatever kiln's own schedule), global-norm clip
1.0, fp32, for `--steps` steps (default: the recipe's, 450 of 16 x 256 tokens on the demo).
Its width is chosen so its parameter count is within 2% of kiln's model at the same depth and
heads (demo: d_model 248, 5,060,688 against kiln's 5,049,088). Parameters are counted as
`sum(p.numel())` over each model's parameters: the tied token table once on both sides, the
baseline's position table included (kiln's RoPE has none).
Its peak lr, 3e-3, is the best of a sweep on the demo (`--sweep`, run while this benchmark was
written; final validation loss after 450 steps: 1.5e-3 5.262, 2e-3 5.191, 3e-3 5.185, 4e-3
5.291; 6e-3 trailed 3e-3 by 0.35 nats of training loss at step 300 and was stopped there; the
finished benchmark's own baseline run at 3e-3 gives 5.1878).

Same data: the baseline draws its batches from kiln's own sampler and collator
(kiln.mix.sampler over the run's train shards, kiln.train.collate), so step n of both reads the
same 16 token windows; its final loss is kiln's validation scorer (kiln.model.perplexity, the
recipe's eval settings: per source, non-overlapping windows of seq_len + 1 from the start of the
val split) on the same val shards, the function `kiln train` validates with.

kiln's side: the real `kiln train` stage on a copy of the run's tokenizer and token shards in
a temporary folder, the recipe as it is plus `train.eval_every` (validation every
`--eval-every` steps, metrics.jsonl lines of kind periodic) and `train.eval_at_start=false`
(neither changes the weights), once with AdamW and once with `train.optim.name=muon` (kiln's
Muon defaults: muon_lr 0.02 on the blocks' matrices, AdamW at train.optim.lr for the rest).
steps_to_match is the first step whose validation loss is at or below the baseline's final one,
linearly interpolated between the two evaluations that bracket it. The recipe's cosine still
runs over all its steps, so the crossing is measured mid-schedule, where the lr is still high:
an upper bound on the steps a run sized to the target needs. Once crossed the run is stopped
with SIGTERM (kiln's preemption path) to save time. Then the goal itself: a kiln run sized to
70% of the baseline's steps (train.steps = 0.7 x steps, the schedule compressed to it, warmup
unchanged) trains to its end; its final validation loss is compared with the target.
Wall time does not enter any figure, so other load on the machine only makes it slower
(`--threads 1` then holds up better than torch's default of one thread per core).
Not measured: wall time to the target.

    .venv/bin/python benchmarks/recipe_speedrun.py            # about 30 min on 2 idle CPU cores

Ends with: RESULT baseline_steps=.. baseline_lr=.. baseline_val_loss=.. kiln_params=..
baseline_params=.. adamw_steps=.. adamw_ratio=.. adamw_sized_steps=.. adamw_sized_loss=..
muon_steps=.. muon_ratio=.. muon_sized_steps=.. muon_sized_loss=.. (steps nan where a run never
reached the target; *_sized_loss is the final validation loss of the run sized to 70%).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kiln.core.layout import TOKENIZE, TOKENIZER, RunLayout
from kiln.mix.sampler import build_sampler
from kiln.model.config import count_params
from kiln.model.perplexity import validation_scorer
from kiln.recipe import Recipe, load_recipe
from kiln.text.tokenizer import KilnTokenizer
from kiln.train.collate import build_collator
from kiln.train.objectives import token_ids
from kiln.train.parts import build_precision
from kiln.train.schedule import lr_at

ROOT = Path(__file__).resolve().parent.parent
BASELINE_LR = 3e-3  # best of the --sweep on the demo (module docstring)
BASELINE_MIN_LR_RATIO = 0.1  # GPT-2-style cosine to 10% of the peak
GOAL_RATIO = 0.7  # the goal: kiln reaches the baseline's loss in at most 70% of its steps
PARAM_TOLERANCE = 0.02


# ---- the baseline: GPT-2 (shape legend: B batch, T positions, D d_model, H heads, E head dim, V vocabulary)


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    max_seq_len: int


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # q, k, v in one matrix, as GPT-2
        self.attn_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.mlp_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q_BTD, k_BTD, v_BTD = self.c_attn(self.ln_1(x_BTD)).split(D, dim=-1)
        q_BHTE, k_BHTE, v_BHTE = (
            t.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q_BTD, k_BTD, v_BTD)
        )
        y_BHTE = F.scaled_dot_product_attention(q_BHTE, k_BHTE, v_BHTE, is_causal=True)
        x_BTD = x_BTD + self.attn_proj(y_BHTE.transpose(1, 2).reshape(B, T, D))
        return x_BTD + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x_BTD)), approximate="tanh"))  # GPT-2's tanh GELU


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        with torch.no_grad():  # GPT-2's init; biases 0 and LayerNorm gains 1 are already in place
            for name, p in self.named_parameters():
                if name.endswith("_proj.weight"):  # the residual branches' outputs
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))
                elif name == "wpe.weight":
                    nn.init.normal_(p, std=0.01)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

    def forward(self, idx_BT: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V); the output projection is the token table (tied, as GPT-2)."""
        positions_T = torch.arange(idx_BT.shape[1], device=idx_BT.device)
        x_BTD = self.wte(idx_BT) + self.wpe(positions_T)
        for block in self.blocks:
            x_BTD = block(x_BTD)
        return F.linear(self.ln_f(x_BTD), self.wte.weight)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields each tensor once


def gpt2_params(cfg: GPT2Config) -> int:
    """GPT2's parameter count from its shape: per block 12 D^2 weights and 13 D biases and gains; the tables; ln_f."""
    d = cfg.d_model
    return cfg.n_layers * (12 * d * d + 13 * d) + (cfg.vocab_size + cfg.max_seq_len + 2) * d


def baseline_config(recipe: Recipe, vocab_size: int) -> tuple[GPT2Config, int]:
    """The GPT-2 shape at kiln's depth and heads whose parameter count is nearest kiln's; (config, kiln's count)."""
    kiln_cfg = recipe.model.resolved(vocab_size)
    target = count_params(kiln_cfg)
    shapes = [
        GPT2Config(vocab_size, d, kiln_cfg.n_layers, kiln_cfg.n_heads, recipe.train.seq_len)
        for d in range(kiln_cfg.n_heads, 4 * kiln_cfg.d_model, kiln_cfg.n_heads)
    ]
    return min(shapes, key=lambda c: abs(gpt2_params(c) - target)), target


def train_baseline(recipe: Recipe, run_dir: Path, cfg: GPT2Config, lr: float, steps: int) -> float:
    """Train the baseline `steps` steps on kiln's batches; its validation loss (nats/token) by kiln's scorer."""
    train_cfg = recipe.train.model_copy(update={"steps": steps})
    precision = build_precision(train_cfg)  # the trainer's: fp32 on the CPU, torch's threads
    layout = RunLayout(run_dir)
    # The train stage's own batch stream: kiln.mix's sampler, the objective's collator (rank 0 of 1).
    ids = token_ids(KilnTokenizer.load(layout.tokenizer_json))
    batches = build_collator(build_sampler(layout.token_shards, recipe.mix, train_cfg.seq_len, "train"), train_cfg, ids)
    scoring = recipe.eval.scoring()
    evaluate = validation_scorer(
        run_dir, scoring.model_copy(update={"seq_len": scoring.seq_len or train_cfg.seq_len}), precision.amp_dtype
    )

    torch.manual_seed(train_cfg.seed)
    model = GPT2(cfg).to(precision.device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    started = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        lr_now = lr_at(step, lr, recipe.train.warmup_steps, steps, BASELINE_MIN_LR_RATIO, "cosine")
        for group in optimizer.param_groups:
            group["lr"] = lr_now
        shape = train_cfg.geometry(step)
        step_loss = 0.0
        for rows in shape.micro_batches:
            batch = batches.next_batch(rows, shape.seq_len, shape.progress).to(precision.device)
            with precision.autocast():
                logits_BTV = model(batch.input_ids_BT)
            # clm keeps every position, so the mean over the batch is the token mean; micro-batches are equal.
            loss = F.cross_entropy(logits_BTV.float().flatten(0, 1), batch.targets_BT.flatten()) / len(
                shape.micro_batches
            )
            loss.backward()
            step_loss += loss.item()  # host sync per micro-batch
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not math.isfinite(step_loss):
            print(f"    baseline lr {lr:g}: loss {step_loss} at step {step}", flush=True)
            return float("inf")
        if step % 50 == 0 or step == steps:
            print(
                (
                    f"    baseline lr {lr:g} step {step}/{steps}: train loss {step_loss:.3f}, lr {lr_now:.2e}, "
                    f"{time.perf_counter() - started:.0f} s"
                ),
                flush=True,
            )
    loss = float(evaluate(model)["all"]["loss"])
    print(f"    baseline lr {lr:g}: validation loss {loss:.4f} after {steps} steps", flush=True)
    return loss


# ---- kiln's side: the real train stage, stopped once it crosses the target


def copy_run(source: Path, runs_dir: Path, name: str) -> Path:
    """The tokenizer and token shards of `source` under runs_dir/name (what `kiln train` reads)."""
    run_dir = runs_dir / name
    for stage in (TOKENIZER, TOKENIZE):
        shutil.copytree(source / stage, run_dir / stage)
    return run_dir


def eval_losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, validation loss) of every periodic and final evaluation logged so far."""
    for folder in ("train.partial", "train"):  # kiln builds the stage in train.partial/, then renames it
        path = run_dir / folder / "metrics.jsonl"
        if path.is_file():
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            return [(r["step"], r["eval"]["all"]["loss"]) for r in records if r.get("kind") in ("periodic", "final")]
    return []


def run_kiln(recipe_arg: str, runs_dir: Path, name: str, settings: list[str], target: float) -> list[tuple[int, float]]:
    """`kiln train` with `settings`, stopped (SIGTERM) after the first evaluation at or below target
    (-inf: trains to the end); its evaluations."""
    run_dir = runs_dir / name
    command = [
        sys.executable,
        "-m",
        "kiln",
        "-q",
        "train",
        "--recipe",
        recipe_arg,
        *(a for s in [f"runs_dir={runs_dir}", f"name={name}", *settings] for a in ("--set", s)),
    ]
    print("  " + " ".join(command[2:]), flush=True)
    started = time.perf_counter()
    log_path = runs_dir / f"{name}.log"  # a file, not a pipe: a pipe nobody reads can fill and stall kiln
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    seen = 0

    def report() -> list[tuple[int, float]]:
        nonlocal seen
        losses = eval_losses(run_dir)
        for step, loss in losses[seen:]:
            print(f"    step {step}: validation loss {loss:.4f} ({time.perf_counter() - started:.0f} s)", flush=True)
        seen = len(losses)
        return losses

    try:
        while proc.poll() is None:
            time.sleep(1.0)
            losses = report()
            if losses and losses[-1][1] <= target:
                break
    finally:
        if proc.poll() is None:  # crossed, or this script was interrupted: stop kiln too
            proc.send_signal(signal.SIGTERM)  # kiln finishes the step, saves a resumable state and exits (130)
        proc.wait()
    if proc.returncode not in (0, 130, -signal.SIGTERM):
        raise SystemExit(f"kiln train failed ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
    return report()


def steps_to_reach(losses: list[tuple[int, float]], target: float) -> tuple[float, tuple[int, int] | None]:
    """First step at or below target, linearly interpolated within its bracket of evaluations; (nan, None) if never."""
    previous = None
    for step, loss in losses:
        if loss <= target:
            if previous is None:
                return float(step), (step, step)
            (s0, l0) = previous
            return s0 + (l0 - target) / (l0 - loss) * (step - s0), (s0, step)
        previous = (step, loss)
    return float("nan"), None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--recipe", default="demo", help="kiln's recipe (file or shipped name), as `kiln train --recipe` takes it."
    )
    parser.add_argument(
        "--run",
        type=Path,
        default=ROOT / "runs" / "demo",
        help="A run whose tokenizer and token shards were built with that recipe.",
    )
    parser.add_argument("--steps", type=int, default=None, help="Baseline steps (default: the recipe's train.steps).")
    parser.add_argument("--baseline-lr", type=float, default=BASELINE_LR, help="The baseline's peak lr.")
    parser.add_argument(
        "--sweep",
        default=None,
        help="Comma-separated peak lrs: train the baseline at each and take the lowest validation loss as the target.",
    )
    parser.add_argument(
        "--baseline-loss",
        type=float,
        default=None,
        help="Skip training the baseline and use this final validation loss (from an earlier run with the same steps).",
    )
    parser.add_argument(
        "--eval-every", type=int, default=25, help="kiln's validation interval in steps (train.eval_every)."
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="Extra --set for both kiln runs (e.g. train.optim.lr=6e-3).",
    )
    parser.add_argument("--no-muon", action="store_true", help="Skip the Muon run.")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads of every run (train.threads); 1 holds up better on a machine shared with other work.",
    )
    args = parser.parse_args()

    threads = [f"train.threads={args.threads}"] if args.threads else []
    recipe = load_recipe(args.recipe, [f"runs_dir={args.run.parent}", f"name={args.run.name}", *threads])
    steps = args.steps or recipe.train.steps
    vocab_size = KilnTokenizer.load(RunLayout(args.run).tokenizer_json).vocab_size
    gpt2_cfg, kiln_params = baseline_config(recipe, vocab_size)
    baseline_params = n_params(GPT2(gpt2_cfg))
    assert baseline_params == gpt2_params(gpt2_cfg), "the width search counts what GPT2 holds"
    kiln_body = count_params(recipe.model.resolved(vocab_size), include_embeddings=False)
    gpt2_body = baseline_params - (vocab_size + gpt2_cfg.max_seq_len) * gpt2_cfg.d_model
    print(
        f"kiln model: d_model {recipe.model.d_model}, {recipe.model.n_layers} layers, {recipe.model.activation}: "
        f"{kiln_params:,} params ({kiln_body:,} without the token table)"
    )
    print(
        f"baseline:   d_model {gpt2_cfg.d_model}, {gpt2_cfg.n_layers} layers, {gpt2_cfg.n_heads} heads, GELU 4x: "
        f"{baseline_params:,} params ({gpt2_body:,} without the token and position tables), "
        f"{baseline_params / kiln_params - 1:+.2%}"
    )
    assert abs(baseline_params / kiln_params - 1) <= PARAM_TOLERANCE, "no baseline width within 2% of kiln's parameters"
    print(
        (
            f"batch: {recipe.train.tokens_per_step:,} tokens per step ({recipe.train.micro_batch_size} x "
            f"{recipe.train.seq_len} per micro-batch); kiln's recipe runs {recipe.train.steps} steps"
        ),
        flush=True,
    )

    with tempfile.TemporaryDirectory(prefix="kiln-speedrun-") as tmp:
        runs_dir = Path(tmp)
        run_dir = copy_run(args.run, runs_dir, "baseline")  # the baseline reads the same copied shards as kiln
        lr = args.baseline_lr
        if args.baseline_loss is not None:
            target = args.baseline_loss
            print(f"1. baseline: final validation loss {target:.4f} given (--baseline-loss)")
        else:
            lrs = [float(x) for x in args.sweep.split(",")] if args.sweep else [lr]
            print(f"1. baseline: {steps} steps at peak lr {', '.join(f'{x:g}' for x in lrs)}", flush=True)
            results = {x: train_baseline(recipe, run_dir, gpt2_cfg, x, steps) for x in lrs}
            lr, target = min(results.items(), key=lambda kv: kv[1])
            if len(lrs) > 1:
                print(
                    "   sweep: "
                    + ", ".join(f"lr {x:g} -> {loss:.4f}" for x, loss in results.items())
                    + f"; best {lr:g}"
                )
        print(f"   target: validation loss {target:.4f} after {steps} steps", flush=True)

        runs = {"adamw": ["train.optim.name=adamw"]} | ({} if args.no_muon else {"muon": ["train.optim.name=muon"]})
        sized_steps = int(GOAL_RATIO * steps)
        found: dict[str, float] = {}
        sized: dict[str, float] = {}
        for i, (optim, extra) in enumerate(runs.items(), start=2):
            print(f"{i}. kiln with {optim}", flush=True)
            copy_run(args.run, runs_dir, optim)
            settings = [
                f"train.eval_every={args.eval_every}",
                "train.eval_at_start=false",
                *threads,
                *extra,
                *args.overrides,
            ]
            losses = run_kiln(args.recipe, runs_dir, optim, settings, target)
            found[optim], bracket = steps_to_reach(losses, target)
            if bracket is None:
                print(
                    f"   never reached {target:.4f}: {losses[-1][1] if losses else float('nan'):.4f} at step "
                    f"{losses[-1][0] if losses else 0}"
                )
            else:
                print(
                    f"   reached {target:.4f} at step {found[optim]:.1f} (between evaluations at {bracket[0]} and "
                    f"{bracket[1]}): {found[optim] / steps:.3f} of the baseline's steps"
                )
            print(f"   sized to {sized_steps} steps ({GOAL_RATIO:.0%} of the baseline's)", flush=True)
            copy_run(args.run, runs_dir, f"{optim}-sized")
            # Validation at the end only; the warmup stays the recipe's in steps (not a share of the fewer steps).
            sized_settings = [
                *settings[1:],
                f"train.steps={sized_steps}",
                f"train.schedule.warmup_steps={recipe.train.warmup_steps}",
                "train.schedule.warmup_fraction=null",
            ]
            sized[optim] = run_kiln(args.recipe, runs_dir, f"{optim}-sized", sized_settings, float("-inf"))[-1][1]
            print(
                f"   final validation loss {sized[optim]:.4f} after {sized_steps} steps against the baseline's "
                f"{target:.4f} after {steps}: "
                f"{'reached' if sized[optim] <= target else 'not reached'}",
                flush=True,
            )

    print(
        f"goal: the baseline's loss in at most {GOAL_RATIO:.0%} of its {steps} steps; "
        + ", ".join(
            (
                f"{o}: crossing mid-schedule at {s / steps:.3f}, a run of {sized_steps} steps ends at {sized[o]:.4f} "
                f"({'met' if sized[o] <= target else 'not met'})"
            )
            for o, s in found.items()
        )
    )
    fields = {
        "baseline_steps": steps,
        "baseline_lr": f"{lr:g}",
        "baseline_val_loss": f"{target:.4f}",
        "kiln_params": kiln_params,
        "baseline_params": baseline_params,
    }
    for optim, s in found.items():
        fields |= {
            f"{optim}_steps": f"{s:.1f}",
            f"{optim}_ratio": f"{s / steps:.3f}",
            f"{optim}_sized_steps": sized_steps,
            f"{optim}_sized_loss": f"{sized[optim]:.4f}",
        }
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
