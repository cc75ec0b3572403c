"""Training compute: for a recipe's model and schedule, a named preset, or raw numbers.

Uses kiln.model.config's parameter and FLOP counts (the trainer's MFU uses the same), and
shows the 6ND approximation beside the exact count with attention. Per token, training costs
3x the forward pass; the forward pass is 2 FLOPs per matmul weight plus attention's two
sequence-length products:
  Kaplan et al. 2020, Table 1: C_forward = 2N + 2 * n_layer * n_ctx * d_attn (counts the
      score product once), so training = 6N + 6 * L * T * d_attn;
  PaLM (Chowdhery et al. 2022), Appendix B: 6N + 12 * L * H * Q * T (both the score and the
      value products, H * Q = d_attn), which is what kiln.model.config.flops_per_token counts
      and what the model's own matmuls add up to (tests/model/test_presets.py).
Not handled here: sizing, memory and cost (kiln.plan.chinchilla, .memory, .hardware); the
causal mask's halving of attention work (PaLM counts the full square, as kiln does).
"""

from __future__ import annotations

from typing import Any

from kiln.core.errors import ConfigError
from kiln.model.config import ModelConfig, count_params, flops_per_token, get_preset
from kiln.plan.checks import require_at_least, require_positive
from kiln.plan.report import count, sci, table
from kiln.plan.scaling import TOKENS_PER_PARAM


def plan_training(model_cfg: ModelConfig, seq_len: int, tokens: int, vocab_size: int) -> dict[str, Any]:
    """Parameters and training compute of `model_cfg` trained on `tokens` in windows of `seq_len`."""
    model_cfg = model_cfg.resolved(vocab_size)
    n = count_params(model_cfg)
    fpt = flops_per_token(model_cfg, seq_len)
    return {
        "params": n,
        "params_non_embedding": count_params(model_cfg, include_embeddings=False),
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "tokens": tokens,
        "flops_per_token": fpt,
        "train_flops": fpt * tokens,
        "train_flops_6nd": 6 * n * tokens,
        "chinchilla_tokens": TOKENS_PER_PARAM * n,
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
        (
            "tokens per parameter",
            (
                f"{plan['tokens_per_param']} (Chinchilla-optimal about {TOKENS_PER_PARAM}: "
                f"{plan['chinchilla_tokens']:,} tokens)"
            ),
        ),
    ]
    return table(rows)


def attention_flops_per_token(n_layers: int, seq_len: int, d_attn: int) -> int:
    """PaLM Appendix B's attention term, 12 * L * T * d_attn, for training (forward + backward)."""
    return 12 * n_layers * seq_len * d_attn


def count_flops(
    tokens: float,
    params: float | None = None,
    preset: str | None = None,
    seq_len: int | None = None,
    n_layers: int | None = None,
    d_attn: int | None = None,
) -> dict[str, Any]:
    """Training FLOPs for `tokens` tokens, from a preset (exact) or raw numbers.

    With a preset, parameters and FLOPs per token are kiln.model.config's (seq_len defaults to
    the preset's max_seq_len). With raw `params` alone the answer is 6ND; adding n_layers,
    d_attn and seq_len adds PaLM's attention term to 6N per token. Raw `params` should be the
    matmul parameters (no input embedding) for the exact count, as in Kaplan et al.
    """
    require_positive("tokens", tokens, "training tokens, e.g. 2e12")
    if (preset is None) == (params is None):
        raise ConfigError("give exactly one of params (--params N) or preset (--preset NAME)")
    for name, value in (("seq_len", seq_len), ("n_layers", n_layers), ("d_attn", d_attn)):
        if value is not None:
            require_at_least(name, value, 1, "a dimension of the model")
    if preset is not None:
        if n_layers is not None or d_attn is not None:
            given = " and ".join(
                k for k, v in (("n_layers (--layers)", n_layers), ("d_attn (--d-attn)", d_attn)) if v is not None
            )
            raise ConfigError(
                f"{given} {'go' if ' and ' in given or ', ' in given else 'goes'} only with params (--params); "
                f"preset {preset!r} has its own shape (seq_len, --seq-len, may still be set)"
            )
        cfg = get_preset(preset)
        seq_len = cfg.max_seq_len if seq_len is None else seq_len
        n_layers, d_attn = cfg.n_layers, cfg.n_heads * cfg.head_width
        n = count_params(cfg)
        fpt = flops_per_token(cfg, seq_len)
        matmul = (fpt - attention_flops_per_token(n_layers, seq_len, d_attn)) // 6
        method = "exact"
    else:
        assert params is not None
        require_positive("params", params, "model parameters, e.g. 7e9")
        n = matmul = params
        shape = (n_layers, d_attn, seq_len)
        if all(v is None for v in shape):
            fpt, method = 6 * n, "6nd"
        elif any(v is None for v in shape):
            raise ConfigError(
                "the attention term needs all of n_layers (--layers), d_attn (--d-attn) and seq_len (--seq-len); "
                f"got {n_layers}, {d_attn}, {seq_len}"
            )
        else:
            assert n_layers is not None and d_attn is not None and seq_len is not None
            fpt, method = 6 * n + attention_flops_per_token(n_layers, seq_len, d_attn), "exact"
    # type: ignore[operator]
    kaplan = None if method == "6nd" else (6 * matmul + 6 * n_layers * seq_len * d_attn) * tokens
    return {
        "preset": preset,
        "params": n,
        "tokens": tokens,
        "seq_len": seq_len,
        "n_layers": n_layers,
        "d_attn": d_attn,
        "method": method,
        "flops_per_token": fpt,
        "train_flops": fpt * tokens,
        "train_flops_6nd": 6 * n * tokens,
        "train_flops_kaplan": kaplan,
        "tokens_per_param": tokens / n,
    }


def format_flops(r: dict[str, Any]) -> str:
    rows = [
        ("model", r["preset"] or "raw numbers"),
        ("parameters", count(r["params"])),
        ("training tokens", count(r["tokens"])),
        ("tokens per parameter", f"{r['tokens_per_param']:.1f}"),
        ("FLOPs per token (training)", sci(r["flops_per_token"])),
        (
            "training FLOPs",
            f"{sci(r['train_flops'])} ({'6ND' if r['method'] == '6nd' else 'PaLM App. B, with attention'})",
        ),
        ("training FLOPs by 6ND", sci(r["train_flops_6nd"])),
    ]
    if r["train_flops_kaplan"] is not None:
        rows.append(("training FLOPs by Kaplan Table 1", sci(r["train_flops_kaplan"])))
    notes = (
        []
        if r["method"] == "exact"
        else ["no attention term: add --layers, --d-attn and --seq-len (or use --preset) for the exact count"]
    )
    return table(rows, notes)
