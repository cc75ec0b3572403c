"""What resumable states cost: save and load time and size, synchronous and asynchronous.

A recipe's model and AdamW (kiln.train.optim) take a few real optimizer steps on random tokens
(so the optimizer holds its moments), then kiln.train.resume.States saves the state the trainer
saves (DCP shards of model and optimizer, train_state.json, RNG states, sha256 of every file)
`--repeats` times each way:
- sync: the training loop is blocked for the whole save;
- async: blocked only while DCP copies the state to CPU memory, then the write, the checksums and
  the rename run in a thread; the steps taken meanwhile are timed, so the slowdown the writer
  causes on a busy CPU counts too.
Loading (checksums verified, DCP read, states set) is timed from the newest state.
Ends with: RESULT step_s=.. size_mb=.. sync_save_s=.. async_blocked_s=.. async_total_s=..
async_step_slowdown_s=.. load_s=.. sync_overhead_pct_every_100=.. async_overhead_pct_every_100=..
(the share of training time spent on states when one is saved every 100 steps).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kiln.model.batch import Batch
from kiln.model.config import count_params
from kiln.model.init import build_model
from kiln.recipe import load_recipe
from kiln.train.config import CheckpointConfig
from kiln.train.loss import lm_loss
from kiln.train.mesh import one_process
from kiln.train.optim import build_optimizer
from kiln.train.parts import build_precision
from kiln.train.resume import States
from kiln.train.state_files import drawn_by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every", type=int, default=100, help="Steps between states for the overhead figures.")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.overrides)
    cfg = recipe.train
    precision = build_precision(cfg)
    device = precision.device
    model_cfg = recipe.model.resolved(recipe.tokenizer.vocab_size)
    model = build_model(model_cfg, cfg.seed, device)
    optimizer = build_optimizer(model, cfg.optim)
    B, T = cfg.micro_batch_size, cfg.seq_len
    windows = torch.randint(0, model_cfg.vocab_size, (B, T + 1), device=device)
    batch = Batch(
        windows[:, :-1],
        windows[:, 1:],
        torch.ones(B, T, dtype=torch.bool, device=device),
        None,
        torch.zeros(B, dtype=torch.long, device=device),
    )

    def step() -> float:
        t0 = time.perf_counter()
        for _ in range(cfg.grad_accum_steps):
            with precision.autocast():
                logits_BTV = model(batch.input_ids_BT)
            (lm_loss(logits_BTV, batch).value / cfg.grad_accum_steps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(3):
        step()  # warm-up; the optimizer now holds its moments
    step_s = statistics.median(step() for _ in range(5))
    dp = one_process(device)

    def train_state(step: int) -> dict:
        """What the loop saves besides model, optimizer and RNGs, as the resume checks want it: one source that drew the
        run's rows."""
        rows, tokens = drawn_by(cfg, step, [(1, 1)], {})
        stream = {"epoch": 0, "turn": 0, "position": [0], "offset": [0], "switched_at": []}
        sampler = {
            "sources": ["random"],
            "rows_drawn": rows,
            "drawn": [rows],
            "streams": [stream],
            "factors": [1.0],
            "last_val": {},
        }
        return {
            "batches": {"rows": sampler, "seen": [0]},
            "mixture": {"first_step": 1, "start_tokens": [0.0], "intended": [0.0], "records": []},
            "tokens_trained": tokens,
            "train_flops": 0,
            "val_before": None,
            "guard": {"history": [], "rollbacks": 0, "skips": {}, "low_lr_until": 0},
            "scaler": {},
        }

    print(
        f"{args.recipe}: {count_params(model_cfg):,} params on {device}, {step_s:.3f} s per optimizer step of "
        f"{cfg.tokens_per_step:,} tokens"
    )
    with tempfile.TemporaryDirectory() as tmp:
        sync = States(Path(tmp) / "sync", dp, CheckpointConfig(keep_last=1))
        sync_s = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            sync.save(i + 1, model, optimizer, train_state(i + 1))
            sync_s.append(time.perf_counter() - t0)
        newest = sync.complete()[-1]
        size_mb = sum(p.stat().st_size for p in newest.iterdir()) / 2**20
        files = ", ".join(sorted(p.name for p in newest.iterdir()))
        lazy = States(Path(tmp) / "async", dp, CheckpointConfig(keep_last=1, async_save=True))
        blocked, total, slowdown = [], [], []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            lazy.save(i + 1, model, optimizer, train_state(i + 1))
            blocked.append(time.perf_counter() - t0)
            while lazy.pending is not None and lazy.pending.is_alive():
                slowdown.append(step() - step_s)  # training goes on while the thread writes
            lazy.wait()
            total.append(time.perf_counter() - t0)
        load_s = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sync.load(newest, model, optimizer, cfg)
            load_s.append(time.perf_counter() - t0)
    sync_save, async_blocked, async_total = (
        statistics.median(sync_s),
        statistics.median(blocked),
        statistics.median(total),
    )
    async_cost = (
        async_blocked + sum(slowdown) / args.repeats
    )  # per save: the copy, plus what the writer took from the steps
    train_s = args.every * step_s
    print(f"state after a step: {size_mb:.1f} MB ({newest.name}: {files})")
    print(
        f"sync save {sync_save:.3f} s (blocks training); async: blocked {async_blocked:.3f} s, written after "
        f"{async_total:.3f} s, steps meanwhile slowed by {sum(slowdown) / args.repeats:.3f} s in all; load "
        f"{statistics.median(load_s):.3f} s"
    )
    print(
        f"one state every {args.every} steps: sync costs {100 * sync_save / (train_s + sync_save):.2f}% of "
        f"training time, async {100 * async_cost / (train_s + async_cost):.2f}%"
    )
    print(
        f"RESULT step_s={step_s:.4f} size_mb={size_mb:.2f} sync_save_s={sync_save:.4f} "
        f"async_blocked_s={async_blocked:.4f} async_total_s={async_total:.4f}"
        f" async_step_slowdown_s={sum(slowdown) / args.repeats:.4f} load_s={statistics.median(load_s):.4f}"
        f" sync_overhead_pct_every_{args.every}={100 * sync_save / (train_s + sync_save):.3f} "
        f"async_overhead_pct_every_{args.every}={100 * async_cost / (train_s + async_cost):.3f}"
    )


if __name__ == "__main__":
    main()
