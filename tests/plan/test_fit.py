"""kiln.plan.fit and .fit_plot: recovering known coefficients, reading runs and CSVs, the plot."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from kiln.core.errors import ConfigError, FatalError
from kiln.plan.fit import Run, fit_runs, fit_warnings, format_fit, law_of, read_csv, read_runs
from kiln.plan.fit_plot import check_plot_path, plot_fit
from kiln.plan.scaling import BESIROGLU_2024, LossLaw

SIZES = [2e7, 5e7, 1e8, 2e8, 5e8, 1e9]
TOKENS = [4e8, 1e9, 3e9, 1e10, 3e10]


def synthetic(law: LossLaw, noise: float = 0.0, seed: int = 0) -> list[Run]:
    """A 6 x 5 grid of runs whose losses follow `law`, times lognormal noise of relative size `noise`."""
    rng = random.Random(seed)
    return [Run(f"n{n:g}-d{d:g}", n, d, law.loss(n, d) * math.exp(rng.gauss(0, noise))) for n in SIZES for d in TOKENS]


@pytest.fixture(scope="module")
def noisy_fit() -> dict:
    return fit_runs(
        synthetic(BESIROGLU_2024, noise=0.005), starts=4, bootstrap=40, target_params=7e9, target_tokens=1.4e11
    )


def test_recovers_known_coefficients_without_noise() -> None:
    # Measured: every coefficient within 4e-7 relative of Besiroglu et al.'s values.
    r = fit_runs(synthetic(BESIROGLU_2024), starts=2, bootstrap=0)
    for name, true in BESIROGLU_2024.coefficients().items():
        assert r["coefficients"][name] == pytest.approx(true, rel=1e-4), name
    assert r["rms_log_residual"] < 1e-6 and r["intervals"] is None


def test_recovers_known_coefficients_with_half_a_percent_noise(noisy_fit: dict) -> None:
    # 0.5% noise in each loss over N in [2e7, 1e9], D in [4e8, 3e10]: measured errors are 1.0%
    # (alpha), 1.8% (beta), 1.3% (E), 6% (A) and 11% (B; A and B trade off against the exponents);
    # the prediction at 7B, 140B tokens is off by 0.5%.
    c, truth = noisy_fit["coefficients"], BESIROGLU_2024
    assert c["alpha"] == pytest.approx(truth.alpha, rel=0.05)
    assert c["beta"] == pytest.approx(truth.beta, rel=0.05)
    assert c["E"] == pytest.approx(truth.E, rel=0.03)
    assert c["A"] == pytest.approx(truth.A, rel=0.3) and c["B"] == pytest.approx(truth.B, rel=0.3)
    # The 95% bootstrap intervals cover the truth, and the extrapolation 7x past the largest run
    # is within 1% of the true loss.
    for name, true in truth.coefficients().items():
        lo, hi = noisy_fit["intervals"][name]
        assert lo <= true <= hi, name
    assert noisy_fit["predicted_loss"] == pytest.approx(truth.loss(7e9, 1.4e11), rel=0.01)
    lo, hi = noisy_fit["predicted_loss_interval"]
    assert lo <= noisy_fit["predicted_loss"] <= hi
    assert noisy_fit["rms_log_residual"] == pytest.approx(0.005, rel=0.4)
    text = format_fit(noisy_fit)
    assert "95% bootstrap" in text and "predicted loss at N=7,000,000,000 (7B)" in text
    # A well-posed fit, predicting within 10x of its runs, carries no warning (A's interval is
    # wide, 176 .. 1587, because A trades off against alpha; it is not checked).
    assert noisy_fit["warnings"] == [] and "warning" not in text


def test_a_fit_the_runs_do_not_determine_says_so() -> None:
    # Six runs at three sizes and two token counts, losses barely moving with size and steeply
    # with tokens (like a tiny sweep): exponents land outside (0, 1), intervals span decades.
    runs = [
        Run(f"r{i}", n, d, loss)
        for i, (n, d, loss) in enumerate(
            [
                (631104, 409600, 6.1),
                (631104, 1638400, 5.6),
                (1475200, 409600, 5.9),
                (1475200, 1638400, 5.3),
                (2901312, 409600, 5.85),
                (2901312, 1638400, 5.2),
            ]
        )
    ]
    r = fit_runs(runs, starts=2, bootstrap=10, target_params=1e9, target_tokens=2e10)
    w = r["warnings"]
    # Measured: alpha = 1.17 with a bootstrap interval 0.32 .. 2.14.
    assert any(x.startswith("alpha = 1.17 is outside (0, 1)") for x in w), w
    assert any(
        x.startswith("the 95% bootstrap interval of alpha, ") and "is wider than the estimate 1.169" in x for x in w
    ), w
    assert any(x.startswith("params = 1e+09 is 345x the largest of the fitted runs (2.9e+06)") for x in w), w
    assert any(x.startswith("tokens = 2e+10 is 1.22e+04x the largest of the fitted runs") for x in w), w
    assert format_fit(r).count("\nwarning: ") == len(w)


def test_fit_warnings_by_hand() -> None:
    law = LossLaw(E=1.5, A=100.0, B=1e4, alpha=1.2, beta=0.3)
    assert fit_warnings(law, None) == [
        (
            "alpha = 1.2 is outside (0, 1), where published fits lie (0.28 to 0.37; Hoffmann et al. 2022, Besiroglu "
            "et al. 2024): the runs do not pin it down; add runs over a wider range of model sizes"
        )
    ]
    # beta's interval 0.1 .. 0.5 is 0.4 wide, more than the estimate 0.3; E's 1.4 .. 1.6 is not.
    w = fit_warnings(law, {"E": [1.4, 1.6], "beta": [0.1, 0.5]})
    assert (
        w[1]
        == (
            "the 95% bootstrap interval of beta, 0.1 .. 0.5, is wider than the estimate 0.3: the runs do not "
            "determine it"
        )
        and len(w) == 2
    )


def test_a_csv_fit_and_its_plot(tmp_path: Path, noisy_fit: dict) -> None:
    path = tmp_path / "runs.csv"
    runs = synthetic(BESIROGLU_2024, noise=0.005)
    path.write_text(
        "name,Params,tokens,loss,notes\n" + "".join(f"{r.name},{r.params},{r.tokens:.6g},{r.loss!r},x\n" for r in runs)
    )
    read = read_csv(path)
    assert [(r.name, r.params, r.loss) for r in read] == [(r.name, r.params, r.loss) for r in runs]
    fitted = fit_runs(read, starts=4, bootstrap=0)
    assert fitted["coefficients"] == pytest.approx(noisy_fit["coefficients"], rel=1e-4)
    png = plot_fit(fitted, tmp_path / "plots" / "fit.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert law_of(fitted).loss(1e9, 1e10) == pytest.approx(fitted["runs"][-2]["predicted"])
    # An unwritable or non-PNG path is a named error, not a traceback.
    with pytest.raises(FatalError, match="/proc/kiln-test/fit.png: cannot write the plot here"):
        plot_fit(fitted, Path("/proc/kiln-test/fit.png"))
    with pytest.raises(ConfigError, match="must end in .png"):
        check_plot_path(tmp_path / "fit.svg")
    assert not (tmp_path / "fit.svg").exists()


def write_run(root: Path, name: str, params: int, tokens: int, val_loss: float, eval_loss: float | None = None) -> Path:
    run = root / name
    (run / "train").mkdir(parents=True)
    counts = {
        "params": params,
        "params_non_embedding": params // 2,
        "tokens_trained": tokens,
        "val_after": {"all": {"loss": val_loss}},
    }
    (run / "train" / "manifest.json").write_text(json.dumps({"counts": counts}))
    if eval_loss is not None:
        (run / "eval").mkdir()
        (run / "eval" / "manifest.json").write_text(json.dumps({"counts": {"after": {"all": {"loss": eval_loss}}}}))
    return run


def test_read_runs_from_run_directories(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    write_run(sweep, "b", 2000, 10_000, 4.0)
    write_run(sweep, "a", 1000, 20_000, 5.0, eval_loss=4.5)  # the eval stage's loss wins
    (sweep / "unfinished" / "train").mkdir(parents=True)  # no manifest: not a run, skipped
    single = write_run(tmp_path, "c", 3000, 30_000, 3.5)
    # N defaults to the non-embedding count (written here as half the total).
    runs = read_runs([sweep, single])
    assert runs == [Run("a", 500, 20_000, 4.5), Run("b", 1000, 10_000, 4.0), Run("c", 1500, 30_000, 3.5)]
    assert [r.params for r in read_runs([sweep], "total")] == [1000, 2000]


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 5 runs; got 3"):
        fit_runs(synthetic(BESIROGLU_2024)[:3])
    with pytest.raises(ConfigError, match="vary both params and tokens"):
        fit_runs([Run(str(i), 1e8, 1e9 * (i + 1), 3.0) for i in range(6)])
    with pytest.raises(ConfigError, match="both target_params"):
        fit_runs(synthetic(BESIROGLU_2024), target_params=1e9)
    bad = tmp_path / "bad.csv"
    bad.write_text("params,loss\n1,2\n")
    with pytest.raises(ConfigError, match="missing tokens"):
        read_csv(bad)
    bad.write_text("params,tokens,loss\n1e8,1e9,3.1\n1e8,-5,3.0\n")
    with pytest.raises(ConfigError, match=r"bad.csv:3: tokens = -5.0 must be a finite number above 0"):
        read_csv(bad)
    bad.write_text("params,tokens,loss\n1e8,lots,3.0\n")
    with pytest.raises(ConfigError, match=r"bad.csv:2: params, tokens and loss must be numbers"):
        read_csv(bad)
    with pytest.raises(FatalError, match="no such CSV"):
        read_csv(tmp_path / "missing.csv")
    with pytest.raises(FatalError, match="neither a finished run"):
        read_runs([tmp_path])
    with pytest.raises(ConfigError, match="param_count"):
        read_runs([tmp_path], "all")


def test_a_csv_that_is_not_utf8_is_one_clear_error(tmp_path):
    from kiln.core.errors import ConfigError
    from kiln.plan.fit import read_csv

    path = tmp_path / "runs.csv"
    path.write_bytes("params,tokens,loss\n1e6,2e7,3.5\nsmall caf\xe9,1,2\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"runs.csv:3: not UTF-8 text \(byte 40"):
        read_csv(path)
    path.write_bytes(b"\xef\xbb\xbfparams,tokens,loss\n1e6,2e7,3.5\n")  # a spreadsheet's byte-order mark
    assert [r.params for r in read_csv(path)] == [1e6]
