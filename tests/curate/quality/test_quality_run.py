"""The quality stages end to end: `kiln quality train-lm` / `train-classifier` on a reference
source, then `kiln curate` with the perplexity and classifier filters as ordinary steps.

The corpus: reference documents (pieces of Python's own documentation topics) and a "web" source
made of other pieces plus word-shuffled pieces. The filters' cutoffs come from the models' scores of
the web sample, which here is the whole web source, so the kept fractions are exact.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import pyarrow.parquet as pq
import pytest

from kiln.cli import main
from kiln.core.docshards import list_shards, read_shard
from kiln.core.document import Document
from kiln.core.manifest import MANIFEST
from kiln.curate.audit import Ledger
from kiln.curate.quality.classifier import HashedClassifier
from kiln.curate.quality.ngram import NGramLM
from kiln.curate.steps import chain
from kiln.curate.steps.normalize import normalize_text
from kiln.curate.steps.quality import ClassifierFilter, ClassifierFilterConfig, PerplexityConfig, PerplexityFilter

FILTERS = (
    "url_filter",
    "line_dedup",
    "language",
    "bad_words",
    "gopher_repetition",
    "gopher_quality",
    "c4",
    "fineweb",
    "code_quality",
    "pii",
    "length",
    "exact_dedup",
    "minhash_dedup",
)


def chunks(text: str, size: int = 1200) -> list[str]:
    """The text in runs of whole paragraphs of at least `size` characters (the rest dropped)."""
    out, current = [], ""
    for para in text.split("\n\n"):
        current = f"{current}\n\n{para}" if current else para
        if len(current) >= size:
            out.append(current)
            current = ""
    return out


def build_corpus(folder: Path) -> None:
    texts = [c for _, t in sorted(topics.items()) for c in chunks(t)]  # 287 documents of about 1.5 kB
    rng = random.Random(0)
    rng.shuffle(texts)
    ref, other = texts[:50], texts[50:110]
    web = [{"id": f"clean{i}", "text": t} for i, t in enumerate(other[:30])]
    for i, t in enumerate(other[30:60]):
        lines = [line.split() for line in t.splitlines()]
        for words in lines:
            rng.shuffle(words)
        web.append({"id": f"shuffled{i}", "text": "\n".join(" ".join(w) for w in lines)})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ref.jsonl").write_text(
        "".join(json.dumps({"id": f"ref{i}", "text": t}) + "\n" for i, t in enumerate(ref))
    )
    (folder / "web.jsonl").write_text("".join(json.dumps(d) + "\n" for d in web))


def recipe_args(tmp_path: Path) -> list[str]:
    inputs = [
        {"path": str(tmp_path / "data" / "ref.jsonl"), "source": "ref"},
        {"path": str(tmp_path / "data" / "web.jsonl"), "source": "web"},
    ]
    return ["--run", "q", "--set", "curate.inputs=" + json.dumps(inputs), "--set", "quality.reference_source=ref"]


def curate_args(tmp_path: Path, workers: int = 1, kind: str = "local", run: str = "q") -> list[str]:
    args = [
        "-q",
        "curate",
        *recipe_args(tmp_path),
        "--set",
        f"curate.executor.workers={workers}",
        "--set",
        f"curate.executor.kind={kind}",
    ]
    if run != "q":
        args += ["--set", f"name={run}"]
    for name in FILTERS:
        args += ["--set", f"curate.{name}.enabled=false"]
    return args


def web_outcome(stage: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    kept = {d.id: d.meta for shard in list_shards(stage / "shards") for d in read_shard(shard) if d.source == "web"}
    removed = {r["id"]: r for r in pq.read_table(stage / "removed.parquet").to_pylist() if r["source"] == "web"}
    return kept, removed


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    build_corpus(tmp_path / "data")
    return tmp_path


def test_perplexity_filter_keeps_the_percentile_buckets(corpus, capsys):
    assert main(["-q", "quality", "train-lm", *recipe_args(corpus)]) == 0
    assert "n-gram LM (order 5)" in capsys.readouterr().out
    lm = Path("runs/q/quality/lm")
    manifest = json.loads((lm / MANIFEST).read_text())
    assert manifest["counts"]["reference"]["docs"] == 50 and manifest["counts"]["corpus_sample"]["docs"] == 60
    assert {Path(i["path"]).name for i in manifest["inputs"]} == {"ref.jsonl", "web.jsonl"}  # the training data, hashed

    assert main([*curate_args(corpus), "--set", "curate.perplexity.enabled=true"]) == 0
    kept, removed = web_outcome(Path("runs/q/curate"))
    assert len(kept) + len(removed) == 60
    # head and middle: up to the 60th percentile of the web sample, which is the whole web source
    scores = np.load(lm / "corpus_perplexity.npy")
    cutoff = np.percentile(scores, 60)
    assert len(kept) == int((scores <= cutoff).sum()) == 36
    assert all(
        meta["perplexity"] <= cutoff + 1e-3 and meta["perplexity_bucket"] in ("head", "middle")
        for meta in kept.values()
    )
    assert {r["reason"] for r in removed.values()} == {"perplexity:tail"}
    assert all(r["value"] > cutoff and r["threshold"] == pytest.approx(cutoff) for r in removed.values())
    # shuffled words are what the reference model finds least likely
    assert sum(i.startswith("shuffled") for i in removed) >= 20
    assert sum(i.startswith("clean") for i in kept) >= 25


def web_docs(corpus: Path) -> list[Document]:
    """The web source as curate's first step leaves it."""
    return [
        Document(id=d["id"], text=normalize_text(d["text"]), source="web")
        for d in map(json.loads, (corpus / "data" / "web.jsonl").open())
    ]


