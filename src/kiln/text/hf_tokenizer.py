"""A tokenizer from a Hugging Face folder, kept as it came, with the document boundaries its model was trained with.

The folder's files (tokenizer.json, and tokenizer_config.json and special_tokens_map.json where
present) are kept byte for byte, so an export hands them back unchanged; `kiln_tokenizer.json`
beside them records their hashes and the boundaries in use. Any model `tokenizers` reads works:
byte-level BPE (GPT-2, Llama 3, Qwen2 pre-splits), SentencePiece-style BPE with byte fallback
(Llama 2, Mistral, TinyLlama), WordPiece and Unigram. Ids are `tokenizers`' (what transformers'
AutoTokenizer gives with split_special_tokens), encoded by the fastest library that is exact
for this file (kiln.text.engines). Text that spells a special token is encoded as text.

Boundaries, read from the folder and overridable (tokenizer.boundaries in the recipe):
  bos  prepended to every document when the tokenizer adds one: tokenizer_config.json's
       add_bos_token where it says, otherwise the first token of the post-processor's template
  eos  appended to every document: eos_token, else the template's last token (BERT's [SEP])
  pad  pad_token, else eos (many open models name none)
The specials objectives need (mask, FIM prefix/middle/suffix, span sentinels) are looked up by
their usual spellings; an objective that needs one the vocabulary lacks stops before any work.
Bytes per token (bits per byte): the byte-level alphabet undone, `<0xNN>` as one byte, `▁` as a
space, WordPiece's `##` dropped; for WordPiece and Unigram, whose normalisers change the text,
this is the bytes of the normalised text.
Not handled here: kiln's own tokenizers (kiln.text.tokenizer), choosing the encoder (kiln.text.engines).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from tokenizers import Tokenizer

from kiln.core.errors import FatalError
from kiln.core.layout import TOKENIZER_META
from kiln.text.byte_level import token_to_bytes
from kiln.text.engines import Encoder, Flat, pick, template
from kiln.text.specials import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, MASK, sentinel

FORMAT, VERSION = "kiln-hf-tokenizer", 1
TOKENIZER_JSON, CONFIG, SPECIAL_MAP = "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"
FOLDER_FILES = (TOKENIZER_JSON, CONFIG, SPECIAL_MAP)
MODEL_CONFIG = "config.json"
ORIGIN_FILES = (MODEL_CONFIG, "generation_config.json")  # the model folder's, kept as `origin-<name>`
ORIGIN = "origin-"
FIM_SPELLINGS = ((FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX), ("<fim_prefix>", "<fim_middle>", "<fim_suffix>"))
MASK_SPELLINGS = (MASK, "<mask>", "[MASK]")


@dataclass(frozen=True)
class Boundaries:
    """The spellings of the tokens around each document (bos None: none), and where each came from."""

    bos: str | None
    eos: str
    pad: str
    origin: str
    set: bool = False  # the recipe's (tokenizer.boundaries), not the folder's

    def describe(self, ids: dict[str, int]) -> str:
        bos = f"{self.bos} (id {ids[self.bos]})" if self.bos else "no bos"
        return f"{bos} + text + {self.eos} (id {ids[self.eos]}), pad {self.pad} (id {ids[self.pad]}); {self.origin}"


def role(value: Any) -> str | None:
    """A role's spelling in tokenizer_config.json: a string, or an AddedToken object with its content."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def model_role(hf: Tokenizer, model_config: dict[str, Any], key: str) -> str | None:
    """The spelling of config.json's `key` (eos_token_id, pad_token_id: an id, or a list whose first counts)."""
    value = model_config.get(key)
    value = value[0] if isinstance(value, list) and value else value
    return hf.id_to_token(value) if isinstance(value, int) and not isinstance(value, bool) else None


def folder_boundaries(hf: Tokenizer, config: dict[str, Any], model_config: dict[str, Any], where: str) -> Boundaries:
    """The boundaries the folder's files give its model (module docstring); FatalError when no eos is named.
    config: tokenizer_config.json over special_tokens_map.json; model_config: config.json, for the ids it names."""
    head, tail = template(hf)
    roles = {k: role(config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "sep_token")}
    roles["eos_token"] = roles["eos_token"] or model_role(hf, model_config, "eos_token_id")
    roles["pad_token"] = roles["pad_token"] or model_role(hf, model_config, "pad_token_id")
    if isinstance(config.get("add_bos_token"), bool):
        bos = roles["bos_token"] if config["add_bos_token"] else None
        bos_origin = f"add_bos_token {str(config['add_bos_token']).lower()}"
    else:
        bos = hf.id_to_token(head[0]) if head else None
        bos_origin = "the template adds bos" if head else "the template adds no bos"
    eos = roles["eos_token"] or (hf.id_to_token(tail[-1]) if tail else None) or roles["sep_token"]
    if eos is None:
        raise FatalError(
            f"{where}: no end-of-document token (no eos_token in {CONFIG}, none in the template); name one with "
            "tokenizer.boundaries.eos"
        )
    pad = roles["pad_token"] or eos
    origin = f"from {CONFIG} ({bos_origin}{'' if roles['pad_token'] else ', no pad_token: pad is eos'})"
    return Boundaries(bos, eos, pad, origin)


