"""MinHash near-dedup finds the same planted edits in Chinese and Japanese as in English, at the default
settings: the same sentences (gettext messages translated in every language, read from the machine's
/usr/share/locale; skipped where they are missing) make a few documents per language, each with planted
variants, and kiln's near-dedup phases (sign, buckets, verify, components) run on them per language with
meta.language set.
The edits are the ones English keeps clear of the 0.8 threshold (Jaccard 0.84 to 0.93 on this machine's
catalogs, 0.59 to 0.69 for a dropped paragraph): whether an edit near the threshold is found depends on
how many words a language spends on a sentence (on these sentences Chinese 0.87 and Japanese 1.39 times
English's, as Russian 0.86 and French 1.2), which benchmarks/dedup_languages.py measures on every base
document, with more edits and languages. What the segmenters must give is checked directly: one changed
character costs a Chinese or Japanese document as many shingles as one changed letter costs an English
one."""

from __future__ import annotations

import gettext
import random
import re
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kiln.core.docshards import ShardWriter
from kiln.core.document import Document
from kiln.curate.dedup.minhash import MinHashConfig
from kiln.curate.dedup.near import bucket_task, components_task, sign_task, verify_task
from kiln.text.shingles import shingle_set

LOCALES = {"zh": "zh_CN", "ja": "ja"}
BASES, SENTENCES, PARAGRAPH = 6, 12, 4
# drop_sentence leaves out the shortest sentence of the second paragraph (by its English words, the same
# sentence in every language); drop_paragraph a third of the text: a near-duplicate at 0.8 in no language
EDITS = ("drop_sentence", "change_char", "swap_first_two", "drop_paragraph")
_CHANGEABLE = {
    "en": re.compile(r"(?<=[a-z]{2})[a-z](?=[a-z])"),  # a letter inside a word of 4 or more
    "zh": re.compile("[\u4e00-\u9fff]"),
    "ja": re.compile("[\u4e00-\u9fff\u3041-\u3096\u30a1-\u30fa]"),
}


def plain(text: str) -> bool:
    return bool(text) and not any(c in text for c in "\n\t%{}<>_\\")


def translated_sentences(wanted: int) -> dict[str, list[str]]:
    """`wanted` sentences in en (the message ids), zh and ja, from catalogs every locale has, read in name
    order until twice as many are found (perf: reading every catalog takes a second), then shuffled."""
    folders = {code: Path("/usr/share/locale", locale, "LC_MESSAGES") for code, locale in LOCALES.items()}
    names = set.intersection(*({p.name for p in folder.glob("*.mo")} for folder in folders.values()))
    found: dict[str, list[str]] = {"en": [], **{code: [] for code in LOCALES}}
    seen: set[str] = set()
    for name in sorted(names):
        tables = {}
        for code, folder in folders.items():
            try:
                with (folder / name).open("rb") as f:
                    tables[code] = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
            except (OSError, UnicodeDecodeError, ValueError, struct.error):
                break
        else:
            for key in sorted(k for k in set.intersection(*map(set, tables.values())) if isinstance(k, str)):
                texts = {"en": key, **{code: str(t[key]).strip() for code, t in tables.items()}}
                words = len(key.split())
                if (
                    key.endswith(".")
                    and 6 <= words <= 40
                    and all(map(plain, texts.values()))
                    and not seen & {*texts.values()}
                ):
                    seen |= {*texts.values()}
                    for code, text in texts.items():
                        found[code].append(text)
        if len(found["en"]) >= 2 * wanted:
            break
    order = list(range(len(found["en"])))
    random.Random(0).shuffle(order)
    return {code: [sents[i] for i in order[:wanted]] for code, sents in found.items()}


def document(code: str, sents: list[str]) -> str:
    glue = " " if code == "en" else ""
    return "\n\n".join(glue.join(sents[i : i + PARAGRAPH]) for i in range(0, len(sents), PARAGRAPH))