def test_classifier_filter_keeps_the_top_fraction_on_local_and_ray(corpus, capsys, ray_local):
    assert main(["-q", "quality", "train-classifier", *recipe_args(corpus)]) == 0
    report = json.loads(Path("runs/q/quality/classifier/report.json").read_text())
    # negatives: one per positive, at most half the 60 web documents; the cutoff sample is the rest
    assert report["positives"]["docs"] == 50 and report["negatives"]["docs"] == 30
    assert report["calibration"]["docs"] == 60 - report["train"]["negatives"]
    assert report["heldout"] and report["heldout"]["auc"] > 0.8
    scores = np.load("runs/q/quality/classifier/corpus_scores.npy")
    cutoff = np.quantile(scores, 0.5)
    assert int((scores >= cutoff).sum()) == len(scores) // 2  # the top half of the sample not trained on

    outcomes = []
    for run, workers, kind in (("local", 2, "local"), ("ray", 2, "ray")):
        extra = [
            "--set",
            "curate.quality_classifier.enabled=true",
            "--set",
            "curate.quality_classifier.top_fraction=0.5",
            "--set",
            f"curate.quality_classifier.model={Path('runs/q/quality/classifier').resolve()}",
        ]
        assert main([*curate_args(corpus, workers, kind, run), *extra]) == 0
        outcomes.append(web_outcome(Path(f"runs/{run}/curate")))
        shards = {p.name: [d.to_json() for d in read_shard(p)] for p in list_shards(Path(f"runs/{run}/curate/shards"))}
        outcomes[-1] += (shards,)
    (kept, removed, shards), (_, _, ray_shards) = outcomes
    assert shards == ray_shards  # the same documents, meta and scores on both executors
    web = web_docs(corpus)
    model = HashedClassifier.load(Path("runs/q/quality/classifier/model.npz"))
    assert (
        set(kept) == {d.id for d, s in zip(web, model.scores([d.text for d in web])) if s >= cutoff}
        and 0 < len(kept) < 60
    )
    assert all(meta["quality_score"] >= cutoff - 1e-6 for meta in kept.values())
    assert {r["reason"] for r in removed.values()} == {"quality_classifier:below_top_fraction"}


