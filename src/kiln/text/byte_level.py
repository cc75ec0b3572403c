"""The byte-level alphabet: the printable character GPT-2-style BPE writes for each byte, and back.

Both kinds of tokenizer (kiln's own and an imported byte-level one) and the encoders built from
their vocabularies (kiln.text.engines) read tokens through it.
Not handled here: the tokenizers themselves (kiln.text.tokenizer, kiln.text.hf_tokenizer).
"""

from __future__ import annotations


def byte_alphabet() -> dict[int, str]:
    """Byte -> the printable character byte-level BPE writes it as (the GPT-2 table).

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7F-0xA0,
    0xAD) are shifted to U+0100 onwards in byte order, so every token is a printable string.
    """
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    shifted = (b for b in range(256) if b not in table)
    table.update({b: chr(0x100 + i) for i, b in enumerate(shifted)})
    return table


CHAR_TO_BYTE = {c: b for b, c in byte_alphabet().items()}


def token_to_bytes(token: str) -> bytes | None:
    """The bytes a byte-level token stands for; None when it holds a character outside the alphabet."""
    try:
        return bytes(CHAR_TO_BYTE[c] for c in token)
    except KeyError:
        return None
