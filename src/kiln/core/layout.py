"""Every path of a run directory, spelled once: `runs/<name>/<stage>/...`.

Stages find each other's outputs only through these names (the files between stages are the
contract), so renaming a file or folder is a change to this module and nowhere else.
A stage's scratch files (curate's `work/`, tokenize's `.parts/`) are its own business and are
named inside the stage. A run on an object store has this layout in its local mirror (kiln.core.mirror).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Stage directory names, one per stage (the CLI verb may differ: train-tokenizer writes `tokenizer`).
CURATE, QUALITY, TOKENIZER, TOKENIZER_SWEEP, TOKENIZER_EXTENDED = (
    "curate",
    "quality",
    "tokenizer",
    "tokenizer-sweep",
    "tokenizer-extended",
)
TOKENIZER_COMPARE = "tokenizer-compare"  # train-tokenizer --compare: other tokenizers on the same text
TOKENIZE, TRAIN, EVAL, GENERATE, EXPORT, SWEEP = "tokenize", "train", "eval", "generate", "export", "sweep"

MANIFEST = "manifest.json"
SUMMARY = "summary.txt"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_META = "kiln_tokenizer.json"
CHECKPOINT = "checkpoint"
SHARDS = "shards"  # curate's output folder
SPLITS = ("train", "val")


def audit_sample(curate_dir: Path, source: str, reason: str) -> Path:
    """curate's sampled removed documents of one source and reason: `audit/samples/<source>/<step>__<rule>.jsonl`."""
    return Path(curate_dir) / "audit" / "samples" / source / (reason.replace(":", "__") + ".jsonl")


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory."""

    root: Path

    def stage(self, name: str) -> Path:
        return Path(self.root) / name

    @property
    def recipe_yaml(self) -> Path:
        return Path(self.root) / "recipe.yaml"

    @property
    def summary_json(self) -> Path:
        return Path(self.root) / "summary.json"

    # curate: shards/<source>-NNNNN.jsonl.zst
    @property
    def curated_shards(self) -> Path:
        return self.stage(CURATE) / SHARDS

    def quality_model(self, kind: str) -> Path:
        """`quality/lm/` or `quality/classifier/`."""
        return self.stage(QUALITY) / kind

    # tokenizer: tokenizer.json + kiln_tokenizer.json
    @property
    def tokenizer_json(self) -> Path:
        return self.stage(TOKENIZER) / TOKENIZER_JSON

    # tokenize: <source>/{train,val}.{bin,idx}
    @property
    def token_shards(self) -> Path:
        return self.stage(TOKENIZE)

    def token_split(self, source: str, split: str) -> Path:
        """The prefix of one source's split: add `.bin` / `.idx`."""
        return self.stage(TOKENIZE) / source / split

    # train: checkpoint/{model.safetensors,config.json,train_state.pt}, metrics.jsonl
    @property
    def checkpoint(self) -> Path:
        return self.stage(TRAIN) / CHECKPOINT

    @property
    def metrics(self) -> Path:
        return self.stage(TRAIN) / "metrics.jsonl"

    @property
    def sweep(self) -> Path:
        return Path(self.root) / SWEEP
