"""The `kiln` command: help for every verb, override errors, and `plan`; the verb table it is built from.

Most tests call kiln.cli.main in-process; one runs the installed entry point to check the real
exit status. None of them trains anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.cli import build_parser, main
from kiln.commands import recipe_and_overrides
from kiln.launch import cpu_process_limit, record_for_launcher, report_failed_launch
from kiln.plan.flops import plan_training
from kiln.recipe import load_recipe
from kiln.verbs import DEMO_STAGES, Verb, resolve
from kiln.verbs import VERBS as TABLE

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


def verb_paths(verbs: tuple[Verb, ...] = TABLE, above: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Verb]]:
    """Every verb and subcommand of the table with the words that name it: (("plan", "flops"), verb)."""
    return [
        pair
        for v in verbs
        for pair in [((*above, v.name), v), *(verb_paths(v.group.verbs, (*above, v.name)) if v.group else [])]
    ]


def test_the_parser_has_exactly_the_tables_verbs_with_their_functions() -> None:
    # One declaration per verb: the parser's verbs and subcommands are the table's, and every
    # function the table names (command, run, flags, parser class) exists.
    def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})

    parser = build_parser()
    assert list(choices(parser)) == [v.name for v in TABLE]
    for path, verb in verb_paths():
        level = parser
        for word in path:
            level = choices(level)[word]
        assert level.get_default("declared_verb") is verb, path
        assert list(choices(level)) == ([v.name for v in verb.group.verbs] if verb.group else []), path
        for name in (verb.command, verb.run, verb.arguments, verb.group and verb.group.parser_class):
            assert name is None or callable(resolve(name)), (path, name)


@pytest.mark.parametrize("path", [" ".join(path) for path, _ in verb_paths()])
def test_every_verb_and_subcommand_describes_itself_in_its_help(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    # `kiln plan flops --help` said nothing of what flops computes; every --help now opens with the table's text.
    verb = dict((" ".join(p), v) for p, v in verb_paths())[path]
    code, out, _ = run_main([*path.split(), "--help"], capsys)
    assert code == 0
    assert " ".join(verb.help.split()[:8]) in " ".join(out.split())


def test_the_demo_help_names_its_stages_and_every_section_they_read(capsys: pytest.CaptureFixture[str]) -> None:
    # The demo's stage list and recipe keys come from its stages' entries; parallel.* was missing, though train reads
    # it.
    _, out, _ = run_main(["demo", "--help"], capsys)
    assert f"Run every stage ({', '.join(v.name for v in DEMO_STAGES)})" in " ".join(out.split())
    for verb in DEMO_STAGES:
        for section in verb.sections:
            assert f"\n  {section}." in out, section
    assert "  parallel.tp [default: 1]" in out


def test_importing_the_cli_imports_no_stage_and_no_torch() -> None:
    # The local executor's spawned workers import the `kiln` script: each paid about 4 s of imports
    # when kiln.cli imported the recipe (and with it torch and pydantic) at module level.
    code = (
        "import sys, kiln.cli; print(' '.join(sorted(m for m in sys.modules if m.startswith(('kiln', 'torch', "
        "'pydantic')))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert not [m for m in loaded if m.startswith(("torch", "pydantic"))], loaded
    assert {m.split(".")[1] for m in loaded if m.count(".") >= 1} <= {"cli", "core", "launch", "verbs"}, loaded


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
def test_bad_override_exits_2_naming_the_key_and_writes_nothing(
    override: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
    assert plan == plan_training(
        recipe.model,
        recipe.train.seq_len,
        recipe.train.steps * recipe.train.tokens_per_step,
        recipe.tokenizer.vocab_size,
    )
    assert plan["train_flops"] == plan["flops_per_token"] * plan["tokens"]


def test_plan_follows_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(
        [
            "plan",
            "--json",
            "--set",
            "model.d_model=512",
            "--set",
            "train.steps=10",
            "--set",
            "train.schedule.warmup_fraction=0.2",
        ],
        capsys,
    )
    plan = json.loads(out)
    recipe = load_recipe("demo", ["model.d_model=512", "train.steps=10", "train.schedule.warmup_fraction=0.2"])
    assert plan == plan_training(
        recipe.model,
        recipe.train.seq_len,
        recipe.train.steps * recipe.train.tokens_per_step,
        recipe.tokenizer.vocab_size,
    )
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
    plan = plan_training(
        recipe.model,
        recipe.train.seq_len,
        recipe.train.steps * recipe.train.tokens_per_step,
        recipe.tokenizer.vocab_size,
    )
    assert code == 0
    assert f"{plan['params']:,}" in out and f"{plan['train_flops']:.3e}" in out


# A small model on the CPU: a launch of 2 processes fits its batch (2 rows x 64 x 2 ranks divide 1024 tokens).
SMALL = """\
name: run
runs_dir: {runs}
model: {{d_model: 64, n_layers: 2, n_heads: 2, n_kv_heads: 1, max_seq_len: 64}}
train: {{steps: 4, seq_len: 64, micro_batch_size: 2, global_batch_tokens: 1024, schedule: {{warmup_steps: 1}},
        precision: {{device: cpu}}}}
