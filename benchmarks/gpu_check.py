"""One prepared GPU run: every training figure a CPU cannot give, in one command of at most 8 minutes.

    python benchmarks/gpu_check.py OUT [--run runs/demo] [--parts tests,fp8,flex,resume,mfu] [--dry-run]

Parts, in this order (the new figures before the re-measured ones); each is timed, records the
GPU memory it peaked at, and one that fails is recorded (its error and traceback in the JSON)
without stopping the others; a part that would start with less of `--budget-s` left than it needs
is skipped and says so:
  tests   the CUDA-only tests: `pytest -m gpu` over the test files that hold them (flex attention
          and fp8 steps compiled, the fused loss, bf16 training): a failure here explains the rest.
  fp8     llama-1b, the same 50 steps (micro-batches of 8 x 2,048) in bf16 and with
          train.precision.dtype=fp8 (compiled): tokens/s of each and the loss after step 50; in
          between, llama-1b's MFU over steps of 131,072 tokens, on the bf16 leg's compiled blocks.
  flex    gpt2-124m at seq_len 4,096, packed documents of 250 to 750 tokens (about 500) with
          document masking: training steps with flex attention's block mask against SDPA's dense
          (B, 1, T, T) mask, on the same rows from the same weights: tokens/s and losses; and one
          layer's attention alone, forward and backward, for the profile.
  resume  a real `python -m kiln train` of gpt2-124m on the run's tokens (compiled), once
          uninterrupted and once killed with SIGKILL as soon as its first resumable state is
          complete, then run again: the losses after the resume against the uninterrupted run's.
  mfu     gpt2-124m through kiln's trainer (bf16 autocast, compiled blocks and loss, fused loss,
          fused AdamW) on the run's tokens, steps of 262,144 tokens: tokens/s and MFU against the
          card's dense bf16 peak.
`--run`: a run directory whose tokenize stage is done (`make demo` leaves runs/demo); its
tokenizer and tokenize stages are read or copied, never written to.
Writes OUT/gpu_check.json (the card, PyTorch, CUDA and driver versions, every figure, each goal met
or missed; rewritten after every part) and prints one RESULT line, also saved as OUT/result.txt.
--dry-run: the same code at toy sizes on the CPU (the tiny preset, a few steps; the fp8 leg trains
in fp32, as a CPU has no FP8 matmuls, after one forward pass through torchao's float8 layers; flex
forward only, as PyTorch has no CPU backward for it; the CUDA tests collected, not run), so a GPU
minute is never spent on a typo. tests/train/test_gpu_check.py runs it.
Goals on one H100 or H200: gpt2-124m MFU >= 45%, llama-1b >= 57%, fp8 >= 1.25x bf16's tokens/s with
the loss after 50 steps within 1% of bf16's, flex >= 2x the dense mask's tokens/s with losses within
1%, the losses after the resume equal to the uninterrupted run's.
Not handled here: several GPUs (FSDP2 and fp8 together are tested on the CPU), profiling (the
figures say where to look; torch.profiler is the next step).
"""

from __future__ import annotations

import argparse
import gc
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
from typing import Any, NamedTuple

import torch
from flex_masking import attention_alone, flex_leg, packed_rows
from train_throughput import measure_mfu, preset_config

from kiln.core.layout import RunLayout
from kiln.model.config import ModelConfig, get_preset
from kiln.model.init import build_model
from kiln.recipe import Recipe, load_recipe
from kiln.text.tokenizer import KilnTokenizer
from kiln.train.config import TrainConfig
from kiln.train.float8 import apply_float8
from kiln.train.monitor import device_peak_flops

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("tests", "fp8", "flex", "resume", "mfu")
# Seconds a part needs at the least on one H100 (compiles included): with less left it is skipped.
NEEDS_S = {"tests": 60, "fp8": 150, "flex": 90, "resume": 90, "mfu": 60}
GOALS = {  # at least, or at most for a difference; True for a yes-or-no figure
    "mfu_gpt2_124m": 0.45,
    "mfu_llama_1b": 0.57,
    "fp8_speedup": 1.25,
    "fp8_loss_rel_diff": 0.01,
    "flex_speedup": 2.0,
    "flex_loss_rel_diff": 0.01,
    "resume_equal": True,
}


class Run(NamedTuple):
    seq_len: int
    rows: int  # per micro-batch
    tokens: int  # per optimizer step
    warmup: int  # untimed steps (compiles)
    steps: int  # timed steps after them


