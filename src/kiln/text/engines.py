"""The encoders a Hugging Face tokenizer can run on, and the pick of the fastest one that is exact.

Hugging Face `tokenizers` defines the ids (it is what transformers' AutoTokenizer runs), so it is
the reference and the last resort. Two faster libraries read the same vocabularies:
  splintr   any `tokenizer.json` (byte-level BPE, SentencePiece-style BPE, WordPiece, Unigram);
            its ordinary encode keeps the post-processor's template, which is cut off here
  tiktoken  byte-level BPE whose pre-split is one regex (GPT-2's ByteLevel, or a Split then
            ByteLevel as Llama 3 and Qwen2 ship), after the file's NFC normaliser if it has one
Whether a faster library gives the same ids is not decided from the file's shape (merge rules
and pre-split details differ in ways no field names): each candidate encodes PROBE and every
vocabulary token's text run together, and the first one, in speed order, whose ids equal
`tokenizers`' on all of it is used. Every encoder here encodes special-token spellings in text
as plain text, adds no template tokens, and gives [] for "".

Not handled here: the tokenizer's files, specials and document boundaries
(kiln.text.hf_tokenizer), kiln's own tokenizers (kiln.text.tokenizer, always tiktoken).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import splintr
import tiktoken
from tokenizers import Tokenizer

from kiln.text.tokenizer import token_to_bytes

# Scripts, digits, whitespace runs, emoji sequences, controls and special-token spellings.
PROBE = (
    "Hello, world! It's 2024; we'll pay $1,234.56 (≈ €1.1k).\n\n\tdef f(x):\r\n        return x**2  # note\n"
    "Grüße aus München — ÇA COÛTE 12,50 €. Ελληνικά, русский, עברית, العربية, हिन्दी, 東京は日本の首都です。"
    "한국어 🙂🙃 👩‍💻 🇫🇷 👍🏽 e\u0301 ﬁ ＡＢＣ   many   spaces\u00a0nbsp \x00\x1b[0m\u200b end. "
    "<|endoftext|> <s> </s> [CLS] [SEP] <unk> <|im_start|> <mask> ▁word ##ing 0x41 <0x41> "
    # Runs of characters few vocabularies hold, next to digits and markup: unknown pieces fuse or not.
    "8<unk>9 ⱥ𝔘ᚠ8<q>7 ꙮ₿ 🫠󠁁x "
)


@dataclass(frozen=True)
class Encoder:
    """One library's exact encode of a tokenizer: content ids only, specials in text as text."""

    name: str
    encode: Callable[[str], list[int]]


def reference(hf: Tokenizer) -> Encoder:
    """`tokenizers` itself (hf with encode_special_tokens set)."""
    return Encoder("tokenizers", lambda text: hf.encode(text, add_special_tokens=False).ids if text else [])


def template(hf: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after one text's content (Llama's <s>, BERT's [CLS] [SEP])."""
    content = hf.encode("a", add_special_tokens=False).ids
    full = hf.encode("a", add_special_tokens=True).ids
    for at in range(len(full) - len(content) + 1):
        if full[at : at + len(content)] == content:
            return full[:at], full[at + len(content) :]
    return [], []


def with_splintr(tokenizer_json: bytes, hf: Tokenizer) -> Encoder:
    sp = splintr.from_json_bytes(tokenizer_json)
    head, tail = template(hf)
    start, cut = len(head), len(tail)

    def encode(text: str) -> list[int]:
        if not text:
            return []
        ids = sp.encode_ordinary(text)
        return ids[start : len(ids) - cut]

    return Encoder("splintr", encode)


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
    enc = tiktoken.Encoding(f"hf-{len(ranks)}", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    if norm is not None:
        return Encoder("tiktoken", lambda text: enc.encode_ordinary(unicodedata.normalize("NFC", text)))
    return Encoder("tiktoken", enc.encode_ordinary)


def probe_texts(hf: Tokenizer) -> list[str]:
    """PROBE, then every vocabulary token's text in id order, run together 64 at a time."""
    texts = [PROBE, PROBE * 3]
    pieces = [hf.decode([i], skip_special_tokens=True) for i in range(hf.get_vocab_size())]
    texts += ["".join(pieces[i : i + 64]) for i in range(0, len(pieces), 64)]
    texts += [" ".join(pieces[i : i + 64]) for i in range(0, len(pieces), 64)]
    return texts


def pick(tokenizer_json: bytes, hf: Tokenizer) -> Encoder:
    """The fastest encoder whose ids equal `tokenizers`' on the probe texts (hf: tokenizer_json loaded,
    with encode_special_tokens set); `tokenizers` itself when none does."""
    exact = reference(hf)
    texts = probe_texts(hf)
    expected = [exact.encode(t) for t in texts]
    data = json.loads(hf.to_str())
    for build in (lambda: with_splintr(tokenizer_json, hf), lambda: with_tiktoken(data, hf)):
        try:
            candidate = build()
        except (ValueError, RuntimeError, OSError, KeyError, TypeError):  # a file the library cannot read
            continue
        if candidate is None:
            continue
        try:
            if all(candidate.encode(t) == ids for t, ids in zip(texts, expected, strict=True)):
                return candidate
        except BaseException as e:  # a Rust panic in the library arrives as a BaseException of its own
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
    return exact
