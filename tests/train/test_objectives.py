"""kiln.train.objectives and kiln.train.collate: each objective's rows by hand and by property, and
what the model can see under the rows' attention rules.

Ids below: 0 end-of-document, 1 pad, 2 mask, 3-5 FIM prefix/middle/suffix, 6.. sentinels,
ordinary tokens from 40 up.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.model.batch import Rows
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.train import objectives as obj
from kiln.train.collate import Collator, ObjectiveMix, restart_positions, stack
from kiln.train.config import TrainConfig
from kiln.train.objectives import MLMConfig, PrefixLMConfig, SpanCorruptionConfig, TokenIds

IDS = TokenIds(eot=0, pad=1, mask=2, fim_middle=4, sentinels=tuple(range(6, 38)), first_ordinary=40, vocab_size=97)
EOT = IDS.eot


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_document_ids_and_restarting_positions_by_hand() -> None:
    inputs = np.array([50, 51, EOT, 60, EOT, 70, 71, 72])
    docs = obj.document_ids(inputs, EOT)
    assert docs.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]  # a document includes its end-of-document token
    assert restart_positions(docs).tolist() == [0, 1, 2, 0, 1, 0, 1, 2]


def test_clm_is_the_shifted_window_with_every_target_counted() -> None:
    window = np.array([50, 51, EOT, 60, 61])
    row = obj.clm(window, IDS, masking=False)
    assert row.inputs.tolist() == [50, 51, EOT, 60] and row.targets.tolist() == [51, EOT, 60, 61]
    assert row.loss_mask.all() and row.attention == "causal" and not row.doc_ids.any()
    masked = obj.clm(window, IDS, masking=True)
    assert masked.doc_ids.tolist() == [0, 0, 0, 1]
    # The end-of-document position cannot see the next document, so its target does not count.
    assert masked.loss_mask.tolist() == [True, True, False, True]


def test_fim_middles_by_hand() -> None:
    # <pre> 50 <suf> 51 <mid> 52 53 EOT | 60 61 <pre> 70 <suf> 71 <mid> 72 (cut by the window)
    seq = np.array([[3, 50, 5, 51, 4, 52, 53, 0, 60, 61, 3, 70, 5, 71, 4, 72]])
    mask = obj.fim_middles(seq[:, :-1], seq[:, 1:], IDS)
    # Targets 52, 53, EOT (the first middle and its end) and 72 (the second, cut) count.
    assert np.flatnonzero(mask[0]).tolist() == [4, 5, 6, 14]


def test_prefix_lm_by_hand() -> None:
    # Two documents in the inputs: [50 51 52 53 EOT] and [60 61 62]; shares drawn 0.5 and ~1.
    window = np.array([50, 51, 52, 53, EOT, 60, 61, 62, 63])
    row = obj.prefix_lm(window, IDS, PrefixLMConfig(min_share=0.5, max_share=0.5), masking=True, rng=rng())
    # int(0.5 * 5) = 2 prefix positions in document 0, int(0.5 * 3) = 1 in document 1.
    assert row.prefix.astype(int).tolist() == [1, 1, 0, 0, 0, 1, 0, 0]
    # Loss from the last prefix position on (it predicts the first token after the prefix); the
    # end-of-document position would predict the next document's first token: not counted.
    assert row.loss_mask.astype(int).tolist() == [0, 1, 1, 1, 0, 1, 1, 1]
    whole = obj.prefix_lm(window, IDS, PrefixLMConfig(min_share=0.5, max_share=0.5), masking=False, rng=rng())
    assert whole.prefix.astype(int).tolist() == [1, 1, 1, 1, 0, 0, 0, 0]  # one prefix for the row
    assert whole.loss_mask.astype(int).tolist() == [0, 0, 0, 1, 1, 1, 1, 1]


def test_mlm_selection_and_the_80_10_10_split() -> None:
    # 200,000 ordinary tokens and some specials: specials are never selected. Tolerances are
    # about 5 binomial standard deviations, so the test fails only if the rates are wrong.
    window = rng(1).integers(IDS.first_ordinary, IDS.vocab_size, size=200_000)
    window[::50] = EOT
    row = obj.mlm(window, IDS, MLMConfig(), masking=False, rng=rng(2))
    ordinary = window != EOT
    selected = row.loss_mask
    assert not selected[~ordinary].any()
    assert abs(selected.sum() / ordinary.sum() - 0.15) < 5 * np.sqrt(0.15 * 0.85 / ordinary.sum())  # 0.15 +- 0.004
    assert (row.targets == window).all() and row.attention == "full"
    n = selected.sum()
    masked = (row.inputs == IDS.mask) & selected
    changed = (row.inputs != window) & selected & ~masked
    kept = (row.inputs == window) & selected
    tol = 5 * np.sqrt(0.1 * 0.9 / n)  # 0.1 +- 0.014; a random token equal to the original counts as kept (1/57 of 10%)
    assert abs(masked.sum() / n - 0.8) < 5 * np.sqrt(0.8 * 0.2 / n)
    assert abs(changed.sum() / n - 0.1 * (1 - 1 / 57)) < tol
    assert abs(kept.sum() / n - 0.1 * (1 + 1 / 57)) < tol
    assert (row.inputs[~selected] == window[~selected]).all()
    assert (row.inputs[changed] >= IDS.first_ordinary).all()  # random replacements are ordinary tokens


T5_SPANS = SpanCorruptionConfig()


def span_row(window: np.ndarray, seq_len: int, seed: int, cfg: SpanCorruptionConfig = T5_SPANS) -> obj.Row:
    return obj.span_corruption(window, IDS, cfg, seq_len, rng(seed))


def reconstruct(row: obj.Row) -> list[int]:
    """The original window from a span-corruption row: fill each sentinel of the prefix with its target span."""
    seq = [*row.inputs.tolist(), row.targets[-1].item()]
    P = int(row.prefix.sum())
    corrupted, target = seq[:P], seq[P:]
    end = target.index(EOT)
    spans: dict[int, list[int]] = {}
    current = None
    for t in target[:end]:
        if t in IDS.sentinels:
            current = t
            spans[t] = []
        else:
            spans[current].append(t)
    out: list[int] = []
    for t in corrupted:
        out += spans[t] if t in IDS.sentinels else [t]
    return out


def test_span_corruption_by_hand() -> None:
    # seq_len 12: L = 10 tokens, N = round(1.5) = 2 corrupted in n = 1 span: 10 + 2 + 1 = 13 ids.
    assert obj.span_plan(12, SpanCorruptionConfig()) == (10, 2, 1)
    window = np.arange(50, 60)
    row = span_row(window, 12, seed=0)
    seq = [*row.inputs.tolist(), row.targets[-1].item()]
    P = int(row.prefix.sum())
    assert P == 9 and seq.count(6) == 2  # 8 kept + one sentinel; the sentinel opens the target too
    assert seq[P] == 6 and seq[-1] == EOT and len(seq) == 13
    assert row.loss_mask.astype(int).tolist() == [0] * 8 + [1] * 4  # from the last prefix position on
    assert reconstruct(row) == window.tolist()


@settings(max_examples=200, deadline=None)
@given(
    seq_len=st.integers(8, 300), seed=st.integers(0, 10_000), density=st.floats(0.05, 0.5), mean_span=st.floats(1, 8)
)
def test_span_corruption_targets_reconstruct_the_original(
    seq_len: int, seed: int, density: float, mean_span: float
) -> None:
    cfg = SpanCorruptionConfig(noise_density=density, mean_span=mean_span)
    L, N, n = obj.span_plan(seq_len, cfg)
    if n > len(IDS.sentinels):
        return  # the train stage refuses this before any work (test_check_objectives)
    window = rng(seed).integers(IDS.first_ordinary, IDS.vocab_size, size=L)
    row = span_row(window, seq_len, seed, cfg)
    assert len(row.inputs) == len(row.targets) == len(row.loss_mask) == seq_len
    assert reconstruct(row) == window.tolist()
    seq = [*row.inputs.tolist(), row.targets[-1].item()]
    assert sum(t in IDS.sentinels for t in seq) == 2 * n and seq.count(IDS.pad) == seq_len + 1 - (L + 2 * n + 1)
    # The loss counts exactly the target part: n sentinels, N corrupted tokens, end-of-document.
    assert int(row.loss_mask.sum()) == N + n + 1


def test_check_objectives_stops_before_any_work() -> None:
    with pytest.raises(Exception, match="raise tokenizer.sentinel_tokens to 47"):
        obj.check_objectives({"span_corruption": 1.0}, 1024, SpanCorruptionConfig(), IDS, None)
    with pytest.raises(Exception, match="set tokenize.fim"):
        obj.check_objectives({"fim": 1.0}, 64, SpanCorruptionConfig(), IDS, None)
    obj.check_objectives({"fim": 1.0, "span_corruption": 1.0}, 64, SpanCorruptionConfig(), IDS, {"rate": 0.5})


class Windows:
    """A RowSource over one long stream of documents of 5-12 tokens: row i starts at 37 * i."""

    sources = ["a", "b"]
    adapt_every = None
    report_windows = 1

    def __init__(self) -> None:
        gen = rng(3)
        docs = [
            np.append(gen.integers(IDS.first_ordinary, IDS.vocab_size, size=gen.integers(4, 12)), EOT)
            for _ in range(4000)
        ]
        self.stream = np.concatenate(docs)
        self.rows_drawn = 0

    def next_rows(self, lengths: list[int], progress: float, keep: slice) -> Rows:
        first = self.rows_drawn
        index = np.arange(first, first + len(lengths))
        tokens = [self.stream[37 * i : 37 * i + n] for i, n in zip(index[keep], np.array(lengths)[keep], strict=True)]
        self.rows_drawn += len(lengths)
        return Rows(tokens, index[keep] % 2, index[keep], index % 2)

    def weights_at(self, progress: float) -> np.ndarray:
        return np.array([0.5, 0.5])

    def state_dict(self) -> dict[str, Any]:
        return {"rows_drawn": self.rows_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows_drawn = state["rows_drawn"]


class Batches:
    """A collator over Windows that remembers its row length: next(rows) -> Batch."""

    def __init__(self, objective: Any, seq_len: int = 32, rank: int = 0, world: int = 1, **train: Any):
        cfg = TrainConfig(objective=objective, seq_len=seq_len, **train)
        mix = ObjectiveMix(
            cfg.objectives,
            {o: cfg.masks_documents(o) for o in cfg.objectives},
            cfg.mlm,
            cfg.prefix_lm,
            cfg.span_corruption,
        )
        self.collator, self.seq_len = Collator(Windows(), mix, IDS, cfg.seed, rank, world), seq_len

    def next_batch(self, rows: int) -> Any:
        return self.collator.next_batch(rows, self.seq_len, 0.0)


def collator(objective: Any, seq_len: int = 32, **train: Any) -> Batches:
    return Batches(objective, seq_len, **train)


def batches_equal(a: Any, b: Any) -> bool:
    fields = ("input_ids_BT", "targets_BT", "loss_mask_BT", "doc_ids_BT", "prefix_BT", "positions_BT", "source_B")
    return a.attention == b.attention and all(
        (getattr(a, f) is None and getattr(b, f) is None) or torch.equal(getattr(a, f), getattr(b, f)) for f in fields
    )


MIXED = {"clm": 1.0, "mlm": 1.0, "prefix_lm": 1.0, "span_corruption": 1.0}


@pytest.mark.parametrize("objective", ["clm", "mlm", "prefix_lm", "span_corruption", "fim"])
def test_rows_do_not_depend_on_micro_batching_and_resume_exactly(objective: str) -> None:
    single = collator(objective)
    whole = single.next_batch(8)
    halves = collator(objective)
    first, second = halves.next_batch(4), halves.next_batch(4)
    for name in ("input_ids_BT", "targets_BT", "loss_mask_BT"):
        assert torch.equal(getattr(whole, name), torch.cat([getattr(first, name), getattr(second, name)]))
    resumed = collator(objective)
    resumed.collator.load_state_dict(halves.collator.state_dict())
    assert batches_equal(resumed.next_batch(4), halves.next_batch(4))
    assert resumed.collator.tokens_by_source() == halves.collator.tokens_by_source()
    # Two ranks each build half of every global micro-batch: together, the same rows.
    ranks = [Batches(objective, rank=r, world=2) for r in range(2)]
    parts = [r.next_batch(4) for r in ranks]
    for name in ("input_ids_BT", "targets_BT", "loss_mask_BT"):
        assert torch.equal(getattr(whole, name), torch.cat([getattr(p, name) for p in parts]))
    # Each rank counts the tokens of every rank's rows: the global count, whatever the world size.
    assert (
        ranks[0].collator.tokens_by_source()
        == ranks[1].collator.tokens_by_source()
        == single.collator.tokens_by_source()
    )


def test_a_weighted_mix_draws_each_objective_and_builds_one_rule_for_all() -> None:
    c = collator(MIXED)
    batch = c.next_batch(64)
    assert batch.attention == "prefix" and batch.doc_ids_BT is not None and batch.positions_BT is not None
    full_rows = batch.prefix_BT.all(dim=1)  # mlm rows see every key of their document
    no_prefix = ~batch.prefix_BT.any(dim=1)  # clm rows see nothing bidirectionally
    assert 8 < int(full_rows.sum()) < 26 and 8 < int(no_prefix.sum()) < 30  # 16 expected of each
    # Tokens read: clm and prefix-LM rows a window of 33, mlm rows 32, span corruption rows L = 26;
    # span rows are the ones that hold sentinels.
    L = obj.span_plan(32, SpanCorruptionConfig())[0]
    span_rows = int(((batch.input_ids_BT >= 6) & (batch.input_ids_BT < 38)).any(dim=1).sum())
    assert 8 < span_rows < 26
    mlm_rows = int(full_rows.sum())
    assert (
        sum(c.collator.tokens_by_source().values()) == span_rows * L + mlm_rows * 32 + (64 - span_rows - mlm_rows) * 33
    )


def model() -> Any:
    cfg = ModelConfig(vocab_size=IDS.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    return build_model(cfg, seed=0, device="cpu").eval()


def logits(m: Any, batch: Any, inputs: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return m(batch.input_ids_BT if inputs is None else inputs, rule=batch.rule(), positions_BT=batch.positions_BT)


@pytest.mark.parametrize("objective", ["clm", "fim", "mlm", "prefix_lm"])
def test_with_document_masking_a_document_never_changes_another(objective: str) -> None:
    batch = collator(objective, seq_len=48, document_masking=True).next_batch(4)
    m = model()
    base = logits(m, batch)
    docs = batch.doc_ids_BT
    for row in range(4):
        target_doc = int(docs[row, 0])  # the row's first document, changed everywhere
        changed = batch.input_ids_BT.clone()
        where = docs[row] == target_doc
        changed[row, where] = IDS.first_ordinary + (changed[row, where] + 1 - IDS.first_ordinary) % (
            IDS.vocab_size - IDS.first_ordinary
        )
        after = logits(m, batch, changed)
        others = docs[row] != target_doc
        assert others.any()
        assert torch.equal(after[row, others], base[row, others])  # bit for bit
        assert (after[row, where] - base[row, where]).abs().amax() > 1e-4
    # A document's logits are those it gets alone in a row (positions restart at 0 there).
    last = int(docs[0].max())
    alone = batch.input_ids_BT[0, docs[0] == last][None]
    with torch.no_grad():
        single = m(alone, rule=obj_rule(batch, 0, last))
    assert torch.allclose(single[0], base[0, docs[0] == last], atol=1e-5)


def obj_rule(batch: Any, row: int, doc: int) -> Any:
    """The batch's rule cut down to one document of one row."""
    from kiln.model.attention import AttentionRule

    where = batch.doc_ids_BT[row] == doc
    prefix = None if batch.prefix_BT is None else batch.prefix_BT[row, where][None]
    return AttentionRule(batch.attention, prefix_BT=prefix)


def test_under_clm_a_later_token_never_changes_an_earlier_logit() -> None:
    batch = collator("clm", seq_len=48).next_batch(2)
    assert batch.doc_ids_BT is None and batch.rule().sdpa_kwargs(48, torch.device("cpu")) == {"is_causal": True}
    m = model()
    base = logits(m, batch)
    for position in (0, 17, 47):
        changed = batch.input_ids_BT.clone()
        changed[:, position] = IDS.first_ordinary + (changed[:, position] + 1 - IDS.first_ordinary) % 57
        after = logits(m, batch, changed)
        assert torch.equal(after[:, :position], base[:, :position])
        assert (after[:, position] - base[:, position]).abs().amax() > 1e-4


def test_stack_narrows_the_rule() -> None:
    rows = [obj.clm(np.arange(40, 49), IDS, False) for _ in range(2)]
    assert stack(rows, np.zeros(2, dtype=np.int64), False).attention == "causal"
    full = obj.mlm(np.arange(40, 48), IDS, MLMConfig(), False, rng())
    mixed = stack([rows[0], full], np.zeros(2, dtype=np.int64), False)
    assert mixed.attention == "prefix" and mixed.prefix_BT.tolist() == [[False] * 8, [True] * 8]
