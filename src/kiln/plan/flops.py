"""Training compute for a recipe's model and schedule.

Uses kiln.model.config's parameter and FLOP counts (the trainer's MFU uses the same), and
shows the 6ND approximation beside the exact count with attention (PaLM, Appendix B).
Not handled yet: Chinchilla and inference-aware sizing, memory, layout, checkpoint interval,
scaling-law fits (the planner issue adds them as subcommands).
"""

from __future__ import annotations

from typing import Any

from kiln.model.config import ModelConfig, count_params, flops_per_token
from kiln.train.config import TrainConfig

CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal D is about 20 N


def plan_training(model_cfg: ModelConfig, cfg: TrainConfig, vocab_size: int) -> dict[str, Any]:
    model_cfg = model_cfg.resolved(vocab_size)
    n = count_params(model_cfg)
    tokens = cfg.steps * cfg.tokens_per_step
    fpt = flops_per_token(model_cfg, cfg.seq_len)
    return {
        "params": n,
        "params_non_embedding": count_params(model_cfg, include_embeddings=False),
        "vocab_size": vocab_size,
        "seq_len": cfg.seq_len,
        "tokens": tokens,
        "flops_per_token": fpt,
        "train_flops": fpt * tokens,
        "train_flops_6nd": 6 * n * tokens,
        "chinchilla_tokens": CHINCHILLA_TOKENS_PER_PARAM * n,
        "tokens_per_param": round(tokens / n, 3),
    }


def format_plan(plan: dict[str, Any]) -> str:
    rows = [
        ("parameters", f"{plan['params']:,}"),
        ("  without embeddings", f"{plan['params_non_embedding']:,}"),
        ("vocabulary", f"{plan['vocab_size']:,}"),
        ("tokens (steps x tokens/step)", f"{plan['tokens']:,}"),
        ("FLOPs per token (with attention)", f"{plan['flops_per_token']:,}"),
        ("training FLOPs", f"{plan['train_flops']:.3e}"),
        ("training FLOPs by 6ND", f"{plan['train_flops_6nd']:.3e}"),
        ("tokens per parameter", f"{plan['tokens_per_param']} (Chinchilla-optimal about 20: {plan['chinchilla_tokens']:,} tokens)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
