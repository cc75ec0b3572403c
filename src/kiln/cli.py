"""The `kiln` command: one thin verb per stage, plus `plan`, `sweep` and `demo`.

Every stage verb loads the recipe (a file or a shipped name), applies `--set` overrides,
validates all of it before any work, writes the resolved recipe into the run directory, and
runs. `plan` subcommands (kiln.plan.cli) and `sweep` (kiln.sweep) add their own arguments.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln import __version__
from kiln.core.errors import ConfigError, KilnError
from kiln.core.layout import CURATE, SUMMARY, RunLayout
from kiln.core.ranks import is_main_process

if TYPE_CHECKING:
    from kiln.recipe import Recipe

# Verb -> (stage directory, help). The recipe sections each verb reads are listed in its --help.
STAGE_VERBS = {
    "curate": ("curate", "Read raw text (JSONL, Parquet, WARC, HTML, text), extract, normalize, filter (URL, language, Gopher, C4, FineWeb, code rules), redact PII, remove boilerplate lines, benchmark contamination, exact and near duplicates (MinHash); write curated shards and the audit."),
    "train-tokenizer": ("tokenizer", "Train a byte-level BPE tokenizer on a sample of the curated shards; report bytes per token, tokens per word and fertility per source and language on held-out documents (tokenizer/report.json)."),
    "tokenize": ("tokenize", "Encode curated shards into per-source train/validation token shards."),
    "train": ("train", "Train the decoder on token shards; write a checkpoint and per-step metrics."),
    "eval": ("eval", "Validation loss, perplexity and bits per byte per source for the trained checkpoint (and the untrained model); also any text, JSONL or Parquet file (--data) and zero-shot multiple-choice tasks (--task)."),
    "generate": ("generate", "Complete generate.prompt, or every prompt of --prompt-file into generate/samples.jsonl, from the trained checkpoint: batched, with a KV cache; sampling settings in the recipe's generate section."),
    "export": ("export", "Write the trained model as a Hugging Face folder (export/hf/, and OUT when given) that transformers' Auto classes load offline: Llama (Qwen3 with QK-norm) config, safetensors, kiln's tokenizer, generation config, a model card from the run's manifests."),
}

# `kiln quality` subcommands: help.
QUALITY_VERBS = {
    "train-lm": "Train the n-gram language model of the perplexity filter on the reference text (quality.reference_source or quality.reference); score a sample of the raw corpus for its percentile cutoffs.",
    "train-classifier": "Train the reference-vs-corpus classifier of the quality_classifier filter (positives: reference text, negatives: a sample of the raw corpus); report held-out precision, recall and AUC.",
}

SECTIONS = {
    "curate": ("curate",),
    "quality": ("quality",),
    "train-tokenizer": ("tokenizer", "model"),
    "extend-tokenizer": (),
    "import-hf": (),
    "tokenize": ("tokenize",),
    "train": ("model", "train", "mix", "parallel", "eval"),
    "eval": ("eval",),
    "generate": ("generate",),
    "export": ("export", "generate"),
    "plan": ("model", "train"),
    "sweep": ("model", "train"),
    "report": (),
    "demo": ("curate", "tokenizer", "tokenize", "mix", "model", "train", "eval", "generate", "export"),
}

EPILOG = """examples:
  kiln demo                                   whole pipeline on text found on this machine
  kiln curate --input 'data/*.jsonl.zst' --input crawl.warc.gz --run web   every default step, no recipe
  kiln curate --input 'data/*.jsonl' --run web --decontaminate mmlu.jsonl    also drop documents sharing a 13-gram with mmlu
  kiln curate --run web --explain 'web/part-0.jsonl:17'                      why a document was removed
  kiln curate --recipe recipes/demo.yaml --set curate.max_total_mb=10
  kiln quality train-classifier --recipe demo --set quality.reference_source=prose   then curate with --set curate.quality_classifier.enabled=true
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
    # subtle: the recipe (and with it torch) is imported when the parser is built, not when this
    # module is: the local executor's spawned workers import the `kiln` script that imports this
    # module, and each paid about 4 s of imports for nothing (3 s of CPU per worker per pool).
    from kiln.recipe import Recipe

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
    p.add_argument("--recipe", metavar="FILE|NAME", help="Recipe YAML file, or the name of one shipped in recipes/ (default: demo; for `curate --input`, every default).")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help="Override one recipe value (YAML syntax; a key that takes text takes the value as it is, unless it is one quoted YAML string), e.g. --set train.optim.lr=3e-4; repeatable.")
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
        p = add(verb, help_text)
        _common(p)
        if verb == "curate":
            p.add_argument("--input", dest="inputs", action="append", default=[], metavar="PATH_OR_GLOB", help="Curate these files (format from the extension; source from each record's `source` field, else the file's folder name) instead of the recipe's inputs; repeatable. Without --recipe, every step runs with its defaults.")
            p.add_argument("--run", metavar="NAME", help="Run name (same as --set name=NAME): writes runs/NAME/curate/.")
            p.add_argument("--decontaminate", dest="eval_sets", action="append", default=[], metavar="EVAL.jsonl", help="Remove training documents sharing an n-gram of curate.decontaminate.ngram (13) words with any item of this evaluation set (JSONL, one item per line; every string field is checked); repeatable; replaces the recipe's curate.decontaminate.eval_sets. The report is audit/decontamination.json.")
            p.add_argument("--explain", metavar="DOC_ID", help="Print which step removed (or quarantined) this document, the measured value and the threshold, and stop.")
        if verb == "train":
            p.add_argument("--dry-run", action="store_true", help="Print the planned data mixture over training (a table per phase: weights, tokens and epochs per source) and stop; nothing is trained or written.")
            p.add_argument("--from", dest="from_step", type=int, metavar="STEP", help="Resume the interrupted run from its resumable state after STEP instead of the newest (later states are moved aside into checkpoints/superseded-<time>/).")
            p.add_argument("--nproc", type=int, metavar="N", help="Train with N processes on this machine (at most one per visible GPU; on the CPU one per core, at least 8): checks the recipe's layout for N processes (the parallel section lays them out), then runs `torchrun --standalone --nproc-per-node N -m kiln train` with the other arguments; with --dry-run, plans for N processes without starting them.")
        if verb == "eval":
            p.add_argument("--data", dest="data_files", action="append", default=[], metavar="PATH", help="Also score this text, JSONL or Parquet file (per file and per `source` field); repeatable; replaces eval.data.")
            p.add_argument("--task", dest="tasks", action="append", default=[], metavar="TASK.jsonl", help="Also score this multiple-choice task (JSONL: context or query, choices, label) zero-shot; repeatable; replaces eval.tasks.")
        if verb == "generate":
            p.add_argument("--prompt", metavar="TEXT", help="Complete TEXT, taken as it is (same as --set generate.prompt=TEXT; write --prompt=TEXT for a text that starts with -).")
            p.add_argument("--prompt-file", metavar="FILE", help="Complete every prompt of FILE (JSONL with a `prompt` field, or one prompt per line) into generate/samples.jsonl (same as --set generate.prompt_file=FILE).")
        if verb == "export":
            p.add_argument("out", nargs="?", metavar="OUT", help="Also copy the folder here (same as --set export.out=OUT); an existing folder is replaced only when it is empty or holds an earlier kiln export (kiln_export.json) and nothing else, --force or not.")
            p.add_argument("--format", dest="export_format", choices=["hf"], help="Output format (same as --set export.format=...): hf, a Hugging Face transformers folder.")
        if verb == "train-tokenizer":
            p.add_argument("--sweep", metavar="N,N,...", type=vocab_sizes, help="Train one tokenizer per vocabulary size on the same sample into tokenizer-sweep/ and print their reports side by side (the stage's own tokenizer is left as it is).")
    p = add("import-hf", "Turn a Llama (or Qwen3) Hugging Face folder with kiln's tokenizer into a kiln run (tokenizer/ and train/checkpoint/ with manifests): ready for generate, export, eval --data and continued pretraining.")
    _common(p)
    p.add_argument("folder", metavar="DIR", help="The Hugging Face folder: config.json, model.safetensors (or shards with model.safetensors.index.json), tokenizer.json.")
    p.add_argument("--run", metavar="NAME", help="Run name (same as --set name=NAME): writes runs/NAME/.")
    p = add("extend-tokenizer", "Add domain terms to the run's trained tokenizer as whole tokens (printing each term's token count before and after) and give the run's train checkpoint (or --checkpoint) embedding and output rows for them; writes tokenizer-extended/.")
    _common(p)
    p.add_argument("--terms", required=True, metavar="FILE", help="UTF-8 file, one term per line (one pre-split piece, such as a word; it is added after a space and bare).")
    p.add_argument("--checkpoint", metavar="DIR", help="Checkpoint folder to resize (default: the run's train/checkpoint when it exists).")
    p = add("quality", "Train the models of the model-based quality filters (subcommands); the curate steps `perplexity` and `quality_classifier` then use them. Reads the recipe's quality section and curate.inputs.")
    quality = p.add_subparsers(dest="quality_verb", required=True, metavar="SUBCOMMAND")
    for name, help_text in QUALITY_VERBS.items():
        q = quality.add_parser(name, help=help_text, description=help_text, epilog=describe_sections(SECTIONS["quality"]), formatter_class=argparse.RawDescriptionHelpFormatter)
        _common(q)
        q.add_argument("--run", metavar="NAME", help="Run name (same as --set name=NAME): writes runs/NAME/quality/.")
    p = add("plan", "Plan before spending GPUs: FLOPs, Chinchilla and inference-aware sizes, cost, memory, parallel layout, checkpoint interval, scaling-law fits (subcommands). With no subcommand: parameters, FLOPs per token and training compute for the recipe's model and schedule.")
    _common(p, force=False)
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of the table.")
    from kiln.plan.cli import add_plan_subcommands
    from kiln.sweep import add_sweep_arguments

    add_plan_subcommands(p)
    p = add("sweep", "Train a grid of small models (sizes x steps) on the recipe's data, sharing its curate/tokenize stages, to feed `kiln plan fit`.")
    _common(p)
    add_sweep_arguments(p)
    p = add("report", "Build the run's report: one self-contained HTML page (<run>/report/index.html) with the recipe and lineage, the curation funnel and removal reasons with examples, duplicates, languages, decontamination, the tokenizer, the realized mixture, training curves, evaluation, samples and the planner's estimate beside the measured run. Works on a run in progress.")
    _common(p, force=False)
    p.add_argument("--run", metavar="NAME", help="Run name (same as --set name=NAME): reads runs/NAME/.")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="Rebuild the page every SECONDS seconds until interrupted (for a run in progress).")
    _common(add("demo", "Run every stage (curate, train-tokenizer, tokenize, train, eval, generate, export) and write <run>/summary.json. Finished stages are skipped."))
    return parser


