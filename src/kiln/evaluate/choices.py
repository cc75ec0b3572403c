"""Zero-shot multiple choice: the log-likelihood of each choice given the context.

A task is a JSONL file, one item per line in the common layout: `context` (or `query`), `choices`
(a list of strings) and `label` (the index of the right choice; a digit string or a letter A, B,
... is read as that index). HellaSwag, ARC, PIQA and MMLU converted to this layout are read as
they are. Each choice is scored as the continuation `delimiter + choice` (delimiter " " by
default) of the context, tokenized the way lm-evaluation-harness does it: whitespace that ends
the context moves to the start of the continuation, the pair is encoded whole, and the
continuation's tokens are those after the context's own encoding. An empty context is preceded
by end of document. Pairs longer than the model's window keep their last max_seq_len + 1 tokens.

Accuracy three ways, each the share of items whose best choice is the label: `acc` by the raw
log-likelihood, `acc_norm_char` by log-likelihood per character of the choice (without the
delimiter: lm-evaluation-harness's acc_norm), `acc_norm_token` per continuation token.
Not handled here: few-shot prompts, generation tasks, answer extraction.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kiln.core.errors import FatalError
from kiln.core.storage import read_text
from kiln.model.precision import autocast
from kiln.model.transformer import Transformer
from kiln.text.load import AnyTokenizer


@dataclass(frozen=True)
class Item:
    context: str
    choices: tuple[str, ...]
    label: int
    where: str = field(default="", compare=False)  # file:line, for messages


def read_task(path: Path | str) -> list[Item]:
    """Every item of a task file; FatalError naming the file and line of the first bad one."""
    items = []
    try:
        lines = read_text(path).splitlines()  # a file, or a store's object
    except (OSError, UnicodeDecodeError) as e:
        raise FatalError(f"{path}: cannot read the task file ({e})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except ValueError as e:
            raise FatalError(f"{where}: not valid JSON ({e})") from None
        if not isinstance(record, dict):
            raise FatalError(f"{where}: expected a JSON object with context (or query), choices and label")
        context = record.get("context", record.get("query"))
        choices = record.get("choices")
        if not isinstance(context, str):
            raise FatalError(f"{where}: `context` (or `query`) must be a string")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise FatalError(f"{where}: `choices` must be a list of at least two strings")
        items.append(Item(context, tuple(choices), _label(record.get("label"), len(choices), where), where))
    if not items:
        raise FatalError(f"{path}: no items")
    return items


def _label(value: Any, n: int, where: str) -> int:
    if isinstance(value, str) and len(value) == 1 and value.isalpha():
        value = ord(value.upper()) - ord("A")
    elif isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise FatalError(f"{where}: `label` {value!r} is not the index of one of the {n} choices")
    return value


def encode_pair(tokenizer: AnyTokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids): trailing whitespace of the context moves to the continuation,
    the pair is encoded whole and split after the context's own encoding."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    prefix = [tokenizer.bos_id] if tokenizer.bos_id is not None else []  # a model that starts documents with bos
    whole = prefix + tokenizer.encode(context + continuation)
    context_ids = prefix + tokenizer.encode(context)
    if not context_ids:  # no context, no bos: the continuation starts a fresh document
        return [tokenizer.eot_id], whole
    return context_ids, whole[len(context_ids) :]


@torch.no_grad()
def loglikelihoods(
    model: Transformer, pairs: list[tuple[list[int], list[int]]], batch_size: int, amp_dtype: torch.dtype | None = None
) -> list[float]:
    """Sum of log p(continuation | context) per pair, in nats (right-padded batches, fp32 log-softmax)."""
    device = next(model.parameters()).device
    W = model.cfg.max_seq_len
    out = []
    for start in range(0, len(pairs), batch_size):
        rows = []
        for context, continuation in pairs[start : start + batch_size]:
            assert continuation, "every choice has at least one token"
            ids = (context + continuation)[-(W + 1) :]  # the last W + 1 tokens: W inputs, W targets
            rows.append((ids, min(len(continuation), len(ids) - 1)))
        T = max(len(ids) for ids, _ in rows) - 1
        inputs_BT = torch.zeros(len(rows), T, dtype=torch.long)
        for b, (ids, _) in enumerate(rows):
            inputs_BT[b, : len(ids) - 1] = torch.tensor(ids[:-1])
        with autocast(device, amp_dtype):
            logits_BTV = model(inputs_BT.to(device))  # causal: right padding never reaches a real position
        logp_BTV = F.log_softmax(logits_BTV.float(), dim=-1)
        for b, (ids, n) in enumerate(rows):
            positions = torch.arange(
                len(ids) - 1 - n, len(ids) - 1, device=device
            )  # the predictions of the continuation's tokens
            targets = torch.tensor(ids[len(ids) - n :], device=device)
            out.append(float(logp_BTV[b, positions, targets].sum()))  # host sync per row
    return out


def score_task(
    model: Transformer,
    tokenizer: AnyTokenizer,
    items: list[Item],
    delimiter: str = " ",
    batch_size: int = 16,
    amp_dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """{"items", "acc", "acc_norm_char", "acc_norm_token", "stderr"} for one task."""
    pairs, lengths = [], []
    for item in items:
        for j, choice in enumerate(item.choices):
            context_ids, continuation_ids = encode_pair(tokenizer, item.context, delimiter + choice)
            if not continuation_ids:
                raise FatalError(
                    f"{item.where or 'task item'}: choice {j} ({choice!r}) adds no token after the context; give "
                    "eval.task_delimiter a space or end the context with one"
                )
            pairs.append((context_ids, continuation_ids))
            # Per character of the choice itself, as lm-evaluation-harness's acc_norm counts it.
            lengths.append((max(len(choice), 1), len(continuation_ids)))
    scores = loglikelihoods(model, pairs, batch_size, amp_dtype)
    hits = {"acc": 0, "acc_norm_char": 0, "acc_norm_token": 0}
    k = 0
    for item in items:
        ll = scores[k : k + len(item.choices)]
        chars, tokens = zip(*lengths[k : k + len(item.choices)], strict=True)
        k += len(item.choices)
        hits["acc"] += argmax(ll) == item.label
        hits["acc_norm_char"] += argmax([s / c for s, c in zip(ll, chars, strict=True)]) == item.label
        hits["acc_norm_token"] += argmax([s / t for s, t in zip(ll, tokens, strict=True)]) == item.label
    n = len(items)
    result: dict[str, Any] = {"items": n} | {m: round(h / n, 5) for m, h in hits.items()}
    # The binomial standard error of an accuracy over n items (what a difference must exceed).
    result["stderr"] = {m: round(math.sqrt(result[m] * (1 - result[m]) / max(n - 1, 1)), 5) for m in hits}
    return result


def argmax(values: list[float]) -> int:
    """Index of the largest value; the first one on a tie."""
    return max(range(len(values)), key=values.__getitem__)
