"""The one table of kiln's verbs: each declared once, and everything that lists verbs or stages reads it.

A `Verb` gives its name and help, the run-directory folder its stage writes, the recipe sections
it reads, its own flags and the functions it runs. kiln.cli builds the parser, every `--help`
(with its "recipe keys" epilog) and the dispatch from it; `kiln demo` runs the verbs marked `demo`
in table order, `kiln sweep` the ones before training, and the report lists a run's stages in
this order. Whether a finished stage is skipped is each stage's own decision (its manifest,
kiln.core.manifest.Stage.up_to_date); the table only says which stages run, and in what order.

Functions are named "module:function" and imported when called, so importing this module (and
kiln.cli) imports no stage and no torch: the local executor's spawned workers import the `kiln`
script, and each paid about 4 s of imports (3 s of CPU) for nothing when they did.
Not handled here: what a verb does (kiln.commands, kiln.stages, kiln.plan.cli), how flags become
recipe overrides (kiln.commands.recipe_and_overrides), building the parser (kiln.cli).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from kiln.core.layout import CURATE, EVAL, EXPORT, GENERATE, QUALITY, TOKENIZE, TOKENIZER, TOKENIZER_EXTENDED, TRAIN

PLAN_CLI = "kiln.plan.cli"


@dataclass(frozen=True)
class Group:
    """A verb's subcommands, as argparse adds them (`kiln quality train-lm`, `kiln plan flops`)."""

    dest: str  # the attribute the chosen subcommand's name is parsed into
    verbs: tuple[Verb, ...]
    required: bool = True  # False: the verb alone runs its own command (`kiln plan`)
    title: str | None = None  # the heading of the subcommand list in --help; None: argparse's
    parser_class: str | None = None  # "module:Class" of the subcommands' parsers; None: argparse's


@dataclass(frozen=True)
class Verb:
    """One `kiln` verb (or subcommand). Functions are "module:function" names (see `resolve`)."""

    name: str
    help: str  # its line in the parent's --help, and the description of its own
    command: str = "kiln.commands:run_stage_verb"  # (verb, parsed args) -> exit status
    # What does the work, called by `command`: for a stage, (recipe, force, **options) -> manifest,
    # which `kiln demo` and `kiln sweep` call too; for a plan subcommand, (args) -> (result, format).
    run: str | None = None
    stage: str | None = None  # the run-directory folder it writes (kiln.core.layout)
    sections: tuple[str, ...] = ()  # the recipe sections it reads: its --help lists their keys
    arguments: str | None = None  # (parser) -> None: adds its own flags after --recipe, --set, --force
    recipe: bool = True  # takes --recipe and --set
    force: bool = True  # takes --force (plan and report write no stage)
    demo: bool = False  # one of the stages `kiln demo` runs, in table order
    options: tuple[str, ...] = ()  # parsed flags handed to `run` by name (train: from_step)
    group: Group | None = None


def resolve(name: str) -> Any:
    """The object a "module:attribute" name stands for, its module imported now."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


def plan_subcommand(name: str, help_text: str, run: str) -> Verb:
    """A `kiln plan` subcommand: plan.cli's arguments `<run>_arguments` and its function `run`."""
    return Verb(
        name,
        help_text,
        command="kiln.commands:plan_subcommand",
        run=f"{PLAN_CLI}:{run}",
        arguments=f"{PLAN_CLI}:{run}_arguments",
        recipe=False,
        force=False,
    )


