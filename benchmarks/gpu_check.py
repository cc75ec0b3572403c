"""One prepared GPU run: every training figure a CPU cannot give, in one command of at most 8 minutes.

    python benchmarks/gpu_check.py OUT [--run runs/demo] [--parts tests,mfu,fp8,flex,resume] [--dry-run]

Parts, in this order; each is timed, and one that fails is recorded (its error and traceback in the
JSON) without stopping the others:
  tests   the CUDA-only tests: `pytest -m gpu` over the test files that hold them.
  mfu     gpt2-124m through kiln's trainer (bf16 autocast, compiled blocks and loss, fused loss,
          fused AdamW) on the run's tokens: tokens/s and MFU against the card's dense bf16 peak.
  fp8     llama-1b, the same 50 steps in bf16 and with train.precision.dtype=fp8 (tensorwise
          scaling, compiled): tokens/s of each and the loss after step 50. llama-1b's MFU is the
          bf16 leg's.
  flex    gpt2-124m at seq_len 4,096, packed documents of 250 to 750 tokens (about 500) with
          document masking: training steps with flex attention's block mask against SDPA's dense
          (B, 1, T, T) mask, on the same rows from the same weights: tokens/s and losses; and the
          attention alone, forward and backward, for the profile.
  resume  a real `python -m kiln train` of gpt2-124m on the run's tokens (compiled), once
          uninterrupted and once killed with SIGKILL as soon as its first resumable state is
          complete, then run again: the losses after the resume against the uninterrupted run's.
`--run`: a run directory whose tokenize stage is done (`make demo` leaves runs/demo); its
curate, tokenizer and tokenize stages are copied, never written to.
Writes OUT/gpu_check.json (the card, PyTorch, CUDA and driver versions, every figure, each goal met
or missed) and prints one RESULT line, also saved as OUT/result.txt.
--dry-run: the same code at toy sizes on the CPU (the tiny preset, a few steps; the fp8 leg trains
in bf16, as a CPU has no FP8 matmuls, after one forward pass through torchao's float8 layers; flex
forward only, as PyTorch has no CPU backward for it; the CUDA tests collected, not run), so a GPU
minute is never spent on a typo. tests/train/test_gpu_check.py runs it.
Goals on one H100 or H200: gpt2-124m MFU >= 45%, llama-1b >= 57%, fp8 >= 1.25x bf16's tokens/s with
the loss after 50 steps within 1% of bf16's, flex >= 2x the dense mask's tokens/s.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from train_throughput import benchmark_config, measure_kiln

from kiln.core.layout import RunLayout
from kiln.mix.config import MixConfig
from kiln.mix.sampler import build_sampler
from kiln.model.attention import AttentionRule
from kiln.model.batch import Batch
from kiln.model.config import ModelConfig, flops_per_token, get_preset
from kiln.model.init import build_model
from kiln.model.precision import Precision
from kiln.model.transformer import Rotary, ScaledDotProduct, layer_inputs
from kiln.recipe import Recipe, load_recipe
from kiln.train.config import TrainConfig
from kiln.train.distributed import apply_compile
from kiln.train.float8 import apply_float8
from kiln.train.loss import LossOptions
from kiln.train.monitor import device_peak_flops
from kiln.train.parts import build_loss

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("tests", "mfu", "fp8", "flex", "resume")
GOALS = {
    "mfu_gpt2_124m": 0.45,
    "mfu_llama_1b": 0.57,
    "fp8_speedup": 1.25,
    "fp8_loss_rel_diff": 0.01,
    "flex_speedup": 2.0,
}


@dataclass(frozen=True)
class Sizes:
    """What each part trains: on a GPU the issue's shapes, in a dry run the tiny preset for a few steps."""

    device: str
    mfu_model: str
    mfu_run: tuple[int, int, int, int, int]  # seq_len, rows per micro-batch, tokens per step, warmup steps, timed steps
    fp8_model: str
    fp8_run: tuple[int, int, int, int, int]  # the same; warmup + timed = the 50 steps whose last loss is compared
    flex_model: str
    flex_run: tuple[int, int, int, int]  # seq_len, rows, warmup steps, timed steps
    flex_documents: tuple[int, int]  # shortest and longest packed document (tokens)
    resume_model: str
    resume_run: tuple[int, int, int, int]  # seq_len, rows, tokens per step, steps
    resume_every: int  # steps between resumable states