def test_models_reload_without_retraining(corpus, caplog):
    caplog.set_level(logging.INFO, logger="kiln")
    assert main(["-q", "quality", "train-lm", *recipe_args(corpus)]) == 0
    lm = Path("runs/q/quality/lm")
    first = (lm / MANIFEST).read_text()
    before = NGramLM.load(lm / "model.npz").perplexities([normalize_text(topics["if"])])
    assert main(["quality", "train-lm", *recipe_args(corpus)]) == 0
    assert (lm / MANIFEST).read_text() == first  # up to date: not retrained
    assert "up to date" in caplog.text
    assert np.array_equal(NGramLM.load(lm / "model.npz").perplexities([normalize_text(topics["if"])]), before)
    # a changed setting retrains
    assert main(["-q", "quality", "train-lm", *recipe_args(corpus), "--set", "quality.lm.order=3"]) == 0
    assert json.loads((lm / MANIFEST).read_text())["counts"]["model"]["order"] == 3


def test_a_filter_without_its_model_stops_before_any_work(corpus, capsys):
    assert main([*curate_args(corpus), "--set", "curate.perplexity.enabled=true"]) == 2
    err = capsys.readouterr().err
    assert "quality/lm/model.npz" in err and "kiln quality train-lm" in err
    assert not Path("runs/q/curate").exists()


def test_an_unknown_reference_source_names_the_sources(corpus, capsys):
    args = recipe_args(corpus)
    args[args.index("quality.reference_source=ref")] = "quality.reference_source=wiki"
    assert main(["-q", "quality", "train-classifier", *args]) == 2
    err = capsys.readouterr().err
    assert "'wiki' is not a source of curate.inputs" in err and "ref, web" in err


def test_absolute_thresholds_replace_the_percentiles(corpus):
    assert main(["-q", "quality", "train-lm", *recipe_args(corpus)]) == 0
    assert main(["-q", "quality", "train-classifier", *recipe_args(corpus)]) == 0
    web = web_docs(corpus)
    web.append(Document(id="blank", text="... --- ...", source="web"))

    lm = PerplexityFilter(PerplexityConfig(enabled=True, max_perplexity=250.0), Path("runs/q/quality/lm").resolve())
    ledger = Ledger(0)
    kept = list(lm.process(web, ledger))
    expected = lm.model.perplexities([d.text for d in web])
    assert [d.id for d in kept] == [d.id for d, p in zip(web, expected) if p <= 250.0]
    assert all(d.meta["perplexity"] == round(float(p), 3) for d, p in zip(kept, expected[expected <= 250.0]))
    rules = {r["id"]: (r["reason"], r["threshold"]) for r in ledger.removed}
    assert rules.pop("blank") == ("perplexity:no_words", None)
    assert (
        set(rules.values()) == {("perplexity:above_max", 250.0)}
        and len(rules) + len(kept) == 60
        and 10 < len(kept) < 50
    )

    classifier = ClassifierFilter(
        ClassifierFilterConfig(enabled=True, min_score=0.5), Path("runs/q/quality/classifier").resolve()
    )
    ledger = Ledger(0)
    kept = list(classifier.process(web[:60], ledger))
    scores = classifier.model.scores([d.text for d in web[:60]])
    assert [d.id for d in kept] == [d.id for d, s in zip(web, scores) if s >= 0.5] and 0 < len(kept) < 60
    assert {(r["reason"], r["threshold"]) for r in ledger.removed} == {("quality_classifier:below_min_score", 0.5)}

    everything = ClassifierFilter(
        ClassifierFilterConfig(enabled=True, top_fraction=1.0), Path("runs/q/quality/classifier").resolve()
    )
    assert len(list(everything.process(web[:60], Ledger(0)))) == 60  # even scores below the sample's lowest