STAGE_VERBS = (
    Verb(
        "curate",
        "Read raw text (JSONL, Parquet, WARC, HTML, text), extract, normalize, filter (URL, language, "
        "Gopher, C4, FineWeb, code rules), redact PII, remove boilerplate lines, benchmark contamination, "
        "exact and near duplicates (MinHash); write curated shards and the audit.",
        command="kiln.commands:curate",
        run="kiln.stages:run_curate",
        stage=CURATE,
        sections=("curate",),
        arguments="kiln.commands:curate_arguments",
        demo=True,
    ),
    Verb(
        "train-tokenizer",
        "Train a byte-level BPE tokenizer on a sample of the curated shards; report bytes per token, tokens "
        "per word and fertility per source and language on held-out documents (tokenizer/report.json).",
        command="kiln.commands:train_tokenizer",
        run="kiln.stages:run_tokenizer",
        stage=TOKENIZER,
        sections=("tokenizer", "model"),
        arguments="kiln.commands:tokenizer_arguments",
        demo=True,
    ),
    Verb(
        "tokenize",
        "Encode curated shards into per-source train/validation token shards.",
        run="kiln.stages:run_tokenize",
        stage=TOKENIZE,
        sections=("tokenize",),
        arguments="kiln.commands:tokenize_arguments",
        demo=True,
    ),
    Verb(
        "train",
        "Train the decoder on token shards; write a checkpoint and per-step metrics.",
        command="kiln.commands:train",
        run="kiln.stages:run_train",
        stage=TRAIN,
        sections=("model", "train", "mix", "parallel", "eval"),
        arguments="kiln.commands:train_arguments",
        demo=True,
        options=("from_step",),
    ),
    Verb(
        "eval",
        "Validation loss, perplexity and bits per byte per source for the trained checkpoint (and the "
        "untrained model); also any text, JSONL or Parquet file (--data) and zero-shot multiple-choice tasks "
        "(--task).",
        run="kiln.stages:run_eval",
        stage=EVAL,
        sections=("eval",),
        arguments="kiln.commands:eval_arguments",
        demo=True,
    ),
    Verb(
        "generate",
        "Complete generate.prompt, or every prompt of --prompt-file into generate/samples.jsonl, from the "
        "trained checkpoint: batched, with a KV cache; sampling settings in the recipe's generate section.",
        run="kiln.stages:run_generate",
        stage=GENERATE,
        sections=("generate",),
        arguments="kiln.commands:generate_arguments",
        demo=True,
    ),
    Verb(
        "export",
        "Write the trained model as a Hugging Face folder (export/hf/, and OUT when given) that "
        "transformers' Auto classes load offline: Llama (Qwen3 with QK-norm) config, safetensors, kiln's "
        "tokenizer, generation config, a model card from the run's manifests.",
        run="kiln.stages:run_export",
        stage=EXPORT,
        sections=("export", "generate"),
        arguments="kiln.commands:export_arguments",
        demo=True,
    ),
)

QUALITY_VERBS = (
    Verb(
        "train-lm",
        "Train the n-gram language model of the perplexity filter on the reference text "
        "(quality.reference_source or quality.reference); score a sample of the raw corpus for its "
        "percentile cutoffs.",
        run="kiln.stages:run_quality_lm",
        stage=QUALITY,
        sections=("quality",),
        arguments="kiln.commands:quality_arguments",
    ),
    Verb(
        "train-classifier",
        "Train the reference-vs-corpus classifier of the quality_classifier filter (positives: reference "
        "text, negatives: a sample of the raw corpus); report held-out precision, recall and AUC.",
        run="kiln.stages:run_quality_classifier",
        stage=QUALITY,
        sections=("quality",),
        arguments="kiln.commands:quality_arguments",
    ),
    Verb(
        "train-labels",
        "Train a classifier on each labelled file of quality.labels (JSONL or CSV, a text and a label a row: "
        "classes such as toxic or clean, or a score such as educational value 0-5); report held-out precision "
        "and recall, or correlation. The curate step `classifiers` applies them.",
        run="kiln.stages:run_quality_labels",
        stage=QUALITY,
        sections=("quality",),
        arguments="kiln.commands:quality_arguments",
    ),
    Verb(
        "thresholds",
        "Derive one language's filter settings from text you trust: each threshold where it removes a set share "
        "of that reference (FineWeb-2's method), printed with the share it removes and written as recipe YAML.",
        command="kiln.curate.quality.thresholds:command",
        arguments="kiln.curate.quality.thresholds:arguments",
        recipe=False,
        force=False,
    ),
)

PLAN_VERBS = (
    plan_subcommand(
        "flops",
        "Training FLOPs from parameters and tokens: 6ND, and exact with attention (PaLM App. B) from a "
        "preset or layers, d_attn and seq_len.",
        "flops",
    ),
    plan_subcommand(
        "chinchilla",
        "Compute-optimal parameters and tokens for a FLOP budget, a dollar budget or a fixed size, with "
        "GPU-hours, days and cost.",
        "chinchilla",
    ),
    plan_subcommand(
        "inference-aware",
        "The size and tokens minimising training + inference FLOPs for a target loss (Sardana et al. 2023), "
        "beside the Chinchilla-optimal choice.",
        "inference_aware",
    ),
    plan_subcommand(
        "memory",
        "Bytes per GPU for weights, gradients, optimizer states (ZeRO paper) and activations (Korthikanti et "
        "al. 2022); fits or not.",
        "memory",
    ),
    plan_subcommand(
        "layout",
        "Proposes tp (inside a node), pp, dp, ZeRO stage, recompute and micro-batching that fit, with "
        "reasons and the pipeline bubble.",
        "layout",
    ),
    plan_subcommand(
        "checkpoint-interval",
        "Young/Daly optimal checkpoint interval and the expected share of time lost.",
        "checkpoint_interval",
    ),
    plan_subcommand(
        "fit",
        "Fits L(N, D) = E + A/N^alpha + B/D^beta (Huber on log loss, L-BFGS, as Hoffmann et al.) to kiln "
        "runs or a CSV; bootstrap intervals, prediction, plot.",
        "fit",
    ),
)