GPU = Sizes(
    device="cuda",
    # 64 rows of 1,024 per micro-batch: the gpt2-124m shape train_throughput measured (40.9% on an H100).
    mfu_model="gpt2-124m",
    mfu_run=(1024, 64, 262144, 3, 6),
    fp8_model="llama-1b",
    fp8_run=(2048, 8, 16384, 10, 40),
    flex_model="gpt2-124m",
    flex_run=(4096, 4, 3, 10),
    flex_documents=(250, 750),
    resume_model="gpt2-124m",
    # The mfu part's micro-batch shape: the blocks' compiled graphs come from the cache.
    resume_run=(1024, 64, 65536, 40),
    resume_every=15,
)
DRY = Sizes(
    device="cpu",
    mfu_model="tiny",
    mfu_run=(64, 4, 512, 1, 2),
    fp8_model="tiny",
    fp8_run=(64, 4, 256, 1, 2),
    flex_model="tiny",
    flex_run=(256, 2, 1, 2),
    flex_documents=(20, 60),
    resume_model="tiny",
    resume_run=(64, 4, 256, 6),
    resume_every=2,
)


# --- the run's tokens -----------------------------------------------------------------------


def run_recipe(run_dir: Path, *overrides: str) -> Recipe:
    """Kiln's defaults for a run whose stages up to tokenize are in run_dir."""
    return load_recipe(None, [f"runs_dir={run_dir.parent}", f"name={run_dir.name}", *overrides])


def train_config(recipe: Recipe, seq_len: int, rows: int, tokens: int, sizes: Sizes, **update: Any) -> TrainConfig:
    dtype = "bf16" if sizes.device == "cuda" else "fp32"
    return TrainConfig.model_validate(
        {
            **recipe.train.model_dump(),
            "seq_len": seq_len,
            "micro_batch_size": rows,
            "global_batch_tokens": tokens,
            "compile": sizes.device == "cuda",
            "precision": {"device": sizes.device, "dtype": dtype},
            **update,
        }
    )


def model_of(name: str, seq_len: int) -> ModelConfig:
    """A preset with its published vocabulary (as the planner counts it), long enough for seq_len."""
    cfg = get_preset(name)
    return cfg if cfg.max_seq_len >= seq_len else cfg.model_copy(update={"max_seq_len": seq_len})


# --- the parts ----------------------------------------------------------------------------------


def part_tests(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    """pytest -m gpu over the test files that mark CUDA tests (collected only in a dry run)."""
    files = sorted(str(p) for p in (ROOT / "tests").rglob("test_*.py") if "pytest.mark.gpu" in p.read_text())
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files]
    if args.dry_run:
        command.append("--collect-only")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    (args.out / "tests.log").write_text(done.stdout + done.stderr)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    counts = {
        k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|tests? collected)", summary)
    }
    collected = next((v for k, v in counts.items() if "collected" in k), None)
    return {
        "files": [str(Path(f).relative_to(ROOT)) for f in files],
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
        "skipped": counts.get("skipped", 0),
        "collected": collected,
        "returncode": done.returncode,
        "summary": summary,
    }


def trained(recipe: Recipe, model: ModelConfig, cfg: TrainConfig, warmup: int, steps: int, peak: float | None) -> dict:
    """kiln's train() for warmup + steps steps, from a fresh compile: tokens/s of the timed steps, last loss, MFU."""
    torch.compiler.reset()  # a fresh compile, as a run of this shape gets (no recompiling with dynamic shapes)
    m = measure_kiln(recipe, model, benchmark_config(cfg, warmup + steps), warmup)
    mfu = m.tokens_per_s * flops_per_token(model, cfg.seq_len) / peak if peak else None
    return {"tokens_per_s": m.tokens_per_s, "last_loss": m.loss, "mfu": mfu, "tokens_per_step": cfg.tokens_per_step}


