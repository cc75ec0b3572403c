"""kiln.text.language's paragraph shares: blocks (paragraphs, else lines), shares worked by hand on real lid.176
predictions, a block read from its start, short and unsure blocks left out."""

from __future__ import annotations

from kiln.text.language import BLOCK_CHARS, blocks, language_shares, predict_language

ENGLISH = "The kiln was fired slowly over three days, and the potters watched the colour of the flame change."
FRENCH = (
    "Le four a été chauffé lentement pendant trois jours, et les potiers ont regardé la couleur de la flamme changer."
)
CAPITALS = (
    "THIS SOFTWARE IS PROVIDED BY THE AUTHORS AND CONTRIBUTORS AS IS AND ANY EXPRESS OR IMPLIED WARRANTIES ARE "
    "DISCLAIMED."
)
CHINESE = "这座窑用了三天慢慢加热，陶工们看着火焰的颜色从橙色变成明亮稳定的黄色。"  # 33 Han, weighing 3 letters each


def test_blocks_are_paragraphs_else_lines():
    assert blocks("a\nb\n\nc\n \nd") == ["a\nb", "c", "d"]  # a blank line may hold spaces
    assert blocks("a\nb\nc") == ["a", "b", "c"]
    assert blocks("") == [""]


def test_shares_worked_by_hand():
    assert predict_language(ENGLISH)[0] == "en" and predict_language(FRENCH)[0] == "fr"
    # One paragraph of two lines: each line is a block; 79 English and 91 French letters.
    assert language_shares(ENGLISH + "\n" + FRENCH, 40) == {"fr": round(91 / 170, 4), "en": round(79 / 170, 4)}
    # Two paragraphs: the second (two French lines, 182 letters) is one block.
    assert language_shares(ENGLISH + "\n\n" + FRENCH + "\n" + FRENCH, 40) == {
        "fr": round(182 / 261, 4),
        "en": round(79 / 261, 4),
    }
    # The same sentence in Chinese: 33 characters weigh 99 letters, about the English one.
    assert language_shares(ENGLISH + "\n" + CHINESE, 40) == {"zh": round(99 / 178, 4), "en": round(79 / 178, 4)}


def test_a_block_is_read_from_its_start():
    # A French line that ends in a long English tail is French: only its first BLOCK_CHARS characters are read.
    tail = " " + ENGLISH * 4
    assert len(FRENCH) < BLOCK_CHARS < len(FRENCH + tail) and predict_language(FRENCH + tail)[0] == "en"
    shares = language_shares(FRENCH + tail + "\n" + ENGLISH, 40)
    assert shares is not None and set(shares) == {"fr", "en"} and shares["fr"] > 0.7


def test_short_blocks_and_single_blocks_give_none():
    assert language_shares(ENGLISH, 40) is None  # one block: the whole-text prediction says it all
    assert language_shares(ENGLISH + "\n\nMerci beaucoup.", 40) is None  # the second has 13 letters
    assert language_shares(ENGLISH + "\n" + FRENCH, 80) is None  # 79 letters: only the French line is long enough


def test_unsure_blocks_count_for_no_language():
    score = predict_language(CAPITALS)[1]
    assert predict_language(CAPITALS)[0] == "fr" and score < 0.65  # lid.176 saw little English in capitals
    assert language_shares(CAPITALS + "\n" + ENGLISH, 40) == {"fr": round(98 / 177, 4), "en": round(79 / 177, 4)}
    assert language_shares(CAPITALS + "\n" + ENGLISH, 40, min_score=0.65) == {"en": 1.0}
    assert language_shares(CAPITALS + "\n" + ENGLISH, 40, min_score=0.65, min_scores={"fr": 0.3}) == {
        "fr": round(98 / 177, 4),
        "en": round(79 / 177, 4),
    }
    assert language_shares(CAPITALS + "\n" + CAPITALS, 40, min_score=0.65) is None  # no block is sure
