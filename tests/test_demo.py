"""One end-to-end `kiln demo` at miniature size through the installed command, then a rerun.

The demo recipe reads text already on the machine (stdlib code, pydoc topics, /usr/share/doc),
capped here at 2 MB, trains a 512-token BPE and a 2-layer d_model 64 model for 60 steps on CPU.
Measured: about 10 s on 2 cores for the first run, 2 s for the rerun. The other demos here (the
rerun, the shipped recipes, continued pretraining) run in this process, on the CPU as the command is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from minidemo import OVERRIDES, demo_args

from kiln.core.manifest import sha256_file
from kiln.model.config import ModelConfig, count_params

pytestmark = pytest.mark.slow

STAGES = ("curate", "tokenizer", "tokenize", "train", "eval", "generate", "export")
UPSTREAM = {
    "curate": [],
    "tokenizer": ["curate"],
    "tokenize": ["curate", "tokenizer"],
    "train": ["tokenize"],
    "eval": ["tokenize", "train"],
    "generate": ["train"],
    "export": ["curate", "tokenizer", "tokenize", "train", "eval"],
}


@pytest.fixture(scope="module")
def demo(demo_run: dict[str, Any]) -> dict[str, Any]:
    return demo_run


@dataclass(frozen=True)
class Said:
    """What a `kiln demo` run in this process printed (stdout) and logged, as its stderr has it ("logger: message")."""

    stdout: str
    stderr: str


@pytest.fixture
def demo_here(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Said]:
    """`kiln demo` in this process (a kiln subprocess spends 4 s on imports), on the CPU as kiln_demo's command is;
    the session's demo run (conftest.py) is the one made through the installed command."""
    import torch

    from kiln.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def run(runs_dir: Path, recipe: str = "demo", overrides: list[str] = OVERRIDES) -> Said:
        capsys.readouterr()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="kiln"):
            assert main(demo_args(runs_dir, recipe, overrides)) == 0
        out = capsys.readouterr()
        return Said(out.out, out.err + "".join(f"{r.name}: {r.getMessage()}\n" for r in caplog.records))

    return run


def test_summary_has_every_field(demo: dict[str, Any]) -> None:
    s = demo["summary"]
    for key in (
        "docs_in",
        "docs_out",
        "removed",
        "quarantined",
        "per_source",
        "tokenizer_bytes_per_token",
        "train_tokens_available",
        "params",
        "tokens_trained",
        "val_loss_before",
        "val_loss_after",
        "val_bpb_before",
        "val_bpb_after",
        "val_loss_drop",
        "learned",
        "sample",
    ):
        assert key in s, key
    assert 0 < s["docs_out"] <= s["docs_in"]
    assert s["docs_in"] == s["docs_out"] + sum(s["removed"].values()) + s["quarantined"]
    assert {"code", "prose"} <= set(s["per_source"])  # stdlib and pydoc exist wherever Python does
    for t in s["per_source"].values():
        assert t["docs_in"] == t["docs_out"] + sum(t["removed"].values()) + t["quarantined"]
    assert s["tokenizer_bytes_per_token"] > 1.0
    assert s["params"] == count_params(
        ModelConfig(
            vocab_size=512,
            d_model=64,
            n_layers=2,
            n_heads=2,
            n_kv_heads=1,
            max_seq_len=64,
            tie_embeddings=True,
            qk_norm=True,
        )
    )  # QK-norm from recipes/demo.yaml
    assert s["tokens_trained"] == 60 * 8 * 64
    sources = set(demo["manifests"]["eval"]["counts"]["after"]["sources"])
    assert set(s["val_bpb_before"]) == set(s["val_bpb_after"]) == sources | {"all"}
    assert all(s["val_bpb_after"][src] < s["val_bpb_before"][src] for src in sources | {"all"})
    assert s["sample"].startswith("def ")