def part_mfu(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    seq_len, rows, tokens, warmup, steps = sizes.mfu_run
    recipe = run_recipe(args.run)
    cfg = train_config(recipe, seq_len, rows, tokens, sizes)
    return trained(recipe, model_of(sizes.mfu_model, seq_len), cfg, warmup, steps, args.peak)


def part_fp8(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    seq_len, rows, tokens, warmup, steps = sizes.fp8_run
    recipe, model = run_recipe(args.run), model_of(sizes.fp8_model, seq_len)
    result: dict[str, Any] = {"scaling": args.fp8_scaling, "steps": warmup + steps}
    bf16 = train_config(recipe, seq_len, rows, tokens, sizes)
    result["bf16"] = trained(recipe, model, bf16, warmup, steps, args.peak)
    fp8 = {"dtype": "fp8", "fp8_scaling": args.fp8_scaling, "device": "cuda"}
    cfg = train_config(recipe, seq_len, rows, tokens, sizes, precision=fp8)  # validated here, dry run or not
    if sizes.device != "cuda":  # a dry run: the float8 layers once, then the leg in the CPU's precision
        toy = build_model(model.model_copy(update={"vocab_size": 128}), seed=0, device="cpu")
        result["float8_layers"] = len(apply_float8(toy, args.fp8_scaling))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            toy(torch.zeros(1, 16, dtype=torch.long))
        cfg = bf16
    result["fp8"] = trained(recipe, model, cfg, warmup, steps, args.peak)
    result["speedup"] = result["fp8"]["tokens_per_s"] / result["bf16"]["tokens_per_s"]
    result["loss_rel_diff"] = abs(result["fp8"]["last_loss"] / result["bf16"]["last_loss"] - 1)
    return result


def packed_rows(run_dir: Path, rows: int, T: int, steps: int, documents: tuple[int, int]) -> list[Batch]:
    """`steps` batches of `rows` windows of the run's train tokens, cut into documents of documents[0]
    to documents[1] tokens (document ids, RoPE positions restarting per document; targets within each)."""
    sampler = build_sampler(RunLayout(run_dir).token_shards, MixConfig(), T)
    rng = np.random.default_rng(0)
    shortest, longest = documents
    batches = []
    for _ in range(steps):
        windows = np.stack(sampler.next_rows([T + 1] * rows, 0.0, slice(None)).tokens)  # (rows, T + 1) int64
        doc_BT = np.zeros((rows, T), dtype=np.int64)
        for r in range(rows):
            cuts = np.cumsum(rng.integers(shortest, longest + 1, size=T // shortest + 1))
            doc_BT[r] = np.searchsorted(cuts, np.arange(T), side="right")
        starts = np.maximum.accumulate(np.where(np.diff(doc_BT, prepend=-1, axis=1) != 0, np.arange(T), 0), axis=1)
        ids = torch.from_numpy(windows)
        last_BT = np.diff(doc_BT, append=-1, axis=1) != 0  # the last position of each document predicts nothing
        batches.append(
            Batch(
                ids[:, :-1],
                ids[:, 1:],
                torch.from_numpy(~last_BT),
                torch.from_numpy(doc_BT),
                torch.zeros(rows, dtype=torch.long),
                positions_BT=torch.from_numpy(np.arange(T) - starts),
            )
        )
    return batches


def flex_leg(
    model_cfg: ModelConfig, batches: list[Batch], kernel: str, warmup: int, device: torch.device
) -> dict[str, Any]:
    """Train steps (forward only on the CPU) with the rule computed by `kernel`: tokens/s after warmup, losses."""
    torch.compiler.reset()
    cuda = device.type == "cuda"
    model = build_model(model_cfg, seed=0, device=device)
    if cuda:
        apply_compile(model)
    precision = Precision(device, torch.bfloat16 if cuda else None)
    loss_of = build_loss(LossOptions(chunk=2**28 // model_cfg.vocab_size, compiled=cuda), True, precision, 1, kernel)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    losses, t0 = [], time.perf_counter()
    for step, batch in enumerate(batches):
        if step == warmup:
            synchronize(device)
            t0 = time.perf_counter()
        batch = batch.to(device)
        tokens = int(batch.loss_mask_BT.sum())
        if cuda:
            loss = loss_of(model, batch, tokens)
            loss.value.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                loss = loss_of(model, batch, tokens)
        losses.append(loss.value.detach().float())
    synchronize(device)
    seconds = time.perf_counter() - t0
    timed = sum(b.input_ids_BT.numel() for b in batches[warmup:])
    return {"tokens_per_s": timed / seconds, "losses": [float(v) for v in losses]}


def attention_alone(model_cfg: ModelConfig, batch: Batch, device: torch.device) -> dict[str, float]:
    """ms per forward and backward of one layer's attention on the batch's rule, dense mask against flex."""
    B, T = batch.input_ids_BT.shape
    H, E = model_cfg.n_heads, model_cfg.head_width
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    grad = device.type == "cuda"  # PyTorch has no flex attention backward on the CPU
    q, k, v = (torch.randn(B, H, T, E, device=device, dtype=dtype, generator=g, requires_grad=grad) for _ in range(3))
    attention, rope, result = ScaledDotProduct(1), Rotary(model_cfg).to(device), {}
    for kernel in ("sdpa", "flex"):
        rule = AttentionRule("causal", doc_ids_BT=batch.doc_ids_BT, kernel=kernel)
        kwargs = layer_inputs(rope, T, q.transpose(1, 2), rule).sdpa_kwargs  # the model's: an additive mask, or flex's
        for i in range(13):  # 3 untimed, then 10
            if i == 3:
                synchronize(device)
                t0 = time.perf_counter()
            y = attention(q, k, v, kwargs)
            if device.type == "cuda":
                y.sum().backward()
        synchronize(device)
        result[f"{kernel}_ms"] = (time.perf_counter() - t0) / 10 * 1000
    result["speedup"] = result["sdpa_ms"] / result["flex_ms"]
    return result


def part_flex(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    T, rows, warmup, steps = sizes.flex_run
    device = torch.device(sizes.device)
    model_cfg = model_of(sizes.flex_model, T)
    batches = packed_rows(args.run, rows, T, warmup + steps, sizes.flex_documents)
    legs = {kernel: flex_leg(model_cfg, batches, kernel, warmup, device) for kernel in ("sdpa", "flex")}
    dense, flex = legs["sdpa"]["losses"], legs["flex"]["losses"]
    return {
        "seq_len": T,
        "rows": rows,
        "documents_per_row": float(torch.cat([b.doc_ids_BT[:, -1] + 1 for b in batches]).float().mean()),  # type: ignore[index]
        "dense": legs["sdpa"],
        "flex": legs["flex"],
        "speedup": legs["flex"]["tokens_per_s"] / legs["sdpa"]["tokens_per_s"],
        "first_loss_rel_diff": abs(flex[0] / dense[0] - 1),
        "loss_rel_diff": max(abs(f / d - 1) for f, d in zip(flex, dense, strict=True)),
        "attention_alone": attention_alone(model_cfg, batches[0], device),
    }


RESUME_RECIPE = """\
name: check
runs_dir: {runs_dir}
curate: {{inputs: [{{source: web, format: jsonl, path: unused.jsonl}}]}}
model: {{preset: {model}}}
train:
  steps: {steps}
  seq_len: {seq_len}
  micro_batch_size: {rows}
  global_batch_tokens: {tokens}
  eval_at_start: false
  schedule: {{warmup_fraction: 0.2}}
  compile: {compile}
  checkpoint: {{every: {every}}}
  precision: {{device: {device}}}
eval: {{max_tokens_per_source: {seq_len}}}
"""


def step_losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r and "step" in r}


def part_resume(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    seq_len, rows, tokens, steps = sizes.resume_run
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        result: dict[str, Any] = {"steps": steps, "state_every": sizes.resume_every}
        runs = {}
        for name in ("uninterrupted", "resumed"):
            runs_dir = work / name
            for stage in ("curate", "tokenizer", "tokenize"):
                shutil.copytree(args.run / stage, runs_dir / "check" / stage)
            recipe = runs_dir / "recipe.yaml"
            recipe.write_text(
                RESUME_RECIPE.format(
                    runs_dir=runs_dir,
                    model=sizes.resume_model,
                    steps=steps,
                    seq_len=seq_len,
                    rows=rows,
                    tokens=tokens,
                    compile=str(sizes.device == "cuda").lower(),
                    every=sizes.resume_every,
                    device=sizes.device,
                )
            )
            runs[name] = (runs_dir / "check", [sys.executable, "-m", "kiln", "train", "--recipe", str(recipe)])
        t0 = time.perf_counter()
        run_checked(runs["uninterrupted"][1])
        result["uninterrupted_s"] = time.perf_counter() - t0
        run, command = runs["resumed"]
        t0 = time.perf_counter()
        result["killed_after_state"] = kill_at_first_state(command, run / "train.partial" / "checkpoints")
        done = run_checked(command)
        result["interrupted_s"] = time.perf_counter() - t0
        resumed_from = int(re.search(r"resuming after step (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
        a, b = step_losses(runs["uninterrupted"][0]), step_losses(run)
        after = range(resumed_from + 1, steps + 1)
        diffs = [abs(b[s] - a[s]) for s in after]
        result.update(
            resumed_from=resumed_from,
            compared_steps=len(diffs),
            equal=all(d == 0 for d in diffs),
            max_abs_diff=max(diffs),
            max_rel_diff=max(abs(b[s] / a[s] - 1) for s in after),
        )
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_checked(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a kiln command; a RuntimeError with the end of its stderr if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[1:])} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def kill_at_first_state(command: list[str], states: Path) -> int:
    """Start `command` and SIGKILL it as soon as a resumable state is complete (its folder renamed
    from .tmp); that state's step."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        complete = [p for p in states.glob("step-*") if p.suffix != ".tmp"] if states.is_dir() else []
        if complete:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return min(int(p.name.removeprefix("step-")) for p in complete)
        if process.poll() is not None:
            raise RuntimeError(f"the run ended (exit {process.returncode}) before a resumable state was complete")
        time.sleep(0.05)
    process.kill()
    raise TimeoutError("no resumable state within 600 s")


# --- the run ------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host sync: the clock reads finished work


def environment() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    driver = None
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True).stdout.strip() or None
    return {
        "card": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver,
    }


def goals(figures: dict[str, float | None]) -> dict[str, str]:
    met = {}
    for key, goal in GOALS.items():
        value = figures.get(key)
        ok = value is not None and (value <= goal if key.endswith("rel_diff") else value >= goal)
        met[key] = f"{'met' if ok else 'missed'} ({value if value is None else round(value, 4)} against {goal})"
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Folder for gpu_check.json, result.txt and the tests' log.")
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "demo", help="A run whose tokenize stage is done.")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"Comma-separated, of {', '.join(PARTS)}.")
    parser.add_argument("--fp8-scaling", default="tensorwise", choices=["tensorwise", "rowwise"])
    parser.add_argument("--dry-run", action="store_true", help="Toy sizes on the CPU: checks the script, not the GPU.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.run = args.run.resolve()
    if not (args.run / "tokenize" / "manifest.json").is_file():
        raise SystemExit(f"{args.run}: no finished tokenize stage; run `make demo` or pass --run")
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run on a CPU")
    sizes = DRY if args.dry_run else GPU
    args.peak = device_peak_flops(torch.device(sizes.device))
    report: dict[str, Any] = {**environment(), "dry_run": args.dry_run, "peak_flops": args.peak, "parts": {}}
    functions: dict[str, Callable[[argparse.Namespace, Sizes], dict[str, Any]]] = {
        "tests": part_tests,
        "mfu": part_mfu,
        "fp8": part_fp8,
        "flex": part_flex,
        "resume": part_resume,
    }
    started = time.perf_counter()
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        print(f"gpu_check: {name} ...", flush=True)
        try:
            result = functions[name](args, sizes)
        except Exception as e:  # one part's failure is a figure too; the others still run
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        result["seconds"] = time.perf_counter() - t0
        report["parts"][name] = result
        shown = {k: v for k, v in result.items() if k != "traceback"}
        print(f"gpu_check: {name} {json.dumps(shown, default=str)}", flush=True)
        # Written after each part: what was measured is kept if a later part hangs.
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    parts = report["parts"]
    figures = {
        "tests_passed": parts.get("tests", {}).get("passed"),
        "tests_failed": parts.get("tests", {}).get("failed"),
        "mfu_gpt2_124m": parts.get("mfu", {}).get("mfu"),
        "mfu_llama_1b": parts.get("fp8", {}).get("bf16", {}).get("mfu"),
        "fp8_speedup": parts.get("fp8", {}).get("speedup"),
        "fp8_loss_rel_diff": parts.get("fp8", {}).get("loss_rel_diff"),
        "flex_speedup": parts.get("flex", {}).get("speedup"),
        "flex_loss_rel_diff": parts.get("flex", {}).get("loss_rel_diff"),
        "resume_equal": parts.get("resume", {}).get("equal"),
        "resume_max_abs_diff": parts.get("resume", {}).get("max_abs_diff"),
        "failed_parts": sum("error" in p for p in parts.values()),
        "seconds": time.perf_counter() - started,
    }
    report.update(figures=figures, goals=goals(figures))
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    for key, verdict in report["goals"].items():
        print(f"goal {key}: {verdict}")
    line = "RESULT " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    (args.out / "result.txt").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
