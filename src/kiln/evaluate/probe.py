"""The probe set: a fixed handful of held-out documents and prompts the trainer scores every
`train.probe_every` steps, logging each document's loss and the model's greedy continuations.

The documents are the first `documents_per_source` of each source's validation split (the same
ones in every run on the same shards); each is scored on its first max_seq_len + 1 tokens. The
prompts are the first `prompt_tokens` tokens of each probe document, then `eval.probe.prompts`;
each gets a greedy continuation of `max_new_tokens` (kiln.evaluate.generate, KV cache), so the
lines of one run read as the same questions answered better and better. Generation runs eagerly
even when the blocks are compiled (decoding shapes change every token).
Not handled here: when to probe (the train loop) or where the lines go (its monitor).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kiln.core.layout import RunLayout
from kiln.core.tokenshards import open_split
from kiln.evaluate.config import GenerateConfig, ProbeConfig
from kiln.evaluate.generate import complete
from kiln.model.precision import autocast
from kiln.model.transformer import Transformer
from kiln.text.load import load_tokenizer

Probe = Callable[[Transformer], dict[str, Any]]


def build_probe(run_dir: Path, cfg: ProbeConfig, amp_dtype: torch.dtype | None) -> Probe:
    """`model -> {"documents": {"<source>/<i>": {"loss", "tokens"}}, "generations": [{"prompt", "completion"}]}`."""
    layout = RunLayout(run_dir)
    tokenizer = load_tokenizer(layout.tokenizer_json)
    documents = {
        f"{source}/{i}": shard.document(i)
        for source, shard in sorted(open_split(layout.token_shards, "val").items())
        for i in range(min(cfg.documents_per_source, shard.n_docs))
    }
    # A document's own end-of-document token never goes into its prompt (decoded, it would read as text).
    prompts = [
        tokenizer.decode(ids[: min(cfg.prompt_tokens, len(ids) - 1)].tolist()) for ids in documents.values()
    ] + list(cfg.prompts)
    sampling = GenerateConfig(temperature=0, max_new_tokens=cfg.max_new_tokens, batch_size=max(len(prompts), 1))

    @torch.no_grad()
    def probe(model: Transformer) -> dict[str, Any]:
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        scored = {}
        for name, ids in documents.items():
            window = torch.as_tensor(ids[: model.cfg.max_seq_len + 1].astype("int64"), device=device)[None]
            with autocast(device, amp_dtype):
                logits_1TV = model(window[:, :-1])
            scored[name] = {
                "loss": round(F.cross_entropy(logits_1TV[0].float(), window[0, 1:]).item(), 5),
                "tokens": window.shape[1] - 1,
            }  # host sync per document
        with torch.compiler.set_stance("force_eager"):  # compiled blocks would recompile for every decoding shape
            done = complete(model, tokenizer, prompts, sampling, amp_dtype) if prompts else []
        model.train(was_training)
        return {"documents": scored, "generations": [{"prompt": c.prompt, "completion": c.completion} for c in done]}

    return probe