"""
LAUNCH_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def small_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "small.yaml"
    recipe.write_text(SMALL.format(runs=tmp_path / "runs"))
    return recipe


def kiln_train(recipe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KILN), "train", "--recipe", str(recipe), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=LAUNCH_ENV,
    )


def test_nproc_beyond_this_machine_is_refused_before_any_process_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--nproc 99999` started hundreds of workers, `--nproc 0` trained one process without a word.
    recipe, limit = small_recipe(tmp_path), cpu_process_limit()
    for n in (0, -1):
        code, _, err = run_main(["train", "--recipe", str(recipe), "--nproc", str(n)], capsys)
        assert (code, err) == (2, f"kiln train: error: --nproc {n}: give the number of processes to start, 1 or more\n")
    for n in (limit + 1, 99999):
        code, _, err = run_main(["train", "--recipe", str(recipe), "--nproc", str(n)], capsys)
        assert (
            code == 2
            and err.startswith(f"kiln train: error: --nproc {n}: at most {limit} CPU processes here")
            and f"use --nproc {limit} or fewer" in err
        )
    assert not (tmp_path / "runs").exists()


def test_a_bad_layout_is_told_once_before_any_process_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # With --nproc 8 a bad layout printed the same error 8 times, then torchrun's ChildFailedError traceback.
    done = kiln_train(small_recipe(tmp_path), "--nproc", "2", "--set", "parallel.tp=3")  # the real command
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "kiln train: error: parallel.pp (1) x parallel.dp_replicate (1) x parallel.dp_shard (-1) x parallel.cp "
        "(1) x parallel.tp (3)"
        " must multiply to the world size, the 2 processes torchrun started; the world size must be a multiple of "
        "pp x dp_replicate x cp x tp = 3"
    ]
    # A model the layout cannot split: kiln.train.mesh.check_layout, the ranks' own check, run first.
    monkeypatch.setenv(
        "WORLD_SIZE", "1"
    )  # main() sets it for the N processes: monkeypatch takes it back after the test
    code, _, err = run_main(
        ["train", "--recipe", str(small_recipe(tmp_path)), "--nproc", "2", "--set", "parallel.tp=2"], capsys
    )
    assert code == 2 and err.startswith(
        "kiln train: error: parallel.tp=2 cannot split this model: model.n_kv_heads (1) is not a multiple of "
        "parallel.tp (2)"
    )
    assert len(err.splitlines()) == 1 and not (tmp_path / "runs").exists()
    code, _, err = run_main(
        ["train", "--recipe", str(small_recipe(tmp_path)), "--nproc", "2", "--set", "train.optim.name=muon"], capsys
    )
    assert (
        code == 2
        and (
            "muon orthogonalises whole matrices, and parallel (pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 1) "
            "splits them"
        )
        in err
    )
    assert "use DDP (parallel.dp_replicate=2, parallel.dp_shard=1" in err


@pytest.mark.slow
def test_an_error_of_every_rank_is_told_once_without_a_traceback(tmp_path: Path) -> None:
    # A layout that passes, then every rank stops on missing data (no tokenize stage): rank 0 says it,
    # rank 1 hands its error to the launcher, which adds nothing; no traceback. About 12 s on 2 cores.
    done = kiln_train(small_recipe(tmp_path), "--nproc", "2")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert errors == [
        (
            f"kiln train: error: {tmp_path / 'runs' / 'run' / 'tokenize'}: no manifest.json; run that stage first (or "
            "`kiln demo`)"
        )
    ], done.stderr[-3000:]


def test_a_failed_launch_is_reported_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the launcher of `kiln train --nproc` says from torchrun's failure records (rank -> ProcessFailure).
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "rank1" / "error.json"
    error_file.parent.mkdir()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    record_for_launcher("train: shard 3 is truncated")  # what rank 1's main() does with a kiln error
    stopped = ProcessFailure(local_rank=0, pid=10, exitcode=-15, error_file=str(tmp_path / "none.json"))
    told = ProcessFailure(local_rank=1, pid=11, exitcode=2, error_file=str(error_file))
    # Rank 1 alone failed on a kiln error, rank 0 was stopped: rank 1's message, once.
    assert report_failed_launch({0: stopped, 1: told}, 2) == 2
    assert capsys.readouterr().err == "kiln train: error: train: shard 3 is truncated (process 1 of 2)\n"
    # Rank 0 printed its own kiln error (and recorded it), whether it then exited or torchrun stopped it: nothing more.
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "rank0.json"))
    record_for_launcher("train: shard 3 is truncated")
    for code in (2, -15):
        said = ProcessFailure(local_rank=0, pid=10, exitcode=code, error_file=str(tmp_path / "rank0.json"))
        assert report_failed_launch({0: said, 1: told}, 2) == 2 and capsys.readouterr().err == ""
    # A crash (its traceback is above) or a signal: which process, and how.
    crashed = ProcessFailure(local_rank=1, pid=11, exitcode=1, error_file=str(tmp_path / "none.json"))
    assert report_failed_launch({1: crashed}, 4) == 1
    assert (
        capsys.readouterr().err
        == "kiln train: error: process 1 of 4 exited with status 1 (its messages are above); the others were stopped\n"
    )
    killed = ProcessFailure(local_rank=3, pid=13, exitcode=-9, error_file=str(tmp_path / "none.json"))
    assert (
        report_failed_launch({3: killed}, 4) == 1 and "process 3 of 4 was killed by SIGKILL" in capsys.readouterr().err
    )


@pytest.mark.slow  # kiln processes started
def test_entry_point_exit_status(tmp_path: Path) -> None:
    if not KILN.is_file():
        pytest.skip(f"no kiln script beside {sys.executable}")
    ok = subprocess.run([str(KILN), "plan", "--json"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "train_flops" in json.loads(ok.stdout)
    bad = subprocess.run(
        [str(KILN), "curate", "--set", f"runs_dir={tmp_path / 'runs'}", "--set", "curate.bogus_key=1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "curate.bogus_key: unknown key" in bad.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["plain", "with space", "emoji 😀 and 中文", "tab\there"])
def test_paths_given_as_flags_arrive_unchanged(name: str) -> None:
    # A path's characters beyond U+FFFF were JSON-escaped as surrogate pairs, which YAML read as two broken characters.
    parser = build_parser()
    export = load_recipe(*recipe_and_overrides(parser.parse_args(["export", f"out/{name}"])))
    assert export.export.out == f"out/{name}"
    generate = load_recipe(*recipe_and_overrides(parser.parse_args(["generate", "--prompt-file", f"{name}.jsonl"])))
    assert generate.generate.prompt_file == f"{name}.jsonl"
    curate = load_recipe(
        *recipe_and_overrides(
            parser.parse_args(
                ["curate", "--input", f"data/{name}.jsonl", "--run", "r", "--decontaminate", f"{name}.jsonl"]
            )
        )
    )
    assert (
        curate.curate.inputs[0].path == f"data/{name}.jsonl"
        and curate.curate.decontaminate.eval_sets[0].path == f"{name}.jsonl"
    )
    scored = load_recipe(
        *recipe_and_overrides(parser.parse_args(["eval", "--data", f"{name}.txt", "--task", f"{name}.jsonl"]))
    )
    assert scored.eval.data == [f"{name}.txt"] and scored.eval.tasks == [f"{name}.jsonl"]


def test_a_secret_in_the_recipe_or_a_set_never_reaches_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: x\nstorage:\n  aws_secret_access_key: SECRETXYZ\n")
    for argv in (
        ["plan", "--recipe", str(recipe)],
        ["plan", "--set", "storage.aws_secret_access_key=SECRETXYZ"],
        ["plan", "--set", "storage.secret=SECRETXYZ"],
    ):
        code, out, err = run_main(argv, capsys)
        key = "storage.secret" if "storage.secret=SECRETXYZ" in argv else "storage.aws_secret_access_key"
        assert code == 2 and f"{key}: unknown key; allowed keys here: " in err, err
        assert "SECRETXYZ" not in out + err


def test_run_name_dot_dot_writes_nothing_outside_runs_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # import-hf --run .. wrote tokenizer/ and train/ beside runs_dir; --run, like name and --set name=, is one folder.
    runs = tmp_path / "runs"
    code, _, err = run_main(
        ["-q", "import-hf", str(tmp_path / "hf"), "--run", "..", "--set", f"runs_dir={runs}"], capsys
    )
    assert code == 2 and "name '..': not a run name; a run is one folder under runs_dir" in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_storage_profile_this_machine_lacks_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("botocore")
    (tmp_path / "config").write_text("[profile mine]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "mine")  # applying the storage section sets it: restored after the test
    code, _, err = run_main(["plan", "--set", "storage.profile=nosuchprofile"], capsys)
    assert code == 2 and err == (
        "kiln plan: error: storage.profile 'nosuchprofile': no such profile in this machine's AWS config files "
        "(profiles there: mine); create it (aws configure --profile nosuchprofile) or name another\n"
    )
    assert run_main(["plan", "--set", "storage.profile=mine"], capsys)[0] == 0


def test_a_recipe_in_a_store_is_read_from_there(
    s3_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uuid

    s3fs = pytest.importorskip("s3fs")
    from kiln.recipe import recipe_to_yaml

    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    bucket = f"recipes-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem().mkdir(bucket)
    # What a run in a bucket keeps as its resolved recipe: a stage is rerun from it without copying it down.
    overrides = [f"runs_dir=s3://{bucket}/runs", "name=s3r", "train.steps=7"]
    text = recipe_to_yaml(load_recipe("demo", overrides))
    url = f"s3://{bucket}/runs/s3r/recipe.yaml"
    s3fs.S3FileSystem().pipe(url.removeprefix("s3://"), text.encode())
    assert recipe_to_yaml(load_recipe(url)) == text
    code, out, err = run_main(["plan", "--json", "--recipe", url], capsys)
    assert code == 0, err
    assert json.loads(out) == json.loads(
        run_main(["plan", "--json", *[a for o in overrides for a in ("--set", o)]], capsys)[1]
    )
    code, _, err = run_main(["plan", "--recipe", f"s3://{bucket}/runs/none/recipe.yaml"], capsys)
    assert code == 2 and f"recipe s3://{bucket}/runs/none/recipe.yaml: no such object" in err, err
