"""The text a dedup key is taken of: width variants, CJK punctuation and the spacing beside it folded.

Exact dedup (kiln.curate.dedup.exact) hashes `fold(text)` and line dedup (kiln.curate.steps.lines)
normalizes `fold(line)`, so two copies of a Chinese or Japanese text that differ only in how they were
typed or converted share a key. `fold` changes three things:
- width variants (Unicode's <wide> and <narrow> mappings: U+3000 and U+FF01..U+FFEE): full-width ASCII
  to ASCII (ＡＢＣ１２３ -> ABC123, ，！？：；（） -> ,!?:;()), the ideographic space to a space,
  half-width katakana to full-width (ｶﾞｷﾞ -> ガギ: a sound mark, half-width or combining, composes
  with the kana before it, as NFKC composes it), half-width Hangul to its compatibility jamo, ￥ to ¥;
- the CJK marks an ASCII copy types in ASCII: 。 -> ".", 、 -> ",", 「」 -> '"', 『』 -> "'" (they
  nest as double and single quotes do), 〜 -> "~" (Shift_JIS converters disagree on 〜 and ～);
- horizontal spaces (never line breaks) beside a punctuation mark that a Han or kana letter touches:
  between the letter and the mark, either way round, and on the mark's other side (through up to three
  marks): "你好 , 世界", "你好, 世界" and "你好，世界" all become "你好,世界", "价格: 12元 (含税) ." and
  "价格：12元（含税）。" both "价格:12元(含税).".
Why not NFKC: it also rewrites text that means something else (x² -> x2, ① -> 1, ㌔ -> キロ, Ⅻ ->
XII, ﬁ -> fi) and English typography (… -> ..., the no-break space), and English keys must not move.
ASCII text is returned as it is (str.isascii is O(1)), so every ASCII text keeps its key; a text gets
a new key only where it holds what is folded (DEDUP_KEY_VERSION marks the rule).
Cost of the exact-dedup key against the unfolded one (benchmarks/dedup_languages.py, 2 loaded cores):
ASCII 0.96x (10 GB/s), English whose every document holds typographic quotes 0.58x (1.1 GB/s: its bytes
are scanned in C for lead bytes, about what encoding them costs), Chinese and Japanese 62 and 68 MB/s.
Not handled here: typographic quotes and dashes (“” ‘’ — …, shared with English), spacing between
CJK and Latin letters or digits ("在 Linux 上" against "在Linux上"), traditional against simplified
characters, and 《》【】〈〉 (no ASCII mark an ASCII copy would agree on).
"""

from __future__ import annotations

import re
import string
import unicodedata

# v1 (unnamed): exact dedup hashed the text as it stood; line dedup case-folded, folded digits,
# collapsed spaces and stripped edge marks. v2: both first `fold` (this module).
DEDUP_KEY_VERSION = "kiln-dedup-keys v2"

_CJK_MARKS = {"\u3001": ",", "\u3002": ".", "\u300c": '"', "\u300d": '"', "\u300e": "'", "\u300f": "'", "\u301c": "~"}


def _fold_table() -> dict[str, str]:
    """Each folded character's replacement: its width mapping, then the CJK mark rule (｡ -> 。 -> .)."""
    table = dict(_CJK_MARKS)
    for cp in (0x3000, *range(0xFF01, 0xFFEF)):
        tag, *target = unicodedata.decomposition(chr(cp)).split() or [""]
        if tag in ("<wide>", "<narrow>"):
            mapped = chr(int(target[0], 16))
            table[chr(cp)] = _CJK_MARKS.get(mapped, mapped)
    assert not set(table.values()) & set(table), "a folded character's replacement would fold again"
    assert all(len(v) == 1 for v in table.values()), "fold replaces in place: one character for one"
    return table


