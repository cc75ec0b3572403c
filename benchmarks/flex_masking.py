"""Flex attention's block mask against SDPA's dense mask on packed documents: the flex part of
benchmarks/gpu_check.py (which runs it on a GPU, and at toy sizes on the CPU in its dry run).

`packed_rows` cuts windows of a run's train tokens into documents of a chosen range of lengths;
`flex_leg` trains on them through the trainer's own loss (kiln.train.parts.build_loss) with the
rule computed by one kernel; `attention_alone` times one layer's attention by itself.
Not handled here: objectives other than causal language modelling within documents, several GPUs.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from kiln.core.layout import RunLayout
from kiln.mix.config import MixConfig
from kiln.mix.sampler import build_sampler
from kiln.model.attention import AttentionRule, Kernel
from kiln.model.batch import Batch
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.precision import Precision
from kiln.model.transformer import Rotary, ScaledDotProduct, layer_inputs
from kiln.train.distributed import apply_compile
from kiln.train.loss import LossOptions
from kiln.train.parts import build_loss


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host sync: the clock reads finished work


def packed_rows(run_dir: Path, T: int, rows: int, count: int, documents: tuple[int, int]) -> list[Batch]:
    """`count` batches of `rows` windows of T of the run's train tokens, cut into documents of
    documents[0] to documents[1] tokens (document ids, RoPE positions restarting per document,
    targets within each document)."""
    sampler = build_sampler(RunLayout(run_dir).token_shards, MixConfig(), T)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        windows = np.stack(sampler.next_rows([T + 1] * rows, 0.0, slice(None)).tokens)  # (rows, T + 1) int64
        lengths = rng.integers(documents[0], documents[1] + 1, size=(rows, T // documents[0] + 1))
        doc_BT = np.stack([np.searchsorted(np.cumsum(row), np.arange(T), side="right") for row in lengths])
        starts = np.maximum.accumulate(np.where(np.diff(doc_BT, prepend=-1, axis=1) != 0, np.arange(T), 0), axis=1)
        last_BT = np.diff(doc_BT, append=-1, axis=1) != 0  # the last position of each document predicts nothing
        ids = torch.from_numpy(windows)
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


def flex_leg(model_cfg: ModelConfig, batches: list[Batch], kernel: Kernel, warmup: int, device: torch.device) -> dict:
    """Training steps (forward only on the CPU) with the rule computed by `kernel`, through the
    trainer's loss: tokens/s after `warmup`, and every step's loss."""
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
        kept = int(batch.loss_mask_BT.sum())  # counted on the host: no device sync
        batch = batch.to(device)
        with torch.set_grad_enabled(cuda):
            loss = loss_of(model, batch, kept)
        if cuda:
            loss.value.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(loss.value.detach())
    synchronize(device)
    seconds = time.perf_counter() - t0
    timed = sum(b.input_ids_BT.numel() for b in batches[warmup:])
    return {"tokens_per_s": timed / seconds, "losses": [float(v) for v in losses]}


def attention_alone(model_cfg: ModelConfig, batch: Batch, device: torch.device) -> dict[str, float]:
    """ms per forward and backward (forward only on the CPU) of one layer's attention on the batch's
    documents, the dense mask against flex (compiled on CUDA, as the blocks run it)."""
    B, T = batch.input_ids_BT.shape
    cuda = device.type == "cuda"
    g = torch.Generator(device=device).manual_seed(0)
    shape, dtype = (B, model_cfg.n_heads, T, model_cfg.head_width), torch.bfloat16 if cuda else torch.float32
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=g, requires_grad=cuda) for _ in range(3))
    attention, rope, result = ScaledDotProduct(1), Rotary(model_cfg).to(device), {}
    run = torch.compile(attention) if cuda else attention
    for kernel in ("sdpa", "flex"):
        rule = AttentionRule("causal", doc_ids_BT=batch.doc_ids_BT, kernel=kernel)
        kwargs = layer_inputs(rope, T, q.transpose(1, 2), rule).sdpa_kwargs  # the model's: an additive mask, or flex's
        for i in range(13):  # 3 untimed, then 10
            if i == 3:
                synchronize(device)
                t0 = time.perf_counter()
            y = run(q, k, v, kwargs)
            if cuda:
                y.sum().backward()
        synchronize(device)
        result[f"{kernel}_ms"] = (time.perf_counter() - t0) / 10 * 1000
    result["speedup"] = result["sdpa_ms"] / result["flex_ms"]
    return result
