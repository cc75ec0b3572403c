"""The encoders a Hugging Face tokenizer can run on, and the pick of the fastest one that is exact.

Hugging Face `tokenizers` defines the ids (it is what transformers' AutoTokenizer runs), so it is
the reference and the last resort. Two faster libraries read the same vocabularies:
  splintr   any `tokenizer.json` (byte-level BPE, SentencePiece-style BPE, WordPiece, Unigram);
            its ordinary encode keeps the post-processor's template, which is cut off here
  tiktoken  byte-level BPE whose pre-split is one regex (GPT-2's ByteLevel, or a Split then
            ByteLevel as Llama 3 and Qwen2 ship), after the file's NFC normaliser if it has one
Whether a faster library gives the same ids is not decided from the file's shape (merge rules
and pre-split details differ in ways no field names): each candidate encodes PROBE and every
vocabulary token's text run together, and the first one, in speed order, whose ids equal the
reference's on all of it is used. Every encoder here encodes special-token spellings in text
as plain text, adds no template tokens, gives [] for "", and replaces lone surrogates (which
UTF-8 cannot carry) by U+FFFD.
Each encoder also encodes a batch into flat numpy arrays (ids run together, each text's count),
so the tokenize stage builds no Python int per token. splintr's batch call is the flat form of
its templated, special-matching encode, so the template is cut off and a text whose ids hold an
added token's (a spelling it matched) is encoded again by the per-text call; the probe checks the
batch call too, and an encoder whose batch call differs batches its per-text call.

Not handled here: the tokenizer's files, specials and document boundaries
(kiln.text.hf_tokenizer), kiln's own tokenizers (kiln.text.tokenizer, which pick with tiktoken
as the reference), Rayon's thread count for splintr's batch call (the tokenize stage sets it).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

import numpy as np
import splintr
import tiktoken
from tokenizers import Tokenizer

from kiln.text.byte_level import token_to_bytes

Flat = tuple[np.ndarray, np.ndarray]  # a batch's ids run together, and each text's count (int64)

# Scripts, digits, whitespace runs, emoji sequences, controls and special-token spellings.
PROBE = (
    "Hello, world! It's 2024; we'll pay $1,234.56 (≈ €1.1k).\n\n\tdef f(x):\r\n        return x**2  # note\n"
    "Grüße aus München — ÇA COÛTE 12,50 €. Ελληνικά, русский, עברית, العربية, हिन्दी, 東京は日本の首都です。"
    "한국어 🙂🙃 👩‍💻 🇫🇷 👍🏽 e\u0301 ﬁ ＡＢＣ   many   spaces\u00a0nbsp \x00\x1b[0m\u200b end. "
    "<|endoftext|> <s> </s> [CLS] [SEP] <unk> <|im_start|> <mask> ▁word ##ing 0x41 <0x41> "
    # Runs of characters few vocabularies hold, next to digits and markup: unknown pieces fuse or not.
    "8<unk>9 ⱥ𝔘ᚠ8<q>7 ꙮ₿ \U0001fae0\U000e0041x "
    # Every CJK ideograph block (BERT's normaliser isolates each such character) against digits.
    "0\u4e001\u34002\U000200003\U0002a7004\U0002b7405\U0002b8206\U0002ceb07\U000309008\uf9009\U0002f800 "
)


@dataclass(frozen=True)
class Encoder:
    """One library's exact encode of a tokenizer: content ids only, specials in text as text; encode_flat
    gives the same ids for a batch of texts as flat arrays."""

    name: str
    encode: Callable[[str], list[int]]
    encode_flat: Callable[[list[str]], Flat]


def scrubbed(text: str) -> str:
    """text with each lone surrogate replaced by U+FFFD (a high+low pair becomes the character it spells)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def packed(rows: list[list[int]]) -> Flat:
    """Lists of ids as one flat batch."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum())), lengths


def flat_of(encode: Callable[[str], list[int]]) -> Callable[[list[str]], Flat]:
    """A batch call that runs `encode` per text and packs the lists (for a library with no flat batch call)."""
    return lambda texts: packed([encode(t) for t in texts])


def reference(hf: Tokenizer) -> Encoder:
    """`tokenizers` itself (hf with encode_special_tokens set)."""

    def encode(text: str) -> list[int]:
        return hf.encode(scrubbed(text), add_special_tokens=False).ids if text else []

    return Encoder("tokenizers", encode, flat_of(encode))


def template(hf: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after one text's content (Llama's <s>, BERT's [CLS] [SEP])."""
    content = hf.encode("a", add_special_tokens=False).ids
    full = hf.encode("a", add_special_tokens=True).ids
    for at in range(len(full) - len(content) + 1):
        if full[at : at + len(content)] == content:
            return full[:at], full[at + len(content) :]
    return [], []


