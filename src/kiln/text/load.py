"""The run's tokenizer, of whichever kind its kiln_tokenizer.json names: kiln's own, or a Hugging Face folder's.

Both kinds answer the same calls (encode, encode_batch, encode_flat, decode, document, token_bytes,
vocab_size, encoder_name, specials, bos_id, eot_id, pad_id, mask_id, fim_ids, sentinel_ids, describe,
save), so the tokenize stage, training, evaluation, generation and export take either.
Not handled here: the kinds themselves (kiln.text.tokenizer, kiln.text.hf_tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

from kiln.core.errors import FatalError
from kiln.core.layout import MANIFEST
from kiln.core.manifest import recorded_outputs
from kiln.core.mirror import refresh, url_of
from kiln.text.hf_tokenizer import FORMAT as HF_FORMAT
from kiln.text.hf_tokenizer import VERSION as HF_VERSION
from kiln.text.hf_tokenizer import HfTokenizer
from kiln.text.tokenizer import META_NAME, KilnTokenizer

AnyTokenizer = KilnTokenizer | HfTokenizer


def load_tokenizer(path: Path) -> AnyTokenizer:
    """The tokenizer whose tokenizer.json is `path`; FatalError naming what is missing, foreign or changed."""
    path = Path(path)
    if url_of(path) is not None and refresh(path.parent / MANIFEST):
        recorded_outputs(path.parent)  # a run on a store: the files of the stage that made it (small), checked
    meta_path = path.with_name(META_NAME)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    except (UnicodeDecodeError, ValueError) as e:
        raise FatalError(f"{meta_path}: not valid JSON ({e}); rerun the stage that wrote it") from None
    if isinstance(meta, dict) and meta.get("format") == HF_FORMAT:
        if meta.get("version") != HF_VERSION:
            raise FatalError(f"{meta_path}: {HF_FORMAT} v{meta.get('version')}, this kiln reads v{HF_VERSION}")
        return HfTokenizer.load(path, meta)
    return KilnTokenizer.load(path)
