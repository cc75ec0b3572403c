"""kiln.evaluate.perplexity: loss, perplexity and bits per byte worked by hand on constructed shards."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from kiln.evaluate.perplexity import combined, evaluate_model, val_bytes_per_token
from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer
from kiln.tokenize.shards import TokenShard, TokenShardWriter

# A 4-token model whose next-token distribution is fixed: p = [1/2, 1/4, 1/8, 1/8] at every
# position, so the loss of a target is exactly 1, 2, 3 or 3 bits.
PROBS = [0.5, 0.25, 0.125, 0.125]
BITS = [1.0, 2.0, 3.0, 3.0]


def fixed_distribution_model() -> Transformer:
    model = Transformer(ModelConfig(vocab_size=4, d_model=16, n_layers=1, n_heads=2, max_seq_len=32))
    head = nn.Linear(16, 4, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor(PROBS).log())
    model.lm_head = head
    return model


def write_shard(prefix: Path, tokens: list[int], vocab_size: int = 4) -> TokenShard:
    writer = TokenShardWriter(prefix, vocab_size=vocab_size)
    writer.add(tokens)
    writer.close()
    return TokenShard(prefix)


def test_loss_perplexity_and_bpb_by_hand(tmp_path: Path) -> None:
    # 17 tokens 0,1,2,3,0,1,... = one window of seq_len 16. Its targets (tokens 1..16) hold each
    # id four times: mean (1 + 2 + 3 + 3) / 4 = 2.25 bits = 2.25 * ln 2 = 1.55958 nats per token,
    # perplexity 2^2.25 = 4.75683. With 1.5 bytes per token: bpb = 2.25 / 1.5 = 1.5.
    shard = write_shard(tmp_path / "a", [i % 4 for i in range(17)])
    results = evaluate_model(fixed_distribution_model(), {"a": shard}, {"a": 1.5}, seq_len=16, max_tokens_per_source=1000, batch_size=8)
    assert results == {"a": {"loss": pytest.approx(1.55958, abs=1e-5), "perplexity": pytest.approx(4.757, abs=1e-3), "bpb": pytest.approx(1.5, abs=1e-5), "tokens": 16, "bytes": 24.0}}


@pytest.mark.parametrize(
    ("n_tokens", "seq_len", "max_tokens", "scored"),
    [
        (100, 16, 1000, 96),  # 99 targets -> 6 whole windows of 16
        (100, 16, 40, 32),  # capped: tokens[:41] -> 2 windows of 16
        (10, 16, 1000, 9),  # shorter than seq_len: one window of 9
        (1, 16, 1000, None),  # a single token has no target: the source is left out
    ],
)
def test_windows_scored(tmp_path: Path, n_tokens: int, seq_len: int, max_tokens: int, scored: int | None) -> None:
    tokens = [(7 * i) % 4 for i in range(n_tokens)]
    shard = write_shard(tmp_path / "a", tokens)
    results = evaluate_model(fixed_distribution_model(), {"a": shard}, {"a": 2.0}, seq_len=seq_len, max_tokens_per_source=max_tokens, batch_size=4)
    if scored is None:
        assert results == {}
        return
    assert results["a"]["tokens"] == scored
    # Non-overlapping windows from the start: the scored targets are tokens 1..scored.
    expected_bits = float(np.mean([BITS[t] for t in tokens[1 : scored + 1]]))
    assert results["a"]["loss"] == pytest.approx(expected_bits * math.log(2), abs=1e-5)
    assert results["a"]["bpb"] == pytest.approx(expected_bits / 2.0, abs=1e-5)


def test_batch_size_does_not_change_results_and_mode_is_restored(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=2, max_seq_len=16))
    model.train()
    rng = np.random.default_rng(0)
    shards = {s: write_shard(tmp_path / s, rng.integers(0, 50, size=n).tolist(), vocab_size=50) for s, n in (("a", 300), ("b", 170))}
    kwargs = {"bytes_per_token": {"a": 3.0, "b": 2.0}, "seq_len": 16, "max_tokens_per_source": 10_000}
    one = evaluate_model(model, shards, batch_size=1, **kwargs)
    many = evaluate_model(model, shards, batch_size=7, **kwargs)
    assert model.training  # evaluate_model switches to eval and back
    assert one.keys() == many.keys() == {"a", "b"}
    for s in one:
        assert one[s]["tokens"] == many[s]["tokens"]
        assert one[s]["loss"] == pytest.approx(many[s]["loss"], abs=2e-5)
    # Untrained, near ln 50 = 3.912; bpb = loss / ln 2 / bytes_per_token.
    assert one["a"]["loss"] == pytest.approx(math.log(50), abs=0.1)
    assert one["b"]["bpb"] == pytest.approx(one["b"]["loss"] / math.log(2) / 2.0, abs=1e-4)


def test_combined_loss_is_token_weighted_and_bpb_is_bits_over_bytes() -> None:
    results = {"a": {"loss": 2.0, "bpb": 1.0, "tokens": 100, "bytes": 400.0}, "b": {"loss": 4.0, "bpb": 3.0, "tokens": 300, "bytes": 600.0}}
    # loss (2*100 + 4*300) / 400 = 3.5 nats; exp(3.5) = 33.115
    # bpb: (2*100 + 4*300) nats / ln 2 = 2019.77 bits over 1000 bytes = 2.01977 (not the token-weighted 2.5)
    assert combined(results) == {"loss": 3.5, "perplexity": pytest.approx(33.115, abs=1e-3), "bpb": pytest.approx(1400 / math.log(2) / 1000, abs=1e-5), "tokens": 400, "bytes": 1000.0}


def test_val_bytes_per_token_from_tokenize_counts() -> None:
    counts = {"per_source": {"a": {"train": {"bytes": 9, "tokens": 1}, "val": {"bytes": 300, "tokens": 100}}, "b": {"val": {"bytes": 0, "tokens": 0}}}}
    ratios = val_bytes_per_token(counts)
    assert ratios["a"] == 3.0
    assert math.isnan(ratios["b"])
