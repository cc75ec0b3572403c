"""The `kiln` command: help for every verb, override errors, and `plan`.

Most tests call kiln.cli.main in-process; one runs the installed entry point to check the real
exit status. None of them trains anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.cli import build_parser, main, recipe_and_overrides
from kiln.plan.flops import plan_training
from kiln.recipe import load_recipe

KILN = Path(sys.executable).with_name("kiln")
VERBS = ["curate", "train-tokenizer", "tokenize", "train", "eval", "generate", "plan", "demo"]
# A key each verb's --help must list (the sections it reads).
VERB_KEY = {
    "curate": "curate.max_total_mb",
    "train-tokenizer": "tokenizer.vocab_size",
    "tokenize": "tokenize.val_fraction",
    "train": "train.optim",
    "eval": "eval.max_tokens_per_source",
    "generate": "generate.top_p",
    "plan": "model.d_model",
    "demo": "generate.prompt",
}


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse exits for --help and usage errors
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_top_level_help_lists_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0
    for verb in VERBS:
        assert verb in out
    assert "kiln plan --recipe demo --json" in out  # the examples epilog


@pytest.mark.parametrize("verb", VERBS)
def test_verb_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main([verb, "--help"], capsys)
    assert code == 0
    assert "--recipe" in out and "--set" in out
    assert ("--force" in out) == (verb != "plan")  # plan writes nothing, so there is nothing to redo
    assert VERB_KEY[verb] in out
    if verb == "plan":
        assert "--json" in out


def test_verb_help_lists_only_the_sections_it_reads(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(["eval", "--help"], capsys)
    assert "  eval.batch_size [default: 8]" in out
    assert "  train.optim [default" not in out and "  curate.inputs [default" not in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["--version"], capsys)
    assert code == 0 and out.startswith("kiln ")


def test_unknown_verb_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["bake"], capsys)
    assert code == 2 and "invalid choice: 'bake'" in err


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("curate.bogus_key=1", "curate.bogus_key: unknown key"),
        ("bogus_section.x=1", "bogus_section: unknown key"),
        ("train.optim.lr=fast", "train.optim.lr"),
        ("model.max_seq_len=128", "train.seq_len (256) exceeds model.max_seq_len (128)"),
        ("train", "expected section.key=value"),
    ],
)
def test_bad_override_exits_2_naming_the_key_and_writes_nothing(override: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    code, out, err = run_main(["curate", "--recipe", "demo", "--set", f"runs_dir={runs}", "--set", override], capsys)
    assert code == 2
    assert named in err
    assert err.startswith("kiln curate: error:")
    assert "Traceback" not in err
    assert not runs.exists()
    assert list(tmp_path.iterdir()) == []


def test_unknown_recipe_names_the_shipped_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["plan", "--recipe", "no_such_recipe"], capsys)
    assert code == 2 and "no_such_recipe" in err and "demo" in err


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["plan", "--recipe", "demo", "--json"], capsys)
    assert code == 0
    plan = json.loads(out)
    recipe = load_recipe("demo")
    assert plan == plan_training(recipe.model, recipe.train.seq_len, recipe.train.steps * recipe.train.tokens_per_step, recipe.tokenizer.vocab_size)
    assert plan["train_flops"] == plan["flops_per_token"] * plan["tokens"]


def test_plan_follows_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(["plan", "--json", "--set", "model.d_model=512", "--set", "train.steps=10", "--set", "train.schedule.warmup_fraction=0.2"], capsys)
    plan = json.loads(out)
    recipe = load_recipe("demo", ["model.d_model=512", "train.steps=10", "train.schedule.warmup_fraction=0.2"])
    assert plan == plan_training(recipe.model, recipe.train.seq_len, recipe.train.steps * recipe.train.tokens_per_step, recipe.tokenizer.vocab_size)
    assert plan["tokens"] == 10 * recipe.train.tokens_per_step == 10 * recipe.train.global_batch_tokens
    assert plan["params"] > json.loads(run_main(["plan", "--json"], capsys)[1])["params"]


PARSER = build_parser()


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_generate_prompt_takes_any_text_as_it_is(text: str) -> None:
    # `kiln generate --prompt TEXT`: quotes, `: `, a leading - or #, line breaks arrive unchanged.
    args = PARSER.parse_args(["generate", f"--prompt={text}"])
    assert load_recipe(*recipe_and_overrides(args)).generate.prompt == text
    # A later --set of the same key wins, as for every flag that stands for a key.
    args = PARSER.parse_args(["generate", "--prompt", "a", "--set", "generate.prompt=def main(argv):"])
    assert load_recipe(*recipe_and_overrides(args)).generate.prompt == "def main(argv):"


def test_plan_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["plan"], capsys)
    recipe = load_recipe("demo")
    plan = plan_training(recipe.model, recipe.train.seq_len, recipe.train.steps * recipe.train.tokens_per_step, recipe.tokenizer.vocab_size)
    assert code == 0
    assert f"{plan['params']:,}" in out and f"{plan['train_flops']:.3e}" in out


def test_entry_point_exit_status(tmp_path: Path) -> None:
    if not KILN.is_file():
        pytest.skip(f"no kiln script beside {sys.executable}")
    ok = subprocess.run([str(KILN), "plan", "--json"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "train_flops" in json.loads(ok.stdout)
    bad = subprocess.run([str(KILN), "curate", "--set", f"runs_dir={tmp_path / 'runs'}", "--set", "curate.bogus_key=1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "curate.bogus_key: unknown key" in bad.stderr
    assert not (tmp_path / "runs").exists()