def test_summary_agrees_with_the_manifests(demo: dict[str, Any]) -> None:
    s, m = demo["summary"], demo["manifests"]
    assert s["docs_in"] == m["curate"]["counts"]["docs_in"]
    assert s["tokenizer_bytes_per_token"] == m["tokenizer"]["counts"]["heldout_bytes_per_token"]
    assert s["train_tokens_available"] == m["tokenize"]["counts"]["train_tokens"]
    assert s["val_loss_before"] == m["eval"]["counts"]["before"]["all"]["loss"]
    assert s["val_loss_after"] == m["eval"]["counts"]["after"]["all"]["loss"]
    assert s["sample"] == m["generate"]["counts"]["sample"]
    # The eval stage reloads the checkpoint and rebuilds the untrained model from the train
    # stage's config and seed: both must reproduce the trainer's own validation numbers.
    assert m["eval"]["counts"]["after"] == m["train"]["counts"]["val_after"]
    assert m["eval"]["counts"]["before"] == m["train"]["counts"]["val_before"]
    assert "documents:" in demo["stdout"] and "validation loss:" in demo["stdout"]


def test_validation_loss_falls_clearly(demo: dict[str, Any]) -> None:
    s = demo["summary"]
    assert s["val_loss_before"] == pytest.approx(6.238, abs=0.15)  # untrained: about ln 512
    assert s["val_loss_after"] < s["val_loss_before"] - 0.5  # measured 6.24 -> 5.31
    assert s["val_loss_drop"] == pytest.approx(1 - s["val_loss_after"] / s["val_loss_before"], abs=1e-4)


def test_every_stage_records_its_upstream_manifests(demo: dict[str, Any]) -> None:
    run_dir, manifests = demo["run_dir"], demo["manifests"]
    for stage in STAGES:
        m = manifests[stage]
        assert m["format"] == "kiln-manifest v1" and m["stage"] == stage
        assert m["upstream"] == {u: manifests[u]["fingerprint"] for u in UPSTREAM[stage]}
        for out in m["outputs"]:
            path = run_dir / stage / out["path"]
            assert path.stat().st_size == out["bytes"] and sha256_file(path) == out["sha256"]
    assert (run_dir / "recipe.yaml").is_file()


