"""The `kiln` command: its parser, `--help` and dispatch, all built from kiln.verbs' table.

Each verb of the table becomes a subcommand with its help, its flags and, in its --help, the
recipe keys of the sections it reads; `main` parses the command line and calls the verb's
command (kiln.commands), which loads the recipe (a file or a shipped name), applies `--set`
overrides, validates all of it before any work and runs. A KilnError is printed as one line,
`kiln VERB: error: ...` (exit 2); so is a disk that is full or read-only (exit 2); an interrupt
says that finished work is kept (exit 130). Importing this module imports no stage and no torch.
Not handled here: what a verb does (kiln.commands), `--nproc` launches (kiln.launch).
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys

from kiln import __version__
from kiln.core.errors import Detached, KilnError
from kiln.core.ranks import adopt_slurm_tasks, is_main_process
from kiln.launch import record_for_launcher
from kiln.verbs import VERBS, Verb, resolve

EPILOG = """examples:
  kiln demo                                   whole pipeline on text found on this machine
  kiln curate --input 'data/*.jsonl.zst' --input crawl.warc.gz --run web   every default step, no recipe
  kiln curate --input 'data/*.jsonl' --run web --decontaminate mmlu.jsonl
                                              also drop documents sharing a 13-gram with mmlu
  kiln curate --run web --explain 'web/part-0.jsonl:17'                      why a document was removed
  kiln curate --recipe recipes/demo.yaml --set curate.max_total_mb=10
  kiln quality train-classifier --recipe demo --set quality.reference_source=prose
                                              then curate with --set curate.quality_classifier.enabled=true
  kiln train --recipe demo --set train.steps=500 --set train.optim.lr=1e-3
  kiln generate --recipe demo --prompt 'def main(argv):'      any text, taken as it is (also --set generate.prompt=...)
  kiln eval --data notes.jsonl --task arc_easy.jsonl           perplexity of any file, zero-shot multiple choice
  kiln export --format hf ./my-model                          a folder transformers' Auto classes load
  kiln import-hf ./my-model --run mine                        a Hugging Face Llama with kiln's tokenizer as a run
  kiln plan --recipe demo --json
  kiln plan chinchilla --flops 1e23 --fit hoffmann          compute-optimal size for a budget
  kiln report --run demo                                   the run's HTML page: runs/demo/report/index.html
