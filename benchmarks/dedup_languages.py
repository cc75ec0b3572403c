"""Dedup per language: does MinHash find the same planted edits in Chinese and Japanese as in English, what
does a document cost to shingle and sign per language, and what do the folded exact-dedup keys cost.

Text, all found on the machine: the messages of the gettext catalogs in /usr/share/locale translated in
every language measured (English is the message id), kept where the English is one sentence of 6 to 40
words ending in a full stop and no translation holds a line break or a placeholder. The same shuffled
sentences make the documents of every language: 12 to a document, in 3 paragraphs of 4 (sentences joined
by a space, or by nothing in Chinese and Japanese). Each base document gets planted variants: three that
English keeps clear above the 0.8 threshold, three near it, and one clear below:
  drop_sentence     the shortest sentence of its 2nd paragraph left out (by its English words: the same
                    sentence in every language)
  change_char       one character changed in its 7th sentence (a letter inside a word of 4 or more letters; in
                    Chinese and Japanese a Han character or a kana for another of its kind)
  swap_first_two    its first two sentences swapped
  drop_6th          its 6th sentence left out, whatever its length
  change_3_chars    one character changed in each of sentences 3, 7 and 11
  swap_3_and_10     sentences 3 and 10 swapped (they are in different paragraphs)
  drop_paragraph    its 2nd paragraph left out (a third of the text)
Per language, the documents (with meta.language) go through kiln's near-dedup phases as `kiln curate`
runs them (sign, buckets, verify, components; kiln.curate.dedup.near) with the default MinHashConfig,
and a planted pair counts as found when the verify phase keeps it (its exact shingle Jaccard reaches the
threshold); any kept pair of two different bases is a false pair. Beside the counts: the mean exact
Jaccard of each edit's pairs, the words per sentence that explain the spread near the threshold, and the
shingles one changed character costs (change_3_chars: shingles in one set only, over 3), which is what the
segmenters decide: a changed Chinese or Japanese character should cost what a changed English word costs.
Cost per document: shingling (kiln.text.shingles.shingle_sets with the document's language) plus the
signature (kiln.curate.dedup.minhash.signatures_flat), in batches of the sign phase's size, best of
`--repeats` per batch, microseconds per document.
Exact-dedup keys (kiln.curate.dedup.exact.text_hash, folded text) against the key as it was (xxh3 of the
text's UTF-8): MB/s on English (the licences and standard library docstrings, in ~4 KB documents; that
corpus again as ASCII only, and with every straight double quote made typographic so that every document
holds non-ASCII text but nothing the fold changes), Chinese and Japanese (the catalogs' documents above).
Ends with: RESULT clear_found_<lang>=.. (pairs found of the clear edits, English's count first)
near_found_<lang>=.. (likewise for the edits near the threshold) false_pairs=.. us_per_doc_<lang>=..
key_en_mb_s=.. key_en_before_mb_s=.. key_en_ratio=.. key_en_typographic_ratio=.. key_zh_mb_s=..
key_zh_before_mb_s=.. key_ja_mb_s=.. key_ja_before_mb_s=..
Not measured: exact and line dedup end to end (their keys only), other shingle sizes or thresholds.
"""

from __future__ import annotations

import argparse
import gettext
import random
import re
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import xxhash
from segment_speed import english_text  # benchmarks/ is on the path of a script run from it

from kiln.core.docshards import ShardWriter
from kiln.core.document import Document
from kiln.curate.dedup.exact import text_hash
from kiln.curate.dedup.minhash import MinHashConfig, jaccard, permutation_params, signatures_flat
from kiln.curate.dedup.near import SIGN_BATCH, bucket_task, components_task, sign_task, verify_task
from kiln.text.shingles import shingle_set, shingle_sets, words

LOCALES = {
    "zh": "zh_CN",
    "zh-Hant": "zh_TW",
    "ja": "ja",
    "ko": "ko",
    "fr": "fr",
    "de": "de",
    "es": "es",
    "ru": "ru",
}
UNSPACED = ("zh", "zh-Hant", "ja")
SENTENCES, PARAGRAPH = 12, 4
CLEAR = ("drop_sentence", "change_char", "swap_first_two")
NEAR = ("drop_6th", "change_3_chars", "swap_3_and_10")
EDITS = (*CLEAR, *NEAR, "drop_paragraph")
# Characters a change puts in: common Han characters; kana; Latin letters.
HAN = "的是了不人在有这个上们来到时大地为子中说生国年着就那和要出也得里后自以会"
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのまみむめもアイウエオカキクケコサシスセソ"
_HAN_CHAR = re.compile("[\u4e00-\u9fff]")
_KANA_CHAR = re.compile("[\u3041-\u3096\u30a1-\u30fa]")
_WORD_LETTER = re.compile(r"(?<=[^\W\d_]{2})[^\W\d_](?=[^\W\d_])")  # a letter inside a word of 4 or more