@dataclass(frozen=True)
class Sizes:
    """What each part trains: on a GPU the issue's shapes, in a dry run the tiny preset for a few steps."""

    device: str
    gpt2: str  # the mfu, flex and resume parts' model
    llama: str  # the fp8 part's model
    mfu: Run
    llama_mfu: Run
    fp8: Run  # warmup + steps = the steps whose last loss is compared
    flex: Run  # tokens: unused (one micro-batch per step)
    documents: tuple[int, int]  # flex: shortest and longest packed document (tokens)
    resume: Run  # warmup: unused (every step counts)
    resume_every: int  # steps between resumable states


GPU = Sizes(
    device="cuda",
    gpt2="gpt2-124m",
    llama="llama-1b",
    # 64 rows of 1,024 per micro-batch: the shape train_throughput measured gpt2-124m at (40.9% on an H100).
    mfu=Run(1024, 64, 262144, 3, 6),
    llama_mfu=Run(2048, 8, 131072, 2, 4),
    fp8=Run(2048, 8, 16384, 10, 40),
    flex=Run(4096, 4, 4 * 4096, 3, 10),
    documents=(250, 750),
    # The mfu part's micro-batch shape, so the resumed processes find the blocks in inductor's cache.
    resume=Run(1024, 64, 65536, 0, 40),
    resume_every=15,
)
DRY = Sizes(
    device="cpu",
    gpt2="tiny",
    llama="tiny",
    mfu=Run(64, 4, 512, 1, 2),
    llama_mfu=Run(64, 4, 512, 1, 1),
    fp8=Run(64, 4, 256, 1, 2),
    flex=Run(256, 2, 512, 1, 2),
    documents=(20, 60),
    resume=Run(64, 4, 256, 0, 6),
    resume_every=2,
)


# --- the run's tokens and kiln's trainer --------------------------------------------------------


def run_recipe(run_dir: Path) -> Recipe:
    """Kiln's defaults for a run whose stages up to tokenize are in run_dir."""
    return load_recipe(None, [f"runs_dir={run_dir.parent}", f"name={run_dir.name}"])


def train_config(recipe: Recipe, run: Run, device: str, **update: Any) -> TrainConfig:
    return preset_config(recipe, run.seq_len, run.rows, run.tokens, device, **update)


def model_of(name: str, seq_len: int, run_dir: Path) -> ModelConfig:
    """A preset with its published vocabulary (as the planner counts it; the run's, where that is
    larger: the tiny preset's), long enough for seq_len."""
    cfg = get_preset(name)
    vocab = max(cfg.vocab_size or 0, KilnTokenizer.load(RunLayout(run_dir).tokenizer_json).vocab_size)
    return cfg.model_copy(update={"max_seq_len": max(cfg.max_seq_len, seq_len), "vocab_size": vocab})


def trained(recipe: Recipe, model: ModelConfig, cfg: TrainConfig, run: Run, peak: float | None) -> dict[str, Any]:
    """kiln's train() for run.warmup + run.steps steps: tokens/s of the timed steps, last loss, MFU."""
    m, mfu = measure_mfu(recipe, model, cfg, run.warmup, run.steps, peak)
    return {"tokens_per_s": m.tokens_per_s, "last_loss": m.loss, "mfu": mfu, "tokens_per_step": cfg.tokens_per_step}


# --- the parts ----------------------------------------------------------------------------------


def part_tests(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    """pytest -m gpu over the test files that mark CUDA tests (collected only in a dry run)."""
    files = sorted(str(p) for p in (ROOT / "tests").rglob("test_*.py") if "pytest.mark.gpu" in p.read_text())
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files]
    if args.dry_run:
        command.append("--collect-only")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=remaining(args))
    (args.out / "tests.log").write_text(done.stdout + done.stderr)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    said = re.findall(r"(\d+) (passed|failed|skipped|errors?|tests? collected)", summary)
    counts = {kind.split()[-1]: int(n) for n, kind in said}
    return {
        "files": [str(Path(f).relative_to(ROOT)) for f in files],
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
        "skipped": counts.get("skipped", 0),
        "collected": counts.get("collected"),
        "returncode": done.returncode,
        "summary": summary,
    }


