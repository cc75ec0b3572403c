"""kiln.mix.sampler.Sampler over real token shards written with TokenShardWriter: windows, weights,
state, and the Rows it hands the trainer's objective."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from kiln.core.errors import FatalError
from kiln.core.tokenshards import TokenShard, TokenShardWriter
from kiln.mix.config import MixConfig
from kiln.mix.sampler import Sampler, build_sampler
from kiln.model.batch import Rows

SEQ_LEN = 16
B_OFFSET = 20_000  # source b's token ids start here, so a window tells which source it came from


def write_shard(prefix: Path, tokens: np.ndarray, doc_len: int = 50) -> TokenShard:
    writer = TokenShardWriter(prefix, vocab_size=65_536)
    for start in range(0, len(tokens), doc_len):
        writer.add(tokens[start : start + doc_len].tolist())
    writer.close()
    return TokenShard(prefix)


def draw(sampler: Sampler, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(windows (B, SEQ_LEN + 1), source index per row (B,)) of the sampler's next rows."""
    rows = sampler.next_rows([SEQ_LEN + 1] * batch_size)
    return np.stack(rows.tokens), rows.source_B


@pytest.fixture
def shards(tmp_path: Path) -> dict[str, TokenShard]:
    # Token i of source a is i, of source b is 20000 + i: every window is recognisable.
    return {
        "a": write_shard(tmp_path / "a", np.arange(1000)),
        "b": write_shard(tmp_path / "b", B_OFFSET + np.arange(600)),
    }


def test_windows_are_contiguous_slices_of_their_source(shards: dict[str, TokenShard]) -> None:
    sampler = Sampler(shards, {"a": 1, "b": 1}, SEQ_LEN, seed=0)
    assert sampler.sources == ["a", "b"]
    for _ in range(20):
        windows, which = draw(sampler, 8)
        assert windows.shape == (8, SEQ_LEN + 1) and windows.dtype == np.int64
        assert which.shape == (8,)
        for row, s in zip(windows, which):
            tokens = np.asarray(shards[sampler.sources[s]].tokens, dtype=np.int64)
            start = int(row[0]) - (B_OFFSET if sampler.sources[s] == "b" else 0)
            assert 0 <= start <= len(tokens) - SEQ_LEN - 1
            assert np.array_equal(row, tokens[start : start + SEQ_LEN + 1])


def test_every_window_start_is_drawn_including_the_last(tmp_path: Path) -> None:
    # SEQ_LEN + 3 tokens hold exactly three windows, starting at 0, 1 and 2.
    shard = write_shard(tmp_path / "tiny", np.arange(SEQ_LEN + 3))
    sampler = Sampler({"tiny": shard}, None, SEQ_LEN, seed=0)
    windows, _ = draw(sampler, 300)
    assert set(windows[:, 0].tolist()) == {0, 1, 2}
    assert windows[:, -1].max() == SEQ_LEN + 2  # the final token is reachable as a target


def test_weights_are_respected(shards: dict[str, TokenShard]) -> None:
    sampler = Sampler(shards, {"a": 3.0, "b": 1.0}, SEQ_LEN, seed=1)
    np.testing.assert_allclose(sampler.probs, [0.75, 0.25])
    which = np.concatenate([draw(sampler, 100)[1] for _ in range(40)])  # 4000 draws
    # Expected 3000 from a; the binomial std is sqrt(4000 * 0.75 * 0.25) = 27.4, allow about 5 std.
    assert abs(int((which == 0).sum()) - 3000) < 140
    assert sampler.drawn.tolist() == [int((which == 0).sum()), int((which == 1).sum())]


def test_default_weights_are_proportional_to_train_tokens(shards: dict[str, TokenShard]) -> None:
    sampler = Sampler(shards, None, SEQ_LEN, seed=2)
    np.testing.assert_allclose(sampler.probs, [1000 / 1600, 600 / 1600])


def test_a_source_left_out_or_zero_weighted_is_never_drawn(shards: dict[str, TokenShard]) -> None:
    for weights in ({"a": 1.0}, {"a": 1.0, "b": 0.0}):
        sampler = Sampler(shards, weights, SEQ_LEN, seed=3)
        assert sampler.sources == ["a"]
        windows, which = draw(sampler, 200)
        assert (which == 0).all() and windows.max() < B_OFFSET


def test_state_dict_reproduces_the_next_batches(shards: dict[str, TokenShard], tmp_path: Path) -> None:
    original = Sampler(shards, {"a": 2, "b": 1}, SEQ_LEN, seed=4)
    for _ in range(3):
        draw(original, 8)
    # Through torch.save/torch.load, as train_state.pt stores it.
    torch.save({"sampler": original.state_dict()}, tmp_path / "state.pt")
    expected = [draw(original, 8) for _ in range(2)]

    resumed = Sampler(shards, {"a": 2, "b": 1}, SEQ_LEN, seed=999)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt")["sampler"])
    assert resumed.rows_drawn == 3 * 8  # the counts come with the state
    for windows, which in expected:
        got_windows, got_which = draw(resumed, 8)
        assert np.array_equal(got_windows, windows) and np.array_equal(got_which, which)
    assert resumed.drawn.tolist() == original.drawn.tolist() and resumed.rows_drawn == 5 * 8


