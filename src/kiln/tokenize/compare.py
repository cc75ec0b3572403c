"""The tokenizer-compare stage: this run's tokenizer beside others, measured on the same held-out text.

`kiln train-tokenizer --compare LOCATION` (repeatable) measures each tokenizer named as report.py
measures the run's own: bytes per token, tokens per word, fertility, and where the held-out text
is parallel (meta.parallel_id) its tokens relative to English on the same content; in all and per
language, one column per tokenizer, into `tokenizer-compare/` (report.json, summary.txt).
A LOCATION is a run directory (its tokenizer/: kiln's own, or an imported model's from `kiln
import-hf`), a folder holding a tokenizer.json (a tokenizer stage's, a Hugging Face model's), or a
tokenizer.json of any tool. A file kiln did not write is read with Hugging Face `tokenizers` and
measured on the text alone: no bos or eos its template would add, and text that spells one of its
special tokens encoded as text, as kiln encodes documents.
The run's own tokenizer is not touched, and no later stage reads this folder.
Not handled here: tokenizers in an object store (local paths only), training (train.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from kiln.core.errors import FatalError
from kiln.core.layout import CURATE, SHARDS, TOKENIZER, TOKENIZER_COMPARE, TOKENIZER_JSON, TOKENIZER_META, RunLayout
from kiln.core.manifest import Stage, recorded_outputs
from kiln.text.hf_tokenizer import prepends_space
from kiln.text.load import load_tokenizer
from kiln.tokenize.config import CompareConfig, TokenizerConfig
from kiln.tokenize.report import TextEncoder, format_compare, measure_text
from kiln.tokenize.train import heldout_docs

OWN = "kiln"  # the run's own tokenizer's column


class PlainTokenizer:
    """A tokenizer.json that kiln did not write, read with `tokenizers`: ids of text, nothing around it."""

    def __init__(self, path: Path):
        try:
            self.hf = Tokenizer.from_file(str(path))
            data = json.loads(path.read_text(encoding="utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise FatalError(f"--compare {path}: not a tokenizer.json `tokenizers` reads ({e})") from None
        self.hf.encode_special_tokens = True  # a document that spells "</s>" is text, as kiln encodes it
        self.prepends_space = prepends_space(data)
        self.vocab_size = self.hf.get_vocab_size()

    def encode_batch(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]


def locate(location: str) -> Path:
    """The tokenizer.json a --compare location names (module docstring); FatalError with what was looked for."""
    path = Path(location)
    for candidate in (path, path / TOKENIZER_JSON, RunLayout(path).tokenizer_json):
        if candidate.is_file():
            return candidate
    raise FatalError(
        f"--compare {location}: no tokenizer there (looked for {path}, {path / TOKENIZER_JSON} and "
        f"{RunLayout(path).tokenizer_json}); name a run directory, a tokenizer folder or a tokenizer.json"
    )


def open_tokenizer(path: Path) -> TextEncoder:
    """kiln's reader where kiln wrote the file (its own or an imported model's folder), else `tokenizers`."""
    return load_tokenizer(path) if path.with_name(TOKENIZER_META).is_file() else PlainTokenizer(path)


def labels(locations: list[str]) -> list[str]:
    """A short column name per location: the run or folder it names, numbered where two would read the same."""
    names = []
    for location in locations:
        path = Path(location)
        folder = path.parent if path.suffix == ".json" else path
        if folder.name == TOKENIZER:  # runs/NAME/tokenizer: the run's name
            folder = folder.parent
        names.append(folder.name or location)
    taken = {OWN}
    for i, name in enumerate(names):
        if name in taken:
            names[i] = f"{name}-{i + 1}"
        taken.add(names[i])
    return names


def run(cfg: TokenizerConfig, run_dir: Path, locations: list[str], force: bool = False) -> dict[str, Any]:
    """Measure the run's tokenizer and each location's on the tokenizer stage's held-out documents."""
    layout = RunLayout(run_dir)
    own = layout.tokenizer_json
    paths = [locate(loc) for loc in locations]
    others = [open_tokenizer(p) for p in paths]  # a file no tool reads stops here, before any work
    files = [
        p.with_name(n) for p in [own, *paths] for n in (TOKENIZER_JSON, TOKENIZER_META) if p.with_name(n).is_file()
    ]
    shards = recorded_outputs(layout.stage(CURATE), SHARDS)
    stage = Stage(
        run_dir,
        TOKENIZER_COMPARE,
        {"tokenizer": cfg, "compare": CompareConfig(tokenizers=list(locations))},
        inputs=[*shards, *files],
        upstream=[CURATE, TOKENIZER],
    )
    if done := stage.up_to_date(force, lambda m: ", ".join(m["counts"]["tokenizers"])):
        return done
    stage.begin()
    heldout = heldout_docs(shards, cfg)
    if not heldout:
        raise FatalError(
            f"tokenizer-compare: no held-out documents at tokenizer.heldout_fraction={cfg.heldout_fraction}; "
            "there is no text to compare on, raise it"
        )
    entries = []
    tokenizers = [open_tokenizer(own), *others]
    for label, location, tokenizer in zip([OWN, *labels(locations)], [str(own), *locations], tokenizers, strict=True):
        measured, _ = measure_text(tokenizer, heldout)
        entries.append({"label": label, "location": location, "vocab_size": tokenizer.vocab_size, **measured})
    out = stage.dir / "report.json"
    out.write_text(json.dumps({"tokenizers": entries}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    counts = {
        "tokenizers": [e["label"] for e in entries],
        "heldout_docs": len(heldout),
        "bytes_per_token": {e["label"]: e["all"]["bytes_per_token"] for e in entries},
    }
    return stage.finish([out], counts, format_compare(entries))
