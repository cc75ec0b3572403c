"""kiln.curate.jobs: the scratch layout by hand, and a job that travels to a worker with its phase function
and its phase's settings only, and runs there."""

from __future__ import annotations

import json
import pickle

import numpy as np

from kiln.curate.jobs import Job, WorkDir, run_job
from kiln.curate.phases import LINES, PHASES, LinesSettings, lines_phase
from kiln.curate.steps.lines import LineCounts, line_key


def test_the_scratch_layout_by_hand(tmp_path):
    work = WorkDir(tmp_path / "curate")
    assert work.file("read", 3, ".ids.npy") == tmp_path / "curate" / "work" / "read" / "00003.ids.npy"
    assert work.phase("sign") == tmp_path / "curate" / "work" / "sign"
    assert work.boilerplate == tmp_path / "curate" / "work" / "lines" / "boilerplate.npy"
    assert work.decontamination_index == tmp_path / "curate" / "work" / "decontaminate"
    assert work.assignments == tmp_path / "curate" / "work" / "components" / "assign.parquet"
    job = Job(LINES, 7, work, LinesSettings(partitions=1, max_docs=1))
    assert job.folder == work.phase("lines") and job.marker == work.file("lines", 7, ".done")


def test_phases_are_named_once_in_run_order():
    assert [p.name for p in PHASES] == [
        "read",
        "lines",
        "filter",
        "dedup",
        "sign",
        "buckets",
        "verify",
        "components",
        "write",
    ]


def test_a_pickled_job_runs_its_phase_function_on_its_settings(tmp_path):
    # Two read tasks' line counts: "accept cookies" in 3 documents of web, "hello" in 1.
    work = WorkDir(tmp_path)
    work.phase("read").mkdir(parents=True)
    for task, (lines, docs) in enumerate([(["accept cookies", "hello"], 1), (["accept cookies"], 2)]):
        counts = LineCounts()
        for _ in range(docs):
            counts.add({line_key("web", line) for line in lines})
        keys, found = counts.result()
        np.save(work.file("read", task, ".keys.npy"), keys)
        np.save(work.file("read", task, ".counts.npy"), found)
    job = pickle.loads(pickle.dumps(Job(LINES, 0, work, LinesSettings(partitions=1, max_docs=2))))
    assert job.phase.run is lines_phase and job.settings == LinesSettings(1, 2)
    work.phase("lines").mkdir()
    index, marker = run_job(job)
    assert index == 0 and marker["boilerplate_lines"] == 1
    assert np.load(work.file("lines", 0, ".npy")).tolist() == [line_key("web", "accept cookies")]
    assert json.loads(job.marker.read_text())["boilerplate_lines"] == 1
