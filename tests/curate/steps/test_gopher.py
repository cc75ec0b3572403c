"""Gopher quality and repetition: each rule just inside (kept) and just outside (dropped, exact reason)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.steps.base import Drop
from kiln.curate.steps.gopher import (
    GopherQuality,
    GopherQualityConfig,
    GopherRepetition,
    GopherRepetitionConfig,
    NGrams,
)
from kiln.text.segments import Segments

QUALITY = GopherQuality(GopherQualityConfig())
REPETITION = GopherRepetition(GopherRepetitionConfig())


def doc(text: str) -> Document:
    return Document(id="d", text=text, source="web")


def prose(n: int, filler: str = "word") -> list[str]:
    """n words: two stop words and n-2 fillers (mean length about 4)."""
    return ["the", "and"] + [filler] * (n - 2)


def assert_kept(step, text: str) -> None:
    d = doc(text)
    ledger = Ledger()
    assert list(step.process([d], ledger)) == [d]
    assert ledger.removed == []


def assert_dropped(step, text: str, rule: str) -> Drop:
    d = doc(text)
    ledger = Ledger()
    assert list(step.process([d], ledger)) == []
    assert ledger.removed[0]["reason"] == f"{step.name}:{rule}"
    return step.check(d)


# ------------------------------------------------------------------------------------------ quality


def test_word_count_bounds() -> None:
    assert_kept(QUALITY, " ".join(prose(50)))
    drop = assert_dropped(QUALITY, " ".join(prose(49)), "too_few_words")
    assert (drop.value, drop.threshold) == (49, 50)
    assert_kept(QUALITY, " ".join(prose(100_000)))
    assert_dropped(QUALITY, " ".join(prose(100_001)), "too_many_words")


def test_punctuation_is_not_a_word() -> None:
    # 49 words and many commas: still too few words (the paper counts words, not marks)
    assert_dropped(QUALITY, ", ".join(prose(49)), "too_few_words")


def test_mean_word_length_bounds() -> None:
    assert_kept(QUALITY, " ".join(prose(50, "abc")))  # mean exactly 3.0
    drop = assert_dropped(QUALITY, " ".join(prose(49, "abc") + ["ab"]), "mean_word_length")
    assert drop.value == pytest.approx(149 / 50) and drop.threshold == 3
    # 2 stop words (3 chars) + 46 x 10 + 2 x 17 = 500 chars over 50 words: mean exactly 10
    long_words = ["the", "and"] + ["abcdefghij"] * 46 + ["abcdefghijklmnopq"] * 2
    assert_kept(QUALITY, " ".join(long_words))
    drop = assert_dropped(QUALITY, " ".join(long_words[:-1] + ["abcdefghijklmnopqr"]), "mean_word_length")
    assert drop.value == pytest.approx(10.02) and drop.threshold == 10


def test_hash_and_ellipsis_ratios() -> None:
    # k marks as tokens of their own among 50 words: k / (50 + k) <= 0.1 holds up to k = 5
    assert_kept(QUALITY, " ".join(prose(50) + ["#"] * 5))
    drop = assert_dropped(QUALITY, " ".join(prose(50) + ["#"] * 6), "hash_ratio")
    assert drop.value == pytest.approx(6 / 56)
    assert_kept(QUALITY, " ".join(prose(50) + ["..."] * 5) + " end")
    assert_dropped(QUALITY, " ".join(prose(50) + ["…"] * 6) + " end", "ellipsis_ratio")


def lines_of(words: list[str], n_lines: int) -> list[str]:
    per = len(words) // n_lines
    return [" ".join(words[i * per : (i + 1) * per]) for i in range(n_lines)]


def test_bullet_lines() -> None:
    lines = lines_of(prose(50), 10)
    assert_kept(QUALITY, "\n".join(["- " + l for l in lines[:9]] + lines[9:]))  # 9 of 10: 0.9
    drop = assert_dropped(QUALITY, "\n".join(["• " + l for l in lines]), "bullet_lines")
    assert (drop.value, drop.threshold) == (1.0, 0.9)


def test_ellipsis_lines() -> None:
    lines = lines_of(prose(50), 10)
    assert_kept(QUALITY, "\n".join([l + "..." for l in lines[:3]] + lines[3:]))  # 3 of 10: 0.3
    drop = assert_dropped(QUALITY, "\n".join([l + "…" for l in lines[:4]] + lines[4:]), "ellipsis_lines")
    assert drop.value == pytest.approx(0.4)


def test_alpha_words() -> None:
    # 48 words with letters and 12 numbers: 48 / 60 = 0.8 exactly
    assert_kept(QUALITY, " ".join(prose(48) + ["1234"] * 12))
    drop = assert_dropped(QUALITY, " ".join(prose(48) + ["1234"] * 13), "alpha_words")
    assert drop.value == pytest.approx(48 / 61)


def test_stop_words_are_exact_and_lowercase() -> None:
    drop = assert_dropped(QUALITY, " ".join(["the", "The", "AND"] + ["word"] * 47), "too_few_stop_words")
    assert (drop.value, drop.threshold) == (1, 2)
    assert_kept(QUALITY, " ".join(["the", "with"] + ["word"] * 48))


# --------------------------------------------------------------------------------------- repetition


def unique_words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice('bcdfgklmnprst')}{i}x{seed}" for i in range(n)]


def paragraph(n_words: int, seed: int) -> str:
    return " ".join(unique_words(n_words, seed))


def test_duplicate_paragraph_fraction() -> None:
    unique = [paragraph(20, s) for s in range(6)]
    assert_kept(REPETITION, "\n\n".join(["ok"] * 4 + unique))  # 3 of 10 repeat: 0.3
    drop = assert_dropped(REPETITION, "\n\n".join(["ok"] * 5 + unique), "dup_paragraph_fraction")
    assert drop.value == pytest.approx(4 / 11)


def test_duplicate_line_fraction() -> None:
    unique = [paragraph(20, s) for s in range(6)]
    assert_kept(REPETITION, "\n".join(["ok"] * 4 + unique))
    assert_dropped(REPETITION, "\n".join(["ok"] * 5 + unique), "dup_line_fraction")


def char_case(sep: str, filler_chars: int) -> str:
    """A 10-character block twice, then filler blocks: repeated characters 10 / len(text)."""
    filler = [paragraph(3, s) for s in range(4)]
    text = sep.join(["alpha beta", "alpha beta"] + filler)
    pad = filler_chars - (len(text) - 10 - len(sep) * 5)
    return text + "z" * pad


NO_NGRAMS = GopherRepetition(GopherRepetitionConfig(max_top_ngram_char_fraction={}, max_dup_ngram_char_fraction={}))


@pytest.mark.parametrize("sep, rule", [("\n\n", "dup_paragraph_char_fraction"), ("\n", "dup_line_char_fraction")])
def test_duplicate_char_fractions(sep: str, rule: str) -> None:
    inside = char_case(sep, 0)
    pad = len(inside)
    # grow or shrink the last block so that 10 / len(text) is exactly 0.2, then one character less
    text = inside[: len(inside)] + "z" * (50 - pad) if pad < 50 else inside[:50]
    assert len(text) == 50 and text.count("alpha beta") == 2
    assert_kept(NO_NGRAMS, text)
    drop = assert_dropped(NO_NGRAMS, text[:-1], rule)
    assert drop.value == pytest.approx(10 / 49)


def test_top_ngram_share_worked_by_hand() -> None:
    # "a b a b a b c d": bigrams ab ba ab ba ab bc cd; "a b" is most frequent (3 times, 3 characters
    # with its space): 9 of the text's 15 characters. Trigram "a b a" (twice, 5 chars): 10 / 15.
    grams = NGrams(Segments("a b a b a b c d"))
    assert grams.top_chars(2) == 9
    assert grams.top_chars(3) == 10
    # ties go to the n-gram seen first: all bigrams of "xy zzz w" occur once; "xy zzz" is first (6 chars)
    assert NGrams(Segments("xy zzz w")).top_chars(2) == 6


def test_duplicated_ngram_chars_worked_by_hand() -> None:
    # "a b c d e" three times: 5-grams at positions 0..10. Position 5 repeats position 0: count its
    # 5 characters (words joined without spaces) and jump to 10, which repeats again: 10 characters.
    grams = NGrams(Segments(" ".join(["a b c d e"] * 3)))
    assert grams.duplicated_chars(5) == 10
    # 6-grams at positions 0..9: "abcdea" at 5 repeats position 0 (6 chars); the jump to 11 ends the scan
    assert grams.duplicated_chars(6) == 6
    # with a limit, only the comparison is exact: the bound (every repeated window, 30 chars) is within 40
    assert grams.duplicated_chars(5, enough=40) <= 40 and grams.duplicated_chars(5, enough=9) > 9


def naive_duplicated(words: list[str], n: int) -> int:
    seen, total, i = set(), 0, 0
    while i < len(words) - n + 1:
        gram = tuple(words[i : i + n])
        if gram in seen:
            total += sum(map(len, gram))
            i += n
        else:
            seen.add(gram)
            i += 1
    return total


def naive_top(words: list[str], n: int) -> int:
    grams = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0
    gram, count = Counter(grams).most_common(1)[0]
    return len(gram) * count


def test_ngram_counts_match_brute_force() -> None:
    rng = random.Random(0)
    for _ in range(200):
        words = [rng.choice("ab") * rng.randint(1, 2) for _ in range(rng.randint(0, 60))]
        grams = NGrams(Segments(" ".join(words)))
        for n in range(2, 11):
            assert grams.top_chars(n) == naive_top(words, n)
            assert grams.duplicated_chars(n) == naive_duplicated(words, n)


def test_top_and_duplicated_ngram_rules() -> None:
    body = unique_words(200, 1)
    assert_kept(REPETITION, " ".join(body))
    drop = assert_dropped(REPETITION, " ".join(body[:100] + ["the cat"] * 80), "top_2gram_char_fraction")
    assert drop.threshold == 0.2
    # a 12-word passage repeated three times among unique words: caught by the 5-gram rule
    passage = unique_words(12, 2)
    assert_dropped(REPETITION, " ".join(body[:60] + passage * 3), "dup_5gram_char_fraction")


def test_empty_text() -> None:
    assert_dropped(REPETITION, "", "empty")


# ------------------------------------------------------------------------------- quality per language

FRENCH = " ".join(["L’homme", "de", "la", "maison", "et", "du", "jardin", "regarde", "les", "arbres"] * 6)
CHINESE = (
    "这个工具可以把原始文本变成训练数据。它会读取网页和文档，去掉重复的内容，过滤质量较低的段落，然后把结果写入分片文件。"
    * 3
)


def check_in(text: str, language: str | None, step: GopherQuality = QUALITY) -> Drop | None:
    return step.check(Document(id="d", text=text, source="web", meta={"language": language} if language else {}))


def in_language(code: str, **keys: object) -> GopherQuality:
    """gopher_quality as a document of `code` gets it: kiln's shipped settings for the language, `keys` the recipe's."""
    cfg = CurateConfig.model_validate({"languages": {code: {"gopher_quality": keys}}} if keys else {})
    return GopherQuality(cfg.for_language("web", code).gopher_quality)


def test_a_document_is_judged_with_the_stop_words_and_word_lengths_of_its_language() -> None:
    assert check_in(FRENCH, "fr", in_language("fr")) is None
    dropped = check_in(FRENCH, None)  # no language: English's stop words, which French text lacks
    assert dropped is not None and dropped.rule == "too_few_stop_words"
    assert check_in(CHINESE, "zh", in_language("zh")) is None  # words of 1-3 characters: FineWeb-2's minimum is 1
    dropped = check_in(CHINESE, "zh", in_language("zh", min_mean_word_length=3))
    assert dropped is not None and (dropped.rule, dropped.threshold) == ("mean_word_length", 3.0)
    strict = in_language("fr", stop_words=["quand"])
    assert check_in(FRENCH, "fr", strict).rule == "too_few_stop_words"


def test_a_chinese_ngram_counts_no_joining_spaces_the_text_does_not_have() -> None:
    words = ["我们", "的", "工具"] * 10 + ["读取", "文件"]
    text = "".join(words)
    grams = NGrams(Segments(text, "zh"))
    top = Counter(tuple(words[i : i + 3]) for i in range(len(words) - 2)).most_common(1)[0]
    assert grams.top_chars(3) == sum(map(len, top[0])) * top[1]  # 5 characters a time, not 7
    latin = ["our", "a", "tool"] * 10 + ["reads", "files"]
    assert NGrams(Segments(" ".join(latin), "en")).top_chars(3) == 10 * 10  # spaced: "our a tool" is 10 characters