OTHER_VERBS = (
    Verb(
        "import-hf",
        "Turn a Llama (or Qwen3) Hugging Face folder with kiln's tokenizer into a kiln run (tokenizer/ and "
        "train/checkpoint/ with manifests): ready for generate, export, eval --data and continued "
        "pretraining.",
        command="kiln.commands:import_hf",
        run="kiln.stages:run_import_hf",
        arguments="kiln.commands:import_hf_arguments",
        options=("folder",),
    ),  # writes tokenizer/ and train/, the stages of the verbs above
    Verb(
        "extend-tokenizer",
        "Add domain terms to the run's tokenizer (trained, or an imported model's BPE) as whole tokens "
        "(printing each term's token count before and after, and with --text the fertility of the domain's "
        "validation text) and give the run's train checkpoint (or --checkpoint) embedding and output rows "
        "for them, each the mean of the rows of the term's old pieces; writes tokenizer-extended/.",
        run="kiln.stages:run_extend_tokenizer",
        stage=TOKENIZER_EXTENDED,
        arguments="kiln.commands:extend_tokenizer_arguments",
        options=("terms", "checkpoint", "text", "specials"),
    ),
    Verb(
        "quality",
        "Train the models of the model-based quality filters (subcommands); the curate steps `perplexity` "
        "and `quality_classifier` then use them. Reads the recipe's quality section and curate.inputs.",
        sections=("quality",),
        recipe=False,
        force=False,
        group=Group("quality_verb", QUALITY_VERBS),
    ),
    Verb(
        "plan",
        "Plan before spending GPUs: FLOPs, Chinchilla and inference-aware sizes, cost, memory, parallel "
        "layout, checkpoint interval, scaling-law fits (subcommands). With no subcommand: parameters, FLOPs "
        "per token and training compute for the recipe's model and schedule.",
        command="kiln.commands:plan",
        sections=("model", "train"),
        arguments="kiln.commands:plan_arguments",
        force=False,
        group=Group(
            "plan_command",
            PLAN_VERBS,
            required=False,
            title="subcommands (each takes --json; see `kiln plan SUBCOMMAND --help`)",
            parser_class=f"{PLAN_CLI}:PlanParser",
        ),
    ),
    Verb(
        "sweep",
        "Train a grid of small models (sizes x steps) on the recipe's data, sharing its curate/tokenize "
        "stages, to feed `kiln plan fit`.",
        command="kiln.commands:sweep",
        sections=("model", "train"),
        arguments="kiln.sweep:add_sweep_arguments",
    ),
    Verb(
        "report",
        "Build the run's report: one self-contained HTML page (<run>/report/index.html) with the recipe and "
        "lineage, the curation funnel and removal reasons with examples, duplicates, languages, "
        "decontamination, the tokenizer, the realized mixture, training curves, evaluation, samples and the "
        "planner's estimate beside the measured run. Works on a run in progress.",
        command="kiln.commands:report",
        arguments="kiln.commands:report_arguments",
        force=False,
    ),
)

DEMO_STAGES = tuple(v for v in STAGE_VERBS if v.demo)

VERBS = (
    *STAGE_VERBS,
    *OTHER_VERBS,
    Verb(
        "demo",
        f"Run every stage ({', '.join(v.name for v in DEMO_STAGES)}) and write <run>/summary.json."
        " Finished stages are skipped.",
        command="kiln.commands:demo",
        sections=tuple(dict.fromkeys(s for v in DEMO_STAGES for s in v.sections)),
    ),
    Verb(
        "submit",
        f"Submit the demo's stages ({', '.join(v.name for v in DEMO_STAGES)}) as Slurm jobs, each starting once "
        "the one before succeeded (training as `kiln train --slurm` on --nodes), then `kiln demo` for the "
        "summary and the report; prints each job's id, verb and log. Every job reads the resolved recipe written "
        "beside the scripts (<run>/slurm/submit-<time>/); a stage its manifest says is current is skipped.",
        command="kiln.commands:submit",
        sections=("slurm",),
        arguments="kiln.commands:submit_arguments",
        force=False,
    ),
)


def every_verb(verbs: tuple[Verb, ...] = VERBS) -> list[Verb]:
    """Every verb and subcommand, parents before their subcommands."""
    return [w for v in verbs for w in (v, *(every_verb(v.group.verbs) if v.group else ()))]


def stage_verb(stage: str) -> Verb:
    """The verb of `kiln demo` that writes this stage folder."""
    return next(v for v in DEMO_STAGES if v.stage == stage)


def stages_before(stage: str) -> tuple[Verb, ...]:
    """The demo's stages that run before this one (`kiln sweep` runs the ones before training once)."""
    return DEMO_STAGES[: DEMO_STAGES.index(stage_verb(stage))]


def stage_order() -> tuple[str, ...]:
    """Every stage folder a verb writes, in table order: how the report lists a run's stages."""
    return tuple(dict.fromkeys(v.stage for v in every_verb() if v.stage))
