"""kiln's special tokens, in id order: they take the first ids of every kiln vocabulary.

End of document, padding, mask, the three FIM markers, then the span-corruption sentinels and
reserved slots the tokenizer section asks for. Kept apart from kiln.text.tokenizer so that the
recipe can name them without importing the tokenizer libraries.
"""

from __future__ import annotations

EOT = "<|endoftext|>"
PAD = "<|pad|>"
MASK = "<|mask|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
FIXED_SPECIALS = (EOT, PAD, MASK, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX)
BYTE_ALPHABET = 256


def sentinel(i: int) -> str:
    """Span-corruption sentinel i (T5's <extra_id_i>)."""
    return f"<|sentinel_{i}|>"


def reserved(i: int) -> str:
    return f"<|reserved_{i}|>"


def special_tokens(n_sentinels: int, n_reserved: int) -> list[str]:
    """Every special token in id order: they take the first ids of the vocabulary."""
    return [*FIXED_SPECIALS, *(sentinel(i) for i in range(n_sentinels)), *(reserved(i) for i in range(n_reserved))]
