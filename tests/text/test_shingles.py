"""kiln.text.shingles: normalization into words, and word n-gram hashes checked against a
plain-Python reference of the documented formula."""

from __future__ import annotations

import string

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.text.shingles import (
    MAX_N,
    MULTIPLIERS,
    ngram_hashes,
    shingle_set,
    shingle_sets,
    text_hashes,
    word_hashes,
    words,
)

M64 = 2**64 - 1


def mix64_reference(x: int) -> int:
    """murmur3's fmix64 on a Python int."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def ngrams_reference(tokens: list[str], n: int) -> list[int]:
    """The module docstring's formula, one n-gram at a time, in Python integers."""
    hashes = [xxhash.xxh3_64_intdigest(w.encode("utf-8")) for w in tokens]
    windows = [hashes[i : i + n] for i in range(len(hashes) - n + 1)] or ([hashes] if hashes else [])
    return [mix64_reference(sum(h * int(MULTIPLIERS[j]) for j, h in enumerate(window)) & M64) for window in windows]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello, World!", ["hello", "world"]),
        ("  tabs\tand\nnew\r\nlines  ", ["tabs", "and", "new", "lines"]),
        ("snake_case -- and...dots", ["snake", "case", "and", "dots"]),
        ("don't", ["don", "t"]),
        ("ÉCOLE Café", ["école", "café"]),  # non-ASCII letters are word characters, lowercased
        ("Chapter 12, page 3a", ["chapter", "00", "page", "0a"]),
        ("room ١٢", ["room", "00"]),  # Arabic-Indic digits are decimal digits too
        ("!!! ... ???", []),
        ("", []),
    ],
)
def test_words_normalize_case_punctuation_digits_and_whitespace(text, expected):
    assert words(text) == expected


def test_digits_are_kept_when_not_folded():
    assert words("Chapter 12, page 3a", fold_digits=False) == ["chapter", "12", "page", "3a"]
    assert np.array_equal(shingle_set("see chapter 12 now", 2), shingle_set("see chapter 13 now", 2))
    assert not np.array_equal(
        shingle_set("see chapter 12 now", 2, fold_digits=False), shingle_set("see chapter 13 now", 2, fold_digits=False)
    )


def test_normalization_makes_equal_shingles():
    assert np.array_equal(shingle_set("The cat, the HAT!", 2), shingle_set("the   cat the\nhat", 2))


def test_hand_worked_ngram_count():
    # "the cat the cat" has 4 words: bigrams "the cat", "cat the", "the cat" -> 3 n-grams, 2 distinct
    hashes = ngram_hashes(word_hashes(words("the cat the cat")), 2)
    assert len(hashes) == 3 and hashes[0] == hashes[2] and hashes[0] != hashes[1]
    assert len(shingle_set("the cat the cat", 2)) == 2
    # 6 words, trigrams: 6 - 3 + 1 = 4, all distinct
    assert len(shingle_set("one two three four five six", 3)) == 4
    assert len(shingle_set("one two three four five six", 1)) == 6


def test_ngram_hashes_match_the_reference_formula():
    tokens = words("a quick brown fox jumps over the lazy dog and the quick cat")
    for n in (1, 2, 5, len(tokens), len(tokens) + 3):
        assert ngram_hashes(word_hashes(tokens), n).tolist() == ngrams_reference(tokens, n)


def test_order_matters():
    assert not np.array_equal(shingle_set("alpha beta", 2), shingle_set("beta alpha", 2))
    assert not np.array_equal(shingle_set("a b c", 3), shingle_set("c b a", 3))
    # the same words in another order share no trigram here
    assert len(np.intersect1d(shingle_set("a b c d", 3), shingle_set("d c b a", 3))) == 0


def test_fewer_words_than_n_give_one_shingle_of_all_words():
    short = shingle_set("only two", 5)
    assert len(short) == 1
    assert np.array_equal(short, shingle_set("only two", 2))  # the same formula over the 2 words
    assert len(shingle_set("single", 5)) == 1


def test_empty_and_wordless_texts_give_no_shingles():
    for text in ("", "   \n\t", "--- !!! ..."):
        got = shingle_set(text, 5)
        assert got.dtype == np.uint64 and len(got) == 0


def test_combining_marks_stay_inside_words():
    # split on every non-word character, "हिन्दी भाषा" would lose its vowel signs and viramas
    assert words("हिन्दी भाषा") == ["हिन्दी", "भाषा"]
    assert words("كَتَبَ الوَلَدُ") == ["كَتَبَ", "الوَلَدُ"]
    assert not np.array_equal(shingle_set("कमल", 1), shingle_set("कमला", 1))


