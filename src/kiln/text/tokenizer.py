"""kiln's tokenizer: a byte-level BPE kept as a Hugging Face `tokenizer.json`, encoded by the fastest exact library.

Byte-level means every string encodes (no unknown token) and decodes back exactly. The pre-split
regex is GPT-4 style: contractions, letters with one leading non-letter, numbers in groups of at
most 3 digits, punctuation runs, and newlines apart from other whitespace. Special tokens take
the first ids (end of document, padding, mask, FIM prefix/middle/suffix, sentinels, reserved);
text that spells one ("<|endoftext|>" in a document) is encoded as plain text, never as the id.

Several encoders, one result. `tokenizer.json` is written so that Hugging Face `tokenizers` follows
tiktoken's rule: `ignore_merges` (a pre-split piece that is a whole vocabulary entry is one
token) and merges completed, so every split of a token into two tokens is a merge ranked by the
token's id. tiktoken built from the same vocabulary gives the ids (several times faster than
`tokenizers`' `encode_batch`); on first use, splintr reading the same file is checked against it
on a fixed probe (kiln.text.engines.pick) and encodes instead when its ids are equal, about 3x
faster than tiktoken on one thread (5x through its flat batch call; benchmarks/tokenize_speed.py).
A `kiln_tokenizer.json` beside it carries the format version, the specials and the hash of
`tokenizer.json`, so a file from another tool, another version or edited by hand is refused.

Lone surrogates (possible in a Python str, impossible in UTF-8) are replaced by U+FFFD before
encoding, by every encoder, so decode(encode(x)) == x for every x without them.
Not handled here: adding terms (extend.py), training on a corpus and reports (train.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken
import xxhash
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from kiln.core.errors import FatalError
from kiln.core.layout import TOKENIZER_META
from kiln.text.byte_level import token_to_bytes
from kiln.text.engines import Encoder, Flat, flat_of, pick
from kiln.text.specials import EOT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, FIXED_SPECIALS, MASK, PAD

SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| "
    r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
FORMAT, VERSION = "kiln-tokenizer", 2
META_NAME = TOKENIZER_META  # beside tokenizer.json


def file_hash(path: Path) -> str:
    return xxhash.xxh3_64_hexdigest(Path(path).read_bytes())


class KilnTokenizer:
    """Encode/decode, the special ids, and the files kiln writes (`tokenizer.json` + `kiln_tokenizer.json`).

    A document is its text then end of document, no beginning-of-sequence token: each one starts
    after the previous one's end."""

    kind = "kiln"
    bos_id = None
    prepends_space = False  # a leading space is part of the word's piece

    def __init__(self, hf: Tokenizer, specials: Sequence[str], path: Path | None = None):
        self.hf = hf
        # subtle: a document that merely mentions "<|endoftext|>" must not get a document boundary;
        # special ids come only from kiln itself (the encoder appends end-of-document by id).
        self.hf.encode_special_tokens = True
        self.path = path
        where = path or "tokenizer"
        vocab = hf.get_vocab()
        missing = [s for s in dict.fromkeys([*FIXED_SPECIALS, *specials]) if s not in vocab]
        if missing:
            raise FatalError(
                f"{where}: special tokens {missing[:5]} are missing; it was not made by `kiln train-tokenizer`, "
                "retrain it"
            )
        self.specials = {s: vocab[s] for s in dict.fromkeys([*FIXED_SPECIALS, *specials])}
        ranks: dict[bytes, int] = {}
        for token, i in vocab.items():
            if token in self.specials:
                continue
            raw = token_to_bytes(token)
            if raw is None:
                raise FatalError(
                    f"{where}: token {token!r} (id {i}) is not byte-level BPE; kiln reads only tokenizers made by "
                    "`kiln train-tokenizer`"
                )
            ranks[raw] = i
        if len(ranks) + len(self.specials) != len(vocab) or any(bytes([b]) not in ranks for b in range(256)):
            raise FatalError(
                f"{where}: the vocabulary lacks some of the 256 byte tokens or repeats a token; retrain it with "
                "`kiln train-tokenizer`"
            )
        # tiktoken builds its own regex and rank table from these; construction takes ~0.1 s per 32k tokens.
        self.fast = tiktoken.Encoding(
            f"kiln-{len(vocab)}", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=self.specials
        )
        self.eot_id, self.pad_id, self.mask_id = self.specials[EOT], self.specials[PAD], self.specials[MASK]
        self.fim_ids = (self.specials[FIM_PREFIX], self.specials[FIM_MIDDLE], self.specials[FIM_SUFFIX])
        self.sentinel_ids = [i for s, i in self.specials.items() if s.startswith("<|sentinel_")]
        self.encoder: Encoder | None = None

    def _encoder(self) -> Encoder:
        if self.encoder is None:  # picked on first use (about 0.1 s for 8k tokens): saving needs no encoder
            # tiktoken replaces lone surrogates by U+FFFD itself (the documented replacement).
            exact = Encoder("tiktoken", self.fast.encode_ordinary, flat_of(self.fast.encode_ordinary))
            self.encoder = pick(self.hf.to_str().encode("utf-8"), self.hf, exact)
        return self.encoder

    @property
    def encoder_name(self) -> str:
        return self._encoder().name

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._encoder().encode(text)

    def encode_batch(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        """One list of ids per text; threads > 1 runs tiktoken's encoder on that many threads (it releases the GIL)."""
        if threads > 1:
            return self.fast.encode_ordinary_batch(texts, num_threads=threads)
        encode = self._encoder().encode
        return [encode(t) for t in texts]

    def encode_flat(self, texts: list[str]) -> Flat:
        """The texts' ids run together and each text's count, as numpy arrays (no Python int per token)."""
        return self._encoder().encode_flat(texts)

    def document(self, text: str) -> list[int]:
        """One document's ids: the text, then end of document."""
        return [*self.encode(text), self.eot_id]

    def describe(self) -> str:
        return f"no bos + text + {EOT} (id {self.eot_id}), pad {PAD} (id {self.pad_id}); kiln's own convention"

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ids; a sequence cut inside a multi-byte character shows U+FFFD there."""
        return self.fast.decode_bytes(list(ids)).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each id stands for (0 for special tokens), shape (vocab,). Bits per byte sums these."""
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for token, i in self.hf.get_vocab().items():
            out[i] = 0 if token in self.specials else len(token)  # one alphabet character per byte
        return out

    def save(self, path: Path) -> list[Path]:
        """Write `tokenizer.json` at path and `kiln_tokenizer.json` beside it; returns both."""
        path = Path(path)
        self.hf.save(str(path))
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "pattern": SPLIT_PATTERN,
            "vocab_size": self.vocab_size,
            "specials": self.specials,
            "tokenizer_json_xxh3": file_hash(path),
        }
        meta_path = path.with_name(META_NAME)
        meta_path.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        self.path = path
        return [path, meta_path]

    @classmethod
    def load(cls, path: Path) -> KilnTokenizer:
        path = Path(path)
        meta_path = path.with_name(META_NAME)
        if not path.is_file():
            raise FatalError(f"{path}: no such tokenizer; run `kiln train-tokenizer` first")
        if not meta_path.is_file():
            raise FatalError(
                f"{path}: no {META_NAME} beside it, so it was written by another tool or by a kiln older than "
                f"tokenizer format v{VERSION}; kiln needs its own pre-split and special tokens: run `kiln "
                "train-tokenizer --force`"
            )
        meta = _read_meta(meta_path)
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise FatalError(
                f"{meta_path}: tokenizer format {meta.get('format')!r} v{meta.get('version')}, this kiln reads "
                f"{FORMAT} v{VERSION}; rerun `kiln train-tokenizer --force`"
            )
        if meta.get("tokenizer_json_xxh3") != file_hash(path):
            raise FatalError(
                f"{path}: changed since kiln wrote it (its hash differs from {META_NAME}); rerun `kiln "
                "train-tokenizer --force`, or `kiln extend-tokenizer` to add terms"
            )
        if meta.get("pattern") != SPLIT_PATTERN:
            raise FatalError(
                f"{meta_path}: written with another pre-split pattern; rerun `kiln train-tokenizer --force`"
            )
        try:
            hf = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise FatalError(
                f"{path}: cannot load as a tokenizers JSON file ({e}); rerun `kiln train-tokenizer --force`"
            ) from None
        tok = cls(hf, list(meta["specials"]), path)
        if tok.specials != meta["specials"]:
            raise FatalError(f"{path}: special token ids differ from {META_NAME}; rerun `kiln train-tokenizer --force`")
        return tok