def test_groups_scored_in_one_call_give_the_per_document_outcome(corpus, monkeypatch):
    assert main(["-q", "quality", "train-lm", *recipe_args(corpus)]) == 0
    step = PerplexityFilter(PerplexityConfig(enabled=True), Path("runs/q/quality/lm").resolve())
    one_by_one = [(d.id, d.meta) for d in step.process(web_docs(corpus), Ledger(0))]
    calls = []
    score = step.model.perplexities
    monkeypatch.setattr(step.model, "perplexities", lambda texts: calls.append(len(texts)) or score(texts))
    monkeypatch.setattr(chain, "GROUP_CHARS", 5000)  # a few documents a group
    ledger = Ledger(0)
    outcomes = [
        out for group in chain.groups(web_docs(corpus)) for out in chain.run_documents(group, [step], ledger, "prose")
    ]
    assert [(d.id, d.meta) for d in outcomes if d is not None] == one_by_one
    sizes = [len(g) for g in chain.groups(web_docs(corpus))]
    assert calls == sizes and len(sizes) > 10  # one call a group, not one a document
    assert ledger.tally("web").funnel["prose/perplexity"][0] == len(one_by_one)

    # a group whose call fails is scored document by document: only the document at fault is quarantined
    def fails_on_shuffled0(texts):
        if any(t == web_docs(corpus)[30].text for t in texts):
            raise ValueError("cannot score")
        return score(texts)

    monkeypatch.setattr(step.model, "perplexities", fails_on_shuffled0)
    ledger = Ledger(0)
    outcomes = [
        out for group in chain.groups(web_docs(corpus)) for out in chain.run_documents(group, [step], ledger, "prose")
    ]
    assert [(d.id, d.meta) for d in outcomes if d is not None] == [(i, m) for i, m in one_by_one if i != "shuffled0"]
    assert [q["id"] for q in ledger.quarantined] == ["shuffled0"]


def test_the_corpus_sample_leaves_code_out(corpus):
    (corpus / "data" / "lib.jsonl").write_text(
        "".join(json.dumps({"id": f"lib{i}", "text": f"def f{i}(x):\n    return x + {i}\n"}) + "\n" for i in range(40))
    )
    args = recipe_args(corpus)
    inputs = json.loads(args[args.index("--set") + 1].removeprefix("curate.inputs="))
    args[args.index("--set") + 1] = "curate.inputs=" + json.dumps(
        [*inputs, {"path": str(corpus / "data" / "lib.jsonl"), "source": "lib", "code": True}]
    )
    assert main(["-q", "quality", "train-lm", *args]) == 0
    counts = json.loads(Path("runs/q/quality/lm", MANIFEST).read_text())["counts"]
    assert counts["corpus_sample"]["docs"] == 60  # the web documents; the 40 code documents are not scored


def test_a_corrupt_model_folder_stops_curate_before_any_work(corpus, capsys):
    assert main(["-q", "quality", "train-lm", *recipe_args(corpus)]) == 0
    Path("runs/q/quality/lm/corpus_perplexity.npy").write_bytes(b"not numpy")
    assert main([*curate_args(corpus), "--set", "curate.perplexity.enabled=true"]) == 2
    err = capsys.readouterr().err
    assert "corpus_perplexity.npy is not a readable score array" in err and "kiln quality train-lm" in err
    (lm_dir := Path("runs/q/quality/lm")).joinpath("corpus_perplexity.npy").write_bytes(
        lm_dir.joinpath("model.npz").read_bytes()
    )
    assert main([*curate_args(corpus), "--set", "curate.perplexity.enabled=true"]) == 2
    assert "corpus_perplexity.npy holds several arrays" in capsys.readouterr().err
    # a classifier folder given to the perplexity filter
    assert main(["-q", "quality", "train-classifier", *recipe_args(corpus)]) == 0
    folder = Path("runs/q/quality/classifier").resolve()
    (folder / "corpus_perplexity.npy").write_bytes((folder / "corpus_scores.npy").read_bytes())
    assert (
        main(
            [
                *curate_args(corpus),
                "--set",
                "curate.perplexity.enabled=true",
                "--set",
                f"curate.perplexity.model={folder}",
            ]
        )
        == 2
    )
    assert "kiln-quality-classifier v1" in capsys.readouterr().err
    assert not Path("runs/q/curate").exists()
