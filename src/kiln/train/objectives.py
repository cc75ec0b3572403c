"""Pretraining objectives: how one window of token ids becomes one training row.

Each builder takes a window drawn by the sampler and returns a `Row`: the ids the model reads,
the ids it should predict at each position, the positions that count in the loss, and what the
positions may attend to. All five are trained in one decoder:
  clm              causal; every next token counts. Window T + 1.
  fim              clm over documents the tokenize stage rewrote as prefix/suffix/middle
                   (kiln.text.fim; tokenize.fim). FIM is character-level, so it happens where
                   whole texts exist: at tokenize time, its rate part of the tokenize identity,
                   with no decode/re-encode in the training loop. Window T + 1.
  mlm              BERT masking: mask_rate of the ordinary tokens are selected; of those 80%
                   become <|mask|>, 10% a random ordinary token, 10% stay; bidirectional; the
                   loss counts the selected positions, each predicting its own original token
                   (no shift). Window T.
  prefix_lm        bidirectional over a prefix whose length is drawn per document (a share of
                   it between min_share and max_share), causal after; the loss counts the
                   predictions of tokens after the prefix. Window T + 1.
  span_corruption  T5: noise_density of a window's tokens, in spans of mean length mean_span,
                   are replaced by sentinels; the row is the corrupted window (a bidirectional
                   prefix) followed by sentinel-delimited spans and end-of-document (the
                   target, causal). Window L < T chosen so the row is exactly T + 1 ids.
A weighted mapping (`{span_corruption: 0.5, prefix_lm: 0.25, clm: 0.25}`) picks one per row
(UL2-style mixing). Every random choice of a row comes from a generator seeded by
(train.seed, the row's index in the global stream), so rows do not depend on batch size,
micro-batching or the number of data-parallel ranks, and a resumed run rebuilds them exactly.
Not handled here: drawing windows (kiln.mix), batching rows (kiln.train.collate).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from kiln.core.config import Section
from kiln.core.errors import ConfigError
from kiln.text.load import AnyTokenizer

Objective = Literal["clm", "fim", "mlm", "prefix_lm", "span_corruption"]
Attention = Literal["causal", "full", "prefix"]
# Objectives whose rows keep attention inside each packed document unless the recipe says otherwise.
MASKS_DOCUMENTS_BY_DEFAULT: dict[str, bool] = {
    "clm": False,
    "fim": True,
    "mlm": True,
    "prefix_lm": True,
    "span_corruption": False,
}


class MLMConfig(Section):
    mask_rate: float = Field(
        default=0.15, gt=0, lt=1, description="Share of ordinary (non-special) tokens selected for prediction."
    )
    replace_with_mask: float = Field(
        default=0.8, ge=0, le=1, description="Share of selected tokens replaced by <|mask|>."
    )
    replace_with_random: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Share of selected tokens replaced by a random ordinary token; the rest stay as they are.",
    )

    @model_validator(mode="after")
    def _shares(self) -> MLMConfig:
        if self.replace_with_mask + self.replace_with_random > 1:
            raise ValueError(
                f"replace_with_mask + replace_with_random = {self.replace_with_mask + self.replace_with_random} "
                "exceeds 1"
            )
        return self


class PrefixLMConfig(Section):
    min_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Smallest prefix, as a share of its document's (or, without document masking, its row's) length.",
    )
    max_share: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Largest prefix share; each document draws its share uniformly between the two.",
    )

    @model_validator(mode="after")
    def _order(self) -> PrefixLMConfig:
        if self.min_share > self.max_share:
            raise ValueError(f"min_share ({self.min_share}) exceeds max_share ({self.max_share})")
        return self


class SpanCorruptionConfig(Section):
    noise_density: float = Field(
        default=0.15, gt=0, lt=1, description="Share of a window's tokens that are corrupted (T5: 0.15)."
    )
    mean_span: float = Field(default=3.0, ge=1, description="Mean corrupted span length in tokens (T5: 3).")


@dataclass(frozen=True)
class TokenIds:
    """The special ids objectives write, from the run's tokenizer."""

    eot: int
    pad: int
    mask: int | None  # None: the vocabulary has no mask token (an imported one may not)
    fim_middle: int | None
    sentinels: tuple[int, ...]
    first_ordinary: int  # ids below are special
    vocab_size: int
    late_specials: tuple[int, ...] = ()  # special ids at or above first_ordinary (an imported vocabulary's end)


def token_ids(tokenizer: AnyTokenizer) -> TokenIds:
    specials = sorted(tokenizer.specials.values())
    first = next((i for i, s in enumerate(specials) if s != i), len(specials))  # specials 0..first-1 come first
    return TokenIds(
        tokenizer.eot_id,
        tokenizer.pad_id,
        tokenizer.mask_id,
        tokenizer.fim_ids[1] if tokenizer.fim_ids else None,
        tuple(tokenizer.sentinel_ids),
        first,
        tokenizer.vocab_size,
        tuple(specials[first:]),
    )


