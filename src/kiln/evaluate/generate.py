"""Sampling text from a trained model: temperature, top-k and top-p (nucleus).

Each new token reruns the model on the last max_seq_len tokens (no KV cache yet): fine for
demo-sized models and short samples, and the logits are exactly the training forward's. Device
and autocast come from generate.precision (kiln.model.precision).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from kiln.core.layout import GENERATE, SUMMARY, TRAIN, RunLayout
from kiln.core.manifest import Stage
from kiln.evaluate.config import GenerateConfig
from kiln.model.precision import autocast, resolve_precision
from kiln.model.transformer import Transformer
from kiln.model.weights import CONFIG, WEIGHTS, load_trained_model
from kiln.text.tokenizer import KilnTokenizer

log = logging.getLogger("kiln.generate")


def filter_logits(logits_V: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Logits with everything outside the top-k and the top-p nucleus set to -inf."""
    if top_k is not None and top_k < logits_V.numel():
        kth = torch.topk(logits_V, top_k).values[-1]
        logits_V = logits_V.masked_fill(logits_V < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits_V, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p; the most likely one always stays.
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= top_p
        logits_V = logits_V.masked_fill(drop_sorted.scatter(0, order, drop_sorted), float("-inf"))
    return logits_V


@torch.no_grad()
def generate(model: Transformer, tokenizer: KilnTokenizer, cfg: GenerateConfig, amp_dtype: torch.dtype | None = None) -> str:
    """The prompt and its continuation; amp_dtype is the autocast dtype (None: plain fp32)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    ids = tokenizer.encode(cfg.prompt) or [tokenizer.eot_id]  # an empty prompt starts a fresh document
    new: list[int] = []
    # Specials other than end-of-document (padding, mask, FIM, sentinels, reserved) are never text;
    # end-of-document may end the sample.
    banned = torch.tensor([i for i in tokenizer.specials.values() if i != tokenizer.eot_id], device=device)
    for _ in range(cfg.max_new_tokens):
        context = torch.tensor([ids[-model.cfg.max_seq_len :]], device=device)
        with autocast(device, amp_dtype):
            logits_V = model(context)[0, -1]  # fp32 logits of the last position
        logits_V[banned] = float("-inf")
        if cfg.temperature == 0:
            next_id = int(logits_V.argmax())
        else:
            probs_V = filter_logits(logits_V / cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)
            next_id = int(torch.multinomial(probs_V, 1, generator=gen))  # host sync per token
        if next_id == tokenizer.eot_id:
            break
        ids.append(next_id)
        new.append(next_id)
    return cfg.prompt + tokenizer.decode(new)


def run(cfg: GenerateConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    ckpt, tok_path = layout.checkpoint, layout.tokenizer_json
    stage = Stage(run_dir, GENERATE, {"generate": cfg}, [ckpt / WEIGHTS, ckpt / CONFIG, tok_path], upstream=[TRAIN])
    if done := stage.up_to_date(force, lambda m: f"the sample is in {stage.final_dir / SUMMARY}"):
        return done
    stage.begin()
    precision = resolve_precision(cfg.precision, "generate")
    model = load_trained_model(ckpt, precision.device)
    text = generate(model, KilnTokenizer.load(tok_path), cfg, precision.amp_dtype)
    return stage.finish([], {"sample": text, "chars": len(text)}, text)