class HfTokenizer:
    """Encode/decode, the special ids and boundaries, and the folder's files kept byte for byte."""

    kind = "hf"

    def __init__(
        self,
        files: dict[str, bytes],
        where: str,
        boundaries: Boundaries | None = None,
        origin: dict[str, bytes] | None = None,
    ):
        """files: FOLDER_FILES present, by name; origin: the model folder's config.json and
        generation_config.json as they came (an export keeps their keys); boundaries: the folder's when None."""
        self.files, self.origin, self.path = files, origin or {}, None
        self.where = where
        try:
            self.hf = Tokenizer.from_str(files[TOKENIZER_JSON].decode("utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise FatalError(f"{where}/{TOKENIZER_JSON}: not a tokenizer `tokenizers` reads ({e})") from None
        config, roles = json_object(files, CONFIG, where), json_object(files, SPECIAL_MAP, where)
        # As transformers reads them: special_tokens_map.json's roles over tokenizer_config.json's; a null is no role.
        self.config = {k: v for k, v in {**config, **roles}.items() if v is not None}
        self.hf.encode_special_tokens = True  # a document that spells "</s>" gets no boundary from it
        vocab = self.hf.get_vocab()
        try:
            model_config = json.loads(self.origin[MODEL_CONFIG]) if MODEL_CONFIG in self.origin else {}
        except ValueError:
            model_config = {}
        self.boundaries = boundaries or folder_boundaries(self.hf, self.config, model_config, where)
        unknown = [s for s in (self.boundaries.bos, self.boundaries.eos, self.boundaries.pad) if s and s not in vocab]
        if unknown:
            raise FatalError(f"{where}: boundary tokens {unknown} are not in the vocabulary")
        self.specials = {t.content: i for i, t in sorted(self.hf.get_added_tokens_decoder().items()) if t.special}
        for s in (self.boundaries.bos, self.boundaries.eos, self.boundaries.pad):
            if s:
                self.specials.setdefault(s, vocab[s])
        self.bos_id = vocab[self.boundaries.bos] if self.boundaries.bos else None
        self.eot_id, self.pad_id = vocab[self.boundaries.eos], vocab[self.boundaries.pad]
        mask = [role(self.config.get("mask_token")), *MASK_SPELLINGS]
        self.mask_id = next((vocab[m] for m in mask if m in vocab), None)
        fim = next((f for f in FIM_SPELLINGS if all(s in vocab for s in f)), None)
        self.fim_ids = tuple(vocab[s] for s in fim) if fim else None
        self.sentinel_ids = sentinel_ids(vocab)
        self.prepends_space = prepends_space(json.loads(files[TOKENIZER_JSON]))
        self.encoder: Encoder | None = None

    def _encoder(self) -> Encoder:
        if self.encoder is None:  # picked on first use: saving and copying need no encoder
            try:
                self.encoder = pick(self.files[TOKENIZER_JSON], self.hf)
            except Exception as e:  # tokenizers itself fails on the probe (a bare Exception)
                raise FatalError(f"{self.where}/{TOKENIZER_JSON}: `tokenizers` cannot encode with it ({e})") from None
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
        encode = self._encoder().encode
        return [encode(t) for t in texts]

    def encode_flat(self, texts: list[str]) -> Flat:
        """The texts' ids run together and each text's count, as numpy arrays (no Python int per token)."""
        return self._encoder().encode_flat(texts)

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def document(self, text: str) -> list[int]:
        """One document's ids with its boundaries: bos (when the model has one), the text, eos."""
        ids = self.encode(text)
        return [*([self.bos_id] if self.bos_id is not None else []), *ids, self.eot_id]

    def describe(self) -> str:
        return self.boundaries.describe(self.hf.get_vocab())

    def with_boundaries(self, bos: str | bool | None, eos: str | None, pad: str | None) -> HfTokenizer:
        """The same tokenizer with the recipe's overrides (None keeps the folder's; bos False: none)."""
        if bos is None and eos is None and pad is None:
            return self
        b = self.boundaries
        changed = replace(
            b,
            bos=b.bos if bos is None or bos is True else (bos or None),
            eos=eos or b.eos,
            pad=pad or b.pad,
            origin="tokenizer.boundaries in the recipe, over " + b.origin,
            set=True,
        )
        if bos is True:
            changed = replace(changed, bos=role(self.config.get("bos_token")))
            if changed.bos is None:
                raise FatalError(f"{self.where}: tokenizer.boundaries.bos true, but the folder names no bos_token")
        return HfTokenizer(self.files, self.where, changed, self.origin)

    def with_files(self, changed: dict[str, bytes]) -> HfTokenizer:
        """The same folder with `changed` (FOLDER_FILES by name) in place of its own, as kiln.tokenize.extend
        writes an extended vocabulary: the other files, the model folder's and the boundaries kept as they are."""
        return HfTokenizer({**self.files, **changed}, self.where, self.boundaries, self.origin)

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each id stands for (0 for special tokens), shape (vocab,); see the module docstring."""
        model = json.loads(self.files[TOKENIZER_JSON]).get("model", {})
        byte_level = "ByteLevel" in json.dumps(json.loads(self.files[TOKENIZER_JSON]).get("decoder"))
        prefix = model.get("continuing_subword_prefix") or ""
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for token, i in self.hf.get_vocab().items():
            if token in self.specials:
                continue
            raw = token_to_bytes(token) if byte_level else None
            if raw is not None:
                out[i] = len(raw)
            elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                out[i] = 1
            else:
                if prefix and token.startswith(prefix):
                    token = token[len(prefix) :]
                out[i] = len(token.replace("▁", " ").encode("utf-8"))
        return out

    def save(self, path: Path) -> list[Path]:
        """The folder's files unchanged beside `path` (its tokenizer.json), and kiln_tokenizer.json; returns all."""
        folder = Path(path).parent
        written = []
        for name, data in [*self.files.items(), *((ORIGIN + n, d) for n, d in self.origin.items())]:
            (folder / name).write_bytes(data)
            written.append(folder / name)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "files": {name: xxhash.xxh3_64_hexdigest(data) for name, data in self.files.items()},
            "origin": {name: xxhash.xxh3_64_hexdigest(data) for name, data in self.origin.items()},
            "boundaries": {
                "bos": self.boundaries.bos,
                "eos": self.boundaries.eos,
                "pad": self.boundaries.pad,
                "origin": self.boundaries.origin,
                "set": self.boundaries.set,
            },
            "vocab_size": self.vocab_size,
        }
        (folder / TOKENIZER_META).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        self.path = folder / TOKENIZER_JSON
        return [*written, folder / TOKENIZER_META]

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any]) -> HfTokenizer:
        """The tokenizer saved beside `path` whose kiln_tokenizer.json is `meta` (its format checked by the caller)."""
        folder = Path(path).parent
        files = read_checked(folder, meta.get("files") or {}, FOLDER_FILES, "")
        if TOKENIZER_JSON not in files:
            raise FatalError(f"{folder / TOKENIZER_META}: lists no {TOKENIZER_JSON}; import the model again")
        origin = read_checked(folder, meta.get("origin") or {}, ORIGIN_FILES, ORIGIN)
        b = meta.get("boundaries") or {}
        if not isinstance(b.get("eos"), str) or not isinstance(b.get("pad"), str):
            raise FatalError(f"{folder / TOKENIZER_META}: no boundaries.eos and .pad; import the model again")
        bounds = Boundaries(b.get("bos"), b["eos"], b["pad"], b.get("origin", ""), bool(b.get("set")))
        tok = cls(files, str(folder), bounds, origin)
        tok.path = folder / TOKENIZER_JSON
        return tok


