"""kiln.evaluate.generate: top-k and top-p by hand, greedy decoding, stopping at end of document."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kiln.evaluate.config import GenerateConfig
from kiln.evaluate.generate import filter_logits, generate
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.transformer import Transformer
from kiln.text.specials import FIXED_SPECIALS
from kiln.text.tokenizer import KilnTokenizer, train_bpe

# Probabilities 0.1, 0.4, 0.2, 0.3 for ids 0..3; sorted: id 1 (0.4), id 3 (0.3), id 2 (0.2), id 0 (0.1).
PROBS = torch.tensor([0.1, 0.4, 0.2, 0.3])
LOGITS = PROBS.log()


def kept(logits: torch.Tensor) -> set[int]:
    return {i for i, v in enumerate(logits.tolist()) if v != float("-inf")}


@pytest.mark.parametrize(("k", "expected"), [(1, {1}), (2, {1, 3}), (3, {1, 2, 3}), (4, {0, 1, 2, 3}), (10, {0, 1, 2, 3})])
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


def always_predicts(model: Transformer, token_id: int) -> Transformer:
    """The same model with a head that puts almost all probability on one token."""
    head = nn.Linear(model.cfg.d_model, model.cfg.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[token_id] = 20.0
    model.lm_head = head
    return model


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
    texts = {generate(model, tokenizer, GenerateConfig(prompt="def parse", max_new_tokens=12, temperature=0, seed=seed)) for seed in (0, 1, 2)}
    assert len(texts) == 1
    expected = reference_greedy(model, tokenizer.encode("def parse"), 12, tokenizer.eot_id, banned(tokenizer))
    assert texts.pop() == "def parse" + tokenizer.decode(expected)


def test_top_k_one_sampling_is_greedy(tokenizer: KilnTokenizer) -> None:
    model = model_for(tokenizer, seed=1)
    greedy = generate(model, tokenizer, GenerateConfig(prompt="The quick", max_new_tokens=10, temperature=0))
    sampled = generate(model, tokenizer, GenerateConfig(prompt="The quick", max_new_tokens=10, temperature=1.5, top_k=1, top_p=None, seed=3))
    assert sampled == greedy


def test_sampling_is_reproducible_per_seed(tokenizer: KilnTokenizer) -> None:
    model = model_for(tokenizer, seed=2)
    cfg = GenerateConfig(prompt="def ", max_new_tokens=15, temperature=1.0, top_k=None, top_p=None, seed=7)
    assert generate(model, tokenizer, cfg) == generate(model, tokenizer, cfg)
    others = {generate(model, tokenizer, cfg.model_copy(update={"seed": s})) for s in range(5)}
    assert len(others) > 1  # an untrained model samples near-uniformly: seeds differ


def test_stops_at_end_of_document(tokenizer: KilnTokenizer) -> None:
    model = always_predicts(model_for(tokenizer), tokenizer.eot_id)
    for cfg in (GenerateConfig(prompt="def ", temperature=0), GenerateConfig(prompt="def ", temperature=0.8, seed=1)):
        assert generate(model, tokenizer, cfg) == "def "


def test_generates_max_new_tokens_without_end_of_document(tokenizer: KilnTokenizer) -> None:
    token = tokenizer.encode("fox")[0]
    model = always_predicts(model_for(tokenizer), token)
    text = generate(model, tokenizer, GenerateConfig(prompt="The ", max_new_tokens=5, temperature=0))
    assert text == "The " + tokenizer.decode([token] * 5)


def test_context_longer_than_max_seq_len_uses_the_last_tokens(tokenizer: KilnTokenizer) -> None:
    model = model_for(tokenizer, max_seq_len=8)
    prompt = "def parse(value):\n    return value.strip().split(',')\n"
    assert len(tokenizer.encode(prompt)) > 8
    text = generate(model, tokenizer, GenerateConfig(prompt=prompt, max_new_tokens=20, temperature=0))
    assert text == prompt + tokenizer.decode(reference_greedy(model, tokenizer.encode(prompt), 20, tokenizer.eot_id, banned(tokenizer)))


def test_empty_prompt_starts_a_fresh_document(tokenizer: KilnTokenizer) -> None:
    token = tokenizer.encode("dog")[0]
    model = always_predicts(model_for(tokenizer), token)
    assert generate(model, tokenizer, GenerateConfig(prompt="", max_new_tokens=3, temperature=0)) == tokenizer.decode([token] * 3)


@pytest.mark.parametrize("special", ["<|pad|>", "<|mask|>", "<|fim_middle|>"])
def test_specials_other_than_end_of_document_are_never_generated(tokenizer: KilnTokenizer, special: str) -> None:
    model = always_predicts(model_for(tokenizer), tokenizer.specials[special])
    fox = tokenizer.encode("fox")[0]
    with torch.no_grad():
        model.lm_head.bias[fox] = 10.0  # second only to the special
    for cfg in (GenerateConfig(prompt="The ", max_new_tokens=6, temperature=0), GenerateConfig(prompt="The ", max_new_tokens=6, temperature=1.0, top_k=None, top_p=None, seed=3)):
        text = generate(model, tokenizer, cfg)
        assert text == "The " + tokenizer.decode([fox] * 6)


def test_autocast_dtype_is_applied_and_keeps_a_clear_choice(tokenizer: KilnTokenizer) -> None:
    # bf16 autocast (generate.precision.dtype) changes the matmuls, not a choice this clear.
    token = tokenizer.encode("fox")[0]
    cfg = GenerateConfig(prompt="The", max_new_tokens=4, temperature=0)
    model = always_predicts(model_for(tokenizer), token)
    assert generate(model, tokenizer, cfg, torch.bfloat16) == generate(model, tokenizer, cfg) == "The" + tokenizer.decode([token] * 4)
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    generate(model, tokenizer, cfg.model_copy(update={"max_new_tokens": 1}), torch.bfloat16)
    assert seen == [torch.bfloat16]  # the head ran under autocast (the logits are cast back to fp32)
