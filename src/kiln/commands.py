"""What each `kiln` verb does with its parsed arguments, and the flags only some verbs take.

kiln.verbs names these functions; kiln.cli builds the parser and calls them. A command loads the
recipe (flags that stand for recipe keys become overrides ahead of --set, so a later --set of
the same key wins), runs the verb's function and prints what it made. Errors propagate to
kiln.cli, which prints them as `kiln VERB: error: ...`. Stage code is imported inside each
function, so that building the parser costs none of it.
Not handled here: the parser and error reporting (kiln.cli), the stages' own work (kiln.stages),
starting processes for `--nproc` (kiln.launch), writing and submitting Slurm jobs for `train --slurm` and
`submit` (kiln.slurm_jobs).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kiln.core.errors import ConfigError
from kiln.core.layout import CURATE, SUMMARY, RunLayout
from kiln.core.ranks import is_main_process
from kiln.verbs import DEMO_STAGES, Verb, resolve

if TYPE_CHECKING:
    from kiln.recipe import Recipe


# ---- flags (kiln.verbs names each verb's) ----


def detach_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--detach",
        action="store_true",
        help="With executor.kind slurm: stop once the phase's Slurm arrays are submitted, printing their job ids "
        "(exit status 75); the same command run later waits for them and goes on from their tasks' markers.",
    )


def tokenize_arguments(p: argparse.ArgumentParser) -> None:
    detach_argument(p)


def curate_arguments(p: argparse.ArgumentParser) -> None:
    detach_argument(p)
    p.add_argument(
        "--input",
        dest="inputs",
        action="append",
        default=[],
        metavar="PATH_OR_GLOB",
        help="Curate these files (format from the extension; source from each record's `source` field, else the "
        "file's folder name) instead of the recipe's inputs; repeatable. Without --recipe, every step runs "
        "with its defaults.",
    )
    p.add_argument("--run", metavar="NAME", help="Run name (same as --set name=NAME): writes runs/NAME/curate/.")
    p.add_argument(
        "--decontaminate",
        dest="eval_sets",
        action="append",
        default=[],
        metavar="EVAL.jsonl",
        help="Remove training documents sharing an n-gram of curate.decontaminate.ngram (13) words with any item "
        "of this evaluation set (JSONL, one item per line; every string field is checked); repeatable; "
        "replaces the recipe's curate.decontaminate.eval_sets. The report is audit/decontamination.json.",
    )
    p.add_argument(
        "--explain",
        metavar="DOC_ID",
        help="Print which step removed (or quarantined) this document, the measured value and the threshold, and stop.",
    )


def tokenizer_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sweep",
        metavar="N,N,...",
        type=vocab_sizes,
        help="Train one tokenizer per vocabulary size on the same sample into tokenizer-sweep/ and print their "
        "reports side by side (the stage's own tokenizer is left as it is).",
    )
    p.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="RUN_OR_TOKENIZER_JSON",
        help="Also measure this tokenizer (a run directory, a tokenizer folder or any tokenizer.json) on the same "
        "held-out text and print it beside the run's own, per language, into tokenizer-compare/; repeatable.",
    )


def train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="Print the planned data mixture over training (a table per phase: weights, tokens and epochs per "
        "source) and stop; nothing is trained or written.",
    )
    p.add_argument(
        "--from",
        dest="from_step",
        type=int,
        metavar="STEP",
        help="Resume the interrupted run from its resumable state after STEP instead of the newest (later states "
        "are moved aside into checkpoints/superseded-<time>/).",
    )
    p.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="Train with N processes on this machine (at most one per visible GPU; on the CPU one per core, at "
        "least 8): checks the recipe's layout for N processes (the parallel section lays them out), then "
        "runs `torchrun --standalone --nproc-per-node N -m kiln train` with the other arguments; with "
        "--dry-run, plans for N processes without starting them.",
    )
    p.add_argument(
        "--slurm",
        type=int,
        metavar="NODES",
        help="Submit the training as one Slurm job on NODES nodes (slurm.train.tasks_per_node srun tasks each; "
        "the recipe's slurm and slurm.train sections): checks the layout for that many processes, writes the "
        "resolved recipe and the sbatch script under <run>/slurm/, submits it and prints the job id and its log; "
        "Slurm's warning before the time limit saves a state and requeues the job, which resumes. With "
        "--dry-run, prints the script and submits nothing.",
    )


def submit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="Nodes of the training job (slurm.train.tasks_per_node srun tasks each).",
    )
    p.add_argument(
        "--until",
        choices=[v.name for v in DEMO_STAGES],
        metavar="VERB",
        help="Submit the stages up to this one only (one of: "
        f"{', '.join(v.name for v in DEMO_STAGES)}), without the closing `kiln demo`.",
    )
    p.add_argument("--dry-run", action="store_true", help="Print the scripts and submit nothing.")


def eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        dest="data_files",
        action="append",
        default=[],
        metavar="PATH",
        help="Also score this text, JSONL or Parquet file (per file and per `source` field); repeatable; replaces "
        "eval.data.",
    )
    p.add_argument(
        "--task",
        dest="tasks",
        action="append",
        default=[],
        metavar="TASK.jsonl",
        help="Also score this multiple-choice task (JSONL: context or query, choices, label) zero-shot; "
        "repeatable; replaces eval.tasks.",
    )


def generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompt",
        metavar="TEXT",
        help="Complete TEXT, taken as it is (same as --set generate.prompt=TEXT; write --prompt=TEXT for a text "
        "that starts with -).",
    )
    p.add_argument(
        "--prompt-file",
        metavar="FILE",
        help="Complete every prompt of FILE (JSONL with a `prompt` field, or one prompt per line) into "
        "generate/samples.jsonl (same as --set generate.prompt_file=FILE).",
    )


def export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "out",
        nargs="?",
        metavar="OUT",
        help="Also copy the folder here (same as --set export.out=OUT); an existing folder is replaced only when "
        "it is empty or holds an earlier kiln export (kiln_export.json) and nothing else, --force or not.",
    )
    p.add_argument(
        "--format",
        dest="export_format",
        choices=["hf"],
        help="Output format (same as --set export.format=...): hf, a Hugging Face transformers folder.",
    )


def import_hf_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "folder",
        metavar="DIR",
        help="The Hugging Face folder: config.json, model.safetensors (or shards with "
        "model.safetensors.index.json), tokenizer.json.",
    )
    p.add_argument("--run", metavar="NAME", help="Run name (same as --set name=NAME): writes runs/NAME/.")


def extend_tokenizer_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--terms",
        required=True,
        metavar="FILE",
        help="UTF-8 file, one term per line (one pre-split piece, such as a word; it is added after a space and bare).",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="Checkpoint folder to resize (default: the run's train/checkpoint when it exists).",
    )
    p.add_argument(
        "--text",
        metavar="FILE",
        help="The domain's validation text (UTF-8): its fertility and tokens per word are reported before and after.",
    )
    p.add_argument(
        "--specials",
        metavar="LIST",
        help=(
            "Also add kiln's special tokens to an imported tokenizer: fim, mask, sentinels:N, comma-separated "
            "(each new row the mean of every old row)."
        ),
    )


def quality_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", metavar="NAME", help="Run name (same as --set name=NAME): writes runs/NAME/quality/.")


def plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of the table.")


def report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", metavar="NAME", help="Run name (same as --set name=NAME): reads runs/NAME/.")
    p.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="Rebuild the page every SECONDS seconds until interrupted (for a run in progress).",
    )


def vocab_sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of vocabulary sizes, e.g. 4096,8192,32768"
        ) from None
    if not sizes:
        raise argparse.ArgumentTypeError("give at least one vocabulary size, e.g. 4096,8192,32768")
    return sizes


# ---- the recipe a command line describes ----

# Flags that stand for one recipe key each: (parsed attribute, key), in the order their overrides
# apply (all before --set). A flag's value becomes that key's YAML (as_yaml), but --prompt's text
# is taken as it is (kiln.recipe.literal_override); --input and --decontaminate name files, each
# becoming an entry {path: ...} of the list the key holds.
KEY_FLAGS = (
    ("export_format", "export.format"),
    ("out", "export.out"),
    ("prompt", "generate.prompt"),
    ("prompt_file", "generate.prompt_file"),
    ("tasks", "eval.tasks"),
    ("data_files", "eval.data"),
    ("run", "name"),
    ("eval_sets", "curate.decontaminate.eval_sets"),
    ("inputs", "curate.inputs"),
)
FILE_LISTS = frozenset({"eval_sets", "inputs"})


def as_yaml(value: object) -> str:
    """A flag's value as the YAML of an override: JSON with characters outside ASCII kept as they are
    (JSON's escapes of characters beyond U+FFFF are surrogate pairs, which YAML reads as two broken characters)."""
    return json.dumps(value, ensure_ascii=False)


def recipe_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The recipe to load and the overrides: the flags that stand for recipe keys, then --set."""
    from kiln.recipe import literal_override

    overrides = []
    for attr, key in KEY_FLAGS:
        value = getattr(args, attr, None)
        if attr == "prompt":
            if value is not None:  # --prompt '' completes the empty text
                overrides.append(literal_override(key, value))
        elif value:  # '' (an unset shell variable) sets nothing
            overrides.append(f"{key}={as_yaml([{'path': p} for p in value] if attr in FILE_LISTS else value)}")
    recipe, inputs = args.recipe, getattr(args, "inputs", [])
    if recipe is None and not inputs:
        recipe = "demo"
    if recipe is None and not getattr(args, "run", None):
        raise ConfigError(
            "curate --input needs --run NAME (the run directory to write), or a --recipe that names the run"
        )
    return recipe, [*overrides, *args.overrides]


def load(args: argparse.Namespace) -> Recipe:
    """The recipe of this command line, validated whole before any work."""
    from kiln.core.executors import slurm
    from kiln.core.storage import configure
    from kiln.recipe import load_recipe

    recipe = load_recipe(*recipe_and_overrides(args))
    check_profile(recipe.storage.profile)
    configure(recipe.storage)  # before any stage reaches a store
    detach = getattr(args, "detach", False)
    if detach and getattr(recipe, args.verb).executor.kind != "slurm":
        raise ConfigError(f"--detach: {args.verb}.executor.kind is not slurm; only Slurm arrays run on without kiln")
    slurm.configure(recipe.slurm, recipe.runs_dir, detach)  # before any stage submits an array
    return recipe


def check_profile(profile: str | None) -> None:
    """storage.profile names a profile of this machine's AWS config files: checked here, as the section is
    applied, not at the first request of some stage (where botocore's ProfileNotFound ended the command)."""
    if profile is None:
        return
    try:
        import botocore.session  # installed with s3fs; only a recipe naming a profile pays for the import
    except ImportError:
        return  # no S3 client here: the first s3:// location says what to install (kiln.core.storage)
    # Reads AWS_CONFIG_FILE and AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/config and ~/.aws/credentials).
    known = botocore.session.Session().available_profiles
    if profile not in known:
        raise ConfigError(
            f"storage.profile {profile!r}: no such profile in this machine's AWS config files (profiles there: "
            f"{', '.join(sorted(known)) or 'none'}); create it (aws configure --profile {profile}) or name another"
        )


def flags_for(verb: Verb, args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags a verb hands its function by name (kiln.verbs: `options`)."""
    return {name: getattr(args, name) for name in verb.options}


def print_summary(recipe: Recipe, manifest: dict[str, Any]) -> int:
    """Print the stage's summary.txt, or each one's for a verb of several stages (`{"stages": [...]}`; rank 0
    only, under torchrun); exit status 0."""
    if is_main_process():
        for each in manifest.get("stages", [manifest]):
            print((RunLayout(recipe.run_dir).stage(each["stage"]) / SUMMARY).read_text().rstrip())
    return 0


# ---- commands: (verb, parsed arguments) -> exit status ----


def run_stage_verb(verb: Verb, args: argparse.Namespace) -> int:
    """`kiln VERB` for a stage: run it (kiln.stages.run_stage saves the resolved recipe after
    success) and print its summary."""
    from kiln.stages import run_stage

    recipe = load(args)
    return print_summary(recipe, run_stage(verb, recipe, args.force, **flags_for(verb, args)))


def curate(verb: Verb, args: argparse.Namespace) -> int:
    """`kiln curate`; with --explain, why one document was removed, and nothing is curated."""
    if args.explain is None:  # '' (an unset shell variable) is an error, not a curation
        return run_stage_verb(verb, args)
    from kiln.curate.explain import explain

    print(explain(RunLayout(load(args).run_dir).stage(CURATE), args.explain))
    return 0


def train_tokenizer(verb: Verb, args: argparse.Namespace) -> int:
    """`kiln train-tokenizer`; with --sweep, one tokenizer per vocabulary size beside the stage's own; with
    --compare, the stage's tokenizer (trained unless current) measured beside others."""
    if args.sweep and args.compare:
        raise ConfigError("--sweep and --compare: give one at a time (a sweep already sets its sizes side by side)")
    if args.compare:
        from kiln.stages import run_stage
        from kiln.tokenize.compare import run as compare

        recipe = load(args)
        print_summary(recipe, run_stage(verb, recipe, args.force))
        return print_summary(recipe, compare(recipe.tokenizer, recipe.run_dir, args.compare, args.force))
    if not args.sweep:
        return run_stage_verb(verb, args)
    from kiln.stages import run_tokenizer_sweep, save_resolved

    recipe = load(args)
    manifest = run_tokenizer_sweep(recipe, args.force, args.sweep)
    save_resolved(recipe)
    return print_summary(recipe, manifest)


def train(verb: Verb, args: argparse.Namespace) -> int:
    """`kiln train`: --dry-run plans and stops; --nproc N checks the launch on this machine, then
    starts N processes under torchrun, each running this same command without --nproc; --slurm NODES
    submits it as a Slurm job (kiln.slurm_jobs)."""
    if args.slurm is not None:
        return train_on_slurm(args)
    nproc = args.nproc
    if nproc is not None and nproc < 1:
        raise ConfigError(f"--nproc {nproc}: give the number of processes to start, 1 or more")
    if nproc is not None and args.dry_run:
        # Plan for that launch: the batch and memory per rank of N processes, timed on one.
        os.environ["WORLD_SIZE"] = str(nproc)
    recipe = load(args)
    if nproc is not None and not args.dry_run:
        from kiln.launch import check_layout_for, check_process_count, launch_torchrun

        check_process_count(recipe, nproc)
        os.environ["WORLD_SIZE"] = str(nproc)  # the recipe again, for N processes: the batch arithmetic counts them
        check_layout_for(load(args), nproc)
        return launch_torchrun(args.argv, nproc)
    if args.dry_run:
        from kiln.train_plan import dry_run_train

        print(dry_run_train(recipe))
        return 0
    from kiln.stages import run_stage

    return print_summary(recipe, run_stage(verb, recipe, args.force, **flags_for(verb, args)))


@contextmanager
def validated_for(nproc: int) -> Iterator[None]:
    """WORLD_SIZE=nproc while a recipe is loaded for a launch elsewhere (the batch arithmetic counts the
    processes), as it was afterwards: sbatch hands this process's environment to every job it submits."""
    before = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(nproc)
    try:
        yield
    finally:
        if before is None:
            del os.environ["WORLD_SIZE"]
        else:
            os.environ["WORLD_SIZE"] = before


def train_on_slurm(args: argparse.Namespace) -> int:
    """`kiln train --slurm NODES [--dry-run]`: the recipe and layout checked for the job's processes here,
    then the job's script printed or submitted."""
    from kiln.launch import check_layout_for
    from kiln.slurm_jobs import submit_train

    nodes = args.slurm
    if args.nproc is not None:
        raise ConfigError(
            f"--slurm {nodes} and --nproc {args.nproc}: give one; a Slurm job starts slurm.train.tasks_per_node "
            "processes on each node itself (srun)"
        )
    if nodes < 1:
        raise ConfigError(f"--slurm {nodes}: give the number of nodes of the job, 1 or more")
    processes = nodes * slurm_tasks_per_node(args)
    with validated_for(processes):
        recipe = load(args)
        check_layout_for(recipe, processes)
    # --from and --force hold for the job's first start: a requeued job resumes from its newest state.
    first_start = (*(("--from", str(args.from_step)) if args.from_step is not None else ()),)
    print(submit_train(recipe, nodes, first_start + (("--force",) if args.force else ()), args.dry_run))
    return 0


def slurm_tasks_per_node(args: argparse.Namespace) -> int:
    """slurm.train.tasks_per_node, from the recipe loaded as for one process (what validates for N processes
    validates for one: the batch arithmetic only asks more of more data ranks)."""
    with validated_for(1):
        return load(args).slurm.train.tasks_per_node


def submit(verb: Verb, args: argparse.Namespace) -> int:
    """`kiln submit`: the demo's stages as a chain of Slurm jobs (kiln.slurm_jobs), training on --nodes."""
    from kiln.launch import check_layout_for
    from kiln.slurm_jobs import submit_run

    if args.nodes < 1:
        raise ConfigError(f"--nodes {args.nodes}: give the number of nodes of the training job, 1 or more")
    processes = args.nodes * slurm_tasks_per_node(args)
    with validated_for(processes):
        recipe = load(args)
        names = [v.name for v in DEMO_STAGES]
        if args.until is None or names.index(args.until) >= names.index("train"):
            check_layout_for(recipe, processes)
    print(submit_run(recipe, args.nodes, args.until, args.dry_run))
    return 0


def import_hf(verb: Verb, args: argparse.Namespace) -> int:
    """`kiln import-hf DIR`: no recipe made this run, so none is saved into it."""
    recipe = load(args)
    return print_summary(recipe, resolve(verb.run)(recipe, args.force, **flags_for(verb, args)))


def plan(verb: Verb, args: argparse.Namespace) -> int:
    """`kiln plan` with no subcommand: parameters, FLOPs per token and training compute of the recipe."""
    from kiln.plan.flops import format_plan, plan_training

    recipe = load(args)
    tokens = recipe.train.steps * recipe.train.tokens_per_step
    result = plan_training(
        recipe.model, recipe.train.seq_len, tokens, recipe.model.vocab_size or recipe.tokenizer.vocab_size
    )
    print(json.dumps(result) if args.json else format_plan(result))
    return 0


def plan_subcommand(verb: Verb, args: argparse.Namespace) -> int:
    """`kiln plan SUBCOMMAND`: no recipe; kiln.plan.cli reports its own errors."""
    from kiln.plan.cli import run_plan

    return run_plan(args, resolve(verb.run))


def sweep(verb: Verb, args: argparse.Namespace) -> int:
    from kiln.sweep import run_verb

    return run_verb(args)


def report(verb: Verb, args: argparse.Namespace) -> int:
    from kiln.report_hooks import build_report

    recipe = load(args)
    if args.watch is not None and args.watch <= 0:
        raise ConfigError(f"--watch {args.watch}: give the seconds between rebuilds, more than 0")
    print(build_report(recipe.run_dir, args.watch))
    return 0


def demo(verb: Verb, args: argparse.Namespace) -> int:
    from kiln.demo import format_summary, run_demo

    print(format_summary(run_demo(load(args), args.force)))
    return 0