FOLDS = _fold_table()
_FOLDABLE = re.compile("[" + "".join(sorted(FOLDS)) + "]")
# Kana, 々, 〇 and the Han of the Basic Multilingual Plane (the rare Han beyond it, U+20000 on, is not
# looked at: a text's bytes then need no check of four-byte characters, which emoji are).
_HAN_KANA = (
    "\u3005\u3007\u3041-\u3096\u309d-\u309f\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff"  # kana, 々, 〇
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Han
)
# Punctuation as it stands after the folds: ASCII's, general punctuation, the CJK marks left.
_PUNCT = re.escape(string.punctuation) + "\u2010-\u2027\u2030-\u205e\u3001-\u3003\u3008-\u3011\u3014-\u301f\u30fb"
# Horizontal white space: what \s matches but the line breaks (U+3000 is folded to a space before).
_SPACE = " \t\x0b\x0c\r\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u202f\u205f"
_LOOKED_AT = re.compile(f"[{''.join(sorted(FOLDS))}{_HAN_KANA}]")  # a text without any of these is left as it is
# The spaces beside a mark a Han or kana letter touches (a whole run of them, or none: each branch looks
# past the run's first space only). perf: the pattern opens with a space so re skips to the next space in
# C, and what stands before it is a fixed-width lookbehind; the plain `([letter])[space]+(?=[mark])|...`
# tried the classes at every character (83 against 463 MB/s on Chinese).
_S, _L, _P = f"[{_SPACE}]", f"[{_HAN_KANA}]", f"[{_PUNCT}]"
_SPACED_MARK = re.compile(
    f"{_S}(?:(?<={_L}.){_S}*(?={_P})"  # letter, spaces, mark
    f"|(?<={_P}.){_S}*(?={_L})"  # mark, spaces, letter
    f"|(?<={_L}{_P}.){_S}*|(?<={_L}{_P}{{2}}.){_S}*|(?<={_L}{_P}{{3}}.){_S}*"  # letter, marks, spaces
    f"|{_S}*(?={_P}{{1,3}}{_L}))"  # spaces, marks, letter
)
_SOUND_MARK = re.compile("[\u3041-\u30ff][\u3099\u309a]")  # a kana and the combining mark a ﾞ or ﾟ became


def fold(text: str) -> str:
    """`text` with width variants, CJK marks and the spacing beside them folded (see the module docstring);
    idempotent, and the identity on ASCII text."""
    if text.isascii() or not _LOOKED_AT.search(text):
        return text
    # perf: each distinct folded character is found once and replaced everywhere by str.replace, in C
    # (every replacement is one character, so positions hold): 535 MB/s on Chinese prose, against 221
    # for findall then replace and 44 for str.translate with the table.
    at = 0
    while found := _FOLDABLE.search(text, at):
        char = found.group()
        text = text.replace(char, FOLDS[char])
        at = found.start() + 1
    if "\u3099" in text or "\u309a" in text:  # a kana and a combining sound mark (as ﾞ and ﾟ become): composed
        text = _SOUND_MARK.sub(lambda m: unicodedata.normalize("NFC", m.group()), text)
    # subtle: a removal can bring a mark next to another mark a letter touches ("价 : ( 含" -> "价: (含"),
    # so removals repeat until none is left: what fold returns has none, so fold is idempotent.
    removed = 1
    while removed:
        text, removed = _SPACED_MARK.subn("", text)
    return text


def folded_utf8(text: str, data: bytes) -> bytes:
    """`fold(text)` as UTF-8, given `data`, the text's own UTF-8 (lone surrogates passed through).

    perf: `data` is scanned in C for the UTF-8 lead bytes of anything `fold` looks at (about what the
    encoding took); only a text holding one is folded and encoded again."""
    if text.isascii() or not _may_fold(data):
        return data
    folded = fold(text)
    return data if folded == text else folded.encode("utf-8", "surrogatepass")


def _may_fold(data: bytes) -> bool:
    """Whether UTF-8 `data` holds a character `fold` looks at (a few false positives: U+3000..U+33FF
    that are neither marks nor kana, U+FFF0..U+FFFF).

    perf: one memchr per lead byte (E3..E9 lead U+3000..U+9FFF, EF leads U+F000..U+FFFF), unrolled:
    2.2 us on 4 KB of typographic English against 3.0 for one bytes.translate deleting the others."""
    if (
        b"\xe3" in data
        or b"\xe4" in data
        or b"\xe5" in data
        or b"\xe6" in data
        or b"\xe7" in data
        or b"\xe8" in data
        or b"\xe9" in data
    ):
        return True
    # Only characters of U+F000..U+FFFF are left (a byte-order mark, U+FFFD, private use in most English
    # text): each is decoded from its three bytes (EF is never a continuation byte, so each EF starts one).
    at = data.find(b"\xef")
    while at >= 0:
        code = 0xF000 | (data[at + 1] & 0x3F) << 6 | (data[at + 2] & 0x3F)
        if 0xF900 <= code <= 0xFAFF or 0xFF00 <= code <= 0xFFEF:
            return True
        at = data.find(b"\xef", at + 3)
    return False