def vocab_sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of vocabulary sizes, e.g. 4096,8192,32768") from None
    if not sizes:
        raise argparse.ArgumentTypeError("give at least one vocabulary size, e.g. 4096,8192,32768")
    return sizes


def as_yaml(value: object) -> str:
    """A flag's value as the YAML of an override: JSON with characters outside ASCII kept as they are
    (JSON's escapes of characters beyond U+FFFF are surrogate pairs, which YAML reads as two broken characters)."""
    return json.dumps(value, ensure_ascii=False)


def recipe_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The recipe to load and the overrides, with curate's --input and --run turned into overrides."""
    recipe, overrides = args.recipe, list(args.overrides)
    inputs, run, eval_sets = getattr(args, "inputs", []), getattr(args, "run", None), getattr(args, "eval_sets", [])
    if inputs:
        overrides.insert(0, "curate.inputs=" + as_yaml([{"path": p} for p in inputs]))
    if eval_sets:
        overrides.insert(0, "curate.decontaminate.eval_sets=" + as_yaml([{"path": p} for p in eval_sets]))
    if run:
        overrides.insert(0, f"name={as_yaml(run)}")
    if getattr(args, "data_files", None):
        overrides.insert(0, "eval.data=" + as_yaml(args.data_files))
    if getattr(args, "tasks", None):
        overrides.insert(0, "eval.tasks=" + as_yaml(args.tasks))
    if getattr(args, "prompt_file", None):
        overrides.insert(0, f"generate.prompt_file={as_yaml(args.prompt_file)}")
    if getattr(args, "prompt", None) is not None:
        from kiln.recipe import literal_override

        overrides.insert(0, literal_override("generate.prompt", args.prompt))
    if getattr(args, "out", None):
        overrides.insert(0, f"export.out={as_yaml(args.out)}")
    if getattr(args, "export_format", None):
        overrides.insert(0, f"export.format={args.export_format}")
    if recipe is None and not inputs:
        recipe = "demo"
    if recipe is None and not run:
        raise ConfigError("curate --input needs --run NAME (the run directory to write), or a --recipe that names the run")
    return recipe, overrides