@cache
def ordinary_ids(first: int, vocab_size: int, late: tuple[int, ...]) -> np.ndarray:
    """The ordinary ids in order: first..vocab_size without the late specials."""
    return np.setdiff1d(np.arange(first, vocab_size), np.array(late, dtype=np.int64))


def check_objectives(
    objectives: dict[str, float], seq_len: int, span: SpanCorruptionConfig, ids: TokenIds, tokenize_fim: dict | None
) -> None:
    """Stop before any work when the run's tokenizer or token shards cannot serve the objectives."""
    if "span_corruption" in objectives:
        n_spans = span_plan(seq_len, span)[2]
        if n_spans > len(ids.sentinels):
            raise ConfigError(
                f"train.objective span_corruption at seq_len {seq_len} corrupts {n_spans} spans per row but the "
                "tokenizer reserves"
                f" {len(ids.sentinels)} sentinels; raise tokenizer.sentinel_tokens to {n_spans} (retrains the "
                "tokenizer; an imported one gains <|sentinel_i|> tokens with `kiln extend-tokenizer`) or raise "
                "train.span_corruption.mean_span"
            )
    missing = [
        f"{token} (train.objective {name})"
        for name, token, have in (("mlm", "a mask token", ids.mask), ("fim", "<|fim_middle|>", ids.fim_middle))
        if name in objectives and have is None
    ]
    if missing:
        raise ConfigError(
            f"this run's tokenizer has no {', '.join(missing)}; add the tokens with `kiln extend-tokenizer` or "
            "choose another objective"
        )
    if "fim" in objectives and not (tokenize_fim and tokenize_fim["rate"] > 0):
        raise ConfigError(
            "train.objective fim trains on documents the tokenize stage rearranged, and this run's token shards "
            "have none; set tokenize.fim (e.g. tokenize.fim.rate=0.5) and run tokenize again"
        )


@dataclass(frozen=True, eq=False)  # eq=False: array fields have no single truth value
class Row:
    """One training row of T positions (numpy, int64 / bool)."""

    inputs: np.ndarray
    targets: np.ndarray
    loss_mask: np.ndarray
    doc_ids: np.ndarray  # all zeros when attention may cross documents
    attention: Attention
    prefix: np.ndarray | None = None  # with attention="prefix": keys every query of the document sees


def document_ids(inputs: np.ndarray, eot: int) -> np.ndarray:
    """Document index per position: a document ends with (and includes) its end-of-document token."""
    ends = inputs == eot
    return np.concatenate(([0], np.cumsum(ends[:-1]))).astype(np.int64)


def clm(window: np.ndarray, ids: TokenIds, masking: bool) -> Row:
    inputs, targets = window[:-1], window[1:]
    if not masking:
        return Row(inputs, targets, np.ones(len(inputs), dtype=bool), np.zeros(len(inputs), dtype=np.int64), "causal")
    # Under document masking an end-of-document position cannot see the document it would
    # predict the first token of: that target is not counted (as in prefix_lm).
    return Row(inputs, targets, inputs != ids.eot, document_ids(inputs, ids.eot), "causal")


def mlm(window: np.ndarray, ids: TokenIds, cfg: MLMConfig, masking: bool, rng: np.random.Generator) -> Row:
    T = len(window)
    ordinary = window >= ids.first_ordinary
    if ids.late_specials:
        ordinary &= ~np.isin(window, ids.late_specials)
    selected = ordinary & (rng.random(T) < cfg.mask_rate)  # specials are never selected
    how = rng.random(T)  # < replace_with_mask: mask; then random; the rest unchanged
    if ids.late_specials:
        pool = ordinary_ids(ids.first_ordinary, ids.vocab_size, ids.late_specials)
        random_ids = pool[rng.integers(0, len(pool), size=T)]
    else:  # the same draws as indexing first..vocab_size
        random_ids = rng.integers(ids.first_ordinary, ids.vocab_size, size=T)
    inputs = window.copy()
    to_mask = selected & (how < cfg.replace_with_mask)
    to_random = selected & (how >= cfg.replace_with_mask) & (how < cfg.replace_with_mask + cfg.replace_with_random)
    inputs[to_mask] = ids.mask
    inputs[to_random] = random_ids[to_random]
    docs = document_ids(window, ids.eot) if masking else np.zeros(T, dtype=np.int64)
    return Row(inputs, window, selected, docs, "full")


