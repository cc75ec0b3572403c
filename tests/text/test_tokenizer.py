"""kiln.text.tokenizer: byte-level BPE that round-trips any text, encodes like its HF twin, refuses foreign files."""

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
from kiln.text.byte_level import byte_alphabet
from kiln.text.specials import EOT, FIXED_SPECIALS, PAD, special_tokens
from kiln.text.tokenizer import META_NAME, KilnTokenizer, tiktoken_rules, train_bpe

VOCAB = 600
SPECIALS = special_tokens(n_sentinels=4, n_reserved=2)


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
    return train_bpe(texts, vocab_size=VOCAB, min_frequency=2, specials=SPECIALS)


def test_byte_alphabet_is_the_byte_level_one():
    table = byte_alphabet()
    assert sorted(table) == list(range(256))
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert (table[ord("a")], table[ord(" ")], table[ord("\n")], table[0]) == ("a", "\u0120", "\u010a", "\u0100")


def test_trained_vocab_and_specials(tok):
    assert tok.vocab_size == VOCAB
    assert list(tok.specials) == SPECIALS and list(tok.specials.values()) == list(
        range(len(SPECIALS))
    )  # specials come first
    assert (tok.eot_id, tok.pad_id, tok.mask_id) == (0, 1, 2) and tok.fim_ids == (3, 4, 5)
    assert tok.sentinel_ids == [6, 7, 8, 9]
    assert tok.hf.id_to_token(tok.eot_id) == EOT and tok.hf.id_to_token(tok.pad_id) == PAD
    assert tok.decode([tok.eot_id]) == EOT


def test_hand_worked_merge():
    # "ab ab ab ab" pre-splits into "ab" and 3x " ab"; the byte pairs are (a,b) x4 and (space,a) x3,
    # so with room for exactly one merge (256 bytes + 6 specials + 1) it is a+b, id 262.
    tok = train_bpe(["ab ab ab ab"], vocab_size=263, min_frequency=2, specials=FIXED_SPECIALS)
    assert tok.vocab_size == 263
    assert tok.encode("ab") == [262]
    assert tok.decode([262]) == "ab"
    assert len(tok.encode(" ab")) == 2  # space, ab
    assert len(tok.encode("ba")) == 2  # no merge for b+a
    assert tok.decode(tok.encode("ba ab")) == "ba ab"


def test_tiktoken_rules_hand_worked():
    # Trained: (b,c) -> bc id 10, (a,b) -> ab id 11, (ab,c) -> abc id 12. "abc" also splits as a+bc,
    # which tiktoken would merge at abc's rank, so the rewrite adds it right after (ab,c).
    vocab = {"a": 0, "b": 1, "c": 2, "bc": 10, "ab": 11, "abc": 12}
    out = tiktoken_rules({"model": {"vocab": vocab, "merges": [["b", "c"], ["a", "b"], ["ab", "c"]]}})
    assert out["model"]["merges"] == [["b", "c"], ["a", "b"], ["ab", "c"], ["a", "bc"]]
    assert out["model"]["ignore_merges"] is True


def test_numbers_split_in_groups_of_three():
    tok = train_bpe(["1234567890 " * 300], vocab_size=300, min_frequency=2, specials=FIXED_SPECIALS)
    assert [tok.decode([i]) for i in tok.encode("1234567890")] == ["123", "456", "789", "0"]


def test_compresses_real_text(tok):
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()  # not in the training text
    ids = tok.encode(text)
    assert len(text.encode()) / len(ids) > 2.0  # bytes per token; 1.0 would mean no merges at all
    assert tok.decode(ids) == text


def test_fast_encoder_equals_the_hf_tokenizer_on_real_text(tok):
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8") for p in sorted(root.glob("*.py"))[:60]]
    assert [e.ids for e in tok.hf.encode_batch(texts, add_special_tokens=False)] == tok.encode_batch(texts)


def test_encode_batch_matches_encode(tok):
    texts = ["def f(x):\n    return x", "", "Ünïcödé 東京", "  leading spaces\n\n\nand newlines"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts] == tok.encode_batch(texts, threads=2)


UNICODE_SAMPLES = st.sampled_from(
    [
        "🙂👩‍👩‍👧",
        "東京都の天気",
        "مرحبا بالعالم",
        "שָׁלוֹם",
        "e\u0301\u0308",
        "\x00\x01\t\r\n",
        "\u200b\ufeff",
        "𝔘𝔫𝔦",
        " \t \n\n  ",
        "def f(x):\n\tif x:  \n\t\treturn 1   \n",
        "\u202eevil\u202c",
        "ſ IT'S it's \u212a",
        "\x7f\x85\xa0\u2028\u3000",
    ]
)


@settings(max_examples=300, deadline=None)
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
    # the HF tokenizer.json gives the same ids (with encode_special_tokens set, as kiln sets it)
    assert tok.hf.encode(text, add_special_tokens=False).ids == ids


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.one_of(st.characters(categories=["Cs"]), st.sampled_from("ab 東🙂\n"))))
def test_lone_surrogates_become_replacement_characters(tok, text):
    # UTF-8 cannot hold a surrogate: lone ones become U+FFFD, a high+low pair the character it spells.
    expected = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    assert tok.decode(tok.encode(text)) == expected


