"""`kiln plan <subcommand>` and `kiln sweep` through kiln.cli.main: the documented JSON fields and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


# At Chinchilla's budget, 5.76e23 FLOPs: rule20 gives sqrt(5.76e23 / 120) = 69.3B on 1.39T tokens;
# the Hoffmann coefficients 32.2B on 2.98T (loss 1.9307), Besiroglu et al.'s 72.2B on 1.33T (1.9744).
CHINCHILLA_BUDGET = {
    "rule20": (69.282e9, 1.3856e12, None),
    "hoffmann": (32.190e9, 2.9823e12, 1.93075),
    "epoch": (72.249e9, 1.3287e12, 1.97444),
}


def test_the_spellings_scripts_rely_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_json(["plan", "flops", "--params", "7B", "--tokens", "2T"], capsys)["train_flops"] == pytest.approx(
        8.4e22
    )
    for fit, (params, tokens, loss) in CHINCHILLA_BUDGET.items():
        r = run_json(["plan", "chinchilla", "--flops", "5.76e23", "--fit", fit], capsys)
        assert r["params"] == pytest.approx(params, rel=1e-4) and r["tokens"] == pytest.approx(tokens, rel=1e-4)
        assert r["flops"] == pytest.approx(6 * r["params"] * r["tokens"]) and r["warnings"] == []
        assert r["loss"] is None if loss is None else r["loss"] == pytest.approx(loss, abs=1e-5)
    r = run_json(["plan", "memory", "--params", "7.5e9", "--dp", "64", "--tp", "1", "--pp", "1", "--zero", "2"], capsys)
    assert (
        round(r["weights_gb"], 2),
        round(r["grads_gb"], 3),
        round(r["optimizer_gb"], 3),
        round(r["model_states_gb"], 1),
    ) == (15.0, 0.234, 1.406, 16.6)
    r = run_json(["plan", "checkpoint-interval", "--write-minutes", "5", "--mtbf-minutes", "1440"], capsys)
    assert r["young_min"] == pytest.approx(120) and r["daly_min"] == pytest.approx(116.69, abs=0.01)


def test_dollar_budget_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(
        [
            "plan",
            "chinchilla",
            "--usd",
            "500000",
            "--usd-per-gpu-hour",
            "3",
            "--gpu",
            "h100",
            "--peak-tflops",
            "1000",
            "--mfu",
            "0.35",
            "--gpus",
            "128",
        ],
        capsys,
    )
    assert r["params"] == pytest.approx(41.8e9, rel=1e-3) and r["tokens"] == pytest.approx(837e9, rel=1e-3)
    assert r["days"] == pytest.approx(54.25, abs=0.01) and r["cost_usd"] == pytest.approx(5e5)
    code, out, _ = run(
        [
            "plan",
            "chinchilla",
            "--usd",
            "500000",
            "--usd-per-gpu-hour",
            "3",
            "--peak-tflops",
            "1000",
            "--mfu",
            "0.35",
            "--gpus",
            "128",
        ],
        capsys,
    )
    assert code == 0 and "41.8B" in out and "days on 128 GPUs" in out


def test_other_subcommands_print_tables_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(["plan", "flops", "--preset", "gpt2-124m", "--tokens", "10B"], capsys)
    assert r["params"] == 123_551_232 and r["seq_len"] == 1024 and r["method"] == "exact"
    r = run_json(
        ["plan", "inference-aware", "--inference-tokens", "2T", "--params", "13B", "--fit", "hoffmann"], capsys
    )
    assert r["params"] == pytest.approx(8.02e9, rel=0.005) and r["chinchilla_params"] == pytest.approx(13e9, rel=1e-5)
    r = run_json(
        [
            "plan",
            "memory",
            "--preset",
            "llama-7b",
            "--dp",
            "8",
            "--zero",
            "1",
            "--activation-checkpointing",
            "selective",
        ],
        capsys,
    )
    assert r["seq_len"] == 4096 and r["fits"] is True and r["activations_gb"] == pytest.approx(18.25, abs=0.01)
    assert (
        r["attention"] == "flash"
        and r["headroom"] == 0.1
        and r["usable_gb"] == pytest.approx(72.0)
        and r["warnings"] == []
    )
    r = run_json(
        [
            "plan",
            "memory",
            "--preset",
            "llama-7b",
            "--dp",
            "8",
            "--zero",
            "3",
            "--activation-checkpointing",
            "full",
            "--micro-batch",
            "4",
            "--attention",
            "eager",
            "--headroom",
            "0.2",
        ],
        capsys,
    )
    assert r["activations_gb"] == pytest.approx(17.31, abs=0.01) and r["usable_gb"] == pytest.approx(64.0)
    # Context parallelism: states over dp x cp, half the positions' activations plus the gathered keys and values.
    r = run_json(
        ["plan", "memory", "--preset", "llama-7b", "--tp", "8", "--cp", "2", "--zero", "2", "--seq-len", "131072"],
        capsys,
    )
    assert (
        (r["cp"], r["gpus"]) == (2, 16)
        and r["model_states_gb"] == pytest.approx(7.58, abs=0.01)
        and r["activations_gb"] == pytest.approx(40.80, abs=0.01)
    )
    r = run_json(["plan", "layout", "--preset", "llama-7b", "--gpus", "16", "--seq-len", "131072", "--cp", "4"], capsys)
    assert r["cp"] == 4 and r["recipe"]["parallel.cp"] == 4 and r["tp"] * r["dp"] == 4
    r = run_json(["plan", "layout", "--preset", "llama-70b", "--gpus", "64", "--global-batch", "1024"], capsys)
    assert (
        r["tp"],
        r["pp"],
        r["dp"],
        r["zero"],
        r["activation_checkpointing"],
        r["micro_batches"],
        r["global_batch"],
    ) == (8, 1, 8, 1, "none", 128, 1024)
    assert (
        r["dp_traffic_vs_ddp"] == 1.0
        and r["total_gb"] <= r["usable_gb"] == pytest.approx(72.0)
        and r["warnings"][0].startswith("kiln has no ZeRO-1")
    )
    assert (
        r["recipe"]["parallel.tp"] == r["tp"] and r["recipe"]["parallel.pp"] == r["pp"]
    )  # --json carries the recipe keys
    r = run_json(["plan", "layout", "--preset", "llama-70b", "--gpus", "64", "--gpu", "a100-40gb"], capsys)
    assert (r["tp"], r["pp"], r["dp"], r["zero"]) == (8, 4, 2, 1)
    r = run_json(
        ["plan", "checkpoint-interval", "--write-minutes", "2", "--gpus", "1024", "--failures-per-gpu-day", "1e-3"],
        capsys,
    )
    assert r["mtbf_min"] == pytest.approx(1406.25)
    for argv, needle in [
        (["plan", "flops", "--params", "175B", "--tokens", "300B"], "3.150e+23"),
        (["plan", "memory", "--params", "7.5e9", "--dp", "64", "--zero", "3"], "1.88"),
        (["plan", "layout", "--preset", "llama-7b", "--gpus", "8"], "why: "),
        (["plan", "inference-aware", "--inference-tokens", "1e12", "--loss", "2.1"], "FLOPs saved"),
    ]:
        code, out, err = run(argv, capsys)
        assert code == 0 and needle in out, (argv, out, err)


def test_fit_from_a_csv_with_a_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kiln.plan.scaling import BESIROGLU_2024

    csv = tmp_path / "losses.csv"
    rows = [(n, d, BESIROGLU_2024.loss(n, d)) for n in (3e7, 1e8, 3e8) for d in (1e9, 3e9, 1e10)]
    csv.write_text("params,tokens,loss\n" + "".join(f"{n},{d},{loss}\n" for n, d, loss in rows))
    r = run_json(
        [
            "plan",
            "fit",
            "--csv",
            str(csv),
            "--bootstrap",
            "3",
            "--starts",
            "2",
            "--target-params",
            "1B",
            "--target-tokens",
            "20B",
            "--plot",
            str(tmp_path / "fit.png"),
        ],
        capsys,
    )
    assert set(r["coefficients"]) == {"E", "A", "B", "alpha", "beta"} and set(r["intervals"]) == set(r["coefficients"])
    assert r["predicted_loss"] == pytest.approx(BESIROGLU_2024.loss(1e9, 20e9), rel=1e-4)
    assert Path(r["plot"]).is_file() and r["n_runs"] == 9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "memory", "--preset", "llama-7b", "--tp", "3"], "tp = 3 does not divide n_heads = 32"),
        (
            ["plan", "layout", "--preset", "llama-7b", "--gpus", "100"],
            "gpus = 100 is not a multiple of gpus_per_node = 8",
        ),
        (["plan", "chinchilla", "--flops=-1e23"], "flops = -1e+23 must be above 0"),
        (["plan", "chinchilla", "--flops", "-1e23"], "flops = -1e+23 must be above 0"),
        (["plan", "chinchilla", "--params", "-7B"], "params = -7e+09 must be above 0"),
        (
            ["plan", "inference-aware", "--inference-tokens", "-2T", "--loss", "2.1"],
            "inference_tokens = -2e+12 must be 0 or more",
        ),
        (["plan", "memory", "--preset", "llama-7b", "--dp", "-2"], "dp = -2 must be at least 1"),
        (["plan", "memory", "--preset", "llama-7b", "--seq-len", "0"], "seq_len = 0 must be at least 1"),
        (["plan", "layout", "--preset", "llama-7b", "--gpus", "8", "--seq-len", "0"], "seq_len = 0 must be at least 1"),
        (
            ["plan", "flops", "--preset", "llama-7b", "--tokens", "1e9", "--seq-len", "0"],
            "seq_len = 0 must be at least 1",
        ),
        (
            ["plan", "flops", "--preset", "llama-7b", "--tokens", "1e9", "--d-attn", "128"],
            "d_attn (--d-attn) goes only with params (--params)",
        ),
        (
            ["plan", "memory", "--params", "7e9", "--hidden", "4096"],
            "needs all of n_layers (--layers), d_model (--hidden) and n_heads (--heads), or none of them",
        ),
        (["plan", "memory", "--preset", "llama-7b", "--headroom", "1"], "headroom = 1 must be in [0, 1)"),
        (
            ["plan", "memory", "--preset", "llama-7b", "--cp", "2", "--pp", "2", "--zero", "3"],
            "cp = 2 with pp = 2: kiln runs context parallelism without pipeline stages",
        ),
        (["plan", "chinchilla", "--flops", "1e23", "--mfu", "1.5"], "mfu = 1.5 must be in (0, 1]"),
        (["plan", "chinchilla", "--usd", "0", "--usd-per-gpu-hour", "2"], "usd = 0 must be above 0"),
        (["plan", "memory", "--params", "7e9", "--preset", "llama-7b"], "exactly one of --params N or --preset NAME"),
        (["plan", "memory", "--preset", "llama-7b", "--layers", "4"], "--layers only go with --params"),
        (["plan", "checkpoint-interval", "--write-minutes", "5"], "either mtbf_minutes"),
        (["plan", "fit", "--runs", "/no/such/run"], "no such run directory"),
        (
            ["plan", "fit", "--csv", "/no/such.csv", "--plot", "/proc/kiln-test/fit.png"],
            "/proc/kiln-test/fit.png: cannot write the plot here",
        ),
    ],
)
def test_bad_inputs_exit_2_naming_the_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"kiln plan {argv[1]}: error:") and message in err and "Traceback" not in err


def test_unparseable_numbers_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", "flops", "--params", "seven", "--tokens", "1e9"], capsys)
    assert code == 2 and "'seven' is not a number" in err and err.startswith("usage: kiln plan flops")
    code, _, err = run(["plan", "flops", "--params", "7B", "--tokens", "-bogus"], capsys)  # still an unknown option
    assert code == 2 and "expected one argument" in err


def test_json_before_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    # `kiln plan --json flops ...` must not fall back to the table (the subcommand's own --json default).
    code, out, _ = run(["plan", "--json", "flops", "--params", "7B", "--tokens", "2T"], capsys)
    assert code == 0 and json.loads(out)["train_flops"] == pytest.approx(8.4e22)
    code, out, _ = run(["plan", "flops", "--params", "7B", "--tokens", "2T"], capsys)
    assert code == 0 and out.startswith("model ")


def test_inconsistent_params_and_shape_warn(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(["plan", "memory", "--params", "7e9", "--layers", "2", "--hidden", "64", "--heads", "2"], capsys)
    assert len(r["warnings"]) == 1 and r["warnings"][0].startswith("params = 7e+09 is 7.12e+04x the 9.83e+04")
    code, out, _ = run(["plan", "memory", "--params", "7e9", "--layers", "2", "--hidden", "64", "--heads", "2"], capsys)
    assert code == 0 and "\nwarning: params = 7e+09" in out


def test_sweep_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(["sweep", "--recipe", "demo", "--sizes", "64x2,128x2", "--steps", "20,40", "--dry-run"], capsys)
    assert r["dry_run"] is True and r["sweep_dir"] == "runs/demo/sweep"
    assert [x["name"] for x in r["runs"]] == ["d64-l2-s20", "d64-l2-s40", "d128-l2-s20", "d128-l2-s40"]
    code, out, _ = run(["sweep", "--help"], capsys)
    assert code == 0 and "--sizes" in out and "--dry-run" in out and "model.d_model" in out


def test_plan_help_lists_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--help"], capsys)
    assert code == 0
    for sub in ("flops", "chinchilla", "inference-aware", "memory", "layout", "checkpoint-interval", "fit"):
        assert sub in out
    for sub in ("flops", "chinchilla", "inference-aware", "memory", "layout", "checkpoint-interval", "fit"):
        code, out, _ = run(["plan", sub, "--help"], capsys)
        assert code == 0 and "(default: None)" not in out and "(default: False)" not in out, sub
    code, out, _ = run(["plan", "memory", "--help"], capsys)
    flat = " ".join(out.split())
    assert code == 0 and "--zero" in out and "--gpu-memory-gb" in out and "--attention {flash,eager}" in flat
    assert "(default: flash)" in flat and "(default: 0.1)" in flat and "Default: h100." in flat


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plan", "chinchilla", "--usd", "1e300", "--usd-per-gpu-hour", "1e-300", "--json"],
            "the inputs overflow: flops comes out as inf",
        ),
        (["plan", "chinchilla", "--params", "1e-300"], "params = 1e-300 is less than one parameter"),
        (
            ["plan", "checkpoint-interval", "--write-minutes", "100", "--mtbf-minutes", "10", "--json"],
            "write_minutes = 100 is not shorter than the mean time between failures (10 min)",
        ),
    ],
)
def test_inputs_that_overflow_or_make_no_sense_are_one_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "" and message in err and "Traceback" not in err and "Infinity" not in out