def prefix_lm(window: np.ndarray, ids: TokenIds, cfg: PrefixLMConfig, masking: bool, rng: np.random.Generator) -> Row:
    inputs, targets = window[:-1], window[1:]
    T = len(inputs)
    docs = document_ids(inputs, ids.eot) if masking else np.zeros(T, dtype=np.int64)
    prefix = np.zeros(T, dtype=bool)
    loss = np.zeros(T, dtype=bool)
    starts = np.flatnonzero(np.diff(docs, prepend=-1))
    for start, end in zip(starts, [*starts[1:], T], strict=True):
        n = end - start
        share = rng.uniform(cfg.min_share, cfg.max_share)
        p = int(share * n)  # 0..n prefix positions
        prefix[start : start + p] = True
        # Position i predicts targets[i] = inputs[i + 1]: it counts once that token is past the
        # prefix (the last prefix position predicts the first token after it).
        loss[start + max(p - 1, 0) : end] = True
    if masking:
        # The end-of-document position would predict the next document's first token, which
        # it cannot see: under document masking that target is not the document's to learn.
        loss &= inputs != ids.eot
    return Row(inputs, targets, loss, docs, "prefix", prefix)


def span_plan(seq_len: int, cfg: SpanCorruptionConfig) -> tuple[int, int, int]:
    """(window length L, corrupted tokens N, spans n) whose row fills seq_len + 1 ids: L + 2n + 1 <= seq_len + 1."""
    for L in range(seq_len, 1, -1):
        N = min(max(round(L * cfg.noise_density), 1), L - 1)
        n = min(max(round(N / cfg.mean_span), 1), N, L - N)
        if L + 2 * n <= seq_len:
            return L, N, n
    raise ValueError(f"seq_len {seq_len} is too short for span corruption")


def split_randomly(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """`parts` positive lengths summing to `total`, uniformly over all such compositions."""
    cuts = (
        np.sort(rng.choice(total - 1, size=parts - 1, replace=False) + 1) if parts > 1 else np.array([], dtype=np.int64)
    )
    return np.diff(np.concatenate(([0], cuts, [total]))).astype(np.int64)


def span_corruption(
    window: np.ndarray, ids: TokenIds, cfg: SpanCorruptionConfig, seq_len: int, rng: np.random.Generator
) -> Row:
    L, N, n = span_plan(seq_len, cfg)
    assert len(window) == L, f"span corruption takes windows of {L} tokens, got {len(window)}"
    noise_lens, keep_lens = split_randomly(N, n, rng), split_randomly(L - N, n, rng)
    corrupted: list[np.ndarray] = []
    target: list[np.ndarray] = []
    at = 0
    for k in range(n):  # T5's layout: kept tokens first, then a corrupted span, n times
        corrupted += [window[at : at + keep_lens[k]], np.array([ids.sentinels[k]])]
        at += keep_lens[k]
        target += [np.array([ids.sentinels[k]]), window[at : at + noise_lens[k]]]
        at += noise_lens[k]
    prefix_ids = np.concatenate(corrupted)
    seq = np.concatenate([prefix_ids, *target, [ids.eot]])
    used = len(seq)  # L + 2n + 1 <= seq_len + 1
    seq = np.concatenate([seq, np.full(seq_len + 1 - used, ids.pad, dtype=np.int64)])
    P = len(prefix_ids)
    positions = np.arange(seq_len)
    loss = (positions >= P - 1) & (positions < used - 1)  # predict sentinel 0 .. end-of-document
    return Row(seq[:-1], seq[1:], loss, np.zeros(seq_len, dtype=np.int64), "prefix", positions < P)


def fim_middles(inputs_BT: np.ndarray, targets_BT: np.ndarray, ids: TokenIds) -> np.ndarray:
    """(B, T) bool: the positions whose target lies in a FIM middle (after <|fim_middle|>, up to and
    including the end-of-document that closes it): what the fim objective is validated on."""
    seq_BS = np.concatenate([inputs_BT, targets_BT[:, -1:]], axis=1)  # the row's T + 1 ids
    marker_BS = np.where(seq_BS == ids.fim_middle, 1, np.where(seq_BS == ids.eot, -1, 0))
    # The last marker strictly before each id: +1 inside a middle, -1 after an end, 0 not yet seen.
    last_BS = np.zeros_like(marker_BS)
    for j in range(1, seq_BS.shape[1]):
        last_BS[:, j] = np.where(marker_BS[:, j - 1] != 0, marker_BS[:, j - 1], last_BS[:, j - 1])
    return last_BS[:, 1:] == 1


def window_length(objective: Objective, seq_len: int, span: SpanCorruptionConfig) -> int:
    """Tokens the objective takes from the data for one row of seq_len positions."""
    if objective == "mlm":
        return seq_len  # predicts in place: no shift
    if objective == "span_corruption":
        return span_plan(seq_len, span)[0]
    return seq_len + 1