def test_ngram_size_outside_range_is_rejected():
    for n in (0, MAX_N + 1):
        with pytest.raises(ValueError, match="outside"):
            ngram_hashes(word_hashes(["a"]), n)


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(exclude_categories=()), max_size=200), n=st.integers(1, 8), fold=st.booleans())
def test_any_unicode_text_is_shingled_deterministically(text, n, fold):
    # exclude_categories=() lets in lone surrogates, which hashing must survive too
    first = shingle_set(text, n, fold)
    assert np.array_equal(first, shingle_set(text, n, fold))
    assert first.dtype == np.uint64 and np.all(first[1:] > first[:-1])  # sorted, distinct
    count = len(words(text, fold))
    assert len(first) <= (max(count - n + 1, 1) if count else 0)


# ASCII text takes a byte-level fast path (text_hashes); it must split and fold exactly as words() does.
ASCII_HEAVY = st.text(st.sampled_from(string.printable + "\x00\x0b\x7f_-'"), max_size=120)
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)
# Runs of scripts written without spaces go through a segmenter: on their own, beside ASCII letters, digits,
# breaks and upper case, and with a lone surrogate inside.
UNSPACED_HEAVY = st.text(
    st.sampled_from(
        list("我们的软件是免费的按钮点击上面ここに記述したカスタムを一時的無効化ภาษาไทยกำหนดเองສະບາຍ")
        + list('CSS ab1,."_-\n')
        + ["\ud800", "é", "。"]
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(ASCII_HEAVY, ANY_TEXT, UNSPACED_HEAVY), fold=st.booleans())
def test_text_hashes_equal_word_hashes_of_words(text, fold):
    assert np.array_equal(text_hashes(text, fold), word_hashes(words(text, fold)))


def test_a_run_of_chinese_japanese_or_thai_is_split_into_its_words():
    assert words("您可以点击上面的按钮，Click!") == ["您", "可以", "点击", "上面", "的", "按钮", "click"]
    assert words("一時的に無効化する") == ["一時的", "に", "無効化", "する"]
    assert words("คุณสามารถปิดใช้") == ["คุณ", "สามารถ", "ปิด", "ใช้"]


def test_ascii_fast_path_hand_worked():
    # underscores, apostrophes and control characters break words; digits fold; case folds
    tokens = [b"snake", b"case", b"don", b"t", b"r0d0m", b"a", b"b"]
    assert text_hashes("Snake_case don't R2D2m\ta\x00b").tolist() == [xxhash.xxh3_64_intdigest(w) for w in tokens]
    assert text_hashes("R2D2", fold_digits=False).tolist() == [xxhash.xxh3_64_intdigest(b"r2d2")]


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(
        st.one_of(ASCII_HEAVY, ANY_TEXT, st.sampled_from(["", "!!!", "one", "one two", "a b c d e f g"])), max_size=12
    ),
    n=st.integers(1, 6),
    fold=st.booleans(),
)
def test_batched_shingle_sets_equal_one_by_one(texts, n, fold):
    values, offsets = shingle_sets(texts, n, fold)
    assert offsets.tolist()[0] == 0 and len(offsets) == len(texts) + 1 and offsets[-1] == len(values)
    for i, text in enumerate(texts):
        assert np.array_equal(values[offsets[i] : offsets[i + 1]], shingle_set(text, n, fold)), i


def test_batched_shingle_sets_hand_worked():
    # "a b c" has 2 bigrams, "x" (shorter than n) 1, "" none, "a b c" again its 2; no bigram spans two texts
    values, offsets = shingle_sets(["a b c", "x", "", "a b c"], 2)
    assert offsets.tolist() == [0, 2, 3, 3, 5]
    assert np.array_equal(values[0:2], values[3:5]) and values[2] == shingle_set("x", 2)[0]
    # the batch is hashed as one concatenation; its cross-text bigram "c x" must not leak in
    assert not np.isin(shingle_set("c x", 2), values).any()
    empty, offsets = shingle_sets([], 5)
    assert len(empty) == 0 and offsets.tolist() == [0]
    with pytest.raises(ValueError, match="outside"):
        shingle_sets(["a"], 0)


