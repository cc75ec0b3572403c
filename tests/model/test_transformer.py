"""kiln.model.transformer and kiln.model.init: shapes, causality, RMSNorm and RoPE by hand, GQA,
initialisation (seeded, and on the meta device), and HF Llama logits."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.model.config import ModelConfig
from kiln.model.hf import hf_config, model_config_from_hf, to_hf_state
from kiln.model.init import build_model
from kiln.model.transformer import RMSNorm, Transformer, apply_rope, rope_tables


def small_cfg(**overrides: object) -> ModelConfig:
    base = {"vocab_size": 97, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 24}
    return ModelConfig(**{**base, **overrides})


def seeded_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    return build_model(cfg, seed, "cpu").eval()


def test_logits_shape_and_fp32() -> None:
    model = seeded_model(small_cfg())
    idx = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    logits = model(idx)
    assert logits.shape == (3, 11, 97)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_untrained_loss_is_near_ln_vocab() -> None:
    # With std 0.02 init the logits are nearly flat, so the loss starts at about ln V.
    model = seeded_model(small_cfg())
    idx = torch.randint(0, 97, (4, 24), generator=torch.Generator().manual_seed(2))
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    assert loss.item() == pytest.approx(math.log(97), abs=0.05)


@pytest.mark.parametrize("t", [0, 5, 15])
def test_causal_changing_token_t_leaves_earlier_logits(t: int) -> None:
    model = seeded_model(small_cfg(n_kv_heads=2))
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(3))
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % 97
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    # ... and it does change the logits at t and after (the check above is not vacuous).
    assert (a[:, t:] - b[:, t:]).abs().amax(dim=-1).min() > 1e-4


def test_rmsnorm_by_hand() -> None:
    norm = RMSNorm(2, eps=0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.5]))
    # x = [3, 4]: mean square (9 + 16) / 2 = 12.5, rms = 3.5355; x / rms = [0.84853, 1.13137];
    # times the gains [2, 0.5] = [1.69706, 0.56569].
    out = norm(torch.tensor([[[3.0, 4.0]]]))
    torch.testing.assert_close(out, torch.tensor([[[1.69706, 0.56569]]]), rtol=0, atol=1e-5)


def test_rmsnorm_eps() -> None:
    norm = RMSNorm(4, eps=1.0)
    # all-zero input with eps 1: 0 * rsqrt(0 + 1) = 0; x = [1,1,1,1]: 1 / sqrt(1 + 1) = 0.70711.
    torch.testing.assert_close(norm(torch.ones(1, 1, 4)), torch.full((1, 1, 4), 1 / math.sqrt(2)))
    torch.testing.assert_close(norm(torch.zeros(1, 1, 4)), torch.zeros(1, 1, 4))


def test_rmsnorm_in_bf16_keeps_bf16() -> None:
    # A bf16 model (weights and activations) stays bf16; the mean square is taken in fp32.
    norm = RMSNorm(4, 1e-5).to(torch.bfloat16)
    x = torch.tensor([[[300.0, 400.0, 0.0, 0.0]]], dtype=torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    # rms = sqrt((9e4 + 16e4) / 4) = 250: [1.2, 1.6, 0, 0].
    torch.testing.assert_close(out.float(), torch.tensor([[[1.2, 1.6, 0.0, 0.0]]]), rtol=0, atol=1e-2)


def test_rope_tables_by_hand() -> None:
    cos, sin = rope_tables(seq_len=3, head_dim=4, theta=100.0)
    # pair i rotates by t * 100^(-2i/4): frequencies 1 and 0.1.
    angles = torch.tensor([[0.0, 0.0], [1.0, 0.1], [2.0, 0.2]])
    torch.testing.assert_close(cos, angles.cos())
    torch.testing.assert_close(sin, angles.sin())


def test_apply_rope_rotates_half_pairs_by_hand() -> None:
    cos, sin = rope_tables(seq_len=2, head_dim=2, theta=10000.0)
    x = torch.tensor([1.0, 2.0]).view(1, 1, 1, 2).expand(1, 1, 2, 2)
    out = apply_rope(x, cos, sin)
    # position 0: identity; position 1: rotation by 1 rad of (x1, x2) = (1, 2).
    c, s = math.cos(1.0), math.sin(1.0)
    expected = torch.tensor([[1.0, 2.0], [1 * c - 2 * s, 2 * c + 1 * s]]).view(1, 1, 2, 2)
    torch.testing.assert_close(out, expected)


def test_apply_rope_preserves_norms() -> None:
    cos, sin = rope_tables(seq_len=32, head_dim=16, theta=10000.0)
    x = torch.randn(2, 3, 32, 16, generator=torch.Generator().manual_seed(4))
    out = apply_rope(x, cos, sin)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    assert not torch.allclose(out[:, :, 1:], x[:, :, 1:])  # it did rotate


def test_rope_scores_depend_only_on_relative_position() -> None:
    T, E = 20, 8
    cos, sin = rope_tables(seq_len=T, head_dim=E, theta=10000.0)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(E, generator=gen).expand(1, 1, T, E)
    k = torch.randn(E, generator=gen).expand(1, 1, T, E)
    scores = apply_rope(q, cos, sin)[0, 0] @ apply_rope(k, cos, sin)[0, 0].T  # (T, T): q at m, k at n
    for offset in (-5, 0, 3, 7):
        diagonal = torch.diagonal(scores, offset=offset)  # all (m, n) with n - m = offset
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=0, atol=1e-4)
    # Different offsets give different scores: position does matter.
    assert abs(scores[0, 0] - scores[0, 3]) > 1e-3


def test_gqa_model_runs_and_matches_mha_with_repeated_kv_heads() -> None:
    gqa_cfg = small_cfg(n_heads=4, n_kv_heads=2)
    gqa = seeded_model(gqa_cfg)
    mha = Transformer(small_cfg(n_heads=4, n_kv_heads=None)).eval()
    state = gqa.state_dict()
    E, group = gqa_cfg.head_width, 2
    for i in range(gqa_cfg.n_layers):
        for w in ("wk", "wv"):
            key = f"blocks.{i}.attn.{w}.weight"
            # Each K/V head serves `group` consecutive query heads: repeat its rows per head.
            state[key] = state[key].view(2, E, -1).repeat_interleave(group, dim=0).reshape(4 * E, -1)
    mha.load_state_dict(state)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(gqa(idx), mha(idx), rtol=1e-5, atol=1e-5)


def test_multi_query_attention_runs() -> None:
    model = seeded_model(small_cfg(n_heads=4, n_kv_heads=1))
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 97)
    assert model.blocks["0"].attn.wk.weight.shape == (8, 32)  # one kv head of head_dim 8


def test_tied_embedding_shares_storage() -> None:
    model = Transformer(small_cfg(tie_embeddings=True))
    assert model.lm_head.weight is model.embed.weight
    assert Transformer(small_cfg()).lm_head.weight is not Transformer(small_cfg()).embed.weight


def assert_initialised(model: Transformer) -> None:
    # std 0.02 everywhere, residual outputs (wo, w_down) 0.02 / sqrt(2 * 8) = 0.005, norm gains 1.
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert model.blocks["0"].attn.wq.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert model.blocks["0"].attn.wo.weight.std().item() == pytest.approx(0.005, rel=0.03)
    assert model.blocks["3"].mlp.w_down.weight.std().item() == pytest.approx(0.005, rel=0.03)
    for norm in (model.norm, model.blocks["0"].attn_norm, model.blocks["7"].mlp_norm):
        assert torch.equal(norm.weight, torch.ones(256))
    cos, sin = rope_tables(model.cfg.max_seq_len, model.cfg.head_width, model.cfg.rope_theta)
    assert torch.equal(model.rope.cos, cos) and torch.equal(model.rope.sin, sin)


def test_init_scales_residual_outputs() -> None:
    assert_initialised(
        build_model(ModelConfig(vocab_size=64, d_model=256, n_layers=8, n_heads=4), seed=7, device="cpu")
    )


def test_init_weights_on_a_model_built_on_meta() -> None:
    cfg = ModelConfig(vocab_size=64, d_model=256, n_layers=8, n_heads=4)
    with torch.device("meta"):
        model = Transformer(cfg)
    assert model.embed.weight.is_meta and model.rope.cos.is_meta  # no storage yet
    model.to_empty(device="cpu")  # storage, uninitialised: norm gains and RoPE tables hold garbage
    model.init_weights()
    assert_initialised(model)


def test_same_seed_gives_the_weights_kiln_always_initialised_with() -> None:
    # sha256 of every weight (state_dict keys sorted) that kiln ab60aaa's `torch.manual_seed(0);
    # Transformer(cfg)` gave, before init moved into init_weights(); torch 2.13, CPU generator.
    cfg = small_cfg(n_kv_heads=2)
    state = build_model(cfg, seed=0, device="cpu").state_dict()
    digest = hashlib.sha256(b"".join(state[k].numpy().tobytes() for k in sorted(state))).hexdigest()
    assert digest == "140c3c7dc8290927541c8acf0ae606f27c9f9e0e7025ac31cb557def98fe54b1"


def test_build_model_keeps_the_construction_draw_order() -> None:
    # The same draws as: seed, construct (PyTorch's default per-layer init draws too), then one
    # normal_ per matrix in named_parameters() order; bit for bit, whatever the torch version.
    cfg = small_cfg(n_kv_heads=2, tie_embeddings=True)
    torch.manual_seed(3)
    reference = Transformer(cfg)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02 / math.sqrt(4) if name.endswith(("wo.weight", "w_down.weight")) else 0.02)
    built = build_model(cfg, seed=3, device="cpu")
    assert all(
        torch.equal(a, b) for a, b in zip(built.state_dict().values(), reference.state_dict().values(), strict=True)
    )


def test_sequence_longer_than_max_seq_len_is_refused() -> None:
    model = Transformer(small_cfg(max_seq_len=8))
    with pytest.raises(AssertionError, match="exceeds max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    ("options", "architecture"),
    [
        ({"tie_embeddings": False}, "LlamaForCausalLM"),
        ({"tie_embeddings": True}, "LlamaForCausalLM"),
        ({"qk_norm": True}, "Qwen3ForCausalLM"),
    ],
)
def test_logits_match_hugging_face_through_kilns_name_map(options: dict, architecture: str) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = small_cfg(n_heads=4, n_kv_heads=2, ffn_hidden=48, norm_eps=1e-6, **options)
    ours = seeded_model(cfg)
    settings = {
        k: v
        for k, v in hf_config(cfg, eot_id=0, pad_id=1).items()
        if k not in ("architectures", "model_type", "torch_dtype")
    }
    hf_cls = getattr(transformers, architecture)
    hf = hf_cls(hf_cls.config_class(**settings)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state(ours.state_dict(), cfg), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is the embedding
    idx = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits.float(), rtol=1e-4, atol=1e-4)


SCALINGS = st.one_of(
    st.none(),
    st.builds(lambda f: {"type": "linear", "factor": f}, st.floats(1.0, 64.0)),
    st.builds(
        lambda f, low, gap, original: {
            "type": "llama3",
            "factor": f,
            "low_freq_factor": low,
            "high_freq_factor": low + gap,
            "original_max_position_embeddings": original,
        },
        st.floats(1.0, 64.0),
        st.floats(0.5, 4.0),
        st.floats(0.5, 8.0),
        st.integers(16, 131072),
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    head_dim=st.sampled_from([None, 16, 24, 40]),  # 8 is d_model / n_heads: an import leaves it implicit
    family=st.sampled_from(["llama", "qwen2", "qwen3"]),
    scaling=SCALINGS,
    tie=st.booleans(),
)
def test_hf_config_reads_back_as_the_same_model_config(
    head_dim: int | None, family: str, scaling: dict | None, tie: bool
) -> None:
    # The sizes transformers writes back are given explicitly (n_kv_heads, ffn_hidden), as an import sets them.
    cfg = small_cfg(
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden=48,
        head_dim=head_dim,
        qk_norm=family == "qwen3",
        attention_bias=family == "qwen2",
        rope_scaling=scaling,
        tie_embeddings=tie,
    )
    assert model_config_from_hf(hf_config(cfg, eot_id=0, pad_id=1), "config.json") == cfg


def test_depth_scaled_init_shrinks_each_blocks_residual_outputs_by_its_depth() -> None:
    cfg = ModelConfig(vocab_size=97, d_model=256, n_layers=8, n_heads=4, init_depth_scale="layer")
    model = build_model(cfg, seed=0, device="cpu")
    for layer in (0, 3, 7):  # 0.02 / sqrt(2 * (layer + 1))
        expected = 0.02 / math.sqrt(2 * (layer + 1))
        assert model.blocks[str(layer)].attn.wo.weight.std().item() == pytest.approx(expected, rel=0.03)
        assert model.blocks[str(layer)].mlp.w_down.weight.std().item() == pytest.approx(expected, rel=0.03)
    assert model.blocks["5"].attn.wq.weight.std().item() == pytest.approx(0.02, rel=0.03)


def test_softcap_bounds_the_logits_and_is_tanh_of_the_uncapped_ones() -> None:
    capped = build_model(small_cfg(logit_softcap=2.0, init_std=1.0), seed=0, device="cpu")
    plain = build_model(small_cfg(init_std=1.0), seed=0, device="cpu")
    idx = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        raw, out = plain(idx), capped(idx)
    assert raw.abs().max() > 4.0 and out.abs().max() <= 2.0  # tanh rounds to exactly 1 in fp32 far out
    assert torch.allclose(out, 2.0 * torch.tanh(raw / 2.0), atol=1e-5)


@pytest.mark.parametrize(
    "options", [{"activation": "relu2"}, {"activation": "gelu"}, {"qk_norm": True}, {"n_kv_heads": 1}]
)
def test_every_option_runs_forward_and_backward_and_is_causal(options: dict) -> None:
    model = build_model(small_cfg(**options), seed=0, device="cpu")
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    logits = model(idx)
    F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    changed = idx.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 97
    with torch.no_grad():
        assert torch.equal(model(changed)[:, :6], logits.detach()[:, :6])


def test_restarted_positions_equal_a_sequence_on_its_own() -> None:
    # Rotary attention depends on relative positions, but not exactly in floating point: with
    # positions restarting at 7, the second part's logits equal the same tokens run alone.
    from kiln.model.attention import CAUSAL

    model = build_model(small_cfg(), seed=0, device="cpu").eval()
    idx = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    docs = torch.tensor([[0] * 7 + [1] * 5])
    positions = torch.tensor([list(range(7)) + list(range(5))])
    with torch.no_grad():
        packed = model(idx, rule=CAUSAL.within_documents(docs), positions_BT=positions)
        alone = model(idx[:, 7:])
    assert torch.allclose(packed[:, 7:], alone, atol=1e-6)