def added_ids(hf: Tokenizer) -> np.ndarray:
    """A table over ids, True at each added token's (special or not)."""
    ids = list(hf.get_added_tokens_decoder())
    table = np.zeros(max([hf.get_vocab_size(), *(i + 1 for i in ids)]), dtype=bool)
    table[ids] = True
    return table


def without_template(ids: np.ndarray, ends: np.ndarray, start: int, cut: int) -> Flat:
    """Rows of a flat batch (ends: each row's end, after a leading 0) with `start` ids cut from each row's
    front and `cut` from its back."""
    lengths = np.diff(ends)
    if not start and not cut:
        return ids, lengths
    keep = np.ones(ids.size, dtype=bool)
    for k in range(start):
        keep[ends[:-1] + k] = False
    for k in range(1, cut + 1):
        keep[ends[1:] - k] = False
    return ids[keep], lengths - start - cut


def with_splintr(tokenizer_json: bytes, hf: Tokenizer) -> Encoder:
    sp = splintr.from_json_bytes(tokenizer_json)
    head, tail = template(hf)
    start, cut = len(head), len(tail)
    added = added_ids(hf)
    span = np.flatnonzero(added)[[0, -1]].astype(np.uint32) if added.any() else np.empty(0, dtype=np.uint32)

    def ordinary(text: str) -> list[int]:
        if not text:
            return []
        try:
            ids = sp.encode_ordinary(text)
        except UnicodeEncodeError:  # a lone surrogate
            ids = sp.encode_ordinary(scrubbed(text))
        return ids[start : len(ids) - cut]

    # tokenizers matches non-special added tokens (Qwen2.5's <tool_call>) in text even with specials
    # split; splintr's ordinary encode matches none, so they are cut out first (the probe spells them).
    plain = {t.content: i for i, t in hf.get_added_tokens_decoder().items() if not t.special}
    encode = split_at(plain, ordinary) if plain else ordinary

    def encode_batch(texts: list[str]) -> Flat:
        # perf: one call, two bytes objects back; 100 MB/s on one thread against 60 for encode_ordinary per
        # text (kiln's 8,192-token demo tokenizer, demo corpus). The ids are template + content.
        try:
            ids, ends = sp.encode_batch_flat(texts)
        except UnicodeEncodeError:
            ids, ends = sp.encode_batch_flat([scrubbed(t) for t in texts])
        ends_ = np.frombuffer(ends, dtype="<u8").astype(np.int64)
        return without_template(np.frombuffer(ids, dtype="<u4"), ends_, start, cut)

    def encode_flat(texts: list[str]) -> Flat:
        # subtle: the batch call matches added tokens spelled in text, so a row holding an added token's id (rare
        # outside documents about tokenizers) is encoded again by encode; "" would get the bare template and stays
        # out.
        filled = [i for i, t in enumerate(texts) if t]
        ids, got = encode_batch([texts[i] for i in filled])
        lengths = np.zeros(len(texts), dtype=np.int64)
        lengths[filled] = got
        # perf: most tokenizers keep their added ids in one run at the vocabulary's start or end; one range check
        # over that span skips the table lookup (a gather as costly as the regex) for nearly every batch.
        if not span.size or not ((ids - span[0]) <= span[1] - span[0]).any():
            return ids, lengths
        hit = added[ids]
        if not hit.any():
            return ids, lengths
        again = set(np.repeat(np.arange(len(texts)), lengths)[hit].tolist())
        batched = np.split(ids, np.cumsum(lengths)[:-1])
        rows = [np.array(encode(t), dtype=np.uint32) if i in again else batched[i] for i, t in enumerate(texts)]
        return np.concatenate(rows), np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))

    return Encoder("splintr", encode, encode_flat)


def split_at(tokens: dict[str, int], encode: Callable[[str], list[int]]) -> Callable[[str], list[int]]:
    """encode, with each spelling of `tokens` in the text (longest first, leftmost) taken as its id."""
    pattern = re.compile("|".join(map(re.escape, sorted(tokens, key=len, reverse=True))))

    def split(text: str) -> list[int]:
        out: list[int] = []
        at = 0
        for found in pattern.finditer(text):
            out += encode(text[at : found.start()])
            out.append(tokens[found.group()])
            at = found.end()
        return out + encode(text[at:])

    return split


