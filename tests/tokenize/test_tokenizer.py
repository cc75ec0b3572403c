"""kiln.tokenize.tokenizer: byte-level BPE that round-trips any text, and refuses foreign files."""

from __future__ import annotations

import json
import pydoc_data.topics
import sysconfig
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from kiln.core.errors import FatalError
from kiln.tokenize.config import EOT, PAD
from kiln.tokenize.tokenizer import KilnTokenizer, train_bpe

VOCAB = 600


def real_text() -> list[str]:
    """About 400 KB of text every Python install has: json/ and http/ sources plus docs prose."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8") for d in ("json", "http") for p in sorted((root / d).glob("*.py"))]
    prose, size = [], 0
    for name in sorted(pydoc_data.topics.topics):
        if size > 150_000:
            break
        prose.append(pydoc_data.topics.topics[name])
        size += len(prose[-1])
    return texts + prose


@pytest.fixture(scope="module")
def tok() -> KilnTokenizer:
    texts = real_text()
    assert sum(len(t) for t in texts) > 200_000
    return train_bpe(texts, vocab_size=VOCAB, min_frequency=2)


def test_trained_vocab_and_specials(tok):
    assert tok.vocab_size == VOCAB
    assert (tok.eot_id, tok.pad_id) == (0, 1)  # specials come first in the vocabulary
    assert tok.tok.id_to_token(tok.eot_id) == EOT and tok.tok.id_to_token(tok.pad_id) == PAD
    assert tok.decode([tok.eot_id]) == EOT


def test_hand_worked_merge():
    # "ab ab ab ab" pre-splits into "ab" and 3x " ab"; the byte pairs are (a,b) x4 and (space,a) x3,
    # so with room for exactly one merge (256 bytes + 2 specials + 1) it is a+b, id 258.
    tok = train_bpe(["ab ab ab ab"], vocab_size=259, min_frequency=2)
    assert tok.vocab_size == 259
    assert tok.encode("ab") == [258]
    assert tok.decode([258]) == "ab"
    assert len(tok.encode(" ab")) == 2  # space, ab
    assert len(tok.encode("ba")) == 2  # no merge for b+a
    assert tok.decode(tok.encode("ba ab")) == "ba ab"


def test_numbers_split_in_groups_of_three():
    tok = train_bpe(["1234567890 " * 300], vocab_size=300, min_frequency=2)
    assert [tok.decode([i]) for i in tok.encode("1234567890")] == ["123", "456", "789", "0"]


def test_compresses_real_text(tok):
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()  # not in the training text
    ids = tok.encode(text)
    assert len(text.encode()) / len(ids) > 2.0  # bytes per token; 1.0 would mean no merges at all
    assert tok.decode(ids) == text


def test_encode_batch_matches_encode(tok):
    texts = ["def f(x):\n    return x", "", "Ünïcödé 東京", "  leading spaces\n\n\nand newlines"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


UNICODE_SAMPLES = st.sampled_from(
    ["🙂👩‍👩‍👧", "東京都の天気", "مرحبا بالعالم", "שָׁלוֹם", "e\u0301\u0308", "\x00\x01\t\r\n", "\u200b\ufeff", "𝔘𝔫𝔦", " \t \n\n  "]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(), UNICODE_SAMPLES), max_size=6).map("".join))
@example("")
@example("\x00")
@example("naïve 🙂 東京 مرحبا \u05e9\u05c1 e\u0301\t\r\n\x00 end")
def test_round_trip_any_text(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # byte-level: no unknown token, every id real, and never more tokens than bytes
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert len(ids) <= len(text.encode("utf-8"))
    assert bool(ids) == bool(text)


def test_save_and_load(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    loaded = KilnTokenizer.load(path)
    assert loaded.path == path
    assert loaded.vocab_size == VOCAB and (loaded.eot_id, loaded.pad_id) == (tok.eot_id, tok.pad_id)
    sample = "import json\nprint(json.dumps({'a': 1}))  # 東京 🙂"
    assert loaded.encode(sample) == tok.encode(sample)
    assert loaded.decode(loaded.encode(sample)) == sample


@pytest.mark.parametrize("content", [b"{not json", b'{"version": "1.0", "model": 42}', b"\x00\x01\x02", b""])
def test_loading_garbage_is_fatal(tmp_path, content):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(FatalError, match="cannot load as a tokenizers JSON file"):
        KilnTokenizer.load(path)


def test_loading_missing_file_is_fatal(tmp_path):
    with pytest.raises(FatalError, match="cannot load"):
        KilnTokenizer.load(tmp_path / "nope.json")


def test_loading_a_foreign_bpe_is_fatal(tmp_path):
    foreign = Tokenizer(models.BPE())
    foreign.pre_tokenizer = pre_tokenizers.ByteLevel()
    foreign.train_from_iterator(["some text to train on " * 50], trainer=trainers.BpeTrainer(vocab_size=300, show_progress=False))
    path = tmp_path / "foreign.json"
    foreign.save(str(path))
    assert json.loads(path.read_text())["model"]["type"] == "BPE"  # a valid tokenizers file
    with pytest.raises(FatalError) as info:
        KilnTokenizer.load(path)
    assert f"special tokens {[EOT, PAD]} are missing" in str(info.value)
    assert str(path) in str(info.value)


def test_literal_special_token_text_is_not_the_special_id(tok):
    ids = tok.encode("the GPT-2 separator is <|endoftext|> in its vocabulary")
    assert tok.eot_id not in ids
