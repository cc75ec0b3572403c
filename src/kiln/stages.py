"""Each stage run from a recipe: the one place where stage packages meet.

A runner hands its stage only its own recipe sections. Where a stage needs another's code, the
wiring is here, so stage packages never import each other: train draws its rows through mix's
sampler and scores evaluate's probe set, eval reads `--data` files with curate's readers
(kiln.eval_files), the tokenizer report prices its embedding table at the model's width.
kiln.verbs names these runners; `run_stage` runs one and records the resolved recipe.
Stage code is imported inside each runner, so `kiln curate` never pays for importing torch.
Not handled here: which stages run and in what order (kiln.verbs), flags (kiln.commands).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kiln.core.layout import RunLayout
from kiln.core.mirror import push, run_path
from kiln.core.ranks import is_main_process
from kiln.recipe import Recipe, recipe_to_yaml
from kiln.verbs import Verb, resolve


def run_stage(verb: Verb, recipe: Recipe, force: bool = False, **options: Any) -> dict[str, Any]:
    """Run a verb's stage (kiln.verbs: `run`); options go to its runner (train: from_step). The
    resolved recipe is saved after success: the run's recipe.yaml describes what its stages did."""
    manifest = resolve(verb.run)(recipe, force, **options)
    if is_main_process():  # under torchrun every rank runs the stage; one writes the run's files
        save_resolved(recipe)
    return manifest


def save_resolved(recipe: Recipe) -> None:
    recipe.run_dir.mkdir(parents=True, exist_ok=True)
    path = RunLayout(recipe.run_dir).recipe_yaml
    path.write_text(recipe_to_yaml(recipe), encoding="utf-8")
    push(path)  # a run on a store keeps its recipe there too


def embedding_shape(recipe: Recipe) -> Any:
    """The model width the tokenizer report prices its embedding table at."""
    from kiln.tokenize.train import EmbeddingShape

    return EmbeddingShape(d_model=recipe.model.d_model, tied_embeddings=recipe.model.tie_embeddings)


def run_curate(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.curate.run import run

    return run(r.curate, r.run_dir, force)


def run_tokenizer(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.tokenize.train import run

    return run(r.tokenizer, r.run_dir, embedding_shape(r), force)


def run_tokenizer_sweep(r: Recipe, force: bool, vocab_sizes: list[int]) -> dict[str, Any]:
    """`kiln train-tokenizer --sweep`: one tokenizer per vocabulary size, into tokenizer-sweep/."""
    from kiln.tokenize.train import sweep

    return sweep(r.tokenizer, r.run_dir, vocab_sizes, embedding_shape(r), force)


def run_tokenize(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.tokenize.encode import run

    return run(r.tokenize, r.run_dir, force)


def run_train(r: Recipe, force: bool, from_step: int | None = None) -> dict[str, Any]:
    """The train stage knows its data only as a RowSource: mix's sampler over this run's token
    shards, built once train knows its seq_len; the mix section is hashed with it."""
    from kiln.evaluate.probe import build_probe
    from kiln.mix.sampler import build_sampler
    from kiln.train.run import TrainInputs, run

    make_rows = partial(build_sampler, RunLayout(r.run_dir).token_shards, r.mix)
    replay = [run_path(r.mix.replay.run)] if r.mix.replay else []  # a run in a store: its place in a mirror
    # The probe set is evaluate's; the trainer only knows when to call it (train.probe_every).
    make_probe = partial(build_probe, r.run_dir, r.eval.probe)
    return run(
        r.model,
        r.train,
        TrainInputs(r.mix, make_rows, r.eval.scoring(), r.parallel, replay, make_probe),
        r.run_dir,
        force,
        from_step,
    )


def run_eval(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.eval_files import read_for_eval
    from kiln.evaluate.run import run

    return run(r.eval, r.run_dir, force, read_for_eval)


def run_generate(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.evaluate.generate import run

    return run(r.generate, r.run_dir, force)


def run_export(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.evaluate.export import run

    return run(r.export, r.generate, r.run_dir, force)


def run_import_hf(r: Recipe, force: bool, folder: str) -> dict[str, Any]:
    """`kiln import-hf DIR`: the Hugging Face folder as this run's tokenizer and train stages."""
    from kiln.evaluate.config import ImportConfig
    from kiln.evaluate.import_hf import run

    return run(ImportConfig(source=folder), r.run_dir, force)


def run_extend_tokenizer(
    r: Recipe,
    force: bool,
    terms: str,
    checkpoint: str | None = None,
    text: str | None = None,
    specials: str | None = None,
) -> dict[str, Any]:
    from kiln.tokenize.extend import ExtendConfig, run

    return run(ExtendConfig(terms=terms, checkpoint=checkpoint, text=text, specials=specials), r.run_dir, force)


def run_quality_lm(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.curate.quality.run import train_lm

    return train_lm(r.quality, r.curate, r.run_dir, force)


def run_quality_labels(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.curate.quality.run import train_labels

    return train_labels(r.quality, r.run_dir, force)


def run_quality_classifier(r: Recipe, force: bool) -> dict[str, Any]:
    from kiln.curate.quality.run import train_classifier

    return train_classifier(r.quality, r.curate, r.run_dir, force)