def test_the_exported_demo_model_runs_in_transformers_with_kilns_logits_and_card(demo: dict[str, Any]) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    from kiln.model.weights import load_trained_model
    from kiln.text.tokenizer import KilnTokenizer

    folder = demo["run_dir"] / "export" / "hf"
    assert demo["summary"]["hf_folder"] == str(folder) and f"Hugging Face folder: {folder}" in demo["stdout"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    ours = load_trained_model(demo["run_dir"] / "train" / "checkpoint")
    text = (Path(json.__file__)).read_text()[:3000]  # real code the demo model has seen the like of
    ids = KilnTokenizer.load(demo["run_dir"] / "tokenizer" / "tokenizer.json").encode(text)[:64]
    assert hf_tok(text).input_ids[:64] == ids
    with torch.no_grad():
        assert (ours(torch.tensor([ids])) - hf(torch.tensor([ids])).logits).abs().max().item() < 1e-4
    card = (folder / "README.md").read_text()
    for expected in (
        "## Data",
        "| code |",
        "## Tokenizer",
        "## Training",
        f"{60 * 8 * 64:,} tokens",
        "## Evaluation",
        "| all |",
        "## Lineage",
    ):
        assert expected in card, expected
    assert demo["manifests"]["train"]["fingerprint"] in card


def test_the_probe_set_is_scored_during_training_with_its_continuations(demo: dict[str, Any]) -> None:
    lines = [json.loads(line) for line in (demo["run_dir"] / "train" / "metrics.jsonl").read_text().splitlines()]
    probes = [line for line in lines if line.get("kind") == "probe"]
    assert [p["step"] for p in probes] == [20, 40, 60]
    val_docs = {s: n["val"]["docs"] for s, n in demo["manifests"]["tokenize"]["counts"]["per_source"].items()}
    documents = probes[-1]["probe"]["documents"]
    assert set(documents) == {
        f"{s}/{i}" for s, n in val_docs.items() for i in range(min(2, n))
    }  # the same set every time
    assert all(set(p["probe"]["documents"]) == set(documents) for p in probes)
    generations = probes[-1]["probe"]["generations"]
    assert len(generations) == len(documents) + 1 and generations[-1]["prompt"] == "def "
    mean = [sum(d["loss"] for d in p["probe"]["documents"].values()) / len(documents) for p in probes]
    assert mean[-1] < mean[0]  # the model learns between the first and the last probe


def test_the_demo_runs_the_stages_of_the_verb_table_in_its_order(demo: dict[str, Any]) -> None:
    from kiln.verbs import DEMO_STAGES

    assert tuple(v.stage for v in DEMO_STAGES) == STAGES
    finished = [demo["manifests"][stage]["finished_at"] for stage in STAGES]
    assert finished == sorted(finished)


def test_first_run_is_quick(demo: dict[str, Any]) -> None:
    assert demo["seconds"] < 100  # measured about 10 s on 2 cores


def test_second_demo_skips_every_stage(demo: dict[str, Any], demo_here: Callable[..., Said]) -> None:
    # Nothing is redone: every manifest is byte for byte the first run's. (It used to assert a
    # wall-clock bound too, half the first run's time; on a shared 2-core host the skipping run's
    # imports and input hashing took 5-8 s against 13-18 s, and the bound failed a CI run.)
    done = demo_here(demo["runs_dir"])
    run_dir = demo["run_dir"]
    for stage in STAGES:
        again = json.loads((run_dir / stage / "manifest.json").read_text())
        assert again == demo["manifests"][stage], stage  # finished_at included: nothing was redone
    assert "up to date" in done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["corpus"]["since_last_demo"] == {"changed": 0, "added": 0, "removed": 0, "examples": []}
    assert demo["summary"]["corpus"]["since_last_demo"] is None  # the first demo of the run
    assert {**summary, "corpus": None} == {**demo["summary"], "corpus": None}
    first, again = demo["stdout"].splitlines(), done.stdout.splitlines()
    assert first[0].endswith("first demo of this run") and again[0].endswith("unchanged since the last demo")
    assert first[1:] == again[1:]


def test_a_changed_corpus_file_redoes_the_stages_after_it_and_keeps_the_earlier_model(
    tmp_path: Path, demo_here: Callable[..., Said]
) -> None:
    # The demo reads the machine's own files: a package installed between two demos changes some.
    runs = tmp_path / "runs"
    quick = [o for o in OVERRIDES if not o.startswith(("train.steps", "train.probe_every"))] + ["train.steps=24"]
    demo_here(runs, overrides=quick)
    plain = sorted(p for p in (tmp_path / "corpus" / "usr_share_doc").rglob("*") if p.is_file() and p.suffix != ".gz")
    if not plain:
        pytest.skip("this machine's /usr/share/doc gave the demo no uncompressed file to change")
    changed = plain[0]
    data = changed.read_bytes()  # its last byte changed, its size kept (a bigger file could move the cap's choice)
    changed.write_bytes(data[:-1] + (b"#" if data[-1:] != b"#" else b"\n"))
    done = demo_here(runs, overrides=quick)  # no --force, no error: every stage after curate is redone
    run_dir = runs / "demo"
    since = json.loads((run_dir / "summary.json").read_text())["corpus"]["since_last_demo"]
    assert since == {"changed": 1, "added": 0, "removed": 0, "examples": [str(changed)]}
    assert f"since the last demo 1 changed, 0 added, 0 gone (e.g. {changed})" in done.stdout
    kept = list(run_dir.glob("train.old-*"))  # the model trained on the earlier corpus: moved aside, whole
    assert (
        len(kept) == 1
        and (kept[0] / "checkpoint" / "model.safetensors").is_file()
        and (kept[0] / "manifest.json").is_file()
    )
    assert f"is kept in {kept[0]}" in done.stdout
    train = json.loads((run_dir / "train" / "manifest.json").read_text())
    tokenize = json.loads((run_dir / "tokenize" / "manifest.json").read_text())
    assert train["upstream"]["tokenize"] == tokenize["fingerprint"]  # the model is the new data's


def test_capped_sources_keep_about_val_fraction_for_validation(demo: dict[str, Any]) -> None:
    per_source = demo["manifests"]["tokenize"]["counts"]["per_source"]
    for source, splits in per_source.items():
        docs = splits["train"]["docs"] + splits["val"]["docs"]
        assert splits["train"]["tokens"] > 0, source
        # val_fraction is 0.02; a quarter of the documents is far outside chance for 20+ documents.
        assert splits["val"]["docs"] <= max(2, 0.25 * docs), (source, splits)


# The shipped recipes per idea, at miniature size: the same keys as OVERRIDES, the tiny preset's
# shape cut to 2 layers, and the curriculum's phases scaled to 64-token rows.
MINI = [o for o in OVERRIDES if not o.startswith("model.")] + [
    "model.n_layers=2",
    "model.max_seq_len=64",
    "tokenizer.sample_mb=1",
]
RECIPES = {
    "fim-code": [],
    "multilingual": [],
    "span-corruption": [],
    # ReLU² as well: a model transformers' Llama cannot hold, so the demo ends without an export.
    "curriculum": [
        "train.seq_len_schedule=[{start: 0, seq_len: 32}, {start: 0.8, seq_len: 64, rope_theta: 40000}]",
        "mix.max_epochs=100",
        "model.activation=relu2",
    ],
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_shipped_recipe_runs_end_to_end_and_learns_its_objective(
    recipe: str, tmp_path: Path, demo_here: Callable[..., Said]
) -> None:
    done = demo_here(tmp_path / "runs", recipe, MINI + RECIPES[recipe])
    summary = json.loads((tmp_path / "runs" / recipe / "summary.json").read_text())
    train = json.loads((tmp_path / "runs" / recipe / "train" / "manifest.json").read_text())
    if recipe == "curriculum":
        assert "objective" not in summary and summary["val_loss_after"] < summary["val_loss_before"] - 0.5
        realized = train["counts"]["mixture"]["realized"]
        assert realized[-1]["intended"]["prose"] > realized[0]["intended"]["prose"]  # annealed towards prose
        assert (
            summary["hf_folder"] is None
            and "demo: not exported" in done.stderr
            and "model.activation=relu2" in done.stderr
        )
    elif recipe == "multilingual":
        # The same text in twelve languages (the machine's translated messages): each kept within 0.10 of English,
        # judged by its own language's settings, which the manifest names.
        curate = json.loads((tmp_path / "runs" / recipe / "curate" / "manifest.json").read_text())
        per = curate["counts"]["per_source"]
        rates = {source: v["docs_out"] / v["docs_in"] for source, v in per.items()}
        assert len(rates) == 12 and rates["en"] >= 0.95 and per["en"]["docs_in"] >= 20, rates
        assert all(abs(rate - rates["en"]) <= 0.10 for rate in rates.values()), rates
        used = curate["languages"]
        assert set(used) == {"fr", "de", "es", "pt", "it", "ru", "ko", "ja", "zh", "th"}  # zh_CN and zh_TW are zh
        assert used["zh"]["documents"] == per["zh_CN"]["docs_in"] + per["zh_TW"]["docs_in"]
        assert used["ja"]["shipped"] == "kiln-languages v1: FineWeb-2 configs/jpn_Jpan.yml @baedee4"
        assert summary["val_loss_after"] < summary["val_loss_before"] - 0.5
        planned = train["counts"]["mixture"]["planned_languages"]
        assert planned["zh"]["share"] < planned["zh"]["natural_share"]  # the largest language, flattened
        assert planned["en"]["share"] > planned["en"]["natural_share"]
        languages = json.loads((tmp_path / "runs" / recipe / "eval" / "manifest.json").read_text())["counts"]
        assert languages["after"]["languages"]["zh"]["sources"] == ["zh_CN", "zh_TW"]
    else:
        objective = summary["objective"]
        assert objective["name"] == recipe.replace("-code", "").replace("-", "_")
        assert objective["loss_after"] < objective["loss_before"] - 0.5, objective
        assert f"objective {objective['name']}: held-out loss" in done.stdout


def test_continued_pretraining_starts_from_the_demo_model_replays_its_data_and_reports_what_changed(
    demo: dict[str, Any], demo_here: Callable[..., Said]
) -> None:
    # recipes/continued.yaml at miniature size on the module's demo run: its tokenizer and final
    # weights, a quarter of the rows replayed from its sources.
    runs_dir, base = demo["runs_dir"], demo["run_dir"]
    overrides = [o for o in OVERRIDES if not o.startswith(("curate.", "tokenizer."))] + [
        "curate.max_total_mb=1",
        f"tokenizer.from_run={base}",
        f"train.init_from={base / 'train' / 'checkpoint'}",
        f"mix.replay.run={base}",
        "train.steps=30",
        "train.schedule.warmup_fraction=0.1",
    ]
    done = demo_here(runs_dir, "continued", overrides)
    run_dir = runs_dir / "continued"
    assert sha256_file(run_dir / "tokenizer" / "tokenizer.json") == sha256_file(base / "tokenizer" / "tokenizer.json")
    counts = json.loads((run_dir / "train" / "manifest.json").read_text())["counts"]
    change = counts["val_change"]
    assert set(change) == {"docs", "prose", "demo/code", "demo/docs", "demo/prose"}
    # The starting model is the demo's: its loss on the demo's own validation code is the demo's final one.
    assert change["demo/code"]["before"] == pytest.approx(
        demo["manifests"]["train"]["counts"]["val_after"]["sources"]["code"]["loss"], rel=1e-4
    )
    assert change["docs"]["change"] < 0 and change["prose"]["change"] < 0  # gained on the new domain
    replayed = sum(n for s, n in counts["tokens_by_source"].items() if s.startswith("demo/")) / sum(
        counts["tokens_by_source"].values()
    )
    assert 0.15 < replayed < 0.35  # mix.replay.fraction 0.25 of 30 steps x 8 rows
    assert "validation loss per source, from the starting model" in done.stdout and "demo/code" in done.stdout
    assert "WARNING" not in done.stdout  # the from-scratch 30% rule is not applied to continued pretraining


def test_the_exported_demo_imports_back_scores_a_file_and_continues_pretraining(
    demo: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], demo_here: Callable[..., Said]
) -> None:
    from kiln.cli import main  # in this process: a kiln subprocess would spend 4 s on imports

    runs_dir = demo["runs_dir"]
    folder = demo["run_dir"] / "export" / "hf"
    assert main(["import-hf", str(folder), "--run", "imported", "--set", f"runs_dir={runs_dir}"]) == 0
    imported = runs_dir / "imported"
    assert "train.init_from" in capsys.readouterr().out and sha256_file(
        imported / "train" / "checkpoint" / "model.safetensors"
    ) == sha256_file(demo["run_dir"] / "train" / "checkpoint" / "model.safetensors")
    data = tmp_path / "held_out.jsonl"
    data.write_text(json.dumps({"text": Path(json.__file__).read_text()[:4000], "source": "json_module"}) + "\n")
    assert main(["eval", "--set", f"runs_dir={runs_dir}", "--set", "name=imported", "--data", str(data)]) == 0
    scored = json.loads((imported / "eval" / "manifest.json").read_text())["counts"]["data"]["held_out.jsonl"]
    assert (
        set(scored["sources"]) == {"json_module"} and scored["all"]["loss"] < 6.0
    )  # the trained model knows Python: below ln 512
    # Continued pretraining from the imported run, with its tokenizer and checkpoint.
    overrides = [o for o in OVERRIDES if not o.startswith(("curate.", "tokenizer."))] + [
        "name=from_import",
        "curate.max_total_mb=1",
        f"tokenizer.from_run={imported}",
        f"train.init_from={imported / 'train' / 'checkpoint'}",
        "mix.replay=null",
        "train.steps=20",
        "train.schedule.warmup_fraction=0.1",
    ]
    demo_here(runs_dir, "continued", overrides)
    change = json.loads((runs_dir / "from_import" / "train" / "manifest.json").read_text())["counts"]["val_change"]
    assert change["docs"]["change"] < 0  # it learned the new domain from the imported start