def part_fp8(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    import torchao.float8  # noqa: F401 (missing, it fails here, before the bf16 leg's minutes)

    run, recipe = sizes.fp8, run_recipe(args.run)
    model = model_of(sizes.llama, run.seq_len, args.run)
    result: dict[str, Any] = {"scaling": args.fp8_scaling, "steps": run.warmup + run.steps}
    torch.compiler.reset()  # a fresh compile, as a run of this shape gets (no recompiling with dynamic shapes)
    bf16 = train_config(recipe, run, sizes.device)
    result["bf16"] = trained(recipe, model, bf16, run, args.peak)
    # The same micro-batch shape: the compiled blocks are reused.
    result["llama_mfu"] = trained(
        recipe, model, train_config(recipe, sizes.llama_mfu, sizes.device), sizes.llama_mfu, args.peak
    )
    fp8 = {"dtype": "fp8", "fp8_scaling": args.fp8_scaling, "device": "cuda"}
    cfg = train_config(recipe, run, sizes.device, precision=fp8)  # validated here, dry run or not
    if sizes.device != "cuda":  # a dry run: the float8 layers once, then the leg in the CPU's precision
        toy = build_model(model.model_copy(update={"vocab_size": 128}), seed=0, device="cpu")
        result["float8_layers"] = len(apply_float8(toy, args.fp8_scaling))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            toy(torch.zeros(1, 16, dtype=torch.long))
        cfg = bf16
    torch.compiler.reset()
    result["fp8"] = trained(recipe, model, cfg, run, args.peak)
    result["speedup"] = result["fp8"]["tokens_per_s"] / result["bf16"]["tokens_per_s"]
    result["loss_rel_diff"] = abs(result["fp8"]["last_loss"] / result["bf16"]["last_loss"] - 1)
    return result


def part_flex(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    device, run = torch.device(sizes.device), sizes.flex
    model_cfg = model_of(sizes.gpt2, run.seq_len, args.run)
    batches = packed_rows(args.run, run.seq_len, run.rows, run.warmup + run.steps, sizes.documents)
    torch.compiler.reset()
    legs = {kernel: flex_leg(model_cfg, batches, kernel, run.warmup, device) for kernel in ("sdpa", "flex")}
    dense, flex = legs["sdpa"]["losses"], legs["flex"]["losses"]
    return {
        "seq_len": run.seq_len,
        "rows": run.rows,
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
  steps: {run.steps}
  seq_len: {run.seq_len}
  micro_batch_size: {run.rows}
  global_batch_tokens: {run.tokens}
  eval_at_start: false
  schedule: {{warmup_fraction: 0.2}}
  compile: {compile}
  checkpoint: {{every: {every}}}
  precision: {{device: {device}}}
eval: {{max_tokens_per_source: {run.seq_len}}}
"""


def part_resume(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    run, work = sizes.resume, Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        commands = {}
        for name in ("uninterrupted", "resumed"):
            for stage in ("tokenizer", "tokenize"):  # what the train stage reads
                shutil.copytree(args.run / stage, work / name / "check" / stage)
            recipe = work / name / "recipe.yaml"
            compile = str(sizes.device == "cuda").lower()
            recipe.write_text(
                RESUME_RECIPE.format(
                    runs_dir=work / name,
                    model=sizes.gpt2,
                    run=run,
                    compile=compile,
                    every=sizes.resume_every,
                    device=sizes.device,
                )
            )
            commands[name] = [sys.executable, "-m", "kiln", "train", "--recipe", str(recipe)]
        result: dict[str, Any] = {"steps": run.steps, "state_every": sizes.resume_every}
        t0 = time.perf_counter()
        run_checked(commands["uninterrupted"], args)
        result["uninterrupted_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        states = work / "resumed" / "check" / "train.partial" / "checkpoints"
        result["killed_after_state"] = kill_at_first_state(commands["resumed"], states, args)
        done = run_checked(commands["resumed"], args)
        result["interrupted_s"] = time.perf_counter() - t0
        resumed_from = int(re.search(r"resuming after step (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
        a, b = step_losses(work / "uninterrupted" / "check"), step_losses(work / "resumed" / "check")
        after = range(resumed_from + 1, run.steps + 1)
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


def step_losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r and "step" in r}


def run_checked(command: list[str], args: argparse.Namespace) -> subprocess.CompletedProcess[str]:
    """Run a kiln command within the budget; a RuntimeError with the end of its stderr if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=remaining(args))
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[1:])} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def kill_at_first_state(command: list[str], states: Path, args: argparse.Namespace) -> int:
    """Start `command` and SIGKILL it as soon as a resumable state is complete (its folder renamed
    from .tmp); that state's step."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + remaining(args)
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
    raise TimeoutError("no resumable state within the budget")


def part_mfu(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    recipe = run_recipe(args.run)
    torch.compiler.reset()
    cfg = train_config(recipe, sizes.mfu, sizes.device)
    return trained(recipe, model_of(sizes.gpt2, sizes.mfu.seq_len, args.run), cfg, sizes.mfu, args.peak)


# --- the run ------------------------------------------------------------------------------------


def remaining(args: argparse.Namespace) -> float:
    """Seconds left of --budget-s (at least one, so a subprocess's timeout stays valid)."""
    return max(1.0, args.deadline - time.monotonic())


def environment() -> dict[str, Any]:
    driver = None
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True).stdout.strip() or None
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"card": card, "torch": torch.__version__, "cuda": torch.version.cuda, "driver": driver}