def with_tiktoken(data: dict[str, Any], hf: Tokenizer) -> Encoder | None:
    """tiktoken over the same ranks and pre-split regex; None when the file's pipeline is not one regex
    then bytes (another normaliser, a byte-level pre-split with a prefix space, subword affixes)."""
    model, pre, norm = data.get("model") or {}, data.get("pre_tokenizer") or {}, data.get("normalizer")
    if model.get("type") != "BPE" or model.get("dropout") or model.get("continuing_subword_prefix"):
        return None
    if model.get("end_of_word_suffix") or (norm is not None and norm.get("type") != "NFC"):
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"):
        pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    elif (
        pre.get("type") == "Sequence"
        and [p.get("type") for p in pre["pretokenizers"]] == ["Split", "ByteLevel"]
        and "Regex" in pre["pretokenizers"][0].get("pattern", {})
        and pre["pretokenizers"][0].get("behavior") == "Isolated"
        and not pre["pretokenizers"][0].get("invert")
        and not pre["pretokenizers"][1].get("use_regex", True)
        and not pre["pretokenizers"][1].get("add_prefix_space")
    ):
        pattern = pre["pretokenizers"][0]["pattern"]["Regex"]
    else:
        return None
    added = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    if any(not t.get("special") for t in data.get("added_tokens", [])):
        return None  # a non-special added token is matched in text before the pre-split
    ranks: dict[bytes, int] = {}
    for token, i in model["vocab"].items():
        raw = token_to_bytes(token)
        if raw is None:
            if token in added:
                continue
            return None
        ranks[raw] = i
    if any(bytes([b]) not in ranks for b in range(256)):
        return None
    # tiktoken applies merges in the order of the ids they make, tokenizers in the order of `merges`.
    made = [model["vocab"].get("".join(m) if isinstance(m, list) else m.replace(" ", "", 1)) for m in model["merges"]]
    if None in made or any(a > b for a, b in zip(made, made[1:])):
        return None
    enc = tiktoken.Encoding(f"hf-{len(ranks)}", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    if norm is not None:

        def encode(text: str) -> list[int]:
            return enc.encode_ordinary(unicodedata.normalize("NFC", text))

        return Encoder("tiktoken", encode, flat_of(encode))
    return Encoder("tiktoken", enc.encode_ordinary, flat_of(enc.encode_ordinary))


def probe_texts(hf: Tokenizer) -> list[str]:
    """PROBE, then every vocabulary token's text in id order, run together 64 at a time."""
    texts = [PROBE, PROBE * 3]
    pieces = [hf.decode([i], skip_special_tokens=True) for i in range(hf.get_vocab_size())]
    texts += ["".join(pieces[i : i + 64]) for i in range(0, len(pieces), 64)]
    texts += [" ".join(pieces[i : i + 64]) for i in range(0, len(pieces), 64)]
    return texts


def agrees(candidate: Encoder, texts: list[str], expected: list[list[int]]) -> bool:
    return all(candidate.encode(t) == ids for t, ids in zip(texts, expected, strict=True))


def flat_agrees(candidate: Encoder, texts: list[str], expected: list[list[int]]) -> bool:
    ids, lengths = candidate.encode_flat(texts)
    return lengths.tolist() == list(map(len, expected)) and ids.tolist() == list(chain.from_iterable(expected))


def holds(check: Callable[[Encoder, list[str], list[list[int]]], bool], *args: Any) -> bool:
    """check(*args), with the library failing on the probe counted as False."""
    try:
        return check(*args)
    except BaseException as e:  # a Rust panic in the library arrives as a BaseException of its own
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False


def built(build: Callable[[], Encoder | None]) -> Encoder | None:
    """build(), or None when the library fails on the file (a Rust panic included)."""
    try:
        return build()
    except BaseException as e:  # a Rust panic in the library arrives as a BaseException of its own
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return None


def pick(tokenizer_json: bytes, hf: Tokenizer, exact: Encoder | None = None) -> Encoder:
    """The fastest encoder whose ids equal exact's on the probe texts, exact itself when none does (hf:
    tokenizer_json loaded, with encode_special_tokens set; exact: `tokenizers` itself when None). A candidate
    of exact's own library is not tried; one whose batch call differs batches its per-text call."""
    exact = exact or reference(hf)
    texts = probe_texts(hf)
    expected = [exact.encode(t) for t in texts]
    builds = {
        "splintr": lambda: with_splintr(tokenizer_json, hf),
        "tiktoken": lambda: with_tiktoken(json.loads(hf.to_str()), hf),
    }
    for name, build in builds.items():
        if name == exact.name:
            continue
        candidate = built(build)
        if candidate is None:  # a file the library cannot read, or does not read as tokenizers does
            continue
        if holds(agrees, candidate, texts, expected):
            if holds(flat_agrees, candidate, texts, expected):
                return candidate
            return replace(candidate, encode_flat=flat_of(candidate.encode))
    return exact
