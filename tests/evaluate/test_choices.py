"""kiln.evaluate.choices: task files, the context/continuation split, batched log-likelihoods
against one pair at a time, and the three accuracies on a task whose answers are known."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.errors import FatalError
from kiln.evaluate.choices import Item, encode_pair, loglikelihoods, read_task, score_task
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.transformer import Transformer
from kiln.text.specials import FIXED_SPECIALS
from kiln.text.tokenizer import KilnTokenizer, train_bpe

TEXT = "The cat sat on the mat. The dog ran to the park. A bird sang in the tree by the river.\n"


@pytest.fixture(scope="module")
def tokenizer() -> KilnTokenizer:
    return train_bpe([TEXT] * 40, vocab_size=320, min_frequency=2, specials=FIXED_SPECIALS)


def random_model(tokenizer: KilnTokenizer, max_seq_len: int = 64) -> Transformer:
    cfg = ModelConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=2, max_seq_len=max_seq_len, init_std=0.2
    )
    return build_model(cfg, 0, "cpu").eval()


def test_context_whitespace_moves_to_the_continuation(tokenizer: KilnTokenizer) -> None:
    # "The cat " + "sat": the space ends up in front of "sat", as " sat" is encoded after "The cat".
    assert encode_pair(tokenizer, "The cat ", "sat") == encode_pair(tokenizer, "The cat", " sat")
    context, continuation = encode_pair(tokenizer, "The cat", " sat on")
    assert context == tokenizer.encode("The cat") and context + continuation == tokenizer.encode("The cat sat on")
    assert encode_pair(tokenizer, "", " mat") == (
        [tokenizer.eot_id],
        tokenizer.encode(" mat"),
    )  # no context: end of document


@settings(max_examples=60, deadline=None)
@given(context=st.text(max_size=40), choice=st.text(min_size=1, max_size=20).filter(lambda c: c.strip()))
def test_the_pair_always_encodes_to_the_whole_text(tokenizer: KilnTokenizer, context: str, choice: str) -> None:
    context_ids, continuation_ids = encode_pair(tokenizer, context, " " + choice)
    whole = tokenizer.encode(context + " " + choice)
    assert (context_ids + continuation_ids if context.rstrip() else continuation_ids) == whole
    assert continuation_ids


def test_batched_loglikelihoods_equal_one_pair_at_a_time(tokenizer: KilnTokenizer) -> None:
    model = random_model(tokenizer, max_seq_len=24)
    texts = [
        ("The cat", " sat on the mat"),
        ("A bird sang in the tree by the", " river"),
        ("", " The dog"),
        ("The dog ran to the park. " * 3, " A bird"),
    ]  # the last passes 24 tokens
    pairs = [encode_pair(tokenizer, c, x) for c, x in texts]
    batched = loglikelihoods(model, pairs, batch_size=3)
    for (context, continuation), got in zip(pairs, batched, strict=True):
        ids = (context + continuation)[-25:]
        with torch.no_grad():
            logp_TV = F.log_softmax(model(torch.tensor([ids[:-1]]))[0], -1)
        n = len(continuation)
        expected = sum(float(logp_TV[len(ids) - 1 - n + i, ids[len(ids) - n + i]]) for i in range(n))
        assert got == pytest.approx(expected, abs=1e-4)
        assert got < 0


def test_known_answers_and_what_length_normalisation_changes(
    tokenizer: KilnTokenizer, always_predicts: Callable[[Transformer, int], Transformer]
) -> None:
    the = tokenizer.encode(" the")
    assert len(the) == 1
    model = always_predicts(random_model(tokenizer), the[0])
    items = [
        # " the the the" is three near-certain tokens; " cat" one unlikely token: every rule picks choice 1.
        Item("The cat sat on", (" cat", " the the the"), 1),
        # " dog" alone (one unlikely token) beats " dog the the the the" by raw log-likelihood (the same
        # unlikely token plus four near-certain ones, each a little below 0), but not per token or character.
        Item("A bird sang in", (" dog", " dog the the the the"), 1),
    ]
    result = score_task(model, tokenizer, items, delimiter="")
    assert (result["items"], result["acc"], result["acc_norm_token"], result["acc_norm_char"]) == (2, 0.5, 1.0, 1.0)


def test_task_files_in_the_common_layout(tmp_path: Path) -> None:
    path = tmp_path / "arc.jsonl"
    rows = [
        {"query": "Q: 1+1?", "choices": ["2", "3"], "label": 0},
        {"context": "Sky is", "choices": ["blue", "green", "red"], "label": "B"},
        {"context": "x", "choices": ["a", "b"], "label": "1"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert read_task(path) == [
        Item("Q: 1+1?", ("2", "3"), 0),
        Item("Sky is", ("blue", "green", "red"), 1),
        Item("x", ("a", "b"), 1),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"task\.jsonl:2: not valid JSON"),
        (
            '{"context": "c", "choices": ["a"], "label": 0}',
            r"task\.jsonl:2: `choices` must be a list of at least two strings",
        ),
        (
            '{"context": "c", "choices": ["a", "b"], "label": 2}',
            r"task\.jsonl:2: `label` 2 is not the index of one of the 2 choices",
        ),
        ('{"choices": ["a", "b"], "label": 0}', r"task\.jsonl:2: `context` \(or `query`\) must be a string"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "task.jsonl"
    path.write_text('{"context": "ok", "choices": ["a", "b"], "label": 1}\n' + line + "\n")
    with pytest.raises(FatalError, match=message):
        read_task(path)


def test_a_choice_that_adds_no_token_is_named_by_file_and_line(tmp_path: Path, tokenizer: KilnTokenizer) -> None:
    path = tmp_path / "merge.jsonl"
    # With no delimiter, "The ca" + "t" is "The cat", no more tokens than "The ca" alone: the choice merges into the
    # context.
    path.write_text(
        json.dumps({"context": "The cat", "choices": [" sat", " ran"], "label": 0})
        + "\n"
        + json.dumps({"context": "The ca", "choices": ["t", " dog"], "label": 0})
        + "\n"
    )
    assert len(tokenizer.encode("The cat")) <= len(tokenizer.encode("The ca"))
    with pytest.raises(FatalError, match=r"merge\.jsonl:2: choice 0 \('t'\) adds no token after the context"):
        score_task(random_model(tokenizer), tokenizer, read_task(path), delimiter="")
