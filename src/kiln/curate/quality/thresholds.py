"""`kiln quality thresholds`: a language's filter settings derived from text the user trusts.

FineWeb-2's method: measure each rule's metric on every document of a reference sample of the
language (Wikipedia, a curated corpus, the user's own good pages) and put the threshold where it
removes a chosen share of that reference (`--remove`, 5% by default): a `max_` key at the
(1 - share) quantile, a `min_` key at the share quantile, rounded outward to 3 decimals so it never
removes more. The stop words are the words found in the most reference documents. Each metric is
computed from the same split (kiln.text.segments, in the language's own words) and the same helpers
the steps use; the printed table gives each threshold, kiln's default and the share of the reference
it removes, and the output is recipe YAML (`curate.languages.<code>`).
Not handled here: choosing the reference (any input kiln reads), the model-based filters (their own
verbs), C4's line rules (they edit lines rather than judge documents).
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.readers import InputConfig, plan_reads
from kiln.curate.readers.intake import ReadLimits
from kiln.curate.readers.read import read_task
from kiln.curate.steps.fineweb import punctuated_fraction, text_lines
from kiln.curate.steps.gopher import NGrams, count_with_letter, duplicates, mean_word_length
from kiln.text.language import LID176_LANGUAGES, predict_language
from kiln.text.segments import segments

STOP_WORDS = 15  # how many of the most widespread words become stop words (FineWeb-2's lists hold 8 to 22)
MIN_STOP_WORDS = 2  # a document must hold this many of them, as gopher_quality.min_stop_words says
MIN_DOCUMENTS = 50  # fewer reference documents cannot place a 5% quantile


@dataclass(frozen=True)
class Key:
    """One recipe key a metric sets: `step.key` or `step.key.n` (an n-gram key), and its direction."""

    step: str
    key: str
    upper: bool  # True: documents above the threshold go (a max_ key); False: below it go (a min_ key)
    n: int | None = None

    @property
    def name(self) -> str:
        return f"{self.step}.{self.key}" + (f".{self.n}" if self.n is not None else "")


TOP_NGRAMS, DUP_NGRAMS = (2, 3, 4), (5, 6, 7, 8, 9, 10)
KEYS = (
    Key("language", "min_score", upper=False),
    Key("gopher_quality", "min_mean_word_length", upper=False),
    Key("gopher_quality", "max_mean_word_length", upper=True),
    Key("gopher_quality", "min_alpha_word_fraction", upper=False),
    Key("gopher_repetition", "max_dup_line_fraction", upper=True),
    *(Key("gopher_repetition", "max_top_ngram_char_fraction", True, n) for n in TOP_NGRAMS),
    *(Key("gopher_repetition", "max_dup_ngram_char_fraction", True, n) for n in DUP_NGRAMS),
    Key("fineweb", "min_punctuated_line_fraction", upper=False),
    Key("fineweb", "max_newlines_per_word", upper=True),
)


def measure(doc: Document, language: str) -> dict[str, float]:
    """Every metric of KEYS for one document, as the steps compute it (words in `language`)."""
    seg = segments(doc)
    text, tokens, words = doc.text, seg.words, seg.alnum_words
    n_chars, n_tokens = max(len(text), 1), max(len(tokens), 1)
    grams = NGrams(seg)
    predicted, score = predict_language(text)
    found = {
        "language.min_score": score if predicted == language else 0.0,
        "gopher_quality.min_mean_word_length": mean_word_length(words),
        "gopher_quality.min_alpha_word_fraction": count_with_letter(words) / n_tokens,
        "gopher_repetition.max_dup_line_fraction": _dup_line_fraction([line for line in seg.lines if line]),
        "fineweb.min_punctuated_line_fraction": punctuated_fraction(text_lines(seg)),
        "fineweb.max_newlines_per_word": text.count("\n") / len(tokens) if tokens else 0.0,
    }
    found["gopher_quality.max_mean_word_length"] = found["gopher_quality.min_mean_word_length"]
    for n in TOP_NGRAMS:
        found[f"gopher_repetition.max_top_ngram_char_fraction.{n}"] = grams.top_chars(n) / n_chars
    for n in DUP_NGRAMS:
        found[f"gopher_repetition.max_dup_ngram_char_fraction.{n}"] = grams.duplicated_chars(n) / n_chars
    return found


def _dup_line_fraction(lines: list[str]) -> float:
    """Gopher's: the non-empty lines repeating an earlier one, over the non-empty lines."""
    return duplicates(lines)[0] / len(lines) if lines else 0.0


@dataclass(frozen=True)
class Derived:
    language: str
    documents: int
    thresholds: dict[str, float]  # Key.name -> value
    removes: dict[str, float]  # Key.name -> share of the reference it removes ("gopher_quality.stop_words" too)
    stop_words: tuple[str, ...]
    removes_any: float  # share of the reference at least one threshold removes


