"""Sampling text from a trained model: batched prompts, a KV cache, and the usual sampling controls.

Prompts are encoded, left-padded to one length (padding is masked out of attention and each row's
RoPE positions start at its first real token, so a prompt gives the same logits alone or in a
batch) and run through the model once; every new token then runs one position against the KV
cache (kiln.model.kv_cache). When a row would pass the model's context (max_seq_len) the window
slides instead: each later token reruns the model on the last max_seq_len positions, without a
cache, as the model was trained to see them. `generate.use_cache=false` decodes every token that
way (the reference the cache is tested against, and the slow side of benchmarks/generate_speed.py).

Per step, in this order: specials other than end of document are banned; repetition penalty
(a seen token's logit divided by the penalty when positive, multiplied when negative);
temperature (0: greedy); top-k; top-p (nucleus); min-p (drop tokens below min_p times the top
probability). A row stops at end of document, at a stop string (the completion is cut before it)
or after max_new_tokens. One seeded generator draws for the whole batch.
Device and autocast come from generate.precision (kiln.model.precision).
Not handled here: beam search, speculative decoding, chat templates.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln.core.errors import FatalError
from kiln.core.layout import GENERATE, SUMMARY, TRAIN, RunLayout
from kiln.core.manifest import Stage
from kiln.core.storage import as_location, is_file, read_text
from kiln.evaluate.config import GenerateConfig
from kiln.model.attention import CAUSAL
from kiln.model.kv_cache import KVCache
from kiln.model.precision import autocast, resolve_precision
from kiln.model.transformer import Transformer
from kiln.model.weights import CONFIG, WEIGHTS, load_trained_model
from kiln.text.load import AnyTokenizer, load_tokenizer

log = logging.getLogger("kiln.generate")
SAMPLES = "samples.jsonl"


@dataclass(frozen=True)
class Completion:
    prompt: str
    completion: str
    new_tokens: int
    finish_reason: str  # "end_of_document", "stop", or "length"
    ids: tuple[int, ...]  # the new tokens (a stop string's tokens included; end of document not)

    def record(self) -> dict[str, Any]:
        """The samples.jsonl line."""
        return {
            "prompt": self.prompt,
            "completion": self.completion,
            "new_tokens": self.new_tokens,
            "finish_reason": self.finish_reason,
        }


def filter_logits(
    logits_V: torch.Tensor, top_k: int | None, top_p: float | None, min_p: float | None = None
) -> torch.Tensor:
    """Logits with everything outside the top-k, the top-p nucleus and the min-p floor set to -inf
    (works on (V,) or on (B, V) row by row)."""
    if top_k is not None and top_k < logits_V.shape[-1]:
        kth = torch.topk(logits_V, top_k, dim=-1).values[..., -1:]
        logits_V = logits_V.masked_fill(logits_V < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits_V, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens before it already reach top_p; the most likely one always stays.
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        logits_V = logits_V.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    if min_p is not None and min_p > 0:
        probs = logits_V.softmax(-1)
        logits_V = logits_V.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return logits_V


def penalize_repeats(logits_BV: torch.Tensor, seen_BV: torch.Tensor, penalty: float) -> torch.Tensor:
    """Seen tokens made less likely: positive logits divided by the penalty, negative ones multiplied."""
    if penalty == 1.0:
        return logits_BV
    return torch.where(seen_BV, torch.where(logits_BV > 0, logits_BV / penalty, logits_BV * penalty), logits_BV)


def positions(valid_BN: torch.Tensor) -> torch.Tensor:
    """Each position's RoPE position: real tokens count from 0 at the row's first one; padding gets 0."""
    return (valid_BN.long().cumsum(-1) - 1).clamp(min=0)


def window_logits(model: Transformer, ids_BN: torch.Tensor, valid_BN: torch.Tensor) -> torch.Tensor:
    """Last-position logits (B, V) of the last max_seq_len positions, computed without a cache."""
    ids_BW, valid_BW = ids_BN[:, -model.cfg.max_seq_len :], valid_BN[:, -model.cfg.max_seq_len :]
    if bool(valid_BW.all()):  # host sync; no padding: the plain causal fast path
        return model(ids_BW, last_only=True)[:, -1]
    # Padding and real tokens as two "documents": no real token sees padding.
    return model(
        ids_BW, rule=CAUSAL.within_documents(valid_BW.long()), positions_BT=positions(valid_BW), last_only=True
    )[:, -1]


@torch.no_grad()
def complete(
    model: Transformer,
    tokenizer: AnyTokenizer,
    prompts: list[str],
    cfg: GenerateConfig,
    amp_dtype: torch.dtype | None = None,
) -> list[Completion]:
    """One completion per prompt, decoded together as one batch (amp_dtype: the autocast dtype, None for fp32)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    B, W, V = len(prompts), model.cfg.max_seq_len, model.cfg.vocab_size
    # A prompt starts a document: after bos for a model that has one; an empty one after end of document otherwise.
    prefix = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    encoded = [prefix + tokenizer.encode(p) or [tokenizer.eot_id] for p in prompts]
    P = max(len(e) for e in encoded)
    ids_BN = torch.full((B, P + cfg.max_new_tokens), tokenizer.pad_id, dtype=torch.long)
    valid_BN = torch.zeros(B, P + cfg.max_new_tokens, dtype=torch.bool)
    for row, e in enumerate(encoded):  # left padding: every prompt ends at column P
        ids_BN[row, P - len(e) : P] = torch.tensor(e)
        valid_BN[row, P - len(e) : P] = True
    padded = bool((~valid_BN[:, :P]).any())  # on the host: no sync
    ids_BN, valid_BN = ids_BN.to(device), valid_BN.to(device)
    penalize = cfg.repetition_penalty != 1.0
    seen_BV = torch.zeros(B, V, dtype=torch.bool, device=device)
    if penalize:
        seen_BV.scatter_(
            1, torch.where(valid_BN[:, :P], ids_BN[:, :P], tokenizer.pad_id), True
        )  # padding is banned anyway
    # Specials other than end-of-document (padding, mask, FIM, sentinels, reserved) are never text.
    banned = torch.tensor(
        [i for i in tokenizer.specials.values() if i != tokenizer.eot_id], dtype=torch.long, device=device
    )  # none for a vocabulary whose only special is end of document (GPT-2's)
    # Room for what this call can reach: the prompt and its new tokens, at most the context.
    cache = KVCache(model.cfg.n_layers, min(W, P + cfg.max_new_tokens)) if cfg.use_cache and P < W else None
    # Each row's next RoPE position: its real tokens so far (left padding counts none).
    next_pos_B1 = valid_BN[:, :P].sum(-1, keepdim=True)
    new: list[list[int]] = [[] for _ in range(B)]
    finish: list[str | None] = [None] * B
    cut: list[int | None] = [None] * B  # character offset of a stop string in a row's text
    n = P
    with autocast(device, amp_dtype):
        if cache is None:
            logits_BV = window_logits(model, ids_BN[:, :P], valid_BN[:, :P])
        elif padded:
            logits_BV = model(
                ids_BN[:, :P],
                positions_BT=positions(valid_BN[:, :P]),
                cache=cache,
                valid_BT=valid_BN[:, :P],
                last_only=True,
            )[:, -1]
        else:
            logits_BV = model(ids_BN[:, :P], cache=cache, last_only=True)[:, -1]
    for _ in range(cfg.max_new_tokens):
        logits_BV = logits_BV.float()
        if penalize:
            logits_BV = penalize_repeats(logits_BV, seen_BV, cfg.repetition_penalty)
        logits_BV[:, banned] = float("-inf")
        if cfg.temperature == 0:
            next_B = logits_BV.argmax(-1)
        else:
            probs_BV = filter_logits(logits_BV / cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p).softmax(-1)
            next_B = torch.multinomial(probs_BV, 1, generator=gen)[:, 0]
        next_list = next_B.tolist()  # host sync per token
        ids_BN[:, n] = next_B
        # A finished row keeps decoding (its tokens are dropped); its keys are seen by no other row.
        valid_BN[:, n] = next_B != tokenizer.eot_id
        if penalize:
            seen_BV.scatter_(1, torch.where(valid_BN[:, n : n + 1], ids_BN[:, n : n + 1], tokenizer.pad_id), True)
        n += 1
        for row, token in enumerate(next_list):
            if finish[row] is not None:
                continue
            if token == tokenizer.eot_id:
                finish[row] = "end_of_document"
                continue
            new[row].append(token)
            if cfg.stop:
                text = tokenizer.decode(new[row])
                hits = [i for i in (text.find(s) for s in cfg.stop) if i >= 0]
                if hits:
                    finish[row], cut[row] = "stop", min(hits)
        if all(f is not None for f in finish) or n == ids_BN.shape[1]:
            break
        with autocast(device, amp_dtype):
            if cache is not None and n <= cache.capacity:  # one new position per row against the cache
                logits_BV = model(
                    ids_BN[:, n - 1 : n], positions_BT=next_pos_B1 if padded else None, cache=cache, last_only=True
                )[:, -1]
                next_pos_B1 = next_pos_B1 + 1
            else:  # no cache, or past the context: the window slides
                logits_BV = window_logits(model, ids_BN[:, :n], valid_BN[:, :n])
    out = []
    for row, prompt in enumerate(prompts):
        text = tokenizer.decode(new[row])
        out.append(
            Completion(
                prompt,
                text[: cut[row]] if cut[row] is not None else text,
                len(new[row]),
                finish[row] or "length",
                tuple(new[row]),
            )
        )
    return out