def test_same_seed_same_batches_other_seed_other_batches(shards: dict[str, TokenShard]) -> None:
    one, two, other = (Sampler(shards, None, SEQ_LEN, seed=s) for s in (5, 5, 6))
    a, b, c = draw(one, 16)[0], draw(two, 16)[0], draw(other, 16)[0]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_state_from_other_sources_is_refused(shards: dict[str, TokenShard]) -> None:
    state = Sampler(shards, {"a": 1}, SEQ_LEN, seed=0).state_dict()
    with pytest.raises(FatalError, match=r"drew from \['a'\], this run has \['a', 'b'\]"):
        Sampler(shards, None, SEQ_LEN, seed=0).load_state_dict(state)


def test_too_short_source_is_skipped_with_a_warning(shards: dict[str, TokenShard], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    short = write_shard(tmp_path / "short", np.arange(10))
    with caplog.at_level(logging.WARNING, logger="kiln.mix"):
        sampler = Sampler({**shards, "short": short}, None, SEQ_LEN, seed=0)
    assert sampler.sources == ["a", "b"]
    assert any("source short has 10 train tokens" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_empty_source_is_skipped(shards: dict[str, TokenShard], tmp_path: Path) -> None:
    writer = TokenShardWriter(tmp_path / "empty", vocab_size=65_536)
    writer.close()
    sampler = Sampler({**shards, "empty": TokenShard(tmp_path / "empty")}, None, SEQ_LEN, seed=0)
    assert sampler.sources == ["a", "b"]


def test_a_source_of_exactly_one_window_is_usable(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "one", np.arange(SEQ_LEN + 1))
    sampler = Sampler({"one": shard}, None, SEQ_LEN, seed=0)
    windows, _ = draw(sampler, 4)
    assert (windows == np.arange(SEQ_LEN + 1)).all()


def test_weight_on_an_unusable_source_is_fatal(shards: dict[str, TokenShard], tmp_path: Path) -> None:
    short = write_shard(tmp_path / "short", np.arange(10))
    with pytest.raises(FatalError, match=r"mix.weights gives weight to \['short'\]"):
        Sampler({**shards, "short": short}, {"a": 1, "short": 1}, SEQ_LEN, seed=0)
    # Zero weight on it is fine: nothing is asked of it.
    assert Sampler({**shards, "short": short}, {"a": 1, "short": 0}, SEQ_LEN, seed=0).sources == ["a"]


def test_weight_on_an_unknown_source_is_fatal(shards: dict[str, TokenShard]) -> None:
    with pytest.raises(FatalError, match=r"\['web'\]"):
        Sampler(shards, {"a": 1, "web": 2}, SEQ_LEN, seed=0)


def test_no_usable_source_is_fatal(tmp_path: Path) -> None:
    short = write_shard(tmp_path / "short", np.arange(10))
    with pytest.raises(FatalError, match="no source has the 17 train tokens of one window"):
        Sampler({"short": short}, None, SEQ_LEN, seed=0)


def test_rows_have_the_asked_lengths_and_global_indices(shards: dict[str, TokenShard]) -> None:
    sampler = Sampler(shards, None, SEQ_LEN, seed=7)
    first = sampler.next_rows([SEQ_LEN + 1, 5, SEQ_LEN])
    assert isinstance(first, Rows)
    assert [len(w) for w in first.tokens] == [SEQ_LEN + 1, 5, SEQ_LEN] and all(w.dtype == np.int64 for w in first.tokens)
    assert first.index_B.tolist() == [0, 1, 2]
    assert sampler.next_rows([4, 4]).index_B.tolist() == [3, 4] and sampler.rows_drawn == 5
    for window, source in zip(first.tokens, first.source_B, strict=True):  # contiguous ids of their source
        assert (np.diff(window) == 1).all() and (window[0] >= B_OFFSET) == (source == 1)
    with pytest.raises(AssertionError, match="windows of 18 tokens"):
        sampler.next_rows([SEQ_LEN + 2])


def test_build_sampler_reads_the_train_split(tmp_path: Path) -> None:
    for source, n in (("a", 300), ("b", 200)):
        (tmp_path / source).mkdir()
        write_shard(tmp_path / source / "train", np.arange(n))
    sampler = build_sampler(tmp_path, MixConfig(weights={"a": 1.0}, seed=3), SEQ_LEN)
    assert sampler.sources == ["a"] and sampler.max_window == SEQ_LEN + 1
    assert sampler.state_dict()["rng"] == Sampler({"a": TokenShard(tmp_path / "a" / "train")}, None, SEQ_LEN, seed=3).state_dict()["rng"]