def derive(docs: Iterable[Document], language: str, remove: float = 0.05, n_stop_words: int = STOP_WORDS) -> Derived:
    """The thresholds that each remove at most `remove` of `docs` (the trusted reference in `language`)."""
    docs = [d.with_meta(language=language) for d in docs]
    if len(docs) < MIN_DOCUMENTS:
        raise ConfigError(
            f"quality thresholds: the reference holds {len(docs)} documents; give at least {MIN_DOCUMENTS} (a few "
            "hundred place the quantiles well)"
        )
    values = {k.name: np.empty(len(docs)) for k in KEYS}
    document_frequency: Counter[str] = Counter()
    token_sets = []
    for i, doc in enumerate(docs):
        for name, v in measure(doc, language).items():
            values[name][i] = v
        tokens = set(segments(doc).alnum_words)
        token_sets.append(tokens)
        document_frequency.update(tokens)
    thresholds, removes = {}, {}
    fail = np.zeros(len(docs), dtype=bool)
    for key in KEYS:
        v = values[key.name]
        if key.upper:
            t = math.ceil(float(np.quantile(v, 1 - remove)) * 1000) / 1000
            out = v > t
        else:
            t = math.floor(float(np.quantile(v, remove)) * 1000) / 1000
            out = v < t
        thresholds[key.name], removes[key.name] = t, float(out.mean())
        fail |= out
    stop_words = tuple(w for w, _ in document_frequency.most_common(n_stop_words))
    few = np.array([len(tokens.intersection(stop_words)) < MIN_STOP_WORDS for tokens in token_sets])
    removes["gopher_quality.stop_words"] = float(few.mean())
    fail |= few
    return Derived(language, len(docs), thresholds, removes, stop_words, float(fail.mean()))


def recipe_yaml(d: Derived, sources: list[str], remove: float) -> str:
    """The derived settings as a recipe's `curate.languages.<code>` section, with where they come from."""
    steps: dict[str, dict[str, Any]] = {}
    for key in KEYS:
        section = steps.setdefault(key.step, {})
        if key.n is None:
            section[key.key] = d.thresholds[key.name]
        else:
            section.setdefault(key.key, {})[key.n] = d.thresholds[key.name]
    steps["gopher_quality"]["stop_words"] = list(d.stop_words)
    header = (
        f"# kiln quality thresholds: {d.language} from {', '.join(sources)} ({d.documents:,} documents); each "
        f"threshold removes at most {remove:.0%} of it, all together {d.removes_any:.1%}\n"
    )
    body = {"curate": {"languages": {d.language: steps}}}
    return header + yaml.safe_dump(body, allow_unicode=True, sort_keys=False, default_flow_style=None, width=110)


def table(d: Derived, defaults: Callable[[str], Any]) -> str:
    """One line per key: the derived value, kiln's default and the share of the reference it removes."""
    rows = [f"{'key':<52} {'derived':>9} {'default':>9} {'removes':>8}"]
    for key in KEYS:
        rows.append(
            f"{key.name:<52} {d.thresholds[key.name]:>9.3f} {defaults(key.name)!s:>9} {d.removes[key.name]:>8.1%}"
        )
    rows.append(
        f"{'gopher_quality.stop_words (at least 2 of)':<52} {len(d.stop_words):>9} {'':>9} "
        f"{d.removes['gopher_quality.stop_words']:>8.1%}"
    )
    rows.append(f"stop words: {' '.join(d.stop_words)}")
    rows.append(f"all together: {d.removes_any:.1%} of {d.documents:,} reference documents would go")
    return "\n".join(rows)


def kiln_default(name: str) -> Any:
    """kiln's default for a Key.name (the step's own, before any language's settings)."""
    from kiln.curate.config import CurateConfig

    step, key, *n = name.split(".")
    value = getattr(getattr(CurateConfig(), step), key)
    return value.get(int(n[0])) if n else value


def read_reference(paths: list[str]) -> list[Document]:
    """Every document of the reference files (any format kiln reads); a file no document came from is an error."""
    tasks = plan_reads(tuple(InputConfig(path=p, source="reference") for p in paths), None, 64 << 20)
    ledger = Ledger(0)
    return [doc for task in tasks for doc in read_task(task, ReadLimits(), ledger)]


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reference",
        nargs="+",
        required=True,
        metavar="PATH",
        help="Trusted text of the language (files, folders or globs, any format kiln reads).",
    )
    p.add_argument(
        "--language", required=True, help="Its lid.176 code (fr, zh, ...): the words are split as this language's."
    )
    p.add_argument(
        "--remove",
        type=float,
        default=0.05,
        help="The share of the reference each threshold may remove (default 0.05).",
    )
    p.add_argument("--out", metavar="FILE", help="Write the recipe YAML here (default: print it).")


def command(verb: Any, args: argparse.Namespace) -> int:
    """`kiln quality thresholds`: derive, print the table, write or print the YAML."""
    if args.language not in LID176_LANGUAGES:
        raise ConfigError(f"--language {args.language!r}: not a lid.176 code; use an ISO 639 code such as fr, de, zh")
    if not 0 < args.remove < 0.5:
        raise ConfigError(f"--remove {args.remove}: give a share between 0 and 0.5, such as 0.05")
    derived = derive(read_reference(args.reference), args.language, args.remove)
    print(table(derived, kiln_default))
    text = recipe_yaml(derived, args.reference, args.remove)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}: merge it into your recipe's curate section")
    else:
        print(text)
    return 0