def test_words_are_lowercased_one_by_one():
    # Greek capital sigma lowers to final sigma at a word's end; lowering the whole text first
    # would see the letter after the colon and give a medial sigma instead
    assert words("ΑΣ:Β ΟΔΟΣ.") == ["ας", "β", "οδος"]
    for text in ("ΑΣ:Β ΟΔΟΣ.", "ΣΑΣ'Σ ΣΣ_Σ", "İSTANBUL:ΣΑΣ"):
        assert np.array_equal(text_hashes(text), word_hashes(words(text)))


def jaccard(a: str, b: str, n: int = 5) -> float:
    sa, sb = shingle_set(a, n), shingle_set(b, n)
    return len(np.intersect1d(sa, sb)) / len(np.union1d(sa, sb))


def test_a_few_words_changed_in_chinese_or_japanese_keep_their_shingles_as_in_english():
    """The same paragraph in three languages, two words changed in each: word 5-grams of segmented
    Chinese and Japanese lose about as many shingles as English's (v1 made each clause one word, so two
    changed characters cost most of a paragraph's shingles)."""
    en = (
        "This tool turns raw text into training data. It reads web pages and documents, removes repeated "
        "content, filters out paragraphs of low quality, and then writes the result into shard files. Every "
        "stage records its inputs and outputs, so they can be checked later."
    )
    zh = (
        "这个工具可以把原始文本变成训练数据。它会读取网页和文档，去掉重复的内容，过滤质量较低的段落，"
        "然后把结果写入分片文件。每个阶段都会记录输入和输出，方便以后检查。"
    )
    ja = (
        "このツールは生のテキストを学習用のデータに変換します。ウェブページや文書を読み込み、重複した内容を"
        "取り除き、品質の低い段落を除外してから、結果をシャードファイルに書き込みます。各段階は入力と出力を"
        "記録するので、後から確認できます。"
    )
    edited = {
        "en": jaccard(en, en.replace("low quality", "poor quality").replace("checked", "verified")),
        "zh": jaccard(zh, zh.replace("较低", "很低").replace("检查", "核对")),
        "ja": jaccard(ja, ja.replace("品質の低い", "品質が低い").replace("確認", "検証")),
    }
    assert all(0.5 < j < 1 for j in edited.values()), edited
    assert max(edited.values()) - min(edited.values()) < 0.2, edited


@pytest.mark.parametrize(
    ("text", "language", "expected"),
    [
        # a kanji-only run of a Japanese text: Chinese's dictionary by its script alone, Japanese's with
        # the text's language
        ("（日単位）", None, ["日", "単", "位"]),
        ("（日単位）", "ja", ["日単位"]),
        # a run of mostly Latin letters with some katakana: no script majority, so Chinese without a
        # language, Japanese in a Japanese text
        ("エラー、pkgProblemResolver", None, ["エ", "ラ", "ー", "pkgproblemresolver"]),
        ("エラー、pkgProblemResolver", "ja-JP", ["エラー", "pkgproblemresolver"]),
        # where the script names a language it decides (kana: Japanese), whatever the text's language
        ("カタカナ中文", "zh", ["カタカナ", "中文"]),
        # a spaced language leaves runs to their script
        ("中文字符 text", "en", ["中文", "字符", "text"]),
    ],
)
def test_the_texts_language_splits_the_runs_its_script_leaves_open(text, language, expected):
    assert words(text, language=language) == expected
    assert np.array_equal(text_hashes(text, language=language), word_hashes(expected))


@settings(max_examples=150, deadline=None)
@given(
    text=st.one_of(UNSPACED_HEAVY, ANY_TEXT),
    fold=st.booleans(),
    language=st.sampled_from([None, "ja", "zh", "zh-Hant", "th", "lo", "en", "fr"]),
)
def test_text_hashes_equal_word_hashes_of_words_in_a_language(text, fold, language):
    assert np.array_equal(text_hashes(text, fold, language), word_hashes(words(text, fold, language)))


def test_batched_shingle_sets_take_each_texts_language():
    texts = ["（日単位） 設定変更", "（日単位） 設定変更", "plain English text here"]  # kanji-only runs
    languages = ["ja", None, "en"]
    values, offsets = shingle_sets(texts, 2, languages=languages)
    for i, (text, language) in enumerate(zip(texts, languages)):
        assert np.array_equal(values[offsets[i] : offsets[i + 1]], shingle_set(text, 2, language=language)), i
    assert not np.array_equal(values[offsets[0] : offsets[1]], values[offsets[1] : offsets[2]])
    with pytest.raises(AssertionError, match="one language"):
        shingle_sets(texts, 2, languages=["ja"])