def catalog(locale: str) -> dict[str, str]:
    """Message id -> translation, over every catalog of the locale that gettext can read."""
    found: dict[str, str] = {}
    for mo in sorted(Path("/usr/share/locale", locale, "LC_MESSAGES").glob("*.mo")):
        try:
            with mo.open("rb") as f:
                messages = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
        except (OSError, UnicodeDecodeError, ValueError, struct.error):
            continue
        for key, value in messages.items():
            if isinstance(key, str) and key and isinstance(value, str) and value.strip():
                found.setdefault(key, value)
    return found


def plain(text: str) -> bool:
    return not any(c in text for c in "\n\t%{}<>_\\")


def sentences(languages: dict[str, str]) -> dict[str, list[str]]:
    """Per language the same sentences, in one shuffled order (English: the message ids)."""
    tables = {code: catalog(locale) for code, locale in languages.items()}
    keys = [
        k
        for k in sorted(set.intersection(*(set(t) for t in tables.values())))
        if k.endswith(".") and 6 <= len(k.split()) <= 40 and plain(k) and all(plain(t[k]) for t in tables.values())
    ]
    seen: dict[str, set[str]] = {code: set() for code in ("en", *tables)}
    kept = []
    for k in keys:  # no sentence twice in any language (two messages may share a translation)
        texts = {"en": k, **{code: t[k].strip() for code, t in tables.items()}}
        if all(texts[code] not in seen[code] for code in texts):
            kept.append(texts)
            for code, text in texts.items():
                seen[code].add(text)
    random.Random(0).shuffle(kept)
    return {code: [s[code] for s in kept] for code in ("en", *tables)}


def join(code: str, sents: list[str]) -> str:
    glue = "" if code in UNSPACED else " "
    return "\n\n".join(glue.join(sents[i : i + PARAGRAPH]) for i in range(0, len(sents), PARAGRAPH))


def change_char(code: str, sentence: str, rng: random.Random) -> str:
    """One character of the sentence changed for another of its kind."""
    if code in UNSPACED:
        spots = [(m.start(), HAN) for m in _HAN_CHAR.finditer(sentence)]
        spots += [(m.start(), KANA) for m in _KANA_CHAR.finditer(sentence)]
    else:
        spots = [
            (m.start(), "etaoinshrdlu" if m.group().islower() else "ETAOINSHRDLU")
            for m in _WORD_LETTER.finditer(sentence)
        ]
    if not spots:
        return sentence
    at, pool = rng.choice(spots)
    new = rng.choice([c for c in pool if c != sentence[at]])
    return sentence[:at] + new + sentence[at + 1 :]


