"""The one split of a document's text that every rule shares: lines, paragraphs, words, sentences.

`segments(doc)` computes each view at most once per text and keeps it in `doc.cache`; a step
that edits the text makes a new Document (`with_text`), whose cache starts empty. So no rule
re-splits text another rule already split.

Words are English tokens in the style of spaCy's rule-based English tokenizer (what datatrove's
Gopher and FineWeb filters count with), approximated by one regular expression:
punctuation at the edges of a whitespace-separated chunk is split off one mark at a time,
`n't` and clitics (`'s`, `'re`, ...) are split, hyphens, slashes, `=`, `:` and `<>` between
letters split, commas between letters split, a full stop splits off a word's end (not off
"U.S.", "e.g.", single letters or common abbreviations such as "Mr."), while URLs, numbers
("1,000.50", "10:30"), e-mail addresses, file names ("file.txt") and command-line flags
("--verbose") stay one token. Known, systematic differences from spaCy: unit suffixes stay on
numbers ("10km" is one token, spaCy makes two), spaCy's rare exceptions (emoticons such as ":)",
"'n'", abbreviations outside our list) are not reproduced, and clitics split after any word,
not only after pronouns ("John'll" is two tokens, spaCy keeps one).
Sentences follow spaCy's sentencizer: a sentence ends at a split-off `.`, `!` or `?` (or another
script's sentence terminal) once a token that is not punctuation follows; a sentence never
crosses a line break.
That is English. A document of another language (its `meta.language`, set by the language step, or
the script of its letters when it has none) is split as kiln.text.languages says: the same rule without
English's exceptions and with the language's elisions for a spaced language, a segmenter for Chinese,
Japanese and Thai.
Not handled here: normalization (CRLF, controls: kiln.curate.steps.normalize).
"""

from __future__ import annotations

import functools
import re
from functools import cached_property

from kiln.core.document import Document
from kiln.text.languages import Rule, word_rule