def run_verb(args: argparse.Namespace, recipe: Recipe) -> dict[str, Any]:
    """Run the stage a verb names; returns its manifest. The resolved recipe is saved after success."""
    from kiln import pipeline

    if args.verb == "quality":
        from kiln.curate.quality.run import train_classifier, train_lm

        train = train_lm if args.quality_verb == "train-lm" else train_classifier
        manifest = train(recipe.quality, recipe.curate, recipe.run_dir, args.force)
    elif args.verb == "import-hf":
        from kiln.evaluate.config import ImportConfig
        from kiln.evaluate.import_hf import run as import_hf

        return import_hf(ImportConfig(source=args.folder), recipe.run_dir, args.force)  # no recipe made this run: none is saved
    elif args.verb == "extend-tokenizer":
        from kiln.tokenize.extend import ExtendConfig
        from kiln.tokenize.extend import run as extend_tokenizer

        manifest = extend_tokenizer(ExtendConfig(terms=args.terms, checkpoint=args.checkpoint), recipe.run_dir, args.force)
    elif args.verb == "train-tokenizer" and args.sweep:
        from kiln.tokenize.train import sweep

        manifest = sweep(recipe.tokenizer, recipe.run_dir, args.sweep, pipeline.embedding_shape(recipe), args.force)
    elif args.verb == "train":
        return pipeline.run_stage("train", recipe, args.force, from_step=args.from_step)  # saves the recipe itself
    else:
        return pipeline.run_stage(STAGE_VERBS[args.verb][0], recipe, args.force)
    pipeline.save_resolved(recipe)
    return manifest


