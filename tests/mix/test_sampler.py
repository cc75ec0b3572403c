"""kiln.mix: the sampler over real token shards written with TokenShardWriter: packing and epochs,
scheduled weights, curricula, adaptive reweighting, planning, and exact resume with any number
of data-parallel ranks.

Source a's documents hold ids 1000*d + k (document d, position k); source b's start at 50,000;
every document ends with id 0 (end-of-document), so each token says where it came from.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kiln.core.errors import ConfigError, FatalError
from kiln.core.tokenshards import DOC_SCORES, SCORES_SUFFIX, TokenShard, TokenShardWriter
from kiln.mix.adaptive import reweight
from kiln.mix.config import AdaptiveConfig, MixConfig
from kiln.mix.sampler import Sampler, build_sampler
from kiln.model.batch import Rows

SEQ_LEN = 16
B_OFFSET = 50_000


def write_shard(prefix: Path, docs: list[list[int]], scores: list[float] | None = None) -> TokenShard:
    writer = TokenShardWriter(prefix, vocab_size=2**20)
    for d in docs:
        writer.add(d)
    writer.close()
    table = np.full((len(docs), len(DOC_SCORES)), np.nan, dtype=np.float32)
    if scores is not None:
        table[:, DOC_SCORES.index("quality_score")] = scores
    np.save(prefix.with_suffix(SCORES_SUFFIX), table)
    return TokenShard(prefix)


def docs_of(n: int, offset: int = 0, lengths: list[int] | None = None) -> list[list[int]]:
    lengths = lengths or [5 + (7 * d) % 23 for d in range(n)]  # 5..27 tokens before the end marker
    return [[offset + 1000 * d + k + 1 for k in range(lengths[d])] + [0] for d in range(n)]


@pytest.fixture
def shards(tmp_path: Path) -> dict[str, TokenShard]:
    return {"a": write_shard(tmp_path / "a", docs_of(40)), "b": write_shard(tmp_path / "b", docs_of(30, B_OFFSET))}


def draw(sampler: Sampler, n: int, progress: float = 0.0, length: int = SEQ_LEN + 1) -> Rows:
    return sampler.next_rows([length] * n, progress)


def test_rows_pack_each_epoch_exactly_once_in_a_new_order(tmp_path: Path) -> None:
    docs = docs_of(25)
    shard = write_shard(tmp_path / "a", docs)
    sampler = Sampler({"a": shard}, MixConfig(lanes=8), SEQ_LEN)
    epoch_tokens = len(shard)
    first_order = np.concatenate(sampler.streams[0].lane_docs())
    rows = draw(sampler, 2 * epoch_tokens // (SEQ_LEN + 1) + 1)
    stream = np.concatenate(rows.tokens)
    # Every token of the source exactly once per epoch (each id names its document and place).
    every = sorted(np.concatenate([np.array(d) for d in docs]).tolist())
    assert sorted(stream[:epoch_tokens].tolist()) == sorted(stream[epoch_tokens : 2 * epoch_tokens].tolist()) == every
    assert sampler.state_dict()["streams"][0]["epoch"] == 2
    second_order = np.concatenate(sampler.streams[0].build_lanes())  # the current (third) epoch's, from its seed
    assert sorted(first_order.tolist()) == list(range(25)) and not np.array_equal(first_order, second_order)


def test_successive_rows_come_from_different_documents(tmp_path: Path) -> None:
    # Long documents (200 tokens = 11 rows each): with one lane, 16 rows hold 2 documents; with
    # 16 lanes, 16.
    shard = write_shard(tmp_path / "a", docs_of(40, lengths=[200] * 40))

    def documents_in_first_rows(lanes: int) -> int:
        rows = draw(Sampler({"a": shard}, MixConfig(lanes=lanes), SEQ_LEN), 16)
        return len({int(t) // 1000 for w in rows.tokens for t in w if t})

    assert documents_in_first_rows(1) <= 3
    assert documents_in_first_rows(16) == 16


def test_fixed_weights_are_respected(shards: dict[str, TokenShard]) -> None:
    sampler = Sampler(shards, MixConfig(weights={"a": 3.0, "b": 1.0}), SEQ_LEN)
    np.testing.assert_allclose(sampler.weights_at(0.5), [0.75, 0.25])
    which = np.concatenate([draw(sampler, 100).source_B for _ in range(40)])  # 4000 rows
    # Expected 3000 from a; the binomial std is sqrt(4000 * 0.75 * 0.25) = 27.4, allow about 5 std.
    assert abs(int((which == 0).sum()) - 3000) < 140
    assert sampler.drawn.tolist() == [int((which == 0).sum()), int((which == 1).sum())]


def test_default_weights_are_proportional_to_train_tokens(shards: dict[str, TokenShard]) -> None:
    sampler = Sampler(shards, MixConfig(), SEQ_LEN)
    np.testing.assert_allclose(
        sampler.weights_at(0.0),
        [
            len(shards["a"]) / (len(shards["a"]) + len(shards["b"])),
            len(shards["b"]) / (len(shards["a"]) + len(shards["b"])),
        ],
    )


def test_scheduled_weights_bring_a_source_in_at_30_percent(shards: dict[str, TokenShard]) -> None:
    cfg = MixConfig(weights={"a": 1.0, "b": [[0, 0], [0.3, 0], [0.3, 1]]})
    sampler = Sampler(shards, cfg, SEQ_LEN)
    early = np.concatenate([draw(sampler, 50, progress=p).source_B for p in (0.0, 0.1, 0.29)])
    late = np.concatenate([draw(sampler, 200, progress=p).source_B for p in (0.3, 0.9)])
    assert (early == 0).all()
    assert abs((late == 1).mean() - 0.5) < 0.1
    assert sampler.breakpoints() == [0.0, 0.3]


def test_a_source_left_out_or_zero_weighted_is_never_drawn(shards: dict[str, TokenShard]) -> None:
    for weights in ({"a": 1.0}, {"a": 1.0, "b": 0.0}):
        sampler = Sampler(shards, MixConfig(weights=weights), SEQ_LEN)
        assert sampler.sources == ["a"]
        rows = draw(sampler, 200)
        assert (rows.source_B == 0).all() and max(int(w.max()) for w in rows.tokens) < B_OFFSET


def test_resume_continues_the_stream_exactly(shards: dict[str, TokenShard], tmp_path: Path) -> None:
    cfg = MixConfig(weights={"a": 2, "b": 1}, seed=4)
    original = Sampler(shards, cfg, SEQ_LEN)
    for _ in range(30):  # past the end of an epoch of both sources
        draw(original, 8)
    torch.save({"sampler": original.state_dict()}, tmp_path / "state.pt")  # as train_state.pt stores it
    expected = [draw(original, 8) for _ in range(5)]
    resumed = Sampler(shards, cfg, SEQ_LEN)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt")["sampler"])
    for rows in expected:
        got = draw(resumed, 8)
        assert all(np.array_equal(g, w) for g, w in zip(got.tokens, rows.tokens, strict=True))
        assert np.array_equal(got.index_B, rows.index_B) and np.array_equal(got.source_B, rows.source_B)


def test_ranks_read_disjoint_slices_of_one_stream_and_resume_with_another_world_size(
    shards: dict[str, TokenShard],
) -> None:
    cfg = MixConfig(weights={"a": 1, "b": 1}, seed=5)
    lengths = [SEQ_LEN + 1, 9, SEQ_LEN + 1, 12] * 3  # objectives ask different lengths per row

    def global_rows(world: int, steps: int, state: dict | None = None) -> tuple[list[list[int]], dict]:
        ranks = [Sampler(shards, cfg, SEQ_LEN) for _ in range(world)]
        if state is not None:
            for r in ranks:
                r.load_state_dict(state)
        out: list[list[int]] = []
        per = len(lengths) // world
        for _ in range(steps):
            parts = [r.next_rows(lengths, 0.0, slice(k * per, (k + 1) * per)) for k, r in enumerate(ranks)]
            assert len({tuple(p.all_sources) for p in parts}) == 1  # every rank drew the same global rows
            out += [w.tolist() for p in parts for w in p.tokens]
        assert len({str(r.state_dict()) for r in ranks}) == 1  # the state is the same on every rank
        return out, ranks[0].state_dict()

    single, _ = global_rows(1, 6)
    two, state = global_rows(2, 3)  # 3 steps on 2 ranks ...
    four, _ = global_rows(4, 3, state)  # ... resumed on 4 ranks
    assert two + four == single  # nothing repeated, nothing skipped
    one_after_two, _ = global_rows(1, 3, state)
    assert one_after_two == four


def test_length_curriculum_starts_short_then_shuffles_the_rest_of_the_epoch(tmp_path: Path) -> None:
    lengths = [3 + (11 * d) % 40 for d in range(60)]
    shard = write_shard(tmp_path / "a", docs_of(60, lengths=lengths))
    sampler = Sampler({"a": shard}, MixConfig(lanes=1, curriculum={"key": "length", "until": 0.5}), SEQ_LEN)
    early = np.concatenate(draw(sampler, 20, progress=0.1).tokens)
    starts = [int(t) // 1000 for t, prev in zip(early, np.concatenate([[0], early[:-1]]), strict=True) if prev == 0]
    assert [lengths[d] for d in starts] == sorted(lengths[d] for d in starts)  # shortest first, in order
    assert max(lengths[d] for d in starts) < np.median(lengths)
    reached = sampler.streams[0].state.position[0]
    rest = np.concatenate(draw(sampler, 1, progress=0.6).tokens)  # the first row past the curriculum's share
    assert sampler.streams[0].state.switched_at == [reached + 1]  # the document in progress finishes first
    rest = np.concatenate([rest, *draw(sampler, 60, progress=0.6).tokens])
    later = [
        int(t) // 1000 for t, prev in zip(rest, np.concatenate([[early[-1]], rest[:-1]]), strict=True) if prev == 0
    ]
    first_epoch = starts + later[: 60 - len(starts) - (1 if early[-1] != 0 else 0)]
    assert sorted(set(first_epoch)) == sorted(first_epoch)  # no document twice in the first epoch
    after = [lengths[d] for d in later[:30]]
    assert after != sorted(after)  # the rest is shuffled, not in length order


def test_with_lanes_every_lane_starts_at_the_front_of_the_curriculum(tmp_path: Path) -> None:
    lengths = [3 + (11 * d) % 40 for d in range(60)]
    shard = write_shard(tmp_path / "a", docs_of(60, lengths=lengths))
    sampler = Sampler({"a": shard}, MixConfig(lanes=8, curriculum={"key": "length", "until": 0.5}), SEQ_LEN)
    rows = draw(sampler, 8, length=4)  # one short piece from each lane's first document
    firsts = sorted(lengths[int(w[0]) // 1000] for w in rows.tokens)
    assert firsts == sorted(lengths)[:8]


def test_quality_curriculum_orders_by_the_score_tokenize_carried(tmp_path: Path) -> None:
    scores = [float((13 * d) % 50) for d in range(50)]
    scores[7] = float("nan")  # unscored: last
    shard = write_shard(tmp_path / "a", docs_of(50), scores=scores)
    sampler = Sampler(
        {"a": shard}, MixConfig(lanes=1, curriculum={"key": "quality_score", "descending": True, "until": 1.0}), SEQ_LEN
    )
    stream = np.concatenate(draw(sampler, 60).tokens)
    order = [int(t) // 1000 for t, prev in zip(stream, np.concatenate([[0], stream[:-1]]), strict=True) if prev == 0]
    assert [scores[d] for d in order[:49]] == sorted((s for s in scores if s == s), reverse=True)[: len(order[:49])]
    assert 7 not in order[:49]


def test_a_curriculum_on_a_score_no_document_has_stops_before_training(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "a", docs_of(10))  # no quality scores: all NaN
    with pytest.raises(ConfigError, match="mix.curriculum.key=quality_score: no document of .* has that score"):
        Sampler({"a": shard}, MixConfig(curriculum={"key": "quality_score"}), SEQ_LEN)


def test_bucketed_curriculum_keeps_buckets_in_order_and_shuffles_inside(tmp_path: Path) -> None:
    lengths = list(range(3, 63))
    shard = write_shard(tmp_path / "a", docs_of(60, lengths=lengths))
    sampler = Sampler(
        {"a": shard}, MixConfig(lanes=1, curriculum={"key": "length", "until": 1.0, "buckets": 3}), SEQ_LEN
    )
    order = sampler.streams[0].lane_docs()[0]
    seen = [lengths[d] for d in order]
    assert [sorted(seen[i : i + 20]) for i in (0, 20, 40)] == [lengths[0:20], lengths[20:40], lengths[40:60]]
    assert seen[:20] != lengths[:20]


def test_plan_counts_tokens_and_epochs_and_acts_on_over_repetition(
    shards: dict[str, TokenShard], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = MixConfig(weights={"a": 1, "b": [[0, 0], [0.5, 0], [0.5, 1]]}, max_epochs=2)
    sampler = Sampler(shards, cfg, SEQ_LEN)
    progress = [i / 10 for i in range(10)]
    plan = sampler.plan([100] * 10, progress)
    assert plan["a"]["tokens"] == 500 + 5 * 50 and plan["b"]["tokens"] == 250  # b only in the second half
    assert plan["a"]["epochs"] == pytest.approx(750 / len(shards["a"]), abs=1e-3)
    heavy = [len(shards["b"]) * 2] * 10  # b would repeat about 5 times
    with caplog.at_level(logging.WARNING, logger="kiln.mix"):
        sampler.plan(heavy, progress, check=True)
    assert any("b 5.00 epochs" in r.getMessage() for r in caplog.records)
    strict = Sampler(shards, cfg.model_copy(update={"on_overrepeat": "error"}), SEQ_LEN)
    with pytest.raises(ConfigError, match="beyond mix.max_epochs=2.0: a .* b 5.00 epochs"):
        strict.plan(heavy, progress, check=True)


def test_adaptive_reweighting_favours_the_slowest_improver_within_bounds() -> None:
    cfg = AdaptiveConfig(every=10, step_size=0.2, floor=0.1)
    factors = np.ones(3)
    record = reweight(["a", "b", "c"], factors, {"a": 4.0, "b": 4.0, "c": 4.0}, {"a": 3.0, "b": 3.9, "c": 3.5}, cfg)
    # b improved slowest (2.5%), a fastest (25%): b x1.2, a /1.2, c in between.
    assert factors[1] == pytest.approx(1.2) and factors[0] == pytest.approx(1 / 1.2) and 1 / 1.2 < factors[2] < 1.2
    assert record is not None and record["reason"].startswith("b improved slowest")
    assert record["adaptive"]["b"]["improvement"] == pytest.approx(0.025)
    assert reweight(["a", "b"], np.ones(2), {}, {"a": 3.0, "b": 3.0}, cfg) is None  # first measurement


def test_adaptive_sampler_applies_a_floor_and_keeps_its_factors_in_the_state(shards: dict[str, TokenShard]) -> None:
    sampler = Sampler(shards, MixConfig(weights={"a": 0.97, "b": 0.03}, adaptive={"every": 5, "floor": 0.2}), SEQ_LEN)
    assert sampler.weights_at(0.0)[1] == pytest.approx(0.2 + 0.6 * 0.03)  # the floor, plus its share of the rest
    assert sampler.observe(5, 0.1, {"a": 5.0, "b": 5.0}) is None
    record = sampler.observe(10, 0.2, {"a": 4.0, "b": 4.9})
    assert record is not None and record["step"] == 10 and sampler.factors[1] > 1
    # The record's weights are what rows are drawn by, floor included.
    assert record["adaptive"]["b"]["weight_after"] == pytest.approx(sampler.weights_at(0.2)[1], abs=1e-5)
    assert record["adaptive"]["b"]["weight_after"] > record["adaptive"]["b"]["weight_before"]
    # The plan (and its over-repetition check) counts b at the floored share rows are drawn at.
    fresh = Sampler(shards, MixConfig(weights={"a": 0.97, "b": 0.03}, adaptive={"every": 5, "floor": 0.2}), SEQ_LEN)
    assert fresh.plan([1000], [0.0])["b"]["tokens"] == round(1000 * (0.2 + 0.6 * 0.03))
    resumed = Sampler(shards, MixConfig(weights={"a": 0.97, "b": 0.03}, adaptive={"every": 5, "floor": 0.2}), SEQ_LEN)
    resumed.load_state_dict(sampler.state_dict())
    np.testing.assert_array_equal(resumed.weights_at(0.5), sampler.weights_at(0.5))


def test_state_from_other_sources_is_refused(shards: dict[str, TokenShard]) -> None:
    state = Sampler(shards, MixConfig(weights={"a": 1}), SEQ_LEN).state_dict()
    with pytest.raises(FatalError, match=r"drew from \['a'\], this run has \['a', 'b'\]"):
        Sampler(shards, MixConfig(), SEQ_LEN).load_state_dict(state)


@pytest.mark.parametrize(
    ("key", "edit", "reason"),
    [
        (
            "position",
            lambda s: [s["position"][0] + 100, *s["position"][1:]],
            r"lane 0: position \d+ \(or switched_at \d+\) lies past its \d+ documents",
        ),
        (
            "offset",
            lambda s: [10**6, *s["offset"][1:]],
            r"lane 0: offset 1000000 lies past the \d+ tokens of its document",
        ),
        ("turn", lambda s: 99, r"the state has \d+ lane\(s\) \(turn 99\), this stream \d+"),
    ],
)
def test_a_stream_state_past_its_documents_is_refused(
    shards: dict[str, TokenShard], key: str, edit: Any, reason: str
) -> None:
    # Loaded as it was, the stream would index past its lanes (or, an offset past its document, never end a row).
    sampler = Sampler(shards, MixConfig(), SEQ_LEN)
    draw(sampler, 20)
    state = sampler.state_dict()
    state["streams"][0][key] = edit(state["streams"][0])
    with pytest.raises(
        FatalError, match=rf"checkpoint sampler, source a: {reason}; the state belongs to other data or was edited"
    ):
        Sampler(shards, MixConfig(), SEQ_LEN).load_state_dict(state)


def test_too_short_source_is_skipped_with_a_warning(
    shards: dict[str, TokenShard], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    short = write_shard(tmp_path / "short", [[1, 2, 3, 0]])
    with caplog.at_level(logging.WARNING, logger="kiln.mix"):
        sampler = Sampler({**shards, "short": short}, MixConfig(), SEQ_LEN)
    assert sampler.sources == ["a", "b"]
    assert any(
        "source short has 4 train tokens" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records
    )


def test_weight_on_an_unusable_or_unknown_source_is_fatal(shards: dict[str, TokenShard], tmp_path: Path) -> None:
    short = write_shard(tmp_path / "short", [[1, 2, 3, 0]])
    with pytest.raises(FatalError, match=r"mix.weights gives weight to \['short'\]"):
        Sampler({**shards, "short": short}, MixConfig(weights={"a": 1, "short": 1}), SEQ_LEN)
    assert Sampler({**shards, "short": short}, MixConfig(weights={"a": 1, "short": 0}), SEQ_LEN).sources == ["a"]
    with pytest.raises(FatalError, match=r"\['web'\]"):
        Sampler(shards, MixConfig(weights={"a": 1, "web": 2}), SEQ_LEN)


def test_no_usable_source_is_fatal(tmp_path: Path) -> None:
    with pytest.raises(FatalError, match="no source has the 17 train tokens of one window"):
        Sampler({"short": write_shard(tmp_path / "short", [[1, 2, 0]])}, MixConfig(), SEQ_LEN)


def test_weights_that_leave_nothing_to_draw_are_refused() -> None:
    with pytest.raises(ValueError, match="no source a positive weight at progress 0.5"):
        MixConfig(weights={"a": [[0, 1], [0.5, 0]], "b": [[0, 0], [0.5, 0], [0.6, 1]]})
    with pytest.raises(ValueError, match=r"weights.a: progress points \[0.5, 0.2\]"):
        MixConfig(weights={"a": [[0.5, 1], [0.2, 1]]})


def test_build_sampler_reads_the_split_and_validation_is_proportional(tmp_path: Path) -> None:
    for source, n in (("a", 30), ("b", 20)):
        (tmp_path / source).mkdir()
        write_shard(tmp_path / source / "train", docs_of(n))
        write_shard(tmp_path / source / "val", docs_of(n // 2))
    cfg = MixConfig(weights={"a": 1.0}, seed=3, curriculum={"key": "length"})
    assert build_sampler(tmp_path, cfg, SEQ_LEN).sources == ["a"]
    val = build_sampler(tmp_path, cfg, SEQ_LEN, split="val")
    assert val.sources == ["a", "b"] and val.cfg.curriculum is None and val.max_window == SEQ_LEN + 1


def test_replayed_sources_take_their_fixed_share_spread_as_their_run_read_them(
    shards: dict[str, TokenShard], tmp_path: Path
) -> None:
    own = shards
    replay = {
        "base/x": (write_shard(tmp_path / "rx", docs_of(40, 5000)), 0.75),
        "base/y": (write_shard(tmp_path / "ry", docs_of(40, 9000)), 0.25),
    }
    cfg = MixConfig(
        weights={name: [[0, 1], [1, 3]] if i == 0 else 1 for i, name in enumerate(own)},
        replay={"run": "runs/base", "fraction": 0.2},
    )
    sampler = Sampler(own, cfg, SEQ_LEN, replay)
    assert sampler.sources == [*own, "base/x", "base/y"]
    for progress in (0.0, 0.5, 1.0):  # this run's schedule moves, the replayed share does not
        w = sampler.weights_at(progress)
        assert w[len(own) :] == pytest.approx([0.15, 0.05]) and w.sum() == pytest.approx(1.0)
    drawn = draw(sampler, 4000).source_B
    assert np.mean(drawn >= len(own)) == pytest.approx(0.2, abs=0.02)
    with pytest.raises(ValueError, match="mix.replay and mix.adaptive together"):
        MixConfig(replay={"run": "runs/base", "fraction": 0.2}, adaptive={})