def adopt(path: Path) -> KilnTokenizer:
    """A kiln tokenizer from a `tokenizer.json` without kiln's meta file beside it (as in a Hugging
    Face folder `kiln export` wrote): accepted when it is kiln's kind of tokenizer (byte-level BPE
    with kiln's pre-split, tiktoken's merge rule and kiln's special tokens), so that kiln encodes
    text to the ids the model was trained on; FatalError naming what differs otherwise."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
        data = json.loads(text)
        hf = Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise FatalError(f"{where}: cannot read it as a tokenizers JSON file ({e})") from None
    if differ := differences(data):
        raise FatalError(
            f"{where}: not a tokenizer kiln made ({'; '.join(differ)}); kiln can read a Hugging Face folder only "
            "with the tokenizer `kiln export` wrote"
        )
    specials = [t["content"] for t in sorted(data.get("added_tokens", []), key=lambda t: t["id"]) if t.get("special")]
    return KilnTokenizer(hf, specials)


def differences(data: Any) -> list[str]:
    """How a parsed tokenizer.json differs from the kind kiln trains (none: kiln's own, as `kiln export` wrote it)."""
    if not isinstance(data, dict):
        return ["not a JSON object"]
    probe = Tokenizer(models.BPE())
    probe.pre_tokenizer = kiln_pre_tokenizer()
    model = data.get("model") or {}
    differ = []
    if model.get("type") != "BPE":
        differ.append(f"model type {model.get('type')!r}, not BPE")
    if data.get("pre_tokenizer") != json.loads(probe.to_str())["pre_tokenizer"]:
        differ.append("another pre-split (kiln splits with its own regex, then maps bytes to the byte-level alphabet)")
    if not model.get("ignore_merges"):
        differ.append("merges without tiktoken's rule (ignore_merges false)")
    if not all(t.get("content") in (model.get("vocab") or {}) for t in data.get("added_tokens", [])):
        differ.append("added tokens outside the BPE vocabulary")
    if missing := [t for t in FIXED_SPECIALS if t not in (model.get("vocab") or {})]:
        differ.append(f"no {', '.join(missing)}")
    return differ


def _read_meta(meta_path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise FatalError(f"{meta_path}: not valid JSON ({e}); rerun `kiln train-tokenizer --force`") from None
    if not isinstance(meta, dict):
        raise FatalError(f"{meta_path}: expected a JSON object; rerun `kiln train-tokenizer --force`")
    return meta


def tiktoken_rules(tokenizer_json: dict[str, Any]) -> dict[str, Any]:
    """The same BPE, rewritten to follow tiktoken's rule (module docstring); returns the new JSON.

    Merges are ordered by the id of the token they make (trained order for a token's first
    merge); each token gains a merge for every other split into two vocabulary tokens.
    """
    model = tokenizer_json["model"]
    vocab: dict[str, int] = model["vocab"]
    specials = {t["content"] for t in tokenizer_json.get("added_tokens", [])}
    trained: dict[str, list[tuple[str, str]]] = {}
    for left, right in model["merges"]:
        trained.setdefault(left + right, []).append((left, right))
    merges = []
    # Every multi-byte token, not only trained ones: a token added later (extend.py) has no merge
    # yet, and tiktoken would still build it inside a longer word. Specials are never built.
    for token in sorted((t for t in vocab if len(t) > 1 and t not in specials), key=vocab.__getitem__):
        pairs = list(trained.get(token, []))
        pairs += [
            (token[:i], token[i:])
            for i in range(1, len(token))
            if token[:i] in vocab and token[i:] in vocab and (token[:i], token[i:]) not in pairs
        ]
        merges += [list(p) for p in pairs]
    model["merges"] = merges
    model["ignore_merges"] = True
    return tokenizer_json


def kiln_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """The pre-split every kiln tokenizer has: SPLIT_PATTERN's pieces, then bytes to the byte alphabet."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int, specials: Sequence[str]) -> KilnTokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = kiln_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so nothing is ever unknown
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    rewritten = tiktoken_rules(json.loads(tok.to_str()))
    return KilnTokenizer(Tokenizer.from_str(json.dumps(rewritten)), specials)
