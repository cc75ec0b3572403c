"""kiln.core.manifest.Stage: skip-or-redo decisions and what manifest.json records."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

import pytest

from kiln import __version__
from kiln.core.errors import FatalError
from kiln.core.manifest import IDENTITY, MANIFEST, Stage, config_hash, fingerprint, read_manifest, recorded_outputs
from kiln.tokenize.config import TokenizeConfig, TokenizerConfig


@pytest.fixture
def inputs(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "inputs"
    folder.mkdir()
    a, b = folder / "a.txt", folder / "b.txt"
    a.write_text("alpha beta gamma\n")
    b.write_bytes(b"\x00\x01binary-ish\xff")
    return [a, b]


CFG = {"tokenize": TokenizeConfig(val_fraction=0.1)}


def finish_stage(
    run_dir: Path, inputs: list[Path], config=CFG, upstream=(), name="stage", payload=b"token bytes"
) -> tuple[Stage, dict]:
    stage = Stage(run_dir, name, config, inputs, upstream)
    stage.begin()
    out = stage.dir / "sub" / "out.bin"
    out.parent.mkdir()
    out.write_bytes(payload)
    manifest = stage.finish([out], {"docs": 3, "per_source": {"web": 2}}, "three docs\n")
    return stage, manifest


def test_first_run_is_not_current(tmp_path, inputs):
    assert Stage(tmp_path / "run", "stage", CFG, inputs).current_manifest() is None


def test_finished_stage_is_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    _, manifest = finish_stage(run_dir, inputs)
    again = Stage(run_dir, "stage", CFG, list(reversed(inputs)))  # input order does not matter
    assert again.current_manifest() == manifest
    assert read_manifest(run_dir / "stage") == manifest


def test_manifest_contents(tmp_path, inputs):
    run_dir = tmp_path / "run"
    t0 = time.perf_counter()
    stage = Stage(run_dir, "stage", CFG, inputs)
    stage.begin()
    busy_until = time.process_time() + 0.05
    while time.process_time() < busy_until:  # burn some CPU so cpu_seconds has something to count
        pass
    out = stage.dir / "out.bin"
    out.write_bytes(b"12345")
    manifest = stage.finish([out], {"docs": 3}, "summary line")
    wall = time.perf_counter() - t0

    on_disk = json.loads((run_dir / "stage" / MANIFEST).read_text())
    assert on_disk == manifest
    assert manifest["format"] == "kiln-manifest v1"
    assert manifest["stage"] == "stage"
    assert manifest["config"] == {"tokenize": CFG["tokenize"].model_dump(mode="json")}
    assert manifest["config"]["tokenize"]["val_fraction"] == 0.1
    # NOT_HASHED fields (speed only) and unset (None) ones are left out of the hash; the kiln version is in it.
    hashed = {
        "tokenize": {
            k: v
            for k, v in manifest["config"]["tokenize"].items()
            if k not in ("batch_docs", "executor") and v is not None
        }
    }
    assert manifest["config"]["tokenize"]["fim"] is None and "fim" not in hashed["tokenize"]
    expected_hash = hashlib.sha256(
        json.dumps({"kiln": __version__, "sections": hashed}, sort_keys=True).encode()
    ).hexdigest()
    assert manifest["config_hash"] == expected_hash == config_hash(CFG)
    expected_fingerprint = hashlib.sha256(
        json.dumps({k: manifest[k] for k in ("config_hash", "inputs", "upstream", "outputs")}, sort_keys=True).encode()
    ).hexdigest()
    assert manifest["fingerprint"] == expected_fingerprint == fingerprint(manifest)
    assert set(IDENTITY) == {"config_hash", "inputs", "upstream", "outputs"}
    assert manifest["inputs"] == [
        {"path": str(p), "bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(inputs)
    ]
    assert manifest["upstream"] == {}
    assert manifest["outputs"] == [{"path": "out.bin", "bytes": 5, "sha256": hashlib.sha256(b"12345").hexdigest()}]
    assert manifest["counts"] == {"docs": 3}
    assert 0 <= manifest["wall_seconds"] <= wall + 0.01
    assert manifest["cpu_seconds"] >= 0.04
    versions = manifest["versions"]
    assert versions["python"] == platform.python_version()
    assert versions["kiln"] == "0.1.0"
    for pkg in ("torch", "tokenizers", "numpy"):
        assert versions[pkg] and versions[pkg] != "not installed"
    assert time.strptime(manifest["finished_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert (run_dir / "stage" / "summary.txt").read_text() == "summary line\n"
    assert not (run_dir / "stage" / (MANIFEST + ".tmp")).exists()


def test_extra_fields_are_recorded(tmp_path, inputs):
    stage = Stage(tmp_path / "run", "stage", CFG, inputs)
    stage.begin()
    manifest = stage.finish([], {}, "s", extra={"note": "hello"})
    assert manifest["note"] == "hello"
    assert read_manifest(stage.dir)["note"] == "hello"


def test_changed_config_is_not_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    finish_stage(run_dir, inputs)
    assert Stage(run_dir, "stage", {"tokenize": TokenizeConfig(val_fraction=0.2)}, inputs).current_manifest() is None
    # another section under the same stage is a different config too
    assert Stage(run_dir, "stage", {"tokenizer": TokenizerConfig()}, inputs).current_manifest() is None


def test_changed_input_content_same_size_is_not_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    finish_stage(run_dir, inputs)
    inputs[0].write_text("alpha beta GAMMA\n")  # same size: only the sha256 tells
    assert inputs[0].stat().st_size == len("alpha beta gamma\n")
    assert Stage(run_dir, "stage", CFG, inputs).current_manifest() is None


def test_added_or_removed_input_is_not_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    finish_stage(run_dir, inputs)
    assert Stage(run_dir, "stage", CFG, inputs[:1]).current_manifest() is None
    extra = inputs[0].parent / "c.txt"
    extra.write_text("more")
    assert Stage(run_dir, "stage", CFG, [*inputs, extra]).current_manifest() is None


def test_deleted_output_is_not_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    stage, _ = finish_stage(run_dir, inputs)
    (stage.dir / "sub" / "out.bin").unlink()
    assert Stage(run_dir, "stage", CFG, inputs).current_manifest() is None


def test_modified_output_is_not_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    stage, _ = finish_stage(run_dir, inputs)
    with open(stage.dir / "sub" / "out.bin", "ab") as f:
        f.write(b"!")
    assert Stage(run_dir, "stage", CFG, inputs).current_manifest() is None


def test_changed_upstream_is_not_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    finish_stage(run_dir, inputs, name="curate")
    _, manifest = finish_stage(run_dir, inputs, name="tokenize", upstream=["curate"])
    assert manifest["upstream"] == {"curate": read_manifest(run_dir / "curate")["fingerprint"]}
    assert Stage(run_dir, "tokenize", CFG, inputs, ["curate"]).current_manifest() == manifest

    finish_stage(run_dir, inputs, name="curate", payload=b"other token bytes")  # the upstream was redone
    assert read_manifest(run_dir / "curate")["fingerprint"] != manifest["upstream"]["curate"]
    assert Stage(run_dir, "tokenize", CFG, inputs, ["curate"]).current_manifest() is None


def test_upstream_redone_with_identical_outputs_keeps_downstream_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    _, first = finish_stage(run_dir, inputs, name="curate")
    _, manifest = finish_stage(run_dir, inputs, name="tokenize", upstream=["curate"])
    time.sleep(0.01)
    _, again = finish_stage(run_dir, inputs, name="curate")  # same config, inputs and outputs; new timings
    assert again["finished_at"] >= first["finished_at"] and again["fingerprint"] == first["fingerprint"]
    assert Stage(run_dir, "tokenize", CFG, inputs, ["curate"]).current_manifest() == manifest


def test_speed_only_fields_do_not_redo(tmp_path, inputs):
    run_dir = tmp_path / "run"
    _, manifest = finish_stage(run_dir, inputs)
    faster = {"tokenize": TokenizeConfig(val_fraction=0.1, batch_docs=4096)}
    assert Stage(run_dir, "stage", faster, inputs).current_manifest() == manifest
    other = {"tokenize": TokenizeConfig(val_fraction=0.2)}
    assert Stage(run_dir, "stage", other, inputs).current_manifest() is None


def test_missing_upstream_is_fatal(tmp_path, inputs):
    with pytest.raises(FatalError, match=r"no manifest.json; run that stage first"):
        Stage(tmp_path / "run", "tokenize", CFG, inputs, ["curate"])
    with pytest.raises(FatalError, match="no manifest.json"):
        read_manifest(tmp_path / "run" / "curate")


def test_half_written_stage_is_not_current(tmp_path, inputs):
    run_dir = tmp_path / "run"
    stage = Stage(run_dir, "stage", CFG, inputs)
    stage.begin()
    (stage.dir / "out.bin").write_bytes(b"partial")  # crashed before finish(): no manifest
    assert Stage(run_dir, "stage", CFG, inputs).current_manifest() is None


def test_begin_builds_beside_the_finished_outputs_and_finish_swaps_them_in(tmp_path, inputs):
    run_dir = tmp_path / "run"
    stage, first = finish_stage(run_dir, inputs)
    sibling = run_dir / "other"
    sibling.mkdir()
    (sibling / "keep.txt").write_text("not this stage's")

    again = Stage(run_dir, "stage", CFG, inputs)
    again.begin()
    assert again.dir == run_dir / "stage.partial"
    assert [p.name for p in again.dir.iterdir()] == ["in_progress.json"]
    assert read_manifest(run_dir / "stage") == first  # the finished outputs are untouched while it builds
    assert (run_dir / "stage" / "sub" / "out.bin").read_bytes() == b"token bytes"
    out = again.dir / "sub" / "out.bin"
    out.parent.mkdir()
    out.write_bytes(b"new bytes")
    second = again.finish([out], {}, "redone")
    assert again.dir == run_dir / "stage" and not (run_dir / "stage.partial").exists()
    assert (run_dir / "stage" / "sub" / "out.bin").read_bytes() == b"new bytes"
    assert read_manifest(run_dir / "stage") == second != first
    assert sorted(p.name for p in run_dir.iterdir()) == ["other", "stage"]  # no lock, no .old left
    assert (sibling / "keep.txt").read_text() == "not this stage's"


def test_a_failed_rerun_leaves_the_previous_outputs_as_they_were(tmp_path, inputs):
    run_dir = tmp_path / "run"
    _, first = finish_stage(run_dir, inputs)
    again = Stage(run_dir, "stage", {"tokenize": TokenizeConfig(val_fraction=0.3)}, inputs)
    again.begin()
    (again.dir / "half.bin").write_bytes(b"half")
    # ... the work raises here, so finish() never runs
    assert read_manifest(run_dir / "stage") == first
    assert (run_dir / "stage" / "sub" / "out.bin").read_bytes() == b"token bytes"
    assert Stage(run_dir, "stage", CFG, inputs).current_manifest() == first  # still current for its own config


def test_a_folder_kiln_did_not_write_is_refused_untouched(tmp_path, inputs):
    run_dir = tmp_path / "run"
    foreign = run_dir / "stage"
    foreign.mkdir(parents=True)
    (foreign / "thesis.tex").write_text("months of work")
    with pytest.raises(FatalError, match=r"exists but kiln did not write it .*choose another run name"):
        Stage(run_dir, "stage", CFG, inputs).begin()
    assert (foreign / "thesis.tex").read_text() == "months of work"
    assert not (run_dir / "stage.lock").exists()


def test_a_second_command_on_the_same_stage_is_refused_naming_the_holder(tmp_path, inputs):
    import socket

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A live process on this host (our parent) holds the stage.
    (run_dir / "stage.lock").write_text(
        json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "since": "2026-11-25T00:00:00Z"})
    )
    with pytest.raises(
        FatalError,
        match=rf"being built by pid {os.getppid()} on {socket.gethostname()} since 2026-11-25T00:00:00Z; wait for it",
    ):
        Stage(run_dir, "stage", CFG, inputs).begin()
    assert not (run_dir / "stage.partial").exists()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, inputs):
    import socket
    import subprocess

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run_dir / "stage.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "since": "then"}))
    stage = Stage(run_dir, "stage", CFG, inputs)
    stage.begin()
    assert json.loads((run_dir / "stage.lock").read_text())["pid"] == os.getpid()
    stage.finish([], {}, "done")
    assert not (run_dir / "stage.lock").exists()


def test_a_requeued_slurm_job_takes_over_the_lock_its_earlier_run_left_on_another_node(tmp_path, inputs, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    earlier = {"host": "node7", "pid": 1, "since": "then", "slurm_job": "4242", "slurm_restart": 0}
    (run_dir / "stage.lock").write_text(json.dumps(earlier))
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job: node7's process may be alive, so refused
    with pytest.raises(FatalError, match="being built by pid 1 on node7"):
        Stage(run_dir, "stage", CFG, inputs).begin()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # the same job, requeued once: its earlier run has ended
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    stage = Stage(run_dir, "stage", CFG, inputs)
    stage.begin()
    taken = json.loads((run_dir / "stage.lock").read_text())
    assert (taken["pid"], taken["slurm_job"], taken["slurm_restart"]) == (os.getpid(), "4242", 1)


def test_resume_keeps_an_interrupted_attempt_with_the_same_identity(tmp_path, inputs):
    run_dir = tmp_path / "run"
    first = Stage(run_dir, "stage", CFG, inputs)
    assert first.begin(resume=True) is False
    (first.dir / "task-1.done").write_text("finished")  # then the process dies: no manifest
    again = Stage(run_dir, "stage", CFG, inputs)
    assert again.begin(resume=True) is True
    assert (again.dir / "task-1.done").read_text() == "finished"
    again.finish([again.dir / "task-1.done"], {}, "done")
    assert not (again.dir / "in_progress.json").exists()


def test_resume_starts_over_when_config_or_inputs_changed(tmp_path, inputs):
    run_dir = tmp_path / "run"
    partial = run_dir / "stage.partial"
    Stage(run_dir, "stage", CFG, inputs).begin(resume=True)
    (partial / "task-1.done").write_text("finished")
    other = Stage(run_dir, "stage", {"tokenize": TokenizeConfig(val_fraction=0.2)}, inputs)
    assert other.begin(resume=True) is False
    assert not (partial / "task-1.done").exists()
    (partial / "task-1.done").write_text("finished")
    inputs[0].write_text("changed input\n")
    assert Stage(run_dir, "stage", {"tokenize": TokenizeConfig(val_fraction=0.2)}, inputs).begin(resume=True) is False
    assert not (partial / "task-1.done").exists()


@pytest.mark.parametrize("garbage", ["{not json", "[1]", "\udcff"])
def test_a_damaged_in_progress_record_starts_the_attempt_over(tmp_path, inputs, garbage):
    run_dir = tmp_path / "run"
    Stage(run_dir, "stage", CFG, inputs).begin(resume=True)
    (run_dir / "stage.partial" / "task-1.done").write_text("finished")
    (run_dir / "stage.partial" / "in_progress.json").write_text(garbage, errors="surrogateescape")
    again = Stage(run_dir, "stage", CFG, inputs)
    assert again.partial_changes() == [f"its record {run_dir / 'stage.partial' / 'in_progress.json'} is damaged"]
    assert again.begin(resume=True) is False
    assert not (run_dir / "stage.partial" / "task-1.done").exists()


def test_force_ignores_an_interrupted_attempt(tmp_path, inputs):
    run_dir = tmp_path / "run"
    Stage(run_dir, "stage", CFG, inputs).begin(resume=True)
    (run_dir / "stage.partial" / "task-1.done").write_text("finished")
    assert Stage(run_dir, "stage", CFG, inputs).begin(resume=False) is False
    assert not (run_dir / "stage.partial" / "task-1.done").exists()


def test_inputs_from_an_upstream_stage_are_checked_against_its_manifest(tmp_path, inputs):
    run_dir = tmp_path / "run"
    finish_stage(run_dir, inputs, name="curate", payload=b"0123456789")
    out = recorded_outputs(run_dir / "curate")
    assert out == [run_dir / "curate" / "sub" / "out.bin"]
    Stage(run_dir, "tokenize", CFG, out, ["curate"])  # unchanged: accepted
    out[0].write_bytes(b"01234")  # cut
    with pytest.raises(
        FatalError,
        match=(
            r"out.bin changed after the curate stage wrote it \(5 bytes now, 10 recorded\); rerun `curate` with "
            r"--force"
        ),
    ):
        Stage(run_dir, "tokenize", CFG, out, ["curate"])
    out[0].write_bytes(b"9876543210")  # same size, other bytes
    with pytest.raises(FatalError, match="same size but a different sha256"):
        Stage(run_dir, "tokenize", CFG, out, ["curate"])
    out[0].unlink()  # deleted: still listed by the manifest, so reported missing
    with pytest.raises(FatalError, match="input files missing: .*out.bin"):
        Stage(run_dir, "tokenize", CFG, recorded_outputs(run_dir / "curate"), ["curate"])
    stray = run_dir / "curate" / "stray.bin"
    stray.write_bytes(b"x")
    with pytest.raises(FatalError, match="stray.bin is not an output recorded in"):
        Stage(run_dir, "tokenize", CFG, [stray], ["curate"])


def test_refuse_to_replace_stops_or_moves_the_folder_aside(tmp_path, inputs):
    run_dir = tmp_path / "run"
    stage, _ = finish_stage(run_dir, inputs)
    again = Stage(run_dir, "stage", CFG, inputs)
    again.refuse_to_replace(["nothing-here"], "checkpoints", force=False)  # nothing held: no error
    with pytest.raises(FatalError, match=r"holds checkpoints; pass --force to move it aside"):
        again.refuse_to_replace(["sub/out.bin"], "checkpoints", force=False)
    again.refuse_to_replace(["sub/out.bin"], "checkpoints", force=True)
    assert not (run_dir / "stage").exists()
    [aside] = [p for p in run_dir.iterdir() if p.name.startswith("stage.old-")]
    assert (aside / "sub" / "out.bin").read_bytes() == b"token bytes"


def test_up_to_date_is_the_one_skip_check(tmp_path, inputs, caplog):
    run_dir = tmp_path / "run"
    _, manifest = finish_stage(run_dir, inputs)
    stage = Stage(run_dir, "stage", CFG, inputs)
    with caplog.at_level("INFO", logger="kiln.stage"):
        assert stage.up_to_date(False, lambda m: f"{m['counts']['docs']} docs") == manifest
    assert "stage: up to date (3 docs); nothing to do. Use --force to redo." in caplog.text
    assert stage.up_to_date(True) is None


def test_upstream_manifest_without_fingerprint_redoes_downstream(tmp_path, inputs):
    run_dir = tmp_path / "run"
    finish_stage(run_dir, inputs, name="curate")
    finish_stage(run_dir, inputs, name="tokenize", upstream=["curate"])
    path = run_dir / "curate" / MANIFEST
    old = json.loads(path.read_text())
    del old["fingerprint"]  # as written by an older kiln
    path.write_text(json.dumps(old))
    assert Stage(run_dir, "tokenize", CFG, inputs, ["curate"]).current_manifest() is None


def test_a_stage_refuses_an_upstream_made_from_an_earlier_version_of_its_own_upstream(tmp_path, inputs):
    # tokenizer -> tokenize -> train, then the tokenizer is redone: the model was trained on the
    # old tokenizer's ids, so a stage reading it (generate, export) must not serve it with the new one.
    run_dir = tmp_path / "run"
    finish_stage(run_dir, inputs, name="tokenizer")
    finish_stage(run_dir, inputs, upstream=["tokenizer"], name="tokenize")
    finish_stage(run_dir, inputs, upstream=["tokenize"], name="train")
    Stage(run_dir, "export", CFG, inputs, upstream=["train"])  # the chain is current
    finish_stage(run_dir, inputs, name="tokenizer", payload=b"other merges")
    with pytest.raises(
        FatalError,
        match=(
            rf"export: {run_dir / 'tokenize'} was made from an earlier tokenizer stage .* rerun the stages after "
            r"tokenizer"
        ),
    ):
        Stage(run_dir, "export", CFG, inputs, upstream=["train"])
    with pytest.raises(FatalError, match=r"train: .*tokenize was made from an earlier tokenizer stage"):
        Stage(run_dir, "train", CFG, inputs, upstream=["tokenize"])  # nor is a model trained on the stale shards
    finish_stage(run_dir, inputs, upstream=["tokenizer"], name="tokenize")
    with pytest.raises(FatalError, match=r"export: .*/train was made from an earlier tokenize stage"):
        Stage(run_dir, "export", CFG, inputs, upstream=["train"])
    finish_stage(run_dir, inputs, upstream=["tokenize"], name="train")
    Stage(run_dir, "export", CFG, inputs, upstream=["train"])  # every stage redone in order: current again


def test_a_live_holders_lock_is_checked_before_anything_is_moved_aside(tmp_path, inputs):
    run_dir = tmp_path / "run"
    finish_stage(run_dir, inputs)
    holder = Stage(run_dir, "stage", CFG, inputs)
    holder.lock_path.write_text(json.dumps({"host": "another-host", "pid": 1, "since": "now"}))
    with pytest.raises(FatalError, match="being built by pid 1 on another-host"):
        Stage(run_dir, "stage", CFG, inputs).set_aside(run_dir / "stage", "--force")
    assert (run_dir / "stage" / MANIFEST).is_file() and not list(run_dir.glob("stage.old-*"))
