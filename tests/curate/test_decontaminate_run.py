"""Decontamination through the real curate stage: `kiln curate --decontaminate EVAL.jsonl`.

Contaminated training documents (a planted 13-gram of an evaluation item, and an exact copy of
one) are removed with `decontaminate:ngram_overlap` before dedup, so every copy is reported;
audit/decontamination.json names the item and the documents; flag mode keeps them with
`meta.contamination`; accounting holds; an edited evaluation set redoes the stage.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from kiln.cli import main
from kiln.core.docshards import list_shards, read_shard
from kiln.core.manifest import MANIFEST

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
    "minhash_dedup",
)
QUESTION = "which river flows through the ancient city that the traveller reached after nine long days"
PROSE = [
    "the harbour master counted every ship that entered the bay before the winter storms arrived in force",
    "a small bakery on the corner sold bread that the whole street queued for each morning at dawn",
    "children learned to swim in the cold lake behind the school where the old boathouse still stands",
]


def corpus(folder: Path) -> None:
    docs = [{"id": f"clean{i}", "text": text} for i, text in enumerate(PROSE)]
    docs.append(
        {"id": "planted", "text": PROSE[0] + ". Quiz: " + QUESTION.upper() + "? Nobody knew."}
    )  # case differs: still a match
    docs.append(
        {"id": "copy", "text": PROSE[0] + ". Quiz: " + QUESTION.upper() + "? Nobody knew."}
    )  # an exact copy of planted
    docs.append(
        {"id": "twelve", "text": PROSE[1] + " " + " ".join(QUESTION.split()[:12]) + " and then some other words"}
    )
    folder.mkdir(parents=True)
    (folder / "part.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))


def curate(tmp_path: Path, *extra: str) -> Path:
    args = ["-q", "curate", "--input", str(tmp_path / "web"), "--run", "r", "--set", "curate.executor.workers=1"]
    for name in FILTERS:
        args += ["--set", f"curate.{name}.enabled=false"]
    assert main([*args, *extra]) == 0
    return Path("runs/r/curate")


def kept_ids(stage: Path) -> set[str]:
    return {doc.id for shard in list_shards(stage / "shards") for doc in read_shard(shard)}


def test_contaminated_documents_are_removed_and_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus(tmp_path / "web")
    (tmp_path / "quiz.jsonl").write_text(
        json.dumps({"question": "An unrelated question?", "answer": "no"})
        + "\n"
        + json.dumps({"question": QUESTION, "answer": "the river"})
        + "\n"
    )
    stage = curate(tmp_path, "--decontaminate", str(tmp_path / "quiz.jsonl"))

    assert kept_ids(stage) == {"clean0", "clean1", "clean2", "twelve"}  # a 12-gram overlap is no match
    removed = {r["id"]: r for r in pq.read_table(stage / "removed.parquet").to_pylist()}
    assert set(removed) == {"planted", "copy"}  # both copies: decontamination runs before exact dedup
    assert all(
        r["reason"] == "decontaminate:ngram_overlap" and r["value"] == 1 and r["note"].startswith("quiz:1")
        for r in removed.values()
    )

    report = json.loads((stage / "audit" / "decontamination.json").read_text())
    quiz = report["sets"]["quiz"]
    assert (quiz["items"], quiz["items_found"], quiz["documents_found"]) == (2, 1, 2)
    assert quiz["found"] == {"1": [{"id": "copy", "source": "web"}, {"id": "planted", "source": "web"}]}
    assert quiz["items_too_short"] == 1  # "An unrelated question?" has fewer than 13 words
    manifest = json.loads((stage / MANIFEST).read_text())
    counts = manifest["counts"]
    assert counts["docs_in"] == counts["docs_out"] + sum(counts["removed"].values()) + counts["quarantined"] == 6
    assert counts["stats"]["decontaminate:quiz"] == 2
    assert "quiz: 1 of 2 items found in 2 training documents" in (stage / "summary.txt").read_text()
    assert {"path": "audit/decontamination.json"}.items() <= next(
        o for o in manifest["outputs"] if o["path"] == "audit/decontamination.json"
    ).items()

    # the evaluation set is an input of the stage: editing it redoes the stage
    (tmp_path / "quiz.jsonl").write_text(json.dumps({"question": PROSE[1]}) + "\n")
    stage = curate(tmp_path, "--decontaminate", str(tmp_path / "quiz.jsonl"))
    assert kept_ids(stage) == {
        "clean0",
        "clean2",
        "copy",
    }  # clean1 and twelve hold the new item; planted is copy's duplicate (smallest id kept)


def test_flag_mode_keeps_documents_with_their_matches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus(tmp_path / "web")
    (tmp_path / "quiz.jsonl").write_text(json.dumps({"question": QUESTION}) + "\n")
    stage = curate(
        tmp_path, "--decontaminate", str(tmp_path / "quiz.jsonl"), "--set", "curate.decontaminate.action=flag"
    )
    docs = {doc.id: doc for shard in list_shards(stage / "shards") for doc in read_shard(shard)}
    assert docs["copy"].meta["contamination"] == [{"set": "quiz", "item": 0}]
    assert "planted" not in docs  # flagged documents still go through exact dedup (the smallest id is kept)
    assert "contamination" not in docs["twelve"].meta
    report = json.loads((stage / "audit" / "decontamination.json").read_text())
    assert report["action"] == "flag" and report["sets"]["quiz"]["documents_found"] == 2


def test_a_missing_evaluation_set_stops_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    corpus(tmp_path / "web")
    args = [
        "-q",
        "curate",
        "--input",
        str(tmp_path / "web"),
        "--run",
        "r",
        "--decontaminate",
        str(tmp_path / "nope.jsonl"),
    ]
    assert main(args) != 0
    assert "nope.jsonl does not exist" in capsys.readouterr().err
    assert not Path("runs/r/curate/shards").exists()