def cpu_process_limit() -> int:
    """The most CPU processes `kiln train --nproc` starts: one per core this process may use, or 8
    where that is more. Processes beyond the cores only take turns on them (each also holds its own
    torch, about 0.3 GB), and a runaway N (99999) started hundreds before anything failed; 8 lets a
    small machine still lay out three degrees of 2 (dp 2 x tp 2 x pp 2) to try a recipe. torchrun
    started by hand has no such bound."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(8, cores)


def check_process_count(recipe: Recipe, nproc: int) -> None:
    """Stop `kiln train --nproc N` for an N beyond this machine: one process per visible GPU, or on
    the CPU cpu_process_limit."""
    import torch

    from kiln.model.precision import resolve_precision

    device = resolve_precision(recipe.train.precision, "train").device
    if device.type == "cuda" and nproc > (gpus := torch.cuda.device_count()):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise ConfigError(f"--nproc {nproc}: each process trains on a GPU of its own, and {gpus} are visible here{where}; use --nproc {gpus} or fewer, or train.precision.device=cpu")
    if device.type == "cpu" and nproc > (limit := cpu_process_limit()):
        raise ConfigError(f"--nproc {nproc}: at most {limit} CPU processes here (one per core, at least 8; more only take turns on the cores);"
                          f" use --nproc {limit} or fewer, or start torchrun yourself")


def check_layout_for(recipe: Recipe, nproc: int) -> None:
    """Stop `kiln train --nproc N` before any process starts for a parallel layout N processes cannot
    form, or a model or training that layout cannot split (recipe: validated for N processes).
    Checks that need the data (the tokenizer's vocabulary, the shards) run on the ranks."""
    from kiln.model.precision import resolve_precision
    from kiln.train.mesh import MESH_DIMS
    from kiln.train.mesh import check_layout

    # One process trains alone whatever the parallel section says (kiln.train.mesh.init_ranks).
    degrees = recipe.parallel.degrees(nproc) if nproc > 1 else dict.fromkeys(MESH_DIMS, 1)
    check_layout(recipe.model, recipe.train, recipe.parallel, degrees, resolve_precision(recipe.train.precision, "train").amp_dtype)


def launch_torchrun(argv: list[str], nproc: int) -> int:
    """Run the same command (without --nproc) on `nproc` local processes: torchrun's launcher, in this
    process, as `torchrun --standalone --nproc-per-node N -m kiln ...`; the exit status.

    A failure is told once. Rank 0 prints its own error, the other ranks hand theirs to the launcher
    (record_for_launcher); the ChildFailedError traceback and per-process log lines torchrun adds
    would only repeat it, so this prints one line where rank 0 has not already spoken."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    rest, skip = [], False
    for arg in argv:  # drop --nproc N / --nproc=N
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            rest.append(arg)
    # Its "failed (exitcode: 2)" and "Sending process ... closing signal SIGTERM" lines: said below.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        run(get_args_parser().parse_args(["--standalone", f"--nproc-per-node={nproc}", "-m", "kiln", *rest]))
    except ChildFailedError as e:
        return report_failed_launch(e.failures, nproc)
    except SignalException:  # SIGTERM or SIGINT to this launcher: passed on to every process, which report themselves
        return 130
    return 0


def report_failed_launch(failures: dict[int, Any], nproc: int) -> int:
    """One line for a launch of nproc processes where some failed (global rank -> torch.distributed.elastic
    ProcessFailure), unless rank 0 already printed its kiln error; the exit status."""
    # The ranks that stopped on a kiln error and recorded it (record_for_launcher; torchrun names a
    # missing error file <N/A>). subtle: not their exit status: torchrun may stop rank 0 with SIGTERM
    # between its message and its exit, once another rank has failed.
    told = sorted(rank for rank, f in failures.items() if f.error_file != "<N/A>")
    if 0 in told:
        return 2  # rank 0 printed it
    if told:
        print(f"kiln train: error: {failures[told[0]].message} (process {told[0]} of {nproc})", file=sys.stderr)
        return 2
    rank = min(failures, key=lambda r: failures[r].timestamp)  # the first to fail; the others were stopped
    first = failures[rank]
    how = f"was killed by {first.signal_name()}" if first.exitcode < 0 else f"exited with status {first.exitcode}"
    print(f"kiln train: error: process {rank} of {nproc} {how} (its messages are above); the others were stopped", file=sys.stderr)
    return 1


def record_for_launcher(message: str) -> None:
    """Under torchrun, hand this rank's kiln error to the launcher (its error file, the convention of
    torch.distributed.elastic): `kiln train --nproc` then knows whether rank 0 printed it, and prints
    another rank's, which only records it; plain torchrun shows it in its summary."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        Path(path).write_text(json.dumps({"message": message, "timestamp": int(time.time())}), encoding="utf-8")