# Marks split off either edge of a whitespace chunk, one at a time (spaCy's prefix and suffix
# lists: brackets, quotes, clause punctuation, currency, a few symbols). Not "-", "/", "@", "+",
# "." or "|": those stay inside a chunk ("--verbose", "a/b" is split only as an infix, below).
_EDGE = r"""()\[\]{}<>,:;!?¿¡_#*&"'`‘’“”«»„‚‹›§%=—–$£€¥¢₹、。，；：？！（）「」『』【】《》〈〉"""
# Pictographic symbols (box drawing, shapes, dingbats, emoji, ©): split off wherever they are.
_ICON = "©®°™\u2500-\u27bf\u2b00-\u2bff\U0001f000-\U0001faff"
# The rest of the chunk is only split-off marks. perf: one character class under the star; the old
# `(?:[...]|\.+|…)*` nested `\.+` in `*` and backtracked exponentially on "Introduction.....5"
# (98 s at 30 dots; now linear, 3,000 dots in well under a millisecond).
_SUFFIX_MARK = rf"[{_EDGE}{_ICON}.…]"
_SUFFIX_RUN = rf"{_SUFFIX_MARK}*(?:\s|$)"
# The same run where a lazy `\S+?` has already tested the position before: when the previous character
# is itself a mark (and not a "." opening the chunk, where no test came before), the run from here is
# the run from there minus one mark, which failed. perf: without this a long run of marks inside a
# chunk ("x,,,,...,y") is rescanned from each of its positions, quadratic in its length.
_SUFFIX_RUN_AFTER_TEST = rf"(?:(?<!{_SUFFIX_MARK})|(?<=^\.)|(?<=\s\.)){_SUFFIX_RUN}"
# The rest of a chunk up to its trailing marks, greedily: what `\S*?(?={_SUFFIX_RUN})` matches (the
# shortest stretch after which only marks remain), in one pass instead of a mark-run scan per character.
_UP_TO_SUFFIX_RUN = rf"(?:\S*[^\s{_EDGE}{_ICON}.…])?"
_LETTER = r"[^\W\d_]"
_ALNUM = r"[^\W_]"
_CHUNK_START = rf"(?<![^\s{_EDGE}])"
_CLITIC = r"['’](?:s|S|m|M|d|D|ll|LL|re|RE|ve|VE)"
# Words whose final full stop stays on (English abbreviations; spaCy has a longer list).
_ABBREVIATIONS = (
    "Mr|Mrs|Ms|Dr|Prof|St|Jr|Mt|Gen|Gov|Rev|Inc|Ltd|Co|Corp|vs|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
# Contractions written without an apostrophe, split as spaCy's English exceptions split them
# ("dont" -> do nt, "im" -> i m, "cannot" -> can not): the first part, where the rest follows.
_BARE_CONTRACTION = (
    rf"(?:[iI](?=(?:m|d|ve){_SUFFIX_RUN})|[yY]ou(?=(?:d|ll|ve|re){_SUFFIX_RUN})"
    rf"|[hH]e(?=(?:d|s){_SUFFIX_RUN})|[sS]he(?=(?:s){_SUFFIX_RUN})|[iI]t(?=(?:d|ll){_SUFFIX_RUN})"
    rf"|[wW]e(?=(?:d|ve){_SUFFIX_RUN})|[tT]hey(?=(?:d|ll|ve|re){_SUFFIX_RUN})"
    rf"|(?:[tT]here|[wW]hat|[wW]here|[hH]ow)(?=(?:d|ll|ve|re|s){_SUFFIX_RUN})"
    rf"|[tT]hat(?=(?:d|ll|s){_SUFFIX_RUN})|[wW]ho(?=(?:d|ll|ve|s){_SUFFIX_RUN})"
    rf"|(?:[dD]o|[dD]oes|[dD]id|[cC]a|[wW]o|[iI]s|[aA]re|[wW]as|[wW]ere|[hH]as|[hH]ave|[hH]ad|[cC]ould|[wW]ould|[sS]hould|[mM]ust|[nN]eed|[mM]ight|[aA]i|[sS]ha)(?=(?:nt){_SUFFIX_RUN})"
    rf"|(?:[cC]ould|[wW]ould|[sS]hould|[mM]ust|[mM]ight)(?=(?:ve){_SUFFIX_RUN})"
    rf"|[cC]an(?=(?:not){_SUFFIX_RUN})|[gG]on(?=(?:na){_SUFFIX_RUN})|[gG]ot(?=(?:ta){_SUFFIX_RUN}))"
)
# Emoticons made of punctuation, kept whole (spaCy's list; "):" after a parenthesis is the common one).
_EMOTICON = (
    r"""\):|\(:|:\)|;\)|:\(|:-\)|:-\(|;-\)|=\)|\(=|:\]|\[:|:'\(|:'\)"""
    r"""|:/|:-/|=\(|=/|:\||:-\||<3|</3|\)-:|\(-:|-_-|\^_\^|''"""
)
# Units split off a number ("10km" -> 10 km), spaCy's Latin-script list.
_UNIT = "km|m|cm|mm|dm|nm|µm|ha|yd|in|ft|kg|g|mg|µg|t|lb|oz|mph|hPa|Pa|mbar|mb|MB|kb|KB|gb|GB|tb|TB|T|G|M|K"


def _word_trie(words: list[str]) -> str:
    """A regex matching exactly `words`, branching one character at a time.

    perf: re tries alternatives one by one; a trie fails on the first character for almost
    every word, where a flat alternation of 200 words would try each (measured 4x slower).
    """
    heads: dict[str, list[str]] = {}
    for w in sorted(set(words)):
        heads.setdefault(w[:1], []).append(w[1:])
    branches = []
    for head, tails in sorted(heads.items()):
        if head == "":
            continue
        rest = [t for t in tails if t]
        inner = _word_trie(rest) if rest else ""
        branches.append(re.escape(head) + (f"(?:{inner})" + ("?" if "" in tails else "") if rest else ""))
    return "|".join(branches)


# Whole words the contraction rule splits, for the fast path to leave alone.
_BARE_WORDS = (
    "(?:"
    + _word_trie(
        [
            w[:1].upper() + w[1:] if cap else w
            for w in (
                "im id ive youd youll youve youre hed hes shes itd itll wed weve theyd theyll theyve theyre "
                "thered therell thereve therere theres whatd whatll whatve whatre whats whered wherell whereve "
                "wherere wheres "
                "howd howll howve howre hows thatd thatll thats whod wholl whove whos dont doesnt didnt cant wont "
                "isnt arent "
                "wasnt werent hasnt havent hadnt couldnt wouldnt shouldnt mustnt neednt mightnt aint shant "
                "couldve wouldve "
                "shouldve mustve mightve cannot gonna gotta"
            ).split()
            for cap in (False, True)
        ]
    )
    + ")"
)


# One token per match of group 1; whitespace runs match too (as "", dropped after findall).
# perf: no rule may rescan the rest of a chunk at each token start (a 200 KB chunk without spaces
# would take seconds to minutes): the host/e-mail rule's open-ended parts are bounded (scheme 32,
# user 256 characters, 32 labels; measured 5 s to 0.5 s at most on 200 KB), lazy scans test a mark run once.
# perf: whitespace is the first alternative, so the scanner does not try every rule at every
# space; plain words (most tokens) are the second. ~15 MB/s per core on the benchmark corpus.
# English has its contractions, clitics and abbreviations; another space-separated language has none of
# them, and its elided articles and prepositions (French l', qu', Italian dell') split off the word after.
def _word_pattern(english: bool, elisions: str = "") -> str:
    bare_guard = rf"""(?!{_BARE_WORDS}[\s,;:!?)\]"”])""" if english else ""
    abbreviations = rf"(?:{_ABBREVIATIONS})\.|" if english else ""
    contraction = rf"| {_CHUNK_START}{_BARE_CONTRACTION}" if english else ""
    clitic = rf"| n['’]t(?={_SUFFIX_RUN}) | {_CLITIC}(?={_SUFFIX_RUN})" if english else ""
    clitic_split = rf"| n['’]t{_SUFFIX_RUN} | {_CLITIC}{_SUFFIX_RUN}" if english else ""
    elision = rf"| {_CHUNK_START}(?i:{elisions})['’](?={_LETTER})" if elisions else ""
    return rf"""
    \s+
  | (  {bare_guard}{_LETTER}+(?=\s|$|[,;:!?)\]"”]+(?:\s|$))  # fast path: a plain word
     {elision}                                             # l'|homme, dell'|anno
     | [,!?"“”«»{{}}*#&%$…]|(?<=\S)\.(?!\.)                # perf: common marks that start no longer token
     | (?:https?|ftp)://{_UP_TO_SUFFIX_RUN}               # URL, minus trailing punctuation
     | {_CHUNK_START}(?:{abbreviations}(?:[A-Za-z]\.)+|and/or)(?={_SUFFIX_RUN})  # Mr. e.g. U.S. a.
     {contraction}                                         # do|nt, can|not
     | {_ALNUM}*?\d(?=(?:{_UNIT}|\+){_SUFFIX_RUN})           # 10|km, GPLv2|+
     | (?<=\d)\+(?={_SUFFIX_RUN})
     | {_ALNUM}+(?=\s|$|[.,;:!?)\]"”]+(?:\s|$))          # a word or number before a full stop
     {clitic}                                              # do|n't, it|'s
     | \.{{2,}} | …+                                       # ellipsis, anywhere
     | {_EMOTICON}
     | [{_EDGE}{_ICON}]                                    # one edge mark or symbol
     | (?<=\S)\.                                           # a full stop split off a word
     | (?<={_ALNUM})(?:---?|——|[-–—~])(?={_LETTER})         # hyphen infix: well-known
     | (?<=\d)[-+*^](?=[\d-])                              # arithmetic infix: 3-4
     | (?<={_ALNUM})[/](?={_LETTER})                       # slash infix: a/b (: < > = are edge marks)
     # a host name or e-mail address stays whole (spaCy's URL match)
     | (?:[\w+\-.]{{2,32}}://)?(?:[^\s@]{{1,256}}@)?
       (?:(?:{_ALNUM}[\w-]{{0,62}})?{_ALNUM}\.){{1,32}}[a-z]{{2,63}}
       (?::\d{{2,5}})?(?:[/?#]{_UP_TO_SUFFIX_RUN})?(?={_SUFFIX_RUN})
     | \S+?(?=                                             # anything else, up to the next split point
           {_SUFFIX_RUN_AFTER_TEST}
         | \.{{2,}} | … | [{_ICON}]
         | (?<={_ALNUM})(?:---?|——|[-–—~:<>=/]){_LETTER}
         | (?<=\d)[-+*^][\d-]
         | (?<={_LETTER}),{_LETTER}
         | (?<=[a-z])\.[A-Z]
         {clitic_split}
         | (?<=\d)(?:{_UNIT}|\+){_SUFFIX_RUN}
       )
    )
    """


_TOKEN = re.compile(_word_pattern(english=True), re.VERBOSE)


@functools.cache
def spaced_words(elisions: str) -> re.Pattern[str]:
    """The word rule of a space-separated language other than English, with its elided words (a regex
    alternation, "" for none)."""
    return re.compile(_word_pattern(english=False, elisions=elisions), re.VERBOSE)


# A sentence boundary inside one line: a split-off terminal mark (and any marks after it), then
# a later token on the same line that is not only punctuation. "." counts only where the
# tokenizer splits it off: after a lowercase letter, digit or mark, or after two capitals, and
# not after a single letter (initials, "e.g.") or an abbreviation.
_PUNCT = r"""!"#%&'()*,\-./:;?@\[\\\]_{}§¶«»‘’“”„‚‹›–—…·¡¿、。，；：？！「」『』（）【】《》〈〉"""
_TERMINAL = "!?։؟۔܀-܂।॥።፧፨。！？｡"  # the common sentence terminals of spaCy's sentencizer
_ABBREV_LOOKBEHIND = "".join(rf"(?<!\b{a}\.)" for a in _ABBREVIATIONS.split("|"))
_SENTENCE_BOUNDARY = re.compile(
    rf"""
    [.{_TERMINAL}]                                          # perf: a leading character set lets re skip ahead in C
    (?: (?<=[{_TERMINAL}])
      | (?<!\.\.)(?!\.)                                     # a full stop that is not part of an ellipsis,
        (?:(?<=[^\W_A-Z]\.)|(?<=[A-Z][A-Z]\.)|(?<=[{_PUNCT}]\.)|(?<=\s\.)|(?<=^\.))  # split off by the tokenizer,
        (?<![^\w.][A-Za-z]\.)(?<!^[A-Za-z]\.)(?<![A-Za-z]\.[A-Za-z]\.)  # not an initial
        {_ABBREV_LOOKBEHIND}                                # nor an abbreviation
    )
    (?=[{_PUNCT}]{{0,64}}[^\S\n]|(?<=[a-z]\.)[A-Z])           # split off: a chunk end, or end.Start
    (?:[{_PUNCT}]|[^\S\n])*                                 # the marks and spaces after it
    (?=[^{_PUNCT}\s])                                       # then a word on the same line
    """,
    re.VERBOSE,
)
# perf: the sentence regex runs on each line minus its trailing marks and spaces, which can hold no
# boundary (no word follows) and whose every terminal would otherwise rescan the rest of the line:
# ". " * 40000 took 133 s. Likewise at most 64 marks between a terminal and the space after it are
# looked at ("!" * 80000 + "x" is linear); a longer run ends no sentence unless a terminal is in its last 64.
_TRAILING_MARKS = re.sub(r"\\(.)", r"\1", _PUNCT) + "".join(c for c in map(chr, range(0x3001)) if c.isspace())
_PARAGRAPH_BREAK = re.compile(r"\n{2,}")
_HAS_ALNUM = re.compile(_ALNUM)
_ALNUM_TOKEN = re.compile(rf"^(?=[^\n]*?{_ALNUM})[^\n]+", re.MULTILINE)


class Segments:
    """Lazy views of one text; each is computed on first use and kept. `language`: the text's language
    code (None: unknown), which decides how words are split."""

    def __init__(self, text: str, language: str | None = None):
        self.text, self.language = text, language

    @cached_property
    def lines(self) -> list[str]:
        """`str.splitlines()`: no line breaks kept, no empty last line after a final newline."""
        return self.text.splitlines()

    @cached_property
    def paragraphs(self) -> list[str]:
        """Text between runs of two or more newlines, after stripping the text's outer whitespace (Gopher's
        paragraphs)."""
        stripped = self.text.strip()
        return _PARAGRAPH_BREAK.split(stripped) if stripped else []

    @cached_property
    def words(self) -> list[str]:
        """Word tokens, punctuation marks included as tokens of their own (see the module docstring)."""
        return _split(self.text, self._rule)

    @cached_property
    def _rule(self) -> Rule:
        """How this text splits into words (its language's rule, or its script's when it has none): decided
        once, since the script is found by scanning the whole text."""
        return word_rule(self.language, self.text)

    @property
    def spaced(self) -> bool:
        """Whether words are written with spaces between them (False: a segmenter's or one per character)."""
        return self._rule[0] != "segmented"

    @cached_property
    def alnum_words(self) -> list[str]:
        """The words with at least one letter or digit (Gopher's words; punctuation-only tokens left out)."""
        # perf: one regex pass over the tokens joined by newlines (no token holds one) instead of a search per token
        return _ALNUM_TOKEN.findall("\n".join(self.words))

    @cached_property
    def line_word_counts(self) -> list[int]:
        """Words on each line of `lines`: whitespace-separated ones (C4 counts words per line this way), or for
        a language written without spaces its segmenter's words that hold a letter or digit."""
        if self.spaced:
            return [len(line.split()) for line in self.lines]
        return [sum(1 for w in self.line_words(line) if _HAS_ALNUM.search(w)) for line in self.lines]

    def line_words(self, line: str) -> list[str]:
        """One line's words as C4 takes them: whitespace-separated, or a segmenter's for a language written
        without spaces (whose lines have no spaces to split at)."""
        kind, rule = self._rule
        return rule(line) if kind == "segmented" and callable(rule) else line.split()

    @cached_property
    def line_sentence_counts(self) -> list[int]:
        """Sentences on each line of `lines`: 0 for a blank line, else 1 + the sentence boundaries in it."""
        findall = _SENTENCE_BOUNDARY.findall
        return [
            len(findall(line.rstrip(_TRAILING_MARKS))) + 1 if line and not line.isspace() else 0 for line in self.lines
        ]

    @cached_property
    def sentences(self) -> list[str]:
        """The sentences of every line, stripped, in order; a sentence never crosses a line break."""
        out: list[str] = []
        for line in self.lines:
            start = 0
            for m in _SENTENCE_BOUNDARY.finditer(line.rstrip(_TRAILING_MARKS)):
                out.append(line[start : m.end()].strip())
                start = m.end()
            if line[start:].strip():
                out.append(line[start:].strip())
        return out


def split_words(text: str, language: str | None = None) -> list[str]:
    """The words of a text of `language` (None: unknown; see the module docstring)."""
    return _split(text, word_rule(language, text))


def _split(text: str, how: Rule) -> list[str]:
    kind, rule = how
    if kind == "english":
        return list(filter(None, _TOKEN.findall(text)))
    if kind == "spaced":
        return list(filter(None, spaced_words(str(rule)).findall(text)))
    assert callable(rule)
    return rule(text)


def segments(doc: Document) -> Segments:
    """The shared split of `doc`'s current text in its language (`meta.language`), computed once and
    cached on the document (again for the words when the language step has named it since)."""
    language = doc.meta.get("language")
    found = doc.cache.get("segments")
    if found is None or found.language != language:
        found = doc.cache["segments"] = Segments(doc.text, language)
    return found
