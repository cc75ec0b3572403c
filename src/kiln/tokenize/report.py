"""What a tokenizer costs: compression and fertility on held-out text, per source and per language.

Measures, for documents the tokenizer never trained on:
- bytes per token (UTF-8 bytes of the text / tokens): higher is better compression;
- tokens per word (all tokens, whitespace and punctuation included, / words): the sequence
  length a word of this text costs;
- fertility (tokens per word when each word is encoded alone, with its leading space if it had
  one; a SentencePiece-style tokenizer's own word marker stands for that space) and the share of
  words split into two or more tokens.
A word is a run of letters, marks and digits (with the space before it) in a language written with
spaces; in Chinese, Japanese and Thai it is a word of the language's segmenter (kiln.text.languages:
rjieba, SudachiPy, nlpo3), so their fertility is tokens per word as the field counts it, not per
character or per clause; other scripts written without spaces (Lao, Khmer, Myanmar) count each
character as a word.
A document's language is curate's `meta.language`, else `code` for code, else lid.176's guess.
Parallel text, documents that are translations of each other and carry the same `meta.parallel_id`
across languages, also gives each language's premium, the fair comparison across languages: its
tokens over English's tokens on the same content, summed over the groups that hold both (Petrov
et al. 2023 measure it on FLORES). Worked: groups {1: en 4, fr 5}, {2: en 6, fr 9, de 8}, {3: de 7}
give fr 14 / 10 = 1.4, and de 8 / 6 (group 3 has no English).
Also: the longest and most used merges; the printed report adds the embedding-table parameters at
the recipe's model width (not stored: the model's width is not the tokenizer's business).
`measure_text` measures any tokenizer that encodes text (another tool's, for compare.py) the same way.
Not handled here: training (train.py), or drawing the held-out documents.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import regex

from kiln.core.document import Document
from kiln.text.code import is_code
from kiln.text.language import predict_language
from kiln.text.languages import word_rule
from kiln.text.load import AnyTokenizer

UNSPACED = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}"
# One optional leading space is kept with the word: that is how BPE sees most words mid-sentence.
WORD = regex.compile(rf" ?(?:[{UNSPACED}]|(?:(?![{UNSPACED}])[\p{{L}}\p{{M}}\p{{N}}])+)")
HAS_WORD = regex.compile(r"[\p{L}\p{M}\p{N}]")
TOP = 10
PARALLEL_KEY = "parallel_id"  # meta key shared by the translations of one text
REFERENCE = "en"  # premiums are relative to this language


@dataclass(frozen=True)
class HeldoutDoc:
    source: str
    language: str
    text: str
    parallel_id: str | None = None


class TextEncoder(Protocol):
    """What measuring needs of a tokenizer: the ids of texts (no boundary tokens), whether it marks a word
    start itself (SentencePiece style), and its vocabulary size."""

    prepends_space: bool
    vocab_size: int

    def encode_batch(self, texts: list[str], threads: int = 1) -> list[list[int]]: ...


def language_of(doc: Document) -> str:
    if doc.meta.get("language"):
        return str(doc.meta["language"])
    if is_code(doc.source, doc.meta.get("record_path") or doc.meta.get("path"), None):
        return "code"
    return predict_language(doc.text, max_chars=2000)[0]


def parallel_id(doc: Document) -> str | None:
    """The parallel group a document belongs to (meta.parallel_id, as text), None outside any."""
    value = doc.meta.get(PARALLEL_KEY)
    return None if value is None or value == "" else str(value)


def heldout_doc(doc: Document) -> HeldoutDoc:
    return HeldoutDoc(doc.source, language_of(doc), doc.text, parallel_id(doc))


def words(text: str, language: str | None = None) -> list[str]:
    """The words fertility is measured on, as the language splits (see the module docstring)."""
    kind, rule = word_rule(language, text)
    if kind != "segmented":
        return WORD.findall(text)
    assert callable(rule)
    return [w for w in rule(text) if HAS_WORD.search(w)]


class GroupStats:
    """Running sums for one group of documents (a source, a language, or all)."""

    def __init__(self) -> None:
        self.docs = self.bytes = self.tokens = 0
        self.words: Counter[str] = Counter()

    def add(self, n_bytes: int, n_tokens: int, doc_words: Counter[str]) -> None:
        self.docs += 1
        self.bytes += n_bytes
        self.tokens += n_tokens
        self.words.update(doc_words)

    def summary(self, word_tokens: dict[str, int]) -> dict[str, Any]:
        n_words = sum(self.words.values())
        split = sum(c for w, c in self.words.items() if word_tokens[w] > 1)
        fertility = sum(c * word_tokens[w] for w, c in self.words.items())
        return {
            "docs": self.docs,
            "bytes": self.bytes,
            "tokens": self.tokens,
            "words": n_words,
            "bytes_per_token": round(self.bytes / self.tokens, 4) if self.tokens else None,
            "tokens_per_word": round(self.tokens / n_words, 4) if n_words else None,
            "fertility": round(fertility / n_words, 4) if n_words else None,
            "split_word_fraction": round(split / n_words, 4) if n_words else None,
        }


def premium(counts: Iterable[tuple[str, str, int]], reference: str = REFERENCE) -> dict[str, Any] | None:
    """Each language's tokens over the reference language's on the same content (module docstring).

    counts: (parallel group, language, tokens) per document; a group's documents of one language add up.
    None when no group holds the reference language and another."""
    groups: dict[str, Counter[str]] = {}
    for group, language, tokens in counts:
        groups.setdefault(group, Counter())[language] += tokens
    out = {}
    for language in sorted({lang for g in groups.values() for lang in g}):
        both = [g for g in groups.values() if language in g and reference in g]
        tokens, ref = sum(g[language] for g in both), sum(g[reference] for g in both)
        if both:
            out[language] = {
                "groups": len(both),
                "tokens": tokens,
                "reference_tokens": ref,
                "premium": round(tokens / ref, 4) if ref else None,
            }
    if set(out) <= {reference}:
        return None
    return {"reference": reference, "per_language": out}


def measure_text(tokenizer: TextEncoder, docs: Sequence[HeldoutDoc]) -> tuple[dict[str, Any], Counter[int]]:
    """all, per_source, per_language and (with parallel documents) parallel for `docs`, and how often each
    id was used; JSON-ready."""
    total, by_source, by_language = GroupStats(), {}, {}
    used: Counter[int] = Counter()
    parallel = []
    for doc, ids in zip(docs, tokenizer.encode_batch([d.text for d in docs], threads=2), strict=True):
        n_bytes, doc_words = (
            len(doc.text.encode("utf-8")),
            Counter(words(doc.text, doc.language)),
        )  # once per document, for its three groups
        for stats in (
            total,
            by_source.setdefault(doc.source, GroupStats()),
            by_language.setdefault(doc.language, GroupStats()),
        ):
            stats.add(n_bytes, len(ids), doc_words)
        used.update(ids)
        if doc.parallel_id is not None:
            parallel.append((doc.parallel_id, doc.language, len(ids)))
    unique = list(total.words)
    # A SentencePiece-style tokenizer marks the word start itself: " word" alone would read as two marks.
    alone = [w[1:] if tokenizer.prepends_space and w.startswith(" ") else w for w in unique]
    word_tokens = dict(zip(unique, map(len, tokenizer.encode_batch(alone)), strict=True))
    report = {
        "all": total.summary(word_tokens),
        "per_source": {s: by_source[s].summary(word_tokens) for s in sorted(by_source)},
        "per_language": {
            lang: by_language[lang].summary(word_tokens)
            for lang in sorted(by_language, key=lambda k: -by_language[k].bytes)
        },
    }
    if (found := premium(parallel)) is not None:  # only with parallel text: other reports read as before
        report["parallel"] = found
    return report, used


def measure(tokenizer: AnyTokenizer, docs: Sequence[HeldoutDoc]) -> dict[str, Any]:
    """The report for `docs` (see the module docstring); JSON-ready."""
    text, used = measure_text(tokenizer, docs)
    token_bytes = tokenizer.token_bytes()
    merged = [i for i in range(tokenizer.vocab_size) if token_bytes[i] > 1]

    def show(i: int) -> dict[str, Any]:
        return {"id": i, "text": tokenizer.decode([i]), "bytes": int(token_bytes[i])}

    return {
        "vocab_size": tokenizer.vocab_size,
        "special_tokens": len(tokenizer.specials),
        "merges": len(merged),
        **text,
        # runs of indentation are the longest tokens of any code-trained vocabulary; show the others
        "longest_merges": [
            show(i)
            for i in sorted((i for i in merged if tokenizer.decode([i]).strip()), key=lambda i: (-token_bytes[i], i))[
                :TOP
            ]
        ],
        "most_used_merges": [
            {**show(i), "count": c}
            for i, c in sorted(((i, used[i]) for i in merged if used[i]), key=lambda x: (-x[1], x[0]))[:TOP]
        ],
        "first_merges": [show(i) for i in merged[:TOP]],  # learned first: the most frequent pairs of the sample
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _row(name: str, r: dict[str, Any]) -> str:
    return (
        f"  {name:<12} {r['docs']:>6} {r['bytes'] / 1e6:>8.2f} {_fmt(r['bytes_per_token']):>8} "
        f"{_fmt(r['tokens_per_word']):>8} {_fmt(r['fertility']):>8} {_fmt(r['split_word_fraction']):>7}"
    )


def embedding_params(vocab_size: int, d_model: int, tied: bool) -> int:
    """Parameters of the embedding table (and the output projection unless tied) at this width."""
    return vocab_size * d_model * (1 if tied else 2)


def format_report(report: dict[str, Any], d_model: int, tied: bool) -> str:
    """The printed report. The embedding figure is priced at the recipe's model width when printed:
    it is not part of report.json, so a new d_model never retrains the tokenizer."""
    head = f"  {'':<12} {'docs':>6} {'MB':>8} {'B/token':>8} {'tok/word':>8} {'fertil.':>8} {'split':>7}"
    params = embedding_params(report["vocab_size"], d_model, tied)
    lines = [
        (
            f"vocab {report['vocab_size']:,} ({report['special_tokens']} special, {report['merges']:,} merges); "
            f"embedding parameters at d_model {d_model}: {params:,} ({'tied' if tied else 'input + output'})"
        )
    ]
    lines += [
        "held-out text by source:",
        head,
        *(_row(s, r) for s, r in report["per_source"].items()),
        _row("all", report["all"]),
    ]
    parallel = report.get("parallel")
    if parallel is None:
        lines += ["held-out text by language:", head, *(_row(lang, r) for lang, r in report["per_language"].items())]
    else:
        ref = parallel["reference"]
        groups = max(p["groups"] for p in parallel["per_language"].values())
        lines += [
            f"held-out text by language (vs {ref}: tokens over {ref}'s on the same parallel text, {groups:,} groups):",
            f"{head} {'vs ' + ref:>7}",
            *(f"{_row(lang, r)} {_fmt(premium_of(parallel, lang)):>7}" for lang, r in report["per_language"].items()),
        ]
    lines.append("longest merges: " + ", ".join(repr(m["text"]) for m in report["longest_merges"]))
    lines.append(
        "most used merges: " + ", ".join(f"{m['text']!r} ({m['count']:,})" for m in report["most_used_merges"])
    )
    return "\n".join(lines)


def premium_of(parallel: dict[str, Any] | None, language: str) -> float | None:
    """A language's premium in a report's `parallel` section; None without one."""
    return ((parallel or {}).get("per_language", {}).get(language) or {}).get("premium")


def format_balance(balance: dict[str, Any], report: dict[str, Any] | None) -> str:
    """The training sample's languages before and after balancing, and the held-out figures of the natural
    mix's tokenizer beside this one's (`report`, the held-out report) where both were measured."""
    natural = balance.get("natural_mix")
    lines = [
        f"training sample by language at tokenizer.language_alpha {balance['language_alpha']}, natural -> balanced"
    ]
    if natural is None or report is None:
        natural = report = None
        keys: list[tuple[str, str]] = []
    else:
        lines.append(
            "held-out figures: the natural mix's tokenizer (trained on the sample before balancing) -> this one"
        )
        keys = [("tokens_per_word", "tok/word"), ("fertility", "fertility")]
    parallel = report.get("parallel") if report else None
    head = f"  {'':<12} {'MB':>8} {'share':>16}" + "".join(f" {label:>16}" for _, label in keys)
    lines.append(head + (f" {'vs ' + parallel['reference']:>16}" if parallel else ""))

    def pair(before: float | None, after: float | None) -> str:
        return f"{_fmt(before)} -> {_fmt(after)}"

    for lang, s in balance["per_language"].items():
        line = f"  {lang:<12} {s['bytes_before'] / 1e6:>8.2f} {pair(s['share_before'], s['share_after']):>16}"
        if natural is not None and report is not None:
            was, now = natural["per_language"].get(lang, {}), report["per_language"].get(lang, {})
            line += "".join(f" {pair(was.get(k), now.get(k)):>16}" for k, _ in keys)
        if parallel and natural is not None:
            line += f" {pair(premium_of(natural.get('parallel'), lang), premium_of(parallel, lang)):>16}"
        lines.append(line)
    return "\n".join(lines)


def format_compare(entries: Sequence[dict[str, Any]]) -> str:
    """Tokenizers measured on the same text side by side, one column each; `entries` hold a label, a
    location and vocab_size beside measure_text's report."""
    width = max(10, *(len(e["label"]) + 2 for e in entries))
    lines = ["tokenizers measured on the same held-out text:"]
    lines += [f"  {e['label']}: {e['location']} (vocab {e['vocab_size']:,})" for e in entries]
    lines.append(f"  {'':<28}" + "".join(f"{e['label']:>{width}}" for e in entries))

    def metric(label: str, values: list[float | None]) -> None:
        lines.append(f"  {label:<28}" + "".join(f"{_fmt(v):>{width}}" for v in values))

    languages = list(entries[0]["per_language"])
    for key, label in (
        ("bytes_per_token", "bytes/token"),
        ("tokens_per_word", "tokens/word"),
        ("fertility", "fertility"),
    ):
        metric(f"{label} all", [e["all"][key] for e in entries])
        for lang in languages:
            metric(f"{label} [{lang}]", [e["per_language"].get(lang, {}).get(key) for e in entries])
    if any(e.get("parallel") for e in entries):
        ref = next(e["parallel"]["reference"] for e in entries if e.get("parallel"))
        for lang in languages:
            metric(f"tokens vs {ref} [{lang}]", [premium_of(e.get("parallel"), lang) for e in entries])
    return "\n".join(lines)


def format_sweep(reports: Sequence[dict[str, Any]], d_model: int, tied: bool) -> str:
    """Several vocabulary sizes side by side: one column per size."""
    lines = [f"  {'vocab size':<28}" + "".join(f"{r['vocab_size']:>10,}" for r in reports)]

    def metric(label: str, values: list[Any]) -> None:
        lines.append(f"  {label:<28}" + "".join(f"{'-' if v is None else v:>10}" for v in values))

    metric(
        f"embedding params at {d_model} (M)",
        [round(embedding_params(r["vocab_size"], d_model, tied) / 1e6, 2) for r in reports],
    )
    for key, label in (
        ("bytes_per_token", "bytes/token"),
        ("tokens_per_word", "tokens/word"),
        ("fertility", "fertility"),
    ):
        metric(f"{label} all", [r["all"][key] for r in reports])
        for source in reports[0]["per_source"]:
            metric(f"{label} {source}", [r["per_source"].get(source, {}).get(key) for r in reports])
        for lang in reports[0]["per_language"]:
            metric(f"{label} [{lang}]", [r["per_language"].get(lang, {}).get(key) for r in reports])
    return "\n".join(lines)