# Errors of the place a stage writes to, not of kiln: reported as one line naming the path.
STORAGE_ERRORS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        if nproc < 1:
            print(f"kiln train: error: --nproc {nproc}: give the number of processes to start, 1 or more", file=sys.stderr)
            return 2
        if getattr(args, "dry_run", False):  # plan for that launch: the batch and memory per rank of N processes, timed on one
            os.environ["WORLD_SIZE"] = str(nproc)
    # Under torchrun only rank 0 tells the user what happens; the others report problems only.
    quiet = args.quiet or not is_main_process()
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    try:
        if args.verb == "plan" and args.plan_command is not None:
            from kiln.plan.cli import run_plan

            return run_plan(args)
        if args.verb == "sweep":
            from kiln.sweep import run_verb as run_sweep

            return run_sweep(args)
        from kiln.recipe import load_recipe

        recipe = load_recipe(*recipe_and_overrides(args))
        if nproc is not None and not args.dry_run:
            check_process_count(recipe, nproc)
            os.environ["WORLD_SIZE"] = str(nproc)  # the recipe again, for N processes: the batch arithmetic counts them
            check_layout_for(load_recipe(*recipe_and_overrides(args)), nproc)
            return launch_torchrun(argv, nproc)
        if args.verb == "plan":
            from kiln.plan.flops import format_plan, plan_training

            plan = plan_training(recipe.model, recipe.train.seq_len, recipe.train.steps * recipe.train.tokens_per_step, recipe.model.vocab_size or recipe.tokenizer.vocab_size)
            print(json.dumps(plan) if args.json else format_plan(plan))
            return 0
        if args.verb == "curate" and args.explain is not None:  # '' (an unset shell variable) is an error, not a curation
            from kiln.curate.explain import explain

            print(explain(RunLayout(recipe.run_dir).stage(CURATE), args.explain))
            return 0
        if args.verb == "train" and args.dry_run:
            from kiln import pipeline

            print(pipeline.dry_run_train(recipe))
            return 0
        if args.verb == "report":
            from kiln import pipeline

            if args.watch is not None and args.watch <= 0:
                raise ConfigError(f"--watch {args.watch}: give the seconds between rebuilds, more than 0")
            print(pipeline.build_report(recipe.run_dir, args.watch))
            return 0
        if args.verb == "demo":
            from kiln import pipeline

            print(pipeline.format_summary(pipeline.run_demo(recipe, args.force)))
            return 0
        manifest = run_verb(args, recipe)
        if is_main_process():
            print((RunLayout(recipe.run_dir).stage(manifest["stage"]) / SUMMARY).read_text().rstrip())
        return 0
    except KilnError as e:
        if is_main_process():  # under torchrun every rank usually fails alike: rank 0 says it once
            print(f"kiln {args.verb}: error: {e}", file=sys.stderr)
        record_for_launcher(str(e))
        return 2
    except OSError as e:
        if e.errno not in STORAGE_ERRORS:
            raise
        where = f" {e.filename}" if e.filename else ""
        print(f"kiln {args.verb}: error: cannot write{where}: {e.strerror}; free space or choose a writable place (runs_dir), then run the same command again: finished work is kept", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kiln {args.verb}: interrupted; finished work is kept, run the same command again to resume", file=sys.stderr)
        return 130