def planted(code: str, sents: list[str], english: list[str], seed: int) -> dict[str, str]:
    dropped = min(range(PARAGRAPH, 2 * PARAGRAPH), key=lambda i: len(english[i].split()))
    changed = list(sents)
    i = next(i for i in range(6, SENTENCES) if _CHANGEABLE[code].search(sents[i]))  # one with a character to change
    at = random.Random(seed).choice([m.start() for m in _CHANGEABLE[code].finditer(sents[i])])
    changed[i] = sents[i][:at] + ("x" if code == "en" else "中") + sents[i][at + 1 :]
    edited = {
        "drop_sentence": sents[:dropped] + sents[dropped + 1 :],
        "change_char": changed,
        "swap_first_two": [sents[1], sents[0], *sents[2:]],
        "drop_paragraph": sents[:PARAGRAPH] + sents[2 * PARAGRAPH :],
    }
    return {kind: document(code, s) for kind, s in edited.items()}


def near_pairs(docs: list[Document], work: Path) -> set[tuple[str, str]]:
    """The id pairs kiln's verify phase keeps as near-duplicates (default MinHashConfig, one task)."""
    cfg = MinHashConfig()
    for name in ("sign", "buckets", "verify"):
        (work / name).mkdir(parents=True)
    with ShardWriter(work / "filtered.jsonl.zst") as writer:
        for doc in docs:
            writer.write(doc)
    sign_task(work / "filtered.jsonl.zst", work / "sign", 0, set(), cfg, ())
    for band in range(cfg.bands):
        bucket_task(work / "sign", work / "buckets" / f"{band:03d}.npy", band, 0, 1, cfg)
    verify_task(work / "buckets", work / "sign", work / "verify" / "00000.parquet", 0, 1, 1, cfg)
    components_task(work / "verify", work / "sign", work / "assign.parquet")
    rows = pq.read_table(work / "sign" / "00000.docs.parquet").to_pydict()
    id_of = dict(zip(rows["local"], rows["id"]))
    edges = pq.read_table(work / "verify" / "00000.parquet").to_pydict()
    local = np.uint64(0xFFFF_FFFF)
    return {
        tuple(sorted((id_of[int(np.uint64(a) & local)], id_of[int(np.uint64(b) & local)])))
        for a, b in zip(edges["a"], edges["b"])
    }


def test_planted_edits_are_found_alike_in_english_chinese_and_japanese(tmp_path: Path) -> None:
    sents = translated_sentences(BASES * SENTENCES)
    if len(sents["en"]) < BASES * SENTENCES:
        pytest.skip(f"{len(sents['en'])} sentences translated in zh_CN and ja under /usr/share/locale, need more")
    found: dict[str, set[tuple[int, str]]] = {}
    changed_shingles: dict[str, float] = {}
    for code in ("en", *LOCALES):
        docs, changed = [], []
        for b in range(BASES):
            base = sents[code][b * SENTENCES : (b + 1) * SENTENCES]
            variants = planted(code, base, sents["en"][b * SENTENCES : (b + 1) * SENTENCES], b)
            text = document(code, base)
            docs.append(Document(f"{b}", text, "web", {"language": code}))
            docs += [Document(f"{b}-{kind}", edited, "web", {"language": code}) for kind, edited in variants.items()]
            sets = [shingle_set(t, MinHashConfig().ngram, language=code) for t in (text, variants["change_char"])]
            changed.append(len(np.setxor1d(*sets)))
        changed_shingles[code] = float(np.mean(changed))
        pairs = near_pairs(docs, tmp_path / code)
        assert all(x.split("-")[0] == y.split("-")[0] for x, y in pairs), f"{code}: a pair of two bases: {pairs}"
        found[code] = {(b, kind) for b in range(BASES) for kind in EDITS if (f"{b}", f"{b}-{kind}") in pairs}
        assert not {kind for _, kind in found[code]} & {"drop_paragraph"}, code
    # English finds the planted near-duplicates (so equal counts below mean something), and Chinese and
    # Japanese find the same ones, give or take one pair
    assert len(found["en"]) >= BASES * 3 - 1, sorted(found["en"])
    for code in LOCALES:
        assert len(found[code] ^ found["en"]) <= 1, (code, sorted(found[code] ^ found["en"]))
    # a changed word costs its n-grams in every language: 5 lost and 5 new (fewer where one recurs)
    assert 8 <= changed_shingles["en"] <= 10, changed_shingles
    assert all(abs(changed_shingles[code] - changed_shingles["en"]) <= 2 for code in LOCALES), changed_shingles