def json_object(files: dict[str, bytes], name: str, where: str) -> dict[str, Any]:
    """files[name] parsed, {} when absent; FatalError naming the file when it is not one JSON object."""
    if name not in files:
        return {}
    try:
        value = json.loads(files[name])
    except (UnicodeDecodeError, ValueError) as e:
        raise FatalError(f"{where}/{name}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise FatalError(f"{where}/{name}: a JSON {type(value).__name__}, not an object of settings")
    return value


def read_checked(folder: Path, digests: dict[str, str], allowed: tuple[str, ...], prefix: str) -> dict[str, bytes]:
    """The files kiln_tokenizer.json lists (stored as prefix + name), each checked against its hash."""
    files: dict[str, bytes] = {}
    for name, digest in digests.items():
        path = folder / (prefix + name)
        if name not in allowed or not path.is_file():
            raise FatalError(f"{path}: missing or not a file kiln keeps with a tokenizer; import the model again")
        files[name] = path.read_bytes()
        if xxhash.xxh3_64_hexdigest(files[name]) != digest:
            raise FatalError(
                f"{path}: changed since kiln wrote it (its hash differs from {TOKENIZER_META}); import the model "
                "again, or `kiln extend-tokenizer` to add terms"
            )
    return files


def prepends_space(data: dict[str, Any]) -> bool:
    """Whether the file puts a word marker before the text (SentencePiece style: a Prepend("▁")
    normaliser, or a Metaspace pre-split that prepends): " word" alone then reads as two markers."""
    parts = json.dumps([data.get("normalizer"), data.get("pre_tokenizer")])
    return '"Prepend"' in parts or ('"Metaspace"' in parts and '"prepend_scheme": "never"' not in parts)


def sentinel_ids(vocab: dict[str, int]) -> list[int]:
    """Span-corruption sentinels in order: kiln's <|sentinel_i|> or T5's <extra_id_i>, as many as the vocabulary has."""
    for spell in (sentinel, lambda i: f"<extra_id_{i}>"):
        ids = []
        while spell(len(ids)) in vocab:
            ids.append(vocab[spell(len(ids))])
        if ids:
            return ids
    return []