def goals(figures: dict[str, Any]) -> dict[str, str]:
    met = {}
    for key, goal in GOALS.items():
        value = figures.get(key)
        if goal is True:
            ok = value is True
        else:
            ok = value is not None and (value <= goal if key.endswith("rel_diff") else value >= goal)
        shown = round(value, 4) if isinstance(value, float) else value
        met[key] = f"{'met' if ok else 'missed'} ({shown} against {goal})"
    return met


def figures_of(parts: dict[str, dict[str, Any]], seconds: float) -> dict[str, Any]:
    def get(part: str, *keys: str) -> Any:
        value: Any = parts.get(part, {})
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return {
        "tests_passed": get("tests", "passed"),
        "tests_failed": get("tests", "failed"),
        "mfu_gpt2_124m": get("mfu", "mfu"),
        "mfu_llama_1b": get("fp8", "llama_mfu", "mfu"),
        "fp8_speedup": get("fp8", "speedup"),
        "fp8_loss_rel_diff": get("fp8", "loss_rel_diff"),
        "flex_speedup": get("flex", "speedup"),
        "flex_loss_rel_diff": get("flex", "loss_rel_diff"),
        "flex_attention_speedup": get("flex", "attention_alone", "speedup"),
        "resume_equal": get("resume", "equal"),
        "resume_max_abs_diff": get("resume", "max_abs_diff"),
        "failed_parts": sum("error" in p for p in parts.values()),
        "parts_not_run": sum("not_run" in p for p in parts.values()),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Folder for gpu_check.json, result.txt and the tests' log.")
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "demo", help="A run whose tokenize stage is done.")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"Comma-separated, of {', '.join(PARTS)}.")
    parser.add_argument("--budget-s", type=float, default=480, help="Seconds for all parts (8 minutes).")
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
    args.deadline = time.monotonic() + args.budget_s
    report: dict[str, Any] = {**environment(), "dry_run": args.dry_run, "peak_flops": args.peak, "parts": {}}
    functions: dict[str, Callable[[argparse.Namespace, Sizes], dict[str, Any]]] = {
        "tests": part_tests,
        "fp8": part_fp8,
        "flex": part_flex,
        "resume": part_resume,
        "mfu": part_mfu,
    }
    started = time.perf_counter()
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        print(f"gpu_check: {name} ...", flush=True)
        if not args.dry_run and remaining(args) < NEEDS_S[name]:
            result: dict[str, Any] = {"not_run": f"{remaining(args):.0f} s of the budget left, {NEEDS_S[name]} needed"}
        else:
            try:
                result = functions[name](args, sizes)
            except Exception as e:  # one part's failure is a figure too; the others still run
                result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        result["seconds"] = time.perf_counter() - t0
        if torch.cuda.is_available():  # the next part starts with the memory this one cached
            gc.collect()
            torch.cuda.empty_cache()
            result["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
            torch.cuda.reset_peak_memory_stats()
        report["parts"][name] = result
        shown = {k: v for k, v in result.items() if k != "traceback"}
        print(f"gpu_check: {name} {json.dumps(shown, default=str)}", flush=True)
        # Written after each part: what was measured is kept if a later part hangs.
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    report["figures"] = figures_of(report["parts"], time.perf_counter() - started)
    # A dry run's toy figures on a CPU say nothing of the goals.
    report["goals"] = {} if args.dry_run else goals(report["figures"])
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    for key, verdict in report["goals"].items():
        print(f"goal {key}: {verdict}")
    line = "RESULT " + " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in report["figures"].items()
    )
    (args.out / "result.txt").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
