"""kiln's tokenizer wrapper around a Hugging Face `tokenizers` byte-level BPE.

Byte-level means every string encodes (no unknown token) and decodes back exactly. The
pre-split regex is GPT-4 style: letters with their leading space, numbers in groups of at most
3 digits, punctuation runs, and newlines apart from other whitespace.
Not handled here: FIM/mask/sentinel specials and vocabulary extension (the tokenizer issue).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from kiln.core.errors import FatalError
from kiln.tokenize.config import EOT, PAD, SPECIAL_TOKENS

SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class KilnTokenizer:
    """Encode/decode plus the ids kiln needs (end of document, padding)."""

    def __init__(self, tok: Tokenizer, path: Path | None = None):
        self.tok = tok
        # subtle: a document that merely mentions "<|endoftext|>" must not get a document boundary;
        # special ids come only from kiln itself (the encoder appends end-of-document by id).
        self.tok.encode_special_tokens = True
        self.path = path
        missing = [s for s in SPECIAL_TOKENS if tok.token_to_id(s) is None]
        if missing:
            where = path or "tokenizer"
            raise FatalError(f"{where}: special tokens {missing} are missing; it was not made by `kiln train-tokenizer`, retrain it")
        self.eot_id = tok.token_to_id(EOT)
        self.pad_id = tok.token_to_id(PAD)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each id stands for (0 for special tokens), shape (vocab,).

        Byte-level BPE writes each byte as one character of its alphabet, so a regular token's
        byte count is the length of its string. Bits per byte sums these over scored targets.
        """
        special = {t.content for t in self.tok.get_added_tokens_decoder().values()}
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for token, i in self.tok.get_vocab().items():
            out[i] = 0 if token in special else len(token)
        return out

    def save(self, path: Path) -> None:
        self.tok.save(str(path))

    @classmethod
    def load(cls, path: Path) -> KilnTokenizer:
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise FatalError(f"{path}: cannot load as a tokenizers JSON file ({e}); rerun `kiln train-tokenizer`") from None
        return cls(tok, Path(path))


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int) -> KilnTokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so nothing is ever unknown
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return KilnTokenizer(tok)