def generate(
    model: Transformer, tokenizer: AnyTokenizer, cfg: GenerateConfig, amp_dtype: torch.dtype | None = None
) -> str:
    """generate.prompt and its continuation."""
    return cfg.prompt + complete(model, tokenizer, [cfg.prompt], cfg, amp_dtype)[0].completion


def read_prompts(path: Path | str) -> list[str]:
    """Prompts from a file: JSONL with a `prompt` field per line, or plain text with one prompt per line."""
    try:
        lines = read_text(path).splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise FatalError(f"{path}: cannot read the prompt file ({e})") from None
    if not str(path).endswith(".jsonl"):
        return [line for line in lines if line.strip()]
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise FatalError(f"{path}:{number}: not valid JSON ({e})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise FatalError(f"{path}:{number}: expected an object with a string field `prompt`")
        prompts.append(record["prompt"])
    return prompts


def run(cfg: GenerateConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    ckpt, tok_path = layout.checkpoint, layout.tokenizer_json
    prompt_file = [as_location(cfg.prompt_file)] if cfg.prompt_file else []  # a file, or a store's object
    if prompt_file and not is_file(prompt_file[0]):  # the user's file, not an output a stage could remake
        what = "a folder, not a file" if os.path.isdir(prompt_file[0]) else "no such file"
        raise FatalError(
            f"generate.prompt_file {cfg.prompt_file}: {what}; give a JSONL file with a `prompt` field per line, "
            "or a text file with one prompt per line (--prompt-file FILE)"
        )
    stage = Stage(
        run_dir, GENERATE, {"generate": cfg}, [ckpt / WEIGHTS, ckpt / CONFIG, tok_path, *prompt_file], upstream=[TRAIN]
    )
    if done := stage.up_to_date(
        force, lambda m: f"the samples are in {stage.final_dir / (SAMPLES if cfg.prompt_file else SUMMARY)}"
    ):
        return done
    prompts = read_prompts(prompt_file[0]) if prompt_file else [cfg.prompt]
    if not prompts:
        raise FatalError(f"{cfg.prompt_file}: no prompts in the file")
    stage.begin()
    precision = resolve_precision(cfg.precision, "generate")
    model = load_trained_model(ckpt, precision.device)
    tokenizer = load_tokenizer(tok_path)
    t0 = time.perf_counter()
    done_list: list[Completion] = []
    for start in range(0, len(prompts), cfg.batch_size):
        done_list += complete(model, tokenizer, prompts[start : start + cfg.batch_size], cfg, precision.amp_dtype)
    seconds = time.perf_counter() - t0
    tokens = sum(c.new_tokens for c in done_list)
    outputs = []
    if prompt_file:
        samples = stage.dir / SAMPLES
        samples.write_text(
            "".join(json.dumps(c.record(), ensure_ascii=False) + "\n" for c in done_list), encoding="utf-8"
        )
        outputs.append(samples)
    first = done_list[0]
    text = first.prompt + first.completion
    counts = {
        "sample": text,
        "chars": len(text),
        "prompts": len(prompts),
        "new_tokens": tokens,
        "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
    }
    summary = (
        text
        if not prompt_file
        else (
            f"{len(prompts)} prompts, {tokens:,} new tokens ({counts['tokens_per_s']:,} tokens/s) in "
            f"{stage.final_dir / SAMPLES}; the first:\n{text}"
        )
    )
    return stage.finish(outputs, counts, summary)
