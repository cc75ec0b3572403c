"""kiln.evaluate.generate: the sampling filters by hand, greedy decoding, stopping, and the KV cache
against full recomputation (alone and in left-padded batches)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kiln.core.errors import FatalError
from kiln.core.layout import RunLayout
from kiln.core.manifest import Stage
from kiln.evaluate.config import GenerateConfig
from kiln.evaluate.generate import complete, filter_logits, generate, penalize_repeats, positions
from kiln.evaluate.generate import run as generate_stage
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.kv_cache import KVCache
from kiln.model.transformer import Transformer
from kiln.model.weights import save_weights
from kiln.text.specials import FIXED_SPECIALS
from kiln.text.tokenizer import KilnTokenizer, train_bpe

# Probabilities 0.1, 0.4, 0.2, 0.3 for ids 0..3; sorted: id 1 (0.4), id 3 (0.3), id 2 (0.2), id 0 (0.1).
PROBS = torch.tensor([0.1, 0.4, 0.2, 0.3])
LOGITS = PROBS.log()


def kept(logits: torch.Tensor) -> set[int]:
    return {i for i, v in enumerate(logits.tolist()) if v != float("-inf")}


@pytest.mark.parametrize(
    ("k", "expected"), [(1, {1}), (2, {1, 3}), (3, {1, 2, 3}), (4, {0, 1, 2, 3}), (10, {0, 1, 2, 3})]
)
def test_top_k_keeps_exactly_the_k_most_likely(k: int, expected: set[int]) -> None:
    out = filter_logits(LOGITS, top_k=k, top_p=None)
    assert kept(out) == expected
    assert torch.equal(out[sorted(expected)], LOGITS[sorted(expected)])  # survivors are unchanged


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (0.35, {1}),  # 0.4 alone reaches 0.35
        (0.5, {1, 3}),  # 0.4 < 0.5, 0.4 + 0.3 = 0.7 reaches it
        (0.75, {1, 3, 2}),  # 0.7 < 0.75, + 0.2 = 0.9
        (0.95, {0, 1, 2, 3}),  # 0.9 < 0.95: all four
        (1.0, {0, 1, 2, 3}),
        (1e-6, {1}),  # the most likely token always stays
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(p: float, expected: set[int]) -> None:
    out = filter_logits(LOGITS, top_k=None, top_p=p)
    assert kept(out) == expected
    assert torch.equal(out[sorted(expected)], LOGITS[sorted(expected)])


def test_top_p_applies_to_the_top_k_renormalized_distribution() -> None:
    # top_k=3 leaves 0.4, 0.3, 0.2 -> renormalized 0.444, 0.333, 0.222. For p=0.75 the first two
    # reach 0.778, so id 2 goes (without top_k, 0.4 + 0.3 = 0.7 < 0.75 and id 2 would stay).
    assert kept(filter_logits(LOGITS, top_k=3, top_p=0.75)) == {1, 3}


@pytest.mark.parametrize(("min_p", "expected"), [(0.6, {1, 3}), (0.45, {1, 2, 3}), (0.8, {1}), (0.2, {0, 1, 2, 3})])
def test_min_p_drops_tokens_below_a_share_of_the_top_probability(min_p: float, expected: set[int]) -> None:
    # top probability 0.4: min_p 0.6 keeps p >= 0.24 (0.4, 0.3), 0.45 keeps p >= 0.18 (and 0.2), 0.8 keeps p >= 0.32.
    assert kept(filter_logits(LOGITS, top_k=None, top_p=None, min_p=min_p)) == expected


def test_repetition_penalty_by_hand() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    seen = torch.tensor([[True, True, False, False]])
    assert penalize_repeats(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, 3.0]]  # seen: 2/2, -1*2; unseen unchanged
    assert torch.equal(penalize_repeats(logits, seen, 1.0), logits)


def test_filtered_softmax_renormalizes() -> None:
    probs = filter_logits(LOGITS, top_k=2, top_p=None).softmax(-1)
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7]))


@pytest.fixture(scope="module")
def tokenizer() -> KilnTokenizer:
    text = "def parse(value):\n    return value.strip().split(',')\n\nThe quick brown fox jumps over the lazy dog.\n"
    return train_bpe([text] * 20, vocab_size=300, min_frequency=2, specials=FIXED_SPECIALS)


def model_for(tokenizer: KilnTokenizer, max_seq_len: int = 32, seed: int = 0) -> Transformer:
    cfg = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=2, max_seq_len=max_seq_len)
    return build_model(cfg, seed, "cpu").eval()


def banned(tokenizer: KilnTokenizer) -> list[int]:
    """Ids generation never samples: every special but end-of-document."""
    return [i for i in tokenizer.specials.values() if i != tokenizer.eot_id]


def reference_greedy(model: Transformer, ids: list[int], n: int, eot: int, banned: list[int]) -> list[int]:
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids[-model.cfg.max_seq_len :]]))[0, -1]
            logits[banned] = float("-inf")
            next_id = int(logits.argmax())
            if next_id == eot:
                break
            ids, out = ids + [next_id], out + [next_id]
    return out


def test_greedy_is_deterministic_and_matches_a_plain_argmax_loop(tokenizer: KilnTokenizer) -> None:
    model = model_for(tokenizer)
    texts = {
        generate(model, tokenizer, GenerateConfig(prompt="def parse", max_new_tokens=12, temperature=0, seed=seed))
        for seed in (0, 1, 2)
    }
    assert len(texts) == 1
    expected = reference_greedy(model, tokenizer.encode("def parse"), 12, tokenizer.eot_id, banned(tokenizer))
    assert texts.pop() == "def parse" + tokenizer.decode(expected)


def test_top_k_one_sampling_is_greedy(tokenizer: KilnTokenizer) -> None:
    model = model_for(tokenizer, seed=1)
    greedy = generate(model, tokenizer, GenerateConfig(prompt="The quick", max_new_tokens=10, temperature=0))
    sampled = generate(
        model,
        tokenizer,
        GenerateConfig(prompt="The quick", max_new_tokens=10, temperature=1.5, top_k=1, top_p=None, seed=3),
    )
    assert sampled == greedy


def test_sampling_is_reproducible_per_seed(tokenizer: KilnTokenizer) -> None:
    model = model_for(tokenizer, seed=2)
    cfg = GenerateConfig(prompt="def ", max_new_tokens=15, temperature=1.0, top_k=None, top_p=None, seed=7)
    assert generate(model, tokenizer, cfg) == generate(model, tokenizer, cfg)
    others = {generate(model, tokenizer, cfg.model_copy(update={"seed": s})) for s in range(5)}
    assert len(others) > 1  # an untrained model samples near-uniformly: seeds differ


def test_stops_at_end_of_document(
    tokenizer: KilnTokenizer, always_predicts: Callable[[Transformer, int], Transformer]
) -> None:
    model = always_predicts(model_for(tokenizer), tokenizer.eot_id)
    for cfg in (GenerateConfig(prompt="def ", temperature=0), GenerateConfig(prompt="def ", temperature=0.8, seed=1)):
        assert generate(model, tokenizer, cfg) == "def "


def test_generates_max_new_tokens_without_end_of_document(
    tokenizer: KilnTokenizer, always_predicts: Callable[[Transformer, int], Transformer]
) -> None:
    token = tokenizer.encode("fox")[0]
    model = always_predicts(model_for(tokenizer), token)
    text = generate(model, tokenizer, GenerateConfig(prompt="The ", max_new_tokens=5, temperature=0))
    assert text == "The " + tokenizer.decode([token] * 5)


def test_context_longer_than_max_seq_len_uses_the_last_tokens(tokenizer: KilnTokenizer) -> None:
    model = model_for(tokenizer, max_seq_len=8)
    prompt = "def parse(value):\n    return value.strip().split(',')\n"
    assert len(tokenizer.encode(prompt)) > 8
    text = generate(model, tokenizer, GenerateConfig(prompt=prompt, max_new_tokens=20, temperature=0))
    assert text == prompt + tokenizer.decode(
        reference_greedy(model, tokenizer.encode(prompt), 20, tokenizer.eot_id, banned(tokenizer))
    )


def test_empty_prompt_starts_a_fresh_document(
    tokenizer: KilnTokenizer, always_predicts: Callable[[Transformer, int], Transformer]
) -> None:
    token = tokenizer.encode("dog")[0]
    model = always_predicts(model_for(tokenizer), token)
    assert generate(model, tokenizer, GenerateConfig(prompt="", max_new_tokens=3, temperature=0)) == tokenizer.decode(
        [token] * 3
    )


@pytest.mark.parametrize("special", ["<|pad|>", "<|mask|>", "<|fim_middle|>"])
def test_specials_other_than_end_of_document_are_never_generated(
    tokenizer: KilnTokenizer, special: str, always_predicts: Callable[[Transformer, int], Transformer]
) -> None:
    model = always_predicts(model_for(tokenizer), tokenizer.specials[special])
    fox = tokenizer.encode("fox")[0]
    with torch.no_grad():
        model.lm_head.bias[fox] = 10.0  # second only to the special
    for cfg in (
        GenerateConfig(prompt="The ", max_new_tokens=6, temperature=0),
        GenerateConfig(prompt="The ", max_new_tokens=6, temperature=1.0, top_k=None, top_p=None, seed=3),
    ):
        text = generate(model, tokenizer, cfg)
        assert text == "The " + tokenizer.decode([fox] * 6)


def test_autocast_dtype_is_applied_and_keeps_a_clear_choice(
    tokenizer: KilnTokenizer, always_predicts: Callable[[Transformer, int], Transformer]
) -> None:
    # bf16 autocast (generate.precision.dtype) changes the matmuls, not a choice this clear.
    token = tokenizer.encode("fox")[0]
    cfg = GenerateConfig(prompt="The", max_new_tokens=4, temperature=0)
    model = always_predicts(model_for(tokenizer), token)
    assert (
        generate(model, tokenizer, cfg, torch.bfloat16)
        == generate(model, tokenizer, cfg)
        == "The" + tokenizer.decode([token] * 4)
    )
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    generate(model, tokenizer, cfg.model_copy(update={"max_new_tokens": 1}), torch.bfloat16)
    assert seen == [torch.bfloat16]  # the head ran under autocast (the logits are cast back to fp32)


def sharp_model(tokenizer: KilnTokenizer, **options: object) -> Transformer:
    """A random model with large weights: logits that differ clearly from position to position."""
    cfg = ModelConfig(
        vocab_size=tokenizer.vocab_size, d_model=64, n_layers=3, n_heads=4, max_seq_len=48, init_std=0.2, **options
    )  # type: ignore[arg-type]
    return build_model(cfg, 0, "cpu").eval()


@pytest.mark.parametrize("options", [{}, {"n_kv_heads": 2}, {"n_kv_heads": 1, "qk_norm": True}])
def test_cached_decoding_gives_the_full_forwards_logits_at_every_position(
    tokenizer: KilnTokenizer, options: dict
) -> None:
    model = sharp_model(tokenizer, **options)
    ids_1T = torch.randint(0, tokenizer.vocab_size, (1, 40), generator=torch.Generator().manual_seed(3))
    cache = KVCache(model.cfg.n_layers, model.cfg.max_seq_len)
    with torch.no_grad():
        full_TV = model(ids_1T)[0]
        steps = [model(ids_1T[:, :7], cache=cache)[0]]  # a 7-token prompt, then one token at a time
        steps += [model(ids_1T[:, t : t + 1], cache=cache)[0] for t in range(7, 40)]
    cached_TV = torch.cat(steps)
    assert full_TV.std() > 1.0 and cache.length == 40
    assert (cached_TV - full_TV).abs().max().item() < 5e-5  # fp32 rounding of other matmul shapes


def test_a_left_padded_row_gets_the_logits_it_gets_alone(tokenizer: KilnTokenizer) -> None:
    model = sharp_model(tokenizer, n_kv_heads=2)
    gen = torch.Generator().manual_seed(4)
    rows = [torch.randint(0, tokenizer.vocab_size, (n,), generator=gen) for n in (12, 5, 9)]
    P, extra = 12, 6  # prompts padded on the left to 12, then 6 tokens decoded one by one
    ids_BN = torch.full((3, P + extra), tokenizer.pad_id)
    valid_BN = torch.zeros(3, P + extra, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids_BN[b, P - len(r) : P], valid_BN[b, P - len(r) : P] = r, True
    ids_BN[:, P:] = torch.randint(0, tokenizer.vocab_size, (3, extra), generator=gen)
    valid_BN[:, P:] = True
    cache = KVCache(model.cfg.n_layers, model.cfg.max_seq_len)
    with torch.no_grad():
        out = [model(ids_BN[:, :P], positions_BT=positions(valid_BN[:, :P]), cache=cache, valid_BT=valid_BN[:, :P])]
        for n in range(P + 1, P + extra + 1):
            out.append(
                model(
                    ids_BN[:, n - 1 : n],
                    positions_BT=positions(valid_BN[:, :n])[:, -1:],
                    cache=cache,
                    valid_BT=valid_BN[:, n - 1 : n],
                )
            )
        batch_BNV = torch.cat(out, dim=1)
        for b, r in enumerate(rows):
            alone_TV = model(torch.cat([r, ids_BN[b, P:]])[None])[0]
            assert (batch_BNV[b, P - len(r) :] - alone_TV).abs().max().item() < 5e-5


def test_batched_prompts_complete_as_each_would_alone_with_and_without_the_cache(tokenizer: KilnTokenizer) -> None:
    model = sharp_model(tokenizer, n_kv_heads=2)
    prompts = ["def parse(value):", "The", "", "for i in range(10):\n\tprint"]
    cfg = GenerateConfig(max_new_tokens=30, temperature=0)  # 30 new tokens pass the 48-token context: the window slides
    batch = complete(model, tokenizer, prompts, cfg)
    assert batch == [complete(model, tokenizer, [p], cfg)[0] for p in prompts]
    assert batch == complete(model, tokenizer, prompts, cfg.model_copy(update={"use_cache": False}))
    assert {c.finish_reason for c in batch} <= {"length", "end_of_document"} and any(c.new_tokens == 30 for c in batch)


def test_a_stop_string_ends_the_completion_before_it(
    tokenizer: KilnTokenizer, always_predicts: Callable[[Transformer, int], Transformer]
) -> None:
    token = tokenizer.encode("fox")[0]
    piece = tokenizer.decode([token])
    stop = piece[-1] + piece[0]  # where one piece meets the next
    assert len(piece) >= 2 and stop not in piece
    model = always_predicts(model_for(tokenizer), token)
    done = complete(
        model, tokenizer, ["The ", "A "], GenerateConfig(max_new_tokens=10, temperature=0, stop=[stop, "zzz"])
    )
    for c in done:
        assert (c.completion, c.new_tokens, c.finish_reason) == (piece[:-1], 2, "stop")
    assert (
        complete(model, tokenizer, ["The "], GenerateConfig(max_new_tokens=3, temperature=0))[0].finish_reason
        == "length"
    )


def trained_run(run_dir: Path, tokenizer: KilnTokenizer) -> None:
    """A run with the two stages generate reads: a tokenizer, and a train stage with its checkpoint."""
    layout = RunLayout(run_dir)
    tok = Stage(run_dir, "tokenizer", {}, inputs=[])
    tok.begin()
    tok.finish(tokenizer.save(tok.dir / layout.tokenizer_json.name), {}, "tokenizer")
    train = Stage(run_dir, "train", {}, inputs=[], upstream=["tokenizer"])
    train.begin()
    train.finish(save_weights(train.dir / layout.checkpoint.name, model_for(tokenizer)), {}, "trained")


@pytest.mark.parametrize("kind", ["missing", "a folder"])
def test_a_missing_prompt_file_is_named_as_the_setting_not_as_a_stage_to_redo(
    tmp_path: Path, tokenizer: KilnTokenizer, kind: str
) -> None:
    run_dir = tmp_path / "runs" / "demo"
    trained_run(run_dir, tokenizer)
    prompts = tmp_path / "prompts.jsonl"
    if kind == "a folder":
        prompts.mkdir()
    what = "no such file" if kind == "missing" else "a folder, not a file"
    with pytest.raises(FatalError, match=rf"^generate.prompt_file {prompts}: {what}; give a JSONL file") as raised:
        generate_stage(GenerateConfig(prompt_file=str(prompts)), run_dir)
    assert "--force" not in str(raised.value) and not (run_dir / "generate").exists()
