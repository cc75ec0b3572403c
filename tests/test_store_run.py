"""The miniature demo with runs_dir on an object store (the S3 API of a server on localhost,
tests/conftest.py): every stage's outputs land in the bucket, byte-identical to the same recipe run
on local disk (tests/minidemo.py), and a second machine with an empty cache finds every stage done."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from minidemo import DEMO_STAGES, demo_args

s3fs = pytest.importorskip("s3fs")
pytestmark = pytest.mark.slow


def url_of_or_path(p: object) -> object:
    from kiln.core.mirror import url_of

    return url_of(p) or p


def demo_on(runs_dir: str, corpus: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kiln demo` with its run in runs_dir on a machine whose cache is `cache`: in this process (a kiln subprocess
    would spend 4 s on imports), on the CPU as the local run's command is (tests/minidemo.py)."""
    import torch

    from kiln.cli import main

    monkeypatch.setenv("KILN_CACHE", str(cache))
    with monkeypatch.context() as cpu_only:
        cpu_only.setattr(torch.cuda, "is_available", lambda: False)
        assert main(demo_args(runs_dir, corpus=corpus)) == 0


def test_the_demo_with_its_run_in_a_bucket_matches_the_local_run_byte_for_byte(
    demo_run: dict[str, Any],
    s3_store: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fs = s3fs.S3FileSystem()
    bucket = f"runs-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    corpus = Path(demo_run["runs_dir"]).parent / "corpus"  # the local run's copy of the built-in corpus
    demo_on(f"s3://{bucket}/runs", corpus, tmp_path / "cache", monkeypatch)
    # Not compared: the model card's lineage, whose fingerprints cover where the inputs were (paths there, URLs here).
    varies = {("export", "hf/README.md")}
    for stage in DEMO_STAGES:
        stored = json.loads(fs.cat(f"{bucket}/runs/demo/{stage}/manifest.json"))
        local = demo_run["manifests"][stage]
        same = [[o for o in m["outputs"] if (stage, o["path"]) not in varies] for m in (stored, local)]
        assert same[0] == same[1] and len(stored["outputs"]) == len(local["outputs"]), stage  # path, size, sha256
        assert all(i["path"].startswith(f"s3://{bucket}/runs/demo/") for i in stored["inputs"] if stage != "curate")
        for output in stored["outputs"]:
            assert fs.size(f"{bucket}/runs/demo/{stage}/{output['path']}") == output["bytes"]
    assert fs.exists(f"{bucket}/runs/demo/recipe.yaml") and not fs.glob(f"{bucket}/runs/demo/*.lock")

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kiln"):
        demo_on(f"s3://{bucket}/runs", corpus, tmp_path / "other", monkeypatch)  # another machine: an empty cache
    said = [f"{r.name}: {r.getMessage()}" for r in caplog.records]  # as the command's stderr has them
    for stage in DEMO_STAGES:
        assert any(line.startswith(f"kiln.{stage}: {stage}: up to date") for line in said), (stage, said)
    # The report, built on that machine from the store's records, is kept in the bucket too.
    html = fs.cat(f"{bucket}/runs/demo/report/index.html").decode()
    assert html.count("<td>finished</td>") == len(DEMO_STAGES), html[:2000]
    assert json.loads(fs.cat(f"{bucket}/runs/demo/summary.json"))["docs_out"] == demo_run["summary"]["docs_out"]

    # A third machine scores a file that is itself in the bucket, with the model the bucket holds.
    from kiln.cli import main

    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "third"))
    fs.pipe(f"{bucket}/held_out.jsonl", (json.dumps({"text": Path(json.__file__).read_text()[:4000]}) + "\n").encode())
    assert main(["eval", "--set", f"runs_dir=s3://{bucket}/runs", "--data", f"s3://{bucket}/held_out.jsonl"]) == 0
    scored = json.loads(fs.cat(f"{bucket}/runs/demo/eval/manifest.json"))
    assert scored["counts"]["data"]["held_out.jsonl"]["documents"] == 1
    assert any(i["path"] == f"s3://{bucket}/held_out.jsonl" and i["etag"] for i in scored["inputs"])

    # Another machine, its cache empty: the report and the validation of the model on the bucket's token shards.
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "fourth"))
    assert main(["report", "--set", f"runs_dir=s3://{bucket}/runs"]) == 0
    assert main(["eval", "--set", f"runs_dir=s3://{bucket}/runs"]) == 0
    assert "after" in json.loads(fs.cat(f"{bucket}/runs/demo/eval/manifest.json"))["counts"]
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "third"))

    # The model out to a prefix of the bucket, and imported from there into a local run: the same weights.
    out = f"s3://{bucket}/models/demo-hf"
    assert main(["export", "--set", f"runs_dir=s3://{bucket}/runs", "--set", f"export.out={out}"]) == 0
    assert fs.exists(f"{bucket}/models/demo-hf/model.safetensors")
    assert main(["import-hf", out, "--run", "back", "--set", f"runs_dir={tmp_path / 'local'}"]) == 0
    imported = json.loads((tmp_path / "local" / "back" / "train" / "manifest.json").read_text())
    trained = json.loads(fs.cat(f"{bucket}/runs/demo/train/manifest.json"))
    weights = {o["path"]: o["sha256"] for o in trained["outputs"]}["checkpoint/model.safetensors"]
    assert {o["path"]: o["sha256"] for o in imported["outputs"]}["checkpoint/model.safetensors"] == weights
    assert any(i["path"] == f"{out}/model.safetensors" and i["etag"] for i in imported["inputs"])

    # A run continuing the bucket's names its tokenizer and starting checkpoint by URL.
    from kiln.core.manifest import sha256_file
    from kiln.core.mirror import local_folder
    from kiln.recipe import with_checkpoint_model

    sets = ["--set", f"runs_dir={tmp_path / 'local'}", "--set", "name=cont"]
    assert main(["train-tokenizer", *sets, "--set", f"tokenizer.from_run=s3://{bucket}/runs/demo"]) == 0
    tokenizer = (tmp_path / "local" / "cont" / "tokenizer" / "tokenizer.json").read_bytes()
    assert tokenizer == fs.cat(f"{bucket}/runs/demo/tokenizer/tokenizer.json")
    start = f"s3://{bucket}/runs/demo/train/checkpoint"
    assert with_checkpoint_model({"train": {"init_from": start}})["model"]["d_model"] == 64
    assert sha256_file(local_folder(start) / "model.safetensors") == weights
    from kiln.core.layout import RunLayout
    from kiln.core.mirror import run_path
    from kiln.mix.config import MixConfig
    from kiln.mix.sampler import replayed
    from kiln.train.run import reference_inputs

    demo_url = f"s3://{bucket}/runs/demo"  # its train shards replayed, and counted as the stage's inputs
    replay = replayed(MixConfig.model_validate({"replay": {"run": demo_url, "fraction": 0.25}}))
    tokenized = json.loads(fs.cat(f"{bucket}/runs/demo/tokenize/manifest.json"))["counts"]["per_source"]
    assert sorted(replay) == [f"demo/{s}" for s in sorted(tokenized)]
    named = reference_inputs(RunLayout(tmp_path / "local" / "cont"), [run_path(demo_url)], start)
    assert f"{demo_url}/tokenize/code/train.bin" in map(str, map(url_of_or_path, named))

    # The small files a command line names, from the bucket: prompts, a multiple-choice task, domain terms.
    task = {"context": "def main(", "choices": ["):", "}}}"], "label": 0}
    fs.pipe(f"{bucket}/in/prompts.txt", b"def \nimport \n")
    fs.pipe(f"{bucket}/in/task.jsonl", (json.dumps(task) + "\n").encode())
    fs.pipe(f"{bucket}/in/terms.txt", b"assertEqual\n")
    on_store = ["--set", f"runs_dir=s3://{bucket}/runs"]
    assert main(["generate", *on_store, "--prompt-file", f"s3://{bucket}/in/prompts.txt"]) == 0
    assert json.loads(fs.cat(f"{bucket}/runs/demo/generate/manifest.json"))["counts"]["prompts"] == 2
    assert main(["eval", *on_store, "--task", f"s3://{bucket}/in/task.jsonl"]) == 0
    assert json.loads(fs.cat(f"{bucket}/runs/demo/eval/manifest.json"))["counts"]["tasks"]["task"]["items"] == 1
    assert main(["extend-tokenizer", *on_store, "--terms", f"s3://{bucket}/in/terms.txt"]) == 0
    extended = json.loads(fs.cat(f"{bucket}/runs/demo/tokenizer-extended/manifest.json"))
    assert any(i["path"] == f"s3://{bucket}/in/terms.txt" and i["etag"] for i in extended["inputs"])

    # A model imported with --force over the trained run: the trained one moves aside in the bucket, states and
    # all, and the imported stage holds none of its states.
    assert main(["import-hf", out, "--run", "demo", "--force", *on_store]) == 0
    fs.invalidate_cache()
    (aside,) = fs.glob(f"{bucket}/runs/demo/train.old-*")
    assert fs.cat(f"{aside}/manifest.json") == json.dumps(trained, indent=2).encode() + b"\n"
    assert fs.glob(f"{aside}/checkpoints/*/complete.json") and not fs.glob(f"{bucket}/runs/demo/train/checkpoints/*")
