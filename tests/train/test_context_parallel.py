"""Context parallelism: the load-balanced split of each window, a rank's attention mask against the
whole window's, the refusals, and training through torchrun on the CPU (gloo) on the tiny preset:
cp=2 (FSDP2 over the 2 ranks of the group) trains as one process does with the same global batch,
under every attention rule at once (causal, prefix-LM and MLM rows with document masking),
a sequence-length schedule and late-position weighting. A state saved by pipeline stages resumes
under cp=2, and that one under FSDP2 x tensor parallelism: tests/train/test_pipeline_parallel.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from launches import TINY, assert_same_losses, assert_same_weights, assert_states_as_planned, launch

from kiln.core.errors import ConfigError
from kiln.model.attention import AttentionRule
from kiln.train.context_parallel import load_balanced_index
from kiln.train.mesh import check_context_parallel

STEPS = 10
# Every rule at once: each row draws clm, prefix-LM or MLM, attention stays inside each document,
# rows of 32 then of 64 positions, later positions weigh more, blocks recomputed in backward.
RULES = (
    "train.objective={clm: 1, prefix_lm: 1, mlm: 1}",
    "train.document_masking=true",
    "train.seq_len_schedule=[{start: 0, seq_len: 32}, {start: 0.5, seq_len: 64}]",
    "train.late_position_weight=0.5",
    "train.activation_checkpointing=selective",
)


@settings(max_examples=60, deadline=None)
@given(cp=st.integers(1, 4), chunk=st.integers(1, 6))
def test_the_ranks_cover_the_window_once_with_equal_causal_work(cp: int, chunk: int) -> None:
    T = 2 * cp * chunk
    shares = [load_balanced_index(T, cp, r) for r in range(cp)]
    assert sorted(torch.cat(shares).tolist()) == list(range(T))
    # Query at window position t attends to t + 1 keys under a causal mask: the same sum on every rank.
    assert len({int((s + 1).sum()) for s in shares}) == 1
    assert load_balanced_index(8, 2, 0).tolist() == [0, 1, 6, 7] and load_balanced_index(8, 2, 1).tolist() == [
        2,
        3,
        4,
        5,
    ]


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(), T=st.integers(1, 12), kind=st.sampled_from(["causal", "full", "prefix"]), documents=st.booleans()
)
def test_a_ranks_mask_is_the_whole_windows_at_its_queries_and_the_gathered_keys(
    data: st.DataObject, T: int, kind: str, documents: bool
) -> None:
    prefix = (
        torch.tensor([data.draw(st.lists(st.booleans(), min_size=T, max_size=T)) for _ in range(2)])
        if kind == "prefix"
        else None
    )
    docs = (
        torch.tensor([sorted(data.draw(st.lists(st.integers(0, 3), min_size=T, max_size=T))) for _ in range(2)])
        if documents
        else None
    )
    rule = AttentionRule(kind, prefix_BT=prefix, doc_ids_BT=docs)  # type: ignore[arg-type]
    queries = torch.tensor(data.draw(st.lists(st.integers(0, T - 1), min_size=1, max_size=T, unique=True)))
    keys = torch.tensor(data.draw(st.permutations(range(T))))
    whole_BTT = rule.mask_BTT(T, torch.device("cpu"))
    assert torch.equal(rule.mask_BQK(queries, keys), whole_BTT[:, queries][:, :, keys])


def test_what_context_parallelism_cannot_split_is_refused_with_the_reason() -> None:
    check_context_parallel(2, [32, 64], 1)
    check_context_parallel(2, [32, 64], 1, sequence_parallel_tp=2)  # 16 and 32 positions per rank, split over tp 2
    with pytest.raises(
        ConfigError,
        match=(
            r"parallel.cp=4 cannot split this training: train.seq_len \(and seq_len_schedule\) 36 is not a multiple "
            r"of 2 x parallel.cp \(8\)"
        ),
    ):
        check_context_parallel(4, [36, 64], 1)
    with pytest.raises(
        ConfigError,
        match=(
            r"train.seq_len \(and seq_len_schedule\) 24: each rank's 12 positions are not a multiple of parallel.tp "
            r"\(8\).*; parallel.pp=2: pipeline stages pass fixed-shape hidden states"
        ),
    ):
        check_context_parallel(2, [24, 64], 2, sequence_parallel_tp=8)


@pytest.fixture(scope="module")
def single(tokenized_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    root = tmp_path_factory.mktemp("one")
    return launch(tokenized_run, root, 1, *RULES, steps=STEPS, model=TINY), root


@pytest.mark.slow
def test_context_parallel_with_fsdp2_matches_one_process_under_every_attention_rule(
    single: tuple[list, Path], tokenized_run: Path, tmp_path: Path
) -> None:
    one, one_root = single
    two = launch(tokenized_run, tmp_path, 2, "parallel.cp=2", *RULES, steps=STEPS, model=TINY)
    assert_same_losses(two, one, STEPS)
    assert {r["seq_len"] for r in two} == {32, 64}  # both phases of the schedule ran split
    assert_same_weights(tmp_path, one_root)
    manifest = json.loads((tmp_path / "runs" / "run" / "train" / "manifest.json").read_text())
    assert manifest["counts"]["parallel"]["cp"] == 2 and manifest["counts"]["processes"] == 2
    assert_states_as_planned(manifest, 0.01)  # FSDP2 shards the states over dp_shard x cp = 2 ranks
