"""C4's cleaning rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", JMLR 21(140), section 2.2; the line rules not in the paper
come from the C4 builder in TensorFlow Datasets, c4_utils.py).

Line by line: drop a line with a word over 1000 characters, with fewer than 3 words, that
mentions javascript, or that is cookie or terms-of-use boilerplate; strip Wikipedia-style
citation markers ("[1]", "[edit]", "[citation needed]"). Drop the whole document if a kept line
says "lorem ipsum" or has a curly brace, or if fewer than 5 sentences remain. The rule keeping
only lines that end in terminal punctuation is available and off by default, as in FineWeb.
The kept lines, stripped, are joined with single newlines (blank lines go), as C4 writes pages.
Not handled here: the bad-words list (a separate step), deduplication of lines across documents
(C4's three-sentence span dedup), language ID.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from pydantic import Field

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.base import Drop
from kiln.text.segments import segments

_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
# Cookie and legal boilerplate phrases the C4 builder drops lines for (c4_utils.py, _POLICY_SUBSTRINGS).
POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_TERMINAL = (".", "?", "!", '"', "'")  # C4's line-end marks; an ellipsis does not count


class C4Config(Section):
    """C4's line and page rules (JMLR 2020, section 2.2, and TFDS c4_utils.py); defaults are C4's, terminal punctuation
    off."""

    enabled: bool = Field(True, description="Run the C4 rules.")
    max_word_chars: int = Field(
        1000, ge=1, description="Drop a line holding a whitespace-separated word longer than this many characters."
    )
    min_line_words: int = Field(3, ge=0, description="Drop a line with fewer whitespace-separated words than this.")
    remove_citations: bool = Field(
        True, description="Strip '[1]', '[edit]' and '[citation needed]' markers from lines."
    )
    require_terminal_punctuation: bool = Field(
        False, description="Drop a line not ending in . ? ! or a quote (C4 on; FineWeb and kiln off)."
    )
    drop_javascript_lines: bool = Field(True, description="Drop a line that mentions javascript (any case).")
    drop_policy_lines: bool = Field(
        True, description="Drop a line with cookie, privacy-policy or terms-of-use wording."
    )
    drop_lorem_ipsum: bool = Field(
        True, description="Drop the document if a kept line contains 'lorem ipsum' (any case)."
    )
    drop_curly_brace: bool = Field(True, description="Drop the document if a kept line contains '{' (code, not prose).")
    min_sentences: int = Field(
        5, ge=0, description="Drop the document if its kept lines hold fewer sentences than this."
    )


class C4:
    """Removes C4's bad lines from each document and drops documents that fail C4's page rules."""

    name = "c4"

    def __init__(self, cfg: C4Config):
        self.cfg = cfg
        # perf: one scan of the whole text tells whether any line can hold an over-long word
        self._long_word = re.compile(rf"\S{{{cfg.max_word_chars + 1},}}")

    def clean(self, doc: Document) -> tuple[str, int] | Drop:
        """(the kept text, how many non-blank lines were removed), or why the whole document goes."""
        cfg = self.cfg
        seg = segments(doc)
        text = doc.text
        # perf: rules whose trigger appears nowhere in the text are skipped for every line
        any_long = self._long_word.search(text) is not None
        lower_text = text.lower()
        check_javascript = cfg.drop_javascript_lines and "javascript" in lower_text
        check_policy = cfg.drop_policy_lines and any(p in lower_text for p in POLICY_PHRASES)
        check_lorem = cfg.drop_lorem_ipsum and "lorem ipsum" in lower_text
        check_brace = cfg.drop_curly_brace and "{" in text
        kept: list[str] = []
        removed = sentences = 0
        for line, n_words, n_sentences in zip(seg.lines, seg.line_word_counts, seg.line_sentence_counts):
            line = line.strip()
            if n_words < cfg.min_line_words:
                removed += n_words > 0  # blank lines are layout, not removed content
                # subtle: C4 checks the long word before the word count; a line failing both is removed either way
                continue
            if any_long and any(len(w) > cfg.max_word_chars for w in seg.line_words(line)):
                removed += 1
                continue
            if cfg.remove_citations and "[" in line:
                line = _CITATION.sub("", line)
            if cfg.require_terminal_punctuation and (not line.endswith(_TERMINAL) or line.endswith("...")):
                removed += 1
                continue
            lower = line.lower() if check_lorem or check_javascript or check_policy else ""
            if check_lorem and "lorem ipsum" in lower:
                return Drop("lorem_ipsum")
            if check_javascript and "javascript" in lower:
                removed += 1
                continue
            if check_brace and "{" in line:
                return Drop("curly_bracket")
            if check_policy and any(p in lower for p in POLICY_PHRASES):
                removed += 1
                continue
            sentences += n_sentences
            kept.append(line)
        if sentences < cfg.min_sentences:
            return Drop("too_few_sentences", sentences, cfg.min_sentences)
        if not kept:
            return Drop("all_lines_removed")
        return "\n".join(kept).strip(), removed

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            result = self.clean(doc)
            if isinstance(result, Drop):
                ledger.remove(doc, self.name, result.rule, result.value, result.threshold, note=result.note)
                continue
            text, removed = result
            if removed:
                ledger.count(doc.source, "c4:lines_removed", removed)
            # an unchanged text keeps its document, and with it the shared split for later steps
            yield doc if text == doc.text else doc.with_text(text)