"""


def describe_sections(sections: tuple[str, ...]) -> str:
    """The recipe keys a verb reads, with their defaults and descriptions, for its --help."""
    # subtle: the recipe (pydantic and every section, 0.5 to 1 s of imports on 2 cores) is imported
    # when the parser is built, not when this module is: the local executor's spawned workers import
    # the `kiln` script that imports this module, and each paid that for nothing (about 4 s when the
    # recipe still imported torch). tests/test_cli.py checks that importing kiln.cli imports neither;
    # tests/test_startup.py that building the parser, validating a recipe, curating and tokenizing
    # import no torch.
    from kiln.recipe import Recipe

    lines = ["recipe keys (set in the YAML or with --set SECTION.KEY=VALUE):"]
    for key in ("name", "runs_dir"):
        field = Recipe.model_fields[key]
        default = "" if field.is_required() else f" [default: {_show(field.default)}]"
        lines.append(f"  {key}{default}\n      {field.description}")
    for section in sections:
        model = Recipe.model_fields[section].annotation
        for key, field in model.model_fields.items():
            value = None if field.is_required() else field.get_default(call_default_factory=True)
            default = "" if field.is_required() else f" [default: {_show(value)}]"
            lines.append(f"  {section}.{key}{default}\n      {field.description}")
    return "\n".join(lines)


def _show(value: object) -> str:
    if isinstance(value, tuple) and value and hasattr(value[0], "model_dump"):
        return "; ".join(", ".join(f"{k}={v}" for k, v in item.model_dump(exclude_none=True).items()) for item in value)
    return repr(value) if isinstance(value, str) else str(value)


def _common(p: argparse.ArgumentParser, force: bool = True) -> None:
    p.add_argument(
        "--recipe",
        metavar="FILE|NAME",
        help="Recipe YAML file (a path, or a store URL such as s3://bucket/runs/NAME/recipe.yaml, the resolved "
        "recipe a run keeps), or the name of one shipped in recipes/ (default: demo; for `curate --input`, every "
        "default).",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="Override one recipe value (YAML syntax; a key that takes text takes the value as it is, unless it "
        "is one quoted YAML string), e.g. --set train.optim.lr=3e-4; repeatable.",
    )
    if force:
        p.add_argument(
            "--force", action="store_true", help="Redo the stage even when its manifest says it is up to date."
        )


def build_parser() -> argparse.ArgumentParser:
    """The whole `kiln` parser: every verb and subcommand of kiln.verbs.VERBS."""
    parser = argparse.ArgumentParser(
        prog="kiln",
        description="kiln: raw text to a pretrained base language model. Each stage reads and writes files under "
        "<runs_dir>/<name>/<stage>/ and ends with a manifest.json.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="Log warnings only.")
    add_verbs(parser.add_subparsers(dest="verb", required=True, metavar="VERB"), VERBS)
    return parser


def add_verbs(sub: argparse._SubParsersAction, verbs: tuple[Verb, ...]) -> None:
    """One parser per verb: --recipe, --set and --force where it takes them, then its own flags and
    subcommands. The parsed arguments carry the verb (`declared_verb`), the deepest one given."""
    for verb in verbs:
        epilog = describe_sections(verb.sections) if verb.recipe or verb.sections else None
        p = sub.add_parser(
            verb.name,
            help=verb.help,
            description=verb.help,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(declared_verb=verb)
        if verb.recipe:
            _common(p, verb.force)
        if verb.arguments:
            resolve(verb.arguments)(p)
        if group := verb.group:
            # subtle: title=None would still open a help group of its own, away from "positional arguments"
            options = {"title": group.title} if group.title else {}
            if group.parser_class:
                options["parser_class"] = resolve(group.parser_class)
            add_verbs(
                p.add_subparsers(dest=group.dest, required=group.required, metavar="SUBCOMMAND", **options), group.verbs
            )


# Errors of the place a stage writes to, not of kiln: reported as one line naming the path.
DETACHED = 75  # `--detach`: submitted, not done (sysexits' EX_TEMPFAIL: run again later), so `&&` chains stop
STORAGE_ERRORS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # `kiln train --nproc` runs the same command line again under torchrun
    adopt_slurm_tasks()  # `srun kiln train` on several nodes: each task's rank, as torchrun would give it
    # Under torchrun only rank 0 tells the user what happens; the others report problems only.
    quiet = args.quiet or not is_main_process()
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    verb = args.declared_verb
    try:
        return resolve(verb.command)(verb, args)
    except Detached as e:
        from kiln.core.store_lock import leave_to_expire

        leave_to_expire()  # the arrays' tasks write under this run's locks: not released, they expire on their own
        print(f"kiln {args.verb}: {e}")
        return DETACHED
    except KilnError as e:
        if is_main_process():  # under torchrun every rank usually fails alike: rank 0 says it once
            print(f"kiln {args.verb}: error: {e}", file=sys.stderr)
        record_for_launcher(str(e))
        return 2
    except OSError as e:
        if e.errno not in STORAGE_ERRORS:
            raise
        where = f" {e.filename}" if e.filename else ""
        print(
            f"kiln {args.verb}: error: cannot write{where}: {e.strerror}; free space or choose a writable place"
            " (runs_dir), then run the same command again: finished work is kept",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(
            f"kiln {args.verb}: interrupted; finished work is kept, run the same command again to resume",
            file=sys.stderr,
        )
        return 130
