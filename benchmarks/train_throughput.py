"""Training throughput of a recipe's model: tokens/s and, on a known GPU, MFU.

Random token batches (throughput does not depend on the data), the recipe's model, batch
geometry (train.global_batch_tokens) and precision (train.precision), AdamW with clipping, the
loss of kiln.train.loss, as in kiln.train.loop. Warmup steps are not timed.
Ends with: RESULT tokens_per_s=.. step_ms=.. params=.. [mfu=..] (mfu only where the device's
peak FLOP/s is known, i.e. on listed GPUs).
"""

from __future__ import annotations

import argparse
import time

import torch

from kiln.model.batch import Batch
from kiln.model.config import count_params, flops_per_token
from kiln.model.init import build_model
from kiln.recipe import load_recipe
from kiln.train.loop import build_precision
from kiln.train.loss import lm_loss
from kiln.train.monitor import device_peak_flops
from kiln.train.optim import build_optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=20, help="Timed steps.")
    parser.add_argument("--warmup", type=int, default=5, help="Untimed steps first (allocator and kernel warmup).")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.overrides)
    cfg = recipe.train
    precision = build_precision(cfg)
    device = precision.device
    model_cfg = recipe.model.resolved(recipe.tokenizer.vocab_size)
    model = build_model(model_cfg, cfg.seed, device)
    optimizer = build_optimizer(model, cfg.optim)
    windows = torch.randint(0, model_cfg.vocab_size, (cfg.micro_batch_size, cfg.seq_len + 1), device=device)
    B, T = cfg.micro_batch_size, cfg.seq_len
    batch = Batch(windows[:, :-1], windows[:, 1:], torch.ones(B, T, dtype=torch.bool, device=device), None, torch.zeros(B, dtype=torch.long, device=device))

    def step() -> None:
        for _ in range(cfg.grad_accum_steps):
            with precision.autocast():
                logits_BTV = model(batch.input_ids_BT)
            (lm_loss(logits_BTV, batch).mean / cfg.grad_accum_steps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()  # host sync: start the clock on an idle device
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens_per_s = args.steps * cfg.tokens_per_step / seconds
    peak = device_peak_flops(device)
    params = count_params(model_cfg)
    print(f"device {device}, {params:,} params, {cfg.tokens_per_step:,} tokens/step, {1000 * seconds / args.steps:.1f} ms/step")
    mfu = f" mfu={tokens_per_s * flops_per_token(model_cfg, cfg.seq_len) / peak:.4f}" if peak else ""
    print(f"RESULT tokens_per_s={tokens_per_s:.1f} step_ms={1000 * seconds / args.steps:.2f} params={params}{mfu}")


if __name__ == "__main__":
    main()