def variants(code: str, sents: list[str], english: list[str], seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    shortest = min(range(PARAGRAPH, 2 * PARAGRAPH), key=lambda i: len(english[i].split()))
    one, three = list(sents), list(sents)
    one[6] = change_char(code, one[6], rng)
    for i in (2, 6, 10):
        three[i] = change_char(code, three[i], rng)
    swapped = list(sents)
    swapped[2], swapped[9] = swapped[9], swapped[2]
    return {
        "drop_sentence": sents[:shortest] + sents[shortest + 1 :],
        "change_char": one,
        "swap_first_two": [sents[1], sents[0], *sents[2:]],
        "drop_6th": sents[:5] + sents[6:],
        "change_3_chars": three,
        "swap_3_and_10": swapped,
        "drop_paragraph": sents[:PARAGRAPH] + sents[2 * PARAGRAPH :],
    }


def corpus(code: str, sents: list[str], english: list[str]) -> list[Document]:
    """The base documents and their variants, each with meta.language."""
    docs = []
    for b in range(len(sents) // SENTENCES):
        base, cut = sents[b * SENTENCES : (b + 1) * SENTENCES], english[b * SENTENCES : (b + 1) * SENTENCES]
        docs.append(Document(f"b{b:03d}", join(code, base), "web", {"language": code}))
        for kind, edited in variants(code, base, cut, b).items():
            docs.append(Document(f"b{b:03d}-{kind}", join(code, edited), "web", {"language": code}))
    return docs


def verified_pairs(docs: list[Document], work: Path, cfg: MinHashConfig) -> set[tuple[str, str]]:
    """The pairs (id, id) the near-dedup phases verify as near-duplicates, on one shard in one task."""
    for name in ("sign", "buckets", "verify"):
        (work / name).mkdir(parents=True)
    shard = work / "filtered.jsonl.zst"
    with ShardWriter(shard) as writer:
        for doc in docs:
            writer.write(doc)
    sign_task(shard, work / "sign", 0, set(), cfg, ())
    for band in range(cfg.bands):
        bucket_task(work / "sign", work / "buckets" / f"{band:03d}.npy", band, 0, 1, cfg)
    verify_task(work / "buckets", work / "sign", work / "verify" / "00000.parquet", 0, 1, 1, cfg)
    components_task(work / "verify", work / "sign", work / "assign.parquet")  # as curate runs it: it must not fail
    ids = pq.read_table(work / "sign" / "00000.docs.parquet").to_pydict()
    id_of = dict(zip(ids["local"], ids["id"]))
    edges = pq.read_table(work / "verify" / "00000.parquet").to_pydict()
    mask = np.uint64(0xFFFF_FFFF)
    return {
        tuple(sorted((id_of[int(np.uint64(a) & mask)], id_of[int(np.uint64(b) & mask)])))
        for a, b in zip(edges["a"], edges["b"])
    }


def _seconds(piece: Callable[[], object]) -> float:
    """Wall seconds of one call. The measurements take the best of several calls of short pieces (a sign
    batch, about 0.2 MB of keys), so a burst of another process's work on a shared machine spoils one
    call, not a whole figure."""
    started = time.perf_counter()
    piece()
    return time.perf_counter() - started


def cost_per_doc(docs: list[Document], cfg: MinHashConfig, repeats: int) -> float:
    """Microseconds per document to shingle and sign, in the sign phase's batches."""
    a, b = permutation_params(cfg.permutations, cfg.seed)

    def sign(batch: list[Document]) -> None:
        values, ends = shingle_sets(
            [d.text for d in batch], cfg.ngram, cfg.fold_digits, [d.meta["language"] for d in batch]
        )
        signatures_flat(values, np.unique(ends), a, b)

    pieces = [lambda batch=docs[i : i + SIGN_BATCH]: sign(batch) for i in range(0, len(docs), SIGN_BATCH)]
    for piece in pieces:  # warm: segmenter dictionaries, the word-hash cache
        piece()
    return sum(min(_seconds(piece) for _ in range(repeats)) for piece in pieces) / len(docs) * 1e6


def key_before(text: str) -> tuple[int, int]:
    """The exact-dedup key as it was: xxh3-128 of the text's UTF-8, nothing folded."""
    digest = xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass"))
    return digest >> 64, digest & 0xFFFF_FFFF_FFFF_FFFF


def english_documents() -> list[str]:
    """The licences and the standard library's docstrings (segment_speed's English text) in ~4 KB documents."""
    docs, current, size = [], [], 0
    for line in english_text().splitlines():
        current.append(line)
        size += len(line) + 1
        if size >= 4096:
            docs.append("\n".join(current))
            current, size = [], 0
    return docs


def key_speed(texts: list[str], repeats: int) -> tuple[float, float]:
    """MB/s of the key before and after, in pieces of about 0.2 MB taking turns, best of `repeats` each."""
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    pieces, size, cut = [], 0, 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= 200_000 or i == len(texts) - 1:
            pieces.append(texts[cut : i + 1])
            cut, size = i + 1, 0
    before = [lambda p=p: [key_before(t) for t in p] for p in pieces]
    after = [lambda p=p: [text_hash(t) for t in p] for p in pieces]
    seconds = [0.0, 0.0]
    for x, y in zip(before, after):  # a piece before, then after, `repeats` times: the best of each
        best = [float("inf"), float("inf")]
        for _ in range(repeats):
            best = [min(best[0], _seconds(x)), min(best[1], _seconds(y))]
        seconds = [seconds[0] + best[0], seconds[1] + best[1]]
    return mb / seconds[0], mb / seconds[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="Timing repeats (best kept).")
    parser.add_argument("--key-mb", type=float, default=20.0, help="MB of text per key-speed corpus (repeated).")
    args = parser.parse_args()
    started = time.perf_counter()
    cfg = MinHashConfig()
    sents = sentences(LOCALES)
    bases = len(sents["en"]) // SENTENCES
    print(
        f"{len(sents['en'])} sentences translated in all of en, {', '.join(LOCALES)}: {bases} base documents of "
        f"{SENTENCES} sentences, {len(EDITS)} variants each; MinHash {cfg.ngram}-grams, {cfg.bands} x {cfg.rows}, "
        f"threshold {cfg.threshold}"
    )
    found: dict[str, dict[str, set[int]]] = {}
    false_pairs: dict[str, int] = {}
    costs: dict[str, float] = {}
    print(
        "per edit: pairs found / bases (mean exact Jaccard); words per sentence; shingles one changed character "
        "costs; false pairs; microseconds per document to shingle and sign"
    )
    print(f"  {'lang':<8} " + " ".join(f"{k:>21}" for k in EDITS) + f" {'words':>6} {'char':>5} {'false':>5} {'us':>5}")
    for code, texts in sents.items():
        docs = corpus(code, texts, sents["en"])
        with tempfile.TemporaryDirectory() as tmp:
            pairs = verified_pairs(docs, Path(tmp), cfg)
        sets = {d.id: shingle_set(d.text, cfg.ngram, cfg.fold_digits, d.meta["language"]) for d in docs}
        found[code] = {kind: set() for kind in EDITS}
        means = {}
        for kind in EDITS:
            for b in range(bases):
                if (f"b{b:03d}", f"b{b:03d}-{kind}") in pairs:
                    found[code][kind].add(b)
            means[kind] = float(np.mean([jaccard(sets[f"b{b:03d}"], sets[f"b{b:03d}-{kind}"]) for b in range(bases)]))
        per_char = np.mean(
            [len(np.setxor1d(sets[f"b{b:03d}"], sets[f"b{b:03d}-change_3_chars"])) / 3 for b in range(bases)]
        )
        false_pairs[code] = sum(1 for x, y in pairs if x[:4] != y[:4])
        costs[code] = cost_per_doc(docs, cfg, args.repeats)
        per_sentence = np.mean([len(words(s, language=code)) for s in texts])
        print(
            f"  {code:<8} "
            + " ".join(f"{len(found[code][k]):>3}/{bases} ({means[k]:.3f})".rjust(21) for k in EDITS)
            + f" {per_sentence:>6.1f} {per_char:>5.1f} {false_pairs[code]:>5} {costs[code]:>5.0f}"
        )
    print("bases whose pair another language finds and English does not (+), or English finds and it does not (-):")
    for code in sents:
        if code != "en":
            print(
                f"  {code:<8} "
                + ", ".join(
                    f"{k} +{len(found[code][k] - found['en'][k])} -{len(found['en'][k] - found[code][k])}"
                    for k in EDITS
                )
            )

    english = english_documents()
    ascii_only = [t.encode("ascii", "ignore").decode() for t in english]
    typographic = [t.replace('"', "\u201c") for t in ascii_only]
    typographic = [t if not t.isascii() else t + " \u201c" for t in typographic]
    unspaced = {code: [d.text for d in corpus(code, sents[code], sents["en"])] for code in ("zh", "ja")}
    results: dict[str, tuple[float, float]] = {}
    for name, texts in (("en", english), ("en_ascii", ascii_only), ("en_typographic", typographic), *unspaced.items()):
        size = sum(len(t.encode()) for t in texts)
        repeated = texts * max(1, round(args.key_mb * 1e6 / size))
        results[name] = key_speed(repeated, args.repeats)
        before, after = results[name]
        print(f"exact-dedup key {name:<15} {before:8.0f} MB/s before, {after:8.0f} after ({after / before:.3f}x)")
    print(f"whole run {time.perf_counter() - started:.0f} s")

    def count(code: str, kinds: tuple[str, ...]) -> int:
        return sum(len(found[code][k]) for k in kinds)

    print(
        "RESULT "
        + " ".join(f"clear_found_{code.replace('-', '_')}={count(code, CLEAR)}" for code in sents)
        + " "
        + " ".join(f"near_found_{code.replace('-', '_')}={count(code, NEAR)}" for code in sents)
        + f" false_pairs={sum(false_pairs.values())} "
        + " ".join(f"us_per_doc_{code.replace('-', '_')}={costs[code]:.0f}" for code in sents)
        + f" key_en_mb_s={results['en'][1]:.0f} key_en_before_mb_s={results['en'][0]:.0f}"
        + f" key_en_ratio={results['en'][1] / results['en'][0]:.3f}"
        + f" key_en_typographic_ratio={results['en_typographic'][1] / results['en_typographic'][0]:.3f}"
        + "".join(f" key_{c}_mb_s={results[c][1]:.0f} key_{c}_before_mb_s={results[c][0]:.0f}" for c in ("zh", "ja"))
    )


if __name__ == "__main__":
    main()
