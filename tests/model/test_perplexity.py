"""kiln.model.perplexity: loss, perplexity and bits per byte worked by hand on constructed shards."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from kiln.core.errors import FatalError
from kiln.core.tokenshards import TokenShard, TokenShardWriter
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.perplexity import evaluate_model, format_results
from kiln.model.transformer import Transformer

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
    # perplexity 2^2.25 = 4.75683. Ids stand for 1, 2, 1, 2 bytes: 4 * (1 + 2 + 1 + 2) = 24 bytes
    # for 16 * 2.25 = 36 bits, so bpb = 1.5.
    shard = write_shard(tmp_path / "a", [i % 4 for i in range(17)])
    results = evaluate_model(
        fixed_distribution_model(),
        {"a": shard},
        np.array([1, 2, 1, 2]),
        seq_len=16,
        max_tokens_per_source=1000,
        batch_size=8,
    )
    expected = {
        "loss": pytest.approx(1.55958, abs=1e-5),
        "perplexity": pytest.approx(4.757, abs=1e-3),
        "bpb": pytest.approx(1.5, abs=1e-5),
        "tokens": 16,
        "bytes": 24,
    }
    assert results == {"sources": {"a": expected}, "all": expected}


def test_special_tokens_count_no_bytes(tmp_path: Path) -> None:
    # Same stream, but id 3 is a special token (0 bytes): 4 * (1 + 2 + 1 + 0) = 16 bytes for 36 bits.
    shard = write_shard(tmp_path / "a", [i % 4 for i in range(17)])
    results = evaluate_model(
        fixed_distribution_model(),
        {"a": shard},
        np.array([1, 2, 1, 0]),
        seq_len=16,
        max_tokens_per_source=1000,
        batch_size=8,
    )
    assert results["sources"]["a"]["bytes"] == 16
    assert results["sources"]["a"]["bpb"] == pytest.approx(36 / 16, abs=1e-5)


@pytest.mark.parametrize(
    ("n_tokens", "seq_len", "max_tokens", "scored"),
    [
        (100, 16, 1000, 96),  # 99 targets -> 6 whole windows of 16
        (100, 16, 40, 32),  # capped: tokens[:41] -> 2 windows of 16
        (10, 16, 1000, 9),  # shorter than seq_len: one window of 9
    ],
)
def test_windows_scored(tmp_path: Path, n_tokens: int, seq_len: int, max_tokens: int, scored: int) -> None:
    tokens = [(7 * i) % 4 for i in range(n_tokens)]
    shard = write_shard(tmp_path / "a", tokens)
    results = evaluate_model(
        fixed_distribution_model(),
        {"a": shard},
        np.full(4, 2),
        seq_len=seq_len,
        max_tokens_per_source=max_tokens,
        batch_size=4,
    )
    a = results["sources"]["a"]
    assert a["tokens"] == scored and a["bytes"] == 2 * scored
    # Non-overlapping windows from the start: the scored targets are tokens 1..scored.
    expected_bits = float(np.mean([BITS[t] for t in tokens[1 : scored + 1]]))
    assert a["loss"] == pytest.approx(expected_bits * math.log(2), abs=1e-5)
    assert a["bpb"] == pytest.approx(expected_bits / 2.0, abs=1e-5)


def test_source_without_a_target_is_left_out_and_none_at_all_is_fatal(tmp_path: Path) -> None:
    single = write_shard(tmp_path / "one", [2])
    pair = write_shard(tmp_path / "two", [0, 1])
    results = evaluate_model(
        fixed_distribution_model(),
        {"one": single, "two": pair},
        np.ones(4, dtype=np.int64),
        seq_len=16,
        max_tokens_per_source=100,
        batch_size=4,
    )
    assert set(results["sources"]) == {"two"}
    with pytest.raises(FatalError, match="no validation split"):
        evaluate_model(
            fixed_distribution_model(),
            {"one": single},
            np.ones(4, dtype=np.int64),
            seq_len=16,
            max_tokens_per_source=100,
            batch_size=4,
        )


def test_batch_size_does_not_change_results_and_mode_is_restored(tmp_path: Path) -> None:
    model = build_model(
        ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=2, max_seq_len=16), seed=0, device="cpu"
    )
    model.train()
    rng = np.random.default_rng(0)
    shards = {
        s: write_shard(tmp_path / s, rng.integers(0, 50, size=n).tolist(), vocab_size=50)
        for s, n in (("a", 300), ("b", 170))
    }
    kwargs = {"token_bytes": np.full(50, 2), "seq_len": 16, "max_tokens_per_source": 10_000}
    one = evaluate_model(model, shards, batch_size=1, **kwargs)
    many = evaluate_model(model, shards, batch_size=7, **kwargs)
    assert model.training  # evaluate_model switches to eval and back
    assert one["sources"].keys() == many["sources"].keys() == {"a", "b"}
    for s in one["sources"]:
        assert one["sources"][s]["tokens"] == many["sources"][s]["tokens"]
        assert one["sources"][s]["loss"] == pytest.approx(many["sources"][s]["loss"], abs=2e-5)
    # Untrained, near ln 50 = 3.912; bpb = loss / ln 2 / 2 bytes per token.
    assert one["sources"]["a"]["loss"] == pytest.approx(math.log(50), abs=0.1)
    assert one["sources"]["b"]["bpb"] == pytest.approx(one["sources"]["b"]["loss"] / math.log(2) / 2.0, abs=1e-4)


def test_overall_loss_is_token_weighted_and_bpb_is_bits_over_bytes(tmp_path: Path) -> None:
    # Source a scores ids 1,2,3 (bits 2,3,3) at 1 byte each; source b scores id 0 (1 bit) at 4 bytes.
    a = write_shard(tmp_path / "a", [0, 1, 2, 3])
    b = write_shard(tmp_path / "b", [0, 0, 0])
    token_bytes = np.array([4, 1, 1, 1])
    results = evaluate_model(
        fixed_distribution_model(), {"a": a, "b": b}, token_bytes, seq_len=16, max_tokens_per_source=100, batch_size=4
    )
    # all: 8 + 2 = 10 bits over 5 tokens (loss 2 bits = 1.38629 nats) and 3 + 8 = 11 bytes: bpb 10/11.
    assert results["all"]["tokens"] == 5 and results["all"]["bytes"] == 11
    assert results["all"]["loss"] == pytest.approx(2 * math.log(2), abs=1e-5)
    assert results["all"]["bpb"] == pytest.approx(10 / 11, abs=1e-5)


def test_autocast_dtype_is_applied(tmp_path: Path) -> None:
    model = build_model(
        ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=2, max_seq_len=16), seed=0, device="cpu"
    )
    shards = {
        "a": write_shard(tmp_path / "a", np.random.default_rng(0).integers(0, 50, size=200).tolist(), vocab_size=50)
    }
    kwargs = {"token_bytes": np.full(50, 2), "seq_len": 16, "max_tokens_per_source": 10_000, "batch_size": 4}
    fp32, bf16 = (
        evaluate_model(model, shards, **kwargs),
        evaluate_model(model, shards, amp_dtype=torch.bfloat16, **kwargs),
    )
    assert bf16["all"]["loss"] == pytest.approx(fp32["all"]["loss"], abs=0.02)  # bf16 matmuls: close ...
    assert bf16["all"]["loss"] != fp32["all"]["loss"]  # ... but not the fp32 numbers


def test_per_language_bpb_combines_its_sources_by_bytes(tmp_path: Path) -> None:
    # Ids cost 1, 2, 3, 3 bits and stand for 1, 2, 1, 2 bytes. Source fr_a: 0,1,2,3,... (16 targets: 36 bits, 24
    # bytes, bpb 1.5); fr_b: id 0 only (8 targets: 8 bits, 8 bytes, bpb 1); de: id 2 only (8 targets: 24 bits,
    # 8 bytes, bpb 3); web: id 1 only (8 targets: 16 bits, 16 bytes, bpb 1), a quarter fr and three quarters de.
    shards = {
        "fr_a": write_shard(tmp_path / "fr_a", [i % 4 for i in range(17)]),
        "fr_b": write_shard(tmp_path / "fr_b", [0] * 9),
        "de": write_shard(tmp_path / "de", [2] * 9),
        "web": write_shard(tmp_path / "web", [1] * 9),
    }
    languages = {"fr_a": {"fr": 17}, "fr_b": {"fr": 9}, "de": {"de": 9}, "web": {"fr": 3, "de": 9}}
    kwargs = {"token_bytes": np.array([1, 2, 1, 2]), "seq_len": 16, "max_tokens_per_source": 100, "batch_size": 8}
    results = evaluate_model(fixed_distribution_model(), shards, languages=languages, **kwargs)
    assert [results["sources"][s]["bpb"] for s in ("fr_a", "fr_b", "de", "web")] == [1.5, 1.0, 3.0, 1.0]
    fr, de = results["languages"]["fr"], results["languages"]["de"]
    # fr: (36 + 8 + 16 / 4) bits over (24 + 8 + 16 / 4) bytes = 48 / 36; de: (24 + 12) / (8 + 12) = 1.8.
    assert fr["bpb"] == pytest.approx(48 / 36, abs=1e-5) and de["bpb"] == pytest.approx(1.8, abs=1e-5)
    assert (fr["bytes"], fr["tokens"], de["bytes"], de["tokens"]) == (36, 26, 20, 14)
    assert fr["loss"] == pytest.approx(48 * math.log(2) / 26, abs=1e-5)
    assert fr["sources"] == ["fr_a", "fr_b", "web"] and list(results["languages"]) == ["fr", "de"]  # most bytes first
    # Without the mixed source, fr is exactly the byte-weighted combination of its sources' figures.
    alone = evaluate_model(
        fixed_distribution_model(), {s: shards[s] for s in ("fr_a", "fr_b")}, languages=languages, **kwargs
    )
    by_source = alone["sources"]
    assert alone["languages"]["fr"]["bpb"] == pytest.approx(
        sum(r["bpb"] * r["bytes"] for r in by_source.values()) / sum(r["bytes"] for r in by_source.values()), abs=1e-5
    )
    # Languages not counted, or none identified (only `und` and `code`): no per-language figures.
    assert "languages" not in evaluate_model(fixed_distribution_model(), shards, **kwargs)
    und = {s: {"und" if s != "de" else "code": 9} for s in shards}
    assert "languages" not in evaluate_model(fixed_distribution_model(), shards, languages=und, **kwargs)
    assert format_results(results).endswith(
        "\nlanguage       loss        ppl     bpb    tokens  sources"
        "\nfr           1.2797       3.60  1.3333        26  fr_a, fr_b, web"
        "\nde           1.7824       5.94  1.8000        14  de, web"
    )
