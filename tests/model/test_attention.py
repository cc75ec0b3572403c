"""kiln.model.attention: each rule's mask by hand, and what the model's logits can see under it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.model.attention import CAUSAL, FULL, AttentionRule, leading, prefix_lm
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.transformer import Transformer, apply_rope

CPU = torch.device("cpu")
T = 12


def model() -> Transformer:
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)
    return build_model(cfg, seed=0, device=CPU).eval()


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 97, (2, T), generator=torch.Generator().manual_seed(seed))


def logits_after_change(rule: AttentionRule, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (B, T, V) for the tokens and for the tokens with one position changed."""
    m, idx = model(), tokens()
    changed = idx.clone()
    changed[:, position] = (changed[:, position] + 1) % 97
    with torch.no_grad():
        return m(idx, rule=rule), m(changed, rule=rule)


def moved(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: where the logits changed."""
    return (a - b).abs().amax(dim=-1) > 1e-5


def test_masks_by_hand() -> None:
    # 1 = query (row) may attend to key (column).
    causal = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert CAUSAL.mask_BTT(4, CPU).int().tolist() == [causal]
    assert FULL.mask_BTT(4, CPU).int().tolist() == [[[1] * 4] * 4]
    # Row 0 has a prefix of 2 (positions 0-1 see each other), row 1 a prefix of 0 (plain causal).
    prefix_row0 = [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert prefix_lm(leading(torch.tensor([2, 0]), 4)).mask_BTT(4, CPU).int().tolist() == [prefix_row0, causal]
    # Documents 0,0,1,1: causal inside each, nothing across.
    docs = torch.tensor([[0, 0, 1, 1]])
    assert CAUSAL.within_documents(docs).mask_BTT(4, CPU).int().tolist() == [
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    ]
    assert FULL.within_documents(docs).mask_BTT(4, CPU).int().tolist() == [
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    ]


def test_plain_causal_takes_the_fast_path_and_the_others_a_mask() -> None:
    assert CAUSAL.sdpa_kwargs(4, CPU) == {"is_causal": True}
    assert FULL.sdpa_kwargs(4, CPU) == {}
    assert CAUSAL.within_documents(None) is CAUSAL
    mask = CAUSAL.within_documents(torch.zeros(3, 4, dtype=torch.long)).sdpa_kwargs(4, CPU)["attn_mask"]
    assert mask.shape == (3, 1, 4, 4) and mask.dtype == torch.bool


def test_default_forward_is_the_is_causal_kernel_bit_for_bit() -> None:
    # The default rule must be exactly SDPA's is_causal=True path (what kiln trained with before
    # rules existed), not an equivalent mask: compare one attention layer against it directly.
    m, idx = model(), tokens()
    attn = m.blocks["0"].attn
    x_BTD = m.embed(idx)
    cos, sin = m.rope.cos[:T], m.rope.sin[:T]
    with torch.no_grad():
        ours = attn(x_BTD, cos, sin, CAUSAL.sdpa_kwargs(T, CPU))
        B = idx.shape[0]
        q = attn.wq(x_BTD).view(B, T, 4, 8).transpose(1, 2)
        k = attn.wk(x_BTD).view(B, T, 2, 8).transpose(1, 2)
        v = attn.wv(x_BTD).view(B, T, 2, 8).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        reference = attn.wo(y.transpose(1, 2).reshape(B, T, 32))
    assert torch.equal(ours, reference)
    with torch.no_grad():
        assert torch.equal(m(idx), m(idx, rule=CAUSAL))


def test_the_causal_mask_path_agrees_with_the_fast_path() -> None:
    # One document per row: the mask is the causal triangle, built explicitly.
    m, idx = model(), tokens()
    with torch.no_grad():
        fast = m(idx)
        masked = m(idx, rule=CAUSAL.within_documents(torch.zeros_like(idx)))
    torch.testing.assert_close(masked, fast, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", [3, 8])
def test_causal_does_not_see_the_future_and_full_does(position: int) -> None:
    a, b = logits_after_change(CAUSAL, position)
    assert not moved(a, b)[:, :position].any() and moved(a, b)[:, position:].all()
    a, b = logits_after_change(FULL, position)
    assert moved(a, b).all()  # every position, earlier ones included, sees the changed token


def test_prefix_lm_is_bidirectional_inside_the_prefix_and_causal_after() -> None:
    rule = prefix_lm(leading(torch.tensor([5, 5]), T))
    a, b = logits_after_change(rule, 4)  # last prefix token: the whole prefix sees it
    assert moved(a, b).all()
    a, b = logits_after_change(rule, 8)  # after the prefix: causal
    assert not moved(a, b)[:, :8].any() and moved(a, b)[:, 8:].all()


def test_documents_do_not_see_each_other() -> None:
    # Positions 0-5 are document 1, 6-11 document 2 (in both rows).
    doc_ids = torch.tensor([[1] * 6 + [2] * 6] * 2)
    for base in (CAUSAL, FULL):
        a, b = logits_after_change(base.within_documents(doc_ids), 2)  # change inside document 1
        assert not moved(a, b)[:, 6:].any()  # document 2's logits stay exactly as they were
        assert moved(a, b)[:, 2:6].all()
        # Without document ids a causal model does let document 2 see it.
        a, b = logits_after_change(base, 2)
        assert moved(a, b)[:, 6:].all()


def test_rule_matches_a_hand_built_mask_in_the_model() -> None:
    # The model under a rule equals SDPA with the mask written out by hand, layer by layer.
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2]] * 2)
    rule = prefix_lm(leading(torch.tensor([2, 4]), T)).within_documents(doc_ids)
    hand = torch.zeros(2, T, T, dtype=torch.bool)
    for row, prefix in enumerate((2, 4)):
        for i in range(T):
            for j in range(T):
                hand[row, i, j] = (j <= i or j < prefix) and doc_ids[row, i] == doc_ids[row, j]
    assert torch.equal(rule.mask_BTT(T, CPU), hand)
    m, idx = model(), tokens()
    with torch.no_grad():
        x = m.embed(idx)
        for block in m.blocks.values():
            x = block(x, m.rope.cos[:T], m.rope.sin[:T], {"attn_mask": hand[:, None]})
        by_hand = m.lm_head(m.norm(x)).float()
        assert torch.equal(m(idx, rule=rule), by_hand)
