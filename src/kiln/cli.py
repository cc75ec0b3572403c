"""The `kiln` command: one thin verb per stage, plus `plan` and `demo`.

Every verb loads the recipe (a file or a shipped name), applies `--set` overrides, validates
all of it before any work, writes the resolved recipe into the run directory, and runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from kiln import __version__
from kiln.core.errors import KilnError
from kiln.core.recipe import Recipe, load_recipe

# Verb -> (stage directory, help). The recipe sections each verb reads are listed in its --help.
STAGE_VERBS = {
    "curate": ("curate", "Read raw text, normalize, filter, remove exact duplicates; write curated shards and the audit."),
    "train-tokenizer": ("tokenizer", "Train a byte-level BPE tokenizer on curated shards; report bytes per token."),
    "tokenize": ("tokenize", "Encode curated shards into per-source train/validation token shards."),
    "train": ("train", "Train the decoder on token shards; write a checkpoint and per-step metrics."),
    "eval": ("eval", "Validation loss, perplexity and bits per byte per source for the trained checkpoint."),
    "generate": ("generate", "Sample text from the trained checkpoint (prompt and sampling settings in the recipe's generate section)."),
}

SECTIONS = {
    "curate": ("curate",),
    "train-tokenizer": ("tokenizer",),
    "tokenize": ("tokenize",),
    "train": ("model", "train", "mix", "eval"),
    "eval": ("eval",),
    "generate": ("generate",),
    "plan": ("model", "train"),
    "demo": ("curate", "tokenizer", "tokenize", "mix", "model", "train", "eval", "generate"),
}

EPILOG = """examples:
  kiln demo                                   whole pipeline on text found on this machine
  kiln curate --recipe recipes/demo.yaml --set curate.max_total_mb=10
  kiln train --recipe demo --set train.steps=500 --set train.lr=1e-3
  kiln generate --recipe demo --set generate.prompt='import os'
  kiln plan --recipe demo --json
"""


def describe_sections(sections: tuple[str, ...]) -> str:
    """The recipe keys a verb reads, with their defaults and descriptions, for its --help."""
    lines = ["recipe keys (set in the YAML or with --set SECTION.KEY=VALUE):"]
    for key in ("name", "runs_dir"):
        field = Recipe.model_fields[key]
        lines.append(f"  {key}{'' if field.is_required() else f' [default: {_show(field.default)}]'}\n      {field.description}")
    for section in sections:
        model = Recipe.model_fields[section].annotation
        for key, field in model.model_fields.items():
            default = "" if field.is_required() else f" [default: {_show(field.get_default(call_default_factory=True))}]"
            lines.append(f"  {section}.{key}{default}\n      {field.description}")
    return "\n".join(lines)


def _show(value: object) -> str:
    if isinstance(value, tuple) and value and hasattr(value[0], "model_dump"):
        return "; ".join(", ".join(f"{k}={v}" for k, v in item.model_dump(exclude_none=True).items()) for item in value)
    return repr(value) if isinstance(value, str) else str(value)


def _common(p: argparse.ArgumentParser, force: bool = True) -> None:
    p.add_argument("--recipe", default="demo", metavar="FILE|NAME", help="Recipe YAML file, or the name of one shipped in recipes/ (default: demo).")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help="Override one recipe value (YAML syntax), e.g. --set train.lr=3e-4; repeatable.")
    if force:
        p.add_argument("--force", action="store_true", help="Redo the stage even when its manifest says it is up to date.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description="kiln: raw text to a pretrained base language model. Each stage reads and writes files under <runs_dir>/<name>/<stage>/ and ends with a manifest.json.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="Log warnings only.")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    def add(verb: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(verb, help=help_text, description=help_text, epilog=describe_sections(SECTIONS[verb]), formatter_class=argparse.RawDescriptionHelpFormatter)

    for verb, (_, help_text) in STAGE_VERBS.items():
        _common(add(verb, help_text))
    p = add("plan", "Parameters, FLOPs per token and training compute for the recipe's model and schedule.")
    _common(p, force=False)
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of the table.")
    _common(add("demo", "Run every stage (curate, train-tokenizer, tokenize, train, eval, generate) and write <run>/summary.json. Finished stages are skipped."))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if args.verb == "plan":
            from kiln.plan.flops import format_plan, plan_training

            plan = plan_training(recipe.model, recipe.train, recipe.model.vocab_size or recipe.tokenizer.vocab_size)
            print(json.dumps(plan) if args.json else format_plan(plan))
            return 0
        from kiln import pipeline

        if args.verb == "demo":
            print(pipeline.format_summary(pipeline.run_demo(recipe, args.force)))
            return 0
        manifest = pipeline.run_stage(STAGE_VERBS[args.verb][0], recipe, args.force)
        print((recipe.run_dir / manifest["stage"] / "summary.txt").read_text().rstrip())
        return 0
    except KilnError as e:
        print(f"kiln {args.verb}: error: {e}", file=sys.stderr)
        return 2