def test_save_and_load(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    assert tok.save(path) == [path, tmp_path / META_NAME]
    loaded = KilnTokenizer.load(path)
    assert loaded.path == path
    assert loaded.vocab_size == VOCAB and loaded.specials == tok.specials
    sample = "import json\nprint(json.dumps({'a': 1}))  # 東京 🙂"
    assert loaded.encode(sample) == tok.encode(sample)
    assert loaded.decode(loaded.encode(sample)) == sample


@pytest.fixture
def saved(tok, tmp_path) -> Path:
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    return path


@pytest.mark.parametrize("content", [b"{not json", b'{"version": "1.0", "model": 42}', b"\x00\x01\x02", b""])
def test_loading_garbage_is_fatal(saved, content):
    saved.write_bytes(content)
    meta = json.loads((saved.parent / META_NAME).read_text())
    meta["tokenizer_json_xxh3"] = __import__("xxhash").xxh3_64_hexdigest(
        content
    )  # the hash passes; the content does not
    (saved.parent / META_NAME).write_text(json.dumps(meta))
    with pytest.raises(FatalError, match="cannot load as a tokenizers JSON file"):
        KilnTokenizer.load(saved)


def test_loading_missing_file_is_fatal(tmp_path):
    with pytest.raises(FatalError, match="no such tokenizer; run `kiln train-tokenizer`"):
        KilnTokenizer.load(tmp_path / "nope.json")


def test_loading_a_foreign_tokenizer_is_fatal(tmp_path):
    foreign = Tokenizer(models.BPE())
    foreign.pre_tokenizer = pre_tokenizers.ByteLevel()
    foreign.train_from_iterator(
        ["some text to train on " * 50], trainer=trainers.BpeTrainer(vocab_size=300, show_progress=False)
    )
    path = tmp_path / "foreign.json"
    foreign.save(str(path))
    assert json.loads(path.read_text())["model"]["type"] == "BPE"  # a valid tokenizers file
    with pytest.raises(FatalError) as info:
        KilnTokenizer.load(path)
    assert f"no {META_NAME} beside it" in str(info.value) and "kiln train-tokenizer" in str(info.value)
    assert str(path) in str(info.value)


def test_foreign_vocabulary_is_refused_even_as_a_python_object():
    foreign = Tokenizer(models.BPE())
    foreign.train_from_iterator(
        ["some text to train on " * 50],
        trainer=trainers.BpeTrainer(vocab_size=300, special_tokens=list(FIXED_SPECIALS), show_progress=False),
    )
    with pytest.raises(FatalError, match="is not byte-level BPE|lacks some of the 256 byte tokens"):
        KilnTokenizer(foreign, FIXED_SPECIALS)


def test_other_format_version_is_fatal(saved):
    meta_path = saved.parent / META_NAME
    meta = json.loads(meta_path.read_text())
    meta["version"] = 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(
        FatalError, match=r"v1, this kiln reads kiln-tokenizer v2; rerun `kiln train-tokenizer --force`"
    ):
        KilnTokenizer.load(saved)


def test_hand_edited_tokenizer_json_is_fatal(saved):
    data = json.loads(saved.read_text())
    data["model"]["ignore_merges"] = False  # valid for tokenizers, but no longer the rule kiln's encoder follows
    saved.write_text(json.dumps(data))
    with pytest.raises(FatalError, match="changed since kiln wrote it"):
        KilnTokenizer.load(saved)


def test_unreadable_metadata_is_fatal(saved):
    (saved.parent / META_NAME).write_text("[1, 2")
    with pytest.raises(FatalError, match=f"{META_NAME}: not valid JSON"):
        KilnTokenizer.load(saved)


def test_literal_special_token_text_is_not_the_special_id(tok):
    ids = tok.encode("the GPT-2 separator is <|endoftext|> in its vocabulary, <|fim_prefix|> and <|sentinel_0|> too")
    assert not set(ids) & set(tok.specials.values())


def test_the_fastest_exact_encoder_is_picked_against_tiktoken(tok):
    """splintr reads the same tokenizer.json; it encodes when its ids equal tiktoken's (which define kiln's)."""
    assert tok.encoder_name == "splintr"
    texts = [*real_text()[:40], "a <|endoftext|> b", "x\ud800y 東京"]
    assert tok.encode_batch(texts) == [tok.fast.encode_ordinary(t) for t in texts]


def test_flat_batch_equals_the_ids_of_each_text(tok):
    texts = [
        *real_text()[:30],
        "",
        "the separator <|endoftext|> and <|fim_prefix|> stay text",
        "lone \ud800 surrogate",
        "  leading spaces\n\n\nand newlines",
    ]
    ids, lengths = tok.encode_flat(texts)
    per_text = [tok.encode(t) for t in texts]
    assert lengths.tolist() == [len(i) for i in per_text]
    assert ids.tolist() == [i for row in per_text for i in row]
    assert not set(ids.tolist()) & set(tok.specials.values())
    assert tok.decode(per_text[-2]) == "lone \ufffd surrogate"


def test_flat_batch_of_plain_text_only_and_of_nothing(tok):
    texts = ["def f(x):\n    return x", "Ünïcödé 東京"]  # no special spelling: one batch call
    ids, lengths = tok.encode_flat(texts)
    assert ids.tolist() == tok.encode(texts[0]) + tok.encode(texts[1]) and lengths.tolist() == [
        len(tok.encode(t)) for t in texts
    ]
    ids, lengths = tok.encode_flat([])
    assert ids.size == 0 and lengths.size == 0
