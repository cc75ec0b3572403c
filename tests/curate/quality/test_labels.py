"""Classifiers on any labels: the labelled file checked line by line before any training, class and scale
models with their held-out report, and the `classifiers` curate step annotating and removing by threshold."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln.cli import main
from kiln.core.docshards import list_shards, read_shard
from kiln.core.errors import ConfigError
from kiln.curate.quality.config import LabelledConfig
from kiln.curate.quality.labels import _ranks, label_kind, read_rows

ABUSE = "you worthless pathetic idiot nobody wants your stupid garbage here loser shut up moron".split()
CALM = "the committee reviewed the budget and the river project before the spring meeting".split()
LEARN = "theorem proof lemma chapter exercise definition example lecture derivation".split()
SELL = "buy now click deal cheap offer discount limited hurry".split()


def sentence(rng: random.Random, words: list[str], n: int = 12) -> str:
    return " ".join(rng.choice(words) for _ in range(n)) + "."


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"text": "a", "label": "x"}', "{not json"], r"in\.jsonl:2: not JSON"),
        (['{"text": "a", "label": "x"}', '{"label": "y"}'], r"in\.jsonl:2: no text under 'text'"),
        (['{"text": "a", "label": "x"}', '{"text": "b", "label": ""}'], r"in\.jsonl:2: an empty label"),
        (['{"text": "a", "label": "x"}', '{"text": "b", "label": null}'], r"in\.jsonl:2: an empty label"),
        (['{"text": "a", "label": "x"}', '["text", "label"]'], r"in\.jsonl:2: a JSON list, not an object"),
    ],
)
def test_a_bad_row_is_named_by_file_and_line(tmp_path: Path, lines: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_rows(LabelledConfig(path=str(write(tmp_path / "in.jsonl", lines))))


def test_one_class_and_csv_columns_and_scales_are_checked(tmp_path: Path) -> None:
    one = write(tmp_path / "one.jsonl", ['{"text": "a", "label": "toxic"}', '{"text": "b", "label": "toxic"}'])
    rows = read_rows(LabelledConfig(path=str(one)))
    with pytest.raises(ConfigError, match=r"every row has the label 'toxic': a classifier needs two classes"):
        label_kind(rows, "auto", str(one))
    table = write(tmp_path / "t.csv", ["body,score", '"a, quoted text",3'])
    with pytest.raises(ConfigError, match=r"t\.csv:1: the header \['body', 'score'\] has no column 'text', 'label'"):
        read_rows(LabelledConfig(path=str(table)))
    rows = read_rows(LabelledConfig(path=str(table), text_key="body", label_key="score"))
    assert (rows[0].text, rows[0].label) == ("a, quoted text", "3")
    mixed = write(tmp_path / "m.jsonl", ['{"text": "a", "label": 1}', '{"text": "b", "label": "high"}'])
    with pytest.raises(ConfigError, match=r"m\.jsonl:2: label 'high' is not a number, and kind is scale"):
        label_kind(read_rows(LabelledConfig(path=str(mixed))), "scale", str(mixed))


@pytest.mark.parametrize(
    ("labels", "kind", "names"),
    [
        (["toxic", "clean", "toxic"], "classes", ["clean", "toxic"]),
        ([0, 1, 1], "classes", ["0", "1"]),  # two numbers: classes
        ([True, False], "classes", ["false", "true"]),
        ([0, 3, 5, 2], "scale", ["score"]),
        ([0.5, 1.5, 2.5], "scale", ["score"]),
    ],
)
def test_auto_kind(tmp_path: Path, labels: list[object], kind: str, names: list[str]) -> None:
    path = write(tmp_path / "k.jsonl", [json.dumps({"text": f"t{i}", "label": v}) for i, v in enumerate(labels)])
    found, found_names, _ = label_kind(read_rows(LabelledConfig(path=str(path))), "auto", str(path))
    assert (found, found_names) == (kind, names)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=30))
def test_ranks_average_ties_as_spearman_does(values: list[int]) -> None:
    # By hand: a value's rank is 1 + the values below it + half the other values equal to it.
    expected = [1 + sum(w < v for w in values) + (values.count(v) - 1) / 2 for v in values]
    assert _ranks(np.array(values, dtype=float)).tolist() == expected


def labelled_files(root: Path) -> tuple[Path, Path]:
    rng = random.Random(0)
    tox = [
        json.dumps({"text": sentence(rng, ABUSE if i % 2 else CALM), "label": "toxic" if i % 2 else "clean"})
        for i in range(400)
    ]
    edu = ["text,score"]
    for i in range(400):
        score = i % 6  # more learning words, fewer selling ones, as the score rises
        words = [rng.choice(LEARN) for _ in range(2 * score)] + [rng.choice(SELL) for _ in range(2 * (5 - score))]
        edu.append(f'"{" ".join(rng.sample(words, len(words)))}",{score}')
    return write(root / "tox.jsonl", tox), write(root / "edu.csv", edu)


def test_train_labels_then_curate_annotates_removes_and_explains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tox, edu = labelled_files(tmp_path)
    labels = f"quality.labels={{toxicity: {{path: {tox}}}, edu: {{path: {edu}, label_key: score}}}}"
    base = ["--recipe", "demo", "--set", f"runs_dir={tmp_path}/runs", "--set", labels]
    assert main(["quality", "train-labels", *base]) == 0
    out = capsys.readouterr().out
    assert "toxicity: classes model (clean, toxic) on" in out and "edu: scale model (score from 0 to 5)" in out
    quality = tmp_path / "runs" / "demo" / "quality" / "labels"
    toxic = json.loads((quality / "toxicity" / "report.json").read_text())["heldout"]["labels"]["toxic"]
    assert toxic["precision"] > 0.95 and toxic["recall"] > 0.95
    scale = json.loads((quality / "edu" / "report.json").read_text())["heldout"]
    assert scale["pearson"] > 0.9 and scale["spearman"] > 0.9

    # Pages to curate: calm and abusive prose, one document a line.
    rng = random.Random(1)
    pages = [{"id": f"calm-{i}", "text": " ".join(sentence(rng, CALM) for _ in range(8))} for i in range(10)]
    pages += [{"id": f"abuse-{i}", "text": " ".join(sentence(rng, ABUSE) for _ in range(8))} for i in range(10)]
    corpus = write(tmp_path / "pages.jsonl", [json.dumps(p) for p in pages])
    models = "curate.classifiers.models={toxicity: {remove_above: {toxic: 0.5}}, edu: {}}"
    off = [
        w
        for step in (
            "gopher_quality",
            "gopher_repetition",
            "c4",
            "fineweb",
            "language",
            "line_dedup",
            "minhash_dedup",
            "exact_dedup",
        )
        for w in ("--set", f"curate.{step}.enabled=false")
    ]
    args = ["curate", *base, "--input", str(corpus), "--set", models, *off]
    assert main(args) == 0
    stage = tmp_path / "runs" / "demo" / "curate"
    kept = {d.id: d for p in list_shards(stage / "shards") for d in read_shard(p)}
    assert sorted(kept) == sorted(p["id"] for p in pages if p["id"].startswith("calm"))
    assert set(kept["calm-0"].meta["scores"]) == {"toxicity", "edu"}  # every model's scores, removing or not
    assert kept["calm-0"].meta["scores"]["toxicity"]["toxic"] < 0.5
    removed = {r["id"]: r for r in pq.read_table(stage / "removed.parquet").to_pylist()}
    assert removed["abuse-0"]["reason"] == "classifiers:toxicity.toxic" and removed["abuse-0"]["threshold"] == 0.5
    assert removed["abuse-0"]["value"] >= 0.5
    capsys.readouterr()
    assert main(["curate", *base, "--input", str(corpus), "--set", models, *off, "--explain", "abuse-0"]) == 0
    assert "classifiers:toxicity.toxic" in capsys.readouterr().out

    # A threshold of a label the model does not have stops curate before any work, naming the model's labels.
    wrong = f"curate.classifiers.models={{toxicity: {{model: {quality / 'toxicity'}, remove_above: {{nsfw: 0.5}}}}}}"
    assert main(["curate", *base, "--input", str(corpus), "--set", wrong, "--set", "name=other"]) == 2
    err = capsys.readouterr().err
    assert "curate.classifiers.models.toxicity.remove_above: nsfw not a label of" in err
    assert not (tmp_path / "runs" / "other" / "curate").exists()


def test_a_csv_with_a_byte_order_mark_reads_as_excel_writes_it(tmp_path: Path) -> None:
    table = tmp_path / "excel.csv"
    table.write_bytes('text,label\n"first, text",toxic\nsecond,clean\n'.encode("utf-8-sig"))
    rows = read_rows(LabelledConfig(path=str(table)))
    assert [(r.text, r.label) for r in rows] == [("first, text", "toxic"), ("second", "clean")]
