"""Training and whole runs as Slurm batch jobs: `kiln train --slurm NODES` and `kiln submit`.

A submission writes, into a folder of its own, the resolved recipe (the command line's `--set`
applied: every job reads this one file, so a job that starts hours later or starts again runs
what was asked) and one sbatch script per job, then submits them with plain `sbatch --parsable`.
Training is one job of NODES x slurm.train.tasks_per_node `srun` tasks (kiln.core.ranks gives each
its rank), submitted with `--requeue --signal=USR1@warn_seconds`: Slurm's warning makes the loop
save a state and requeue the job (kiln.train.loop), which resumes from it, appending to the same
log. `kiln submit` chains the demo's stages with `--dependency=afterok:<job before>` and
`--kill-on-invalid-dep=yes`, each job running its verb (which skips a stage its manifest says is
current), then `kiln demo` for the summary and the report.
Not handled here: shard tasks as job arrays (kiln.core.executors.slurm), the ranks of srun's tasks
(kiln.core.ranks), the stop and requeue (kiln.train.loop), following the jobs once submitted
(squeue and the logs), a run without a disk every node reads.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.core.errors import FatalError
from kiln.core.executors.slurm import JOBS_DIR, SlurmConfig
from kiln.core.layout import EVAL, EXPORT, GENERATE, TRAIN
from kiln.core.storage import is_url
from kiln.verbs import DEMO_STAGES, Verb

if TYPE_CHECKING:
    from kiln.recipe import Recipe

SUBMISSIONS = "slurm"  # the run folder's subfolder of submissions (a store run: under slurm.jobs_dir/<name>/)
RECIPE_FILE = "recipe.yaml"
MODEL_STAGES = frozenset({EVAL, GENERATE, EXPORT})  # they read the model: one task with training's partition and GPU
# The first line of every job's log, and again after each requeue: where and when it (re)started.
STARTED = (
    'echo "kiln: Slurm job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $(hostname) at '
    '$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)"'
)


@dataclass(frozen=True)
class Resources:
    """What one job asks of Slurm."""

    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    mem: str | None
    time: str | None
    partition: str | None
    sbatch_args: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    """One job of a submission: the verb it runs, its script and the log its output goes to (`%j`: the job id)."""

    verb: str
    script: Path
    text: str
    log: Path


def train_resources(cfg: SlurmConfig, nodes: int) -> Resources:
    """The training job: slurm.train's settings, each unset one falling back to the slurm section's."""
    t = cfg.train
    return Resources(
        nodes,
        t.tasks_per_node,
        t.cpus_per_task or cfg.cpus_per_task,
        t.gpus_per_node,
        t.mem or cfg.mem,
        t.time or cfg.time,
        t.partition or cfg.partition,
        tuple(t.sbatch_args),
    )


def stage_resources(cfg: SlurmConfig, verb: Verb | None) -> Resources:
    """A one-task job: a stage that reads the model (eval, generate, export) gets training's partition,
    CPUs, memory and time and one GPU when training has GPUs; the others, and the closing `kiln demo`,
    the slurm section's."""
    if verb is not None and verb.stage in MODEL_STAGES:
        t = train_resources(cfg, 1)
        return Resources(1, 1, t.cpus_per_task, min(t.gpus_per_node, 1), t.mem, t.time, t.partition, t.sbatch_args)
    return Resources(1, 1, cfg.cpus_per_task, 0, cfg.mem, cfg.time, cfg.partition, tuple(cfg.sbatch_args))


def submission_folder(recipe: Recipe, kind: str) -> Path:
    """A new folder for one submission's recipe, scripts and logs, on a disk the nodes read:
    `<run>/slurm/<kind>-<time>/`, or for a run on a store (whose local mirror is this machine's own)
    `<slurm.jobs_dir>/<name>/<kind>-<time>/` (`kiln-slurm/` in this folder when jobs_dir is a URL: Slurm
    writes a job's log to a path). Apart from the stage folders: a log outlives the stage's swap of its
    partial and final folders, and a requeued job appends to its own."""
    if is_url(recipe.runs_dir):
        jobs_dir = recipe.slurm.jobs_dir if not is_url(recipe.slurm.jobs_dir) else JOBS_DIR
        base = Path(jobs_dir) / recipe.name
    else:
        base = recipe.run_dir / SUBMISSIONS
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, n = base.absolute() / f"{kind}-{stamp}", 1
    while folder.exists():  # two submissions in one second
        n += 1
        folder = base.absolute() / f"{kind}-{stamp}-{n}"
    return folder


def script(
    cfg: SlurmConfig,
    name: str,
    res: Resources,
    log: Path,
    command: list[str],
    *,
    requeue: bool = False,
    warn_seconds: int = 0,
    after: str | None = None,
    first_start: tuple[str, ...] = (),
    about: str = "",
) -> str:
    """An sbatch script: its #SBATCH lines, slurm.setup, then `command` (under srun for several tasks or a
    job that requeues itself).
    `after`: the job it waits for (afterok), leaving the queue if that one fails. `first_start`: flags
    for the first start only (--from, --force): a requeued job resumes from its newest state instead."""
    options = [
        f"--job-name={name}",
        f"--nodes={res.nodes}",
        f"--ntasks-per-node={res.tasks_per_node}",
        f"--cpus-per-task={res.cpus_per_task}",
        *([f"--gpus-per-node={res.gpus_per_node}"] if res.gpus_per_node else []),
        *(f"--{key}={value}" for key, value in (("mem", res.mem), ("time", res.time)) if value),
        *(
            f"--{key}={value}"
            for key, value in (("partition", res.partition), ("account", cfg.account), ("qos", cfg.qos))
            if value
        ),
        *(["--requeue", f"--signal=USR1@{warn_seconds}"] if requeue else []),
        "--open-mode=append",  # a requeued job appends to the log of its first start
        f"--output={log}",
        f"--chdir={Path.cwd()}",  # relative paths of the recipe (runs_dir, inputs) as they were read here
        *([f"--dependency=afterok:{after}", "--kill-on-invalid-dep=yes"] if after else []),
        *res.sbatch_args,
    ]
    lines = ["#!/bin/bash", *([f"# {about}"] if about else []), *(f"#SBATCH {o}" for o in options)]
    lines += [*([cfg.setup] if cfg.setup else []), STARTED]
    # subtle: a requeued job runs under srun even as one task: Slurm's warning (--signal without B:) and
    # `scancel --signal` reach a job's steps, never its batch shell or what that runs. And Slurm 22.05's srun
    # no longer takes --cpus-per-task from the job: each task would get one CPU.
    launcher = (
        ["srun", f"--cpus-per-task={res.cpus_per_task}"] if requeue or res.nodes * res.tasks_per_node > 1 else ["exec"]
    )
    words = " ".join(shlex.quote(w) for w in [*launcher, *command])
    if first_start:
        lines += [
            f"first=({' '.join(shlex.quote(w) for w in first_start)})",
            '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && first=()  # requeued: resume from the newest state',
            f'{words} "${{first[@]}}"',
        ]
    else:
        lines.append(words)
    return "\n".join(lines) + "\n"


def kiln_command(verb: str, recipe_file: Path) -> list[str]:
    """This Python running `kiln VERB` on the submission's recipe: the nodes run the environment that submitted."""
    return [sys.executable, "-m", "kiln", verb, "--recipe", str(recipe_file)]


def train_job(
    recipe: Recipe,
    folder: Path,
    nodes: int,
    first_start: tuple[str, ...] = (),
    after: str | None = None,
    about: str = "",
) -> Job:
    """The training job: NODES x slurm.train.tasks_per_node srun tasks, requeued on Slurm's warning."""
    cfg = recipe.slurm
    log = folder / "train-%j.txt"
    text = script(
        cfg,
        f"kiln-{recipe.name}-train",
        train_resources(cfg, nodes),
        log,
        kiln_command("train", folder / RECIPE_FILE),
        requeue=True,
        warn_seconds=cfg.train.warn_seconds,
        after=after,
        first_start=first_start,
        about=about,
    )
    return Job("train", folder / "train.sh", text, log)


def stage_job(recipe: Recipe, folder: Path, verb: Verb | None, after: str | None) -> Job:
    """A one-task job running a stage's verb (None: `kiln demo`, which finds every stage current)."""
    name = verb.name if verb else "demo"
    log = folder / f"{name}-%j.txt"
    text = script(
        recipe.slurm,
        f"kiln-{recipe.name}-{name}",
        stage_resources(recipe.slurm, verb),
        log,
        kiln_command(name, folder / RECIPE_FILE),
        after=after,
    )
    return Job(name, folder / f"{name}.sh", text, log)


def write_recipe(recipe: Recipe, folder: Path) -> Path:
    """The resolved recipe every job of the submission reads."""
    from kiln.recipe import recipe_to_yaml

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECIPE_FILE
    path.write_text(recipe_to_yaml(recipe), encoding="utf-8")
    return path


def require_sbatch(what: str, here: str) -> None:
    """Stop before anything is written where this machine cannot submit (`here`: how to go on without Slurm)."""
    if shutil.which("sbatch") is None:
        raise FatalError(f"{what}: sbatch is not on PATH; run it on a Slurm login node, or {here}")


def sbatch(job: Job, *extra: str) -> str:
    """Submit a written job (extra: sbatch options of this submission only, such as --hold); its id."""
    done = subprocess.run(["sbatch", "--parsable", *extra, str(job.script)], capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        reason = "; ".join(line.removeprefix("sbatch: error: ").strip() for line in said if line.strip())
        raise FatalError(
            f"sbatch refused {job.script}: {reason or f'exit status {done.returncode}'}; fix the recipe's slurm "
            "section and submit again"
        )
    return done.stdout.strip().split(";")[0]  # "<id>;<cluster>" on a federation


def log_of(job: Job, job_id: str) -> Path:
    return Path(str(job.log).replace("%j", job_id))


def submit_train(recipe: Recipe, nodes: int, first_start: tuple[str, ...], dry_run: bool) -> str:
    """`kiln train --slurm NODES`: the script (dry_run), or what was submitted: the job id and its log."""
    folder = submission_folder(recipe, "train")
    per_node = recipe.slurm.train.tasks_per_node
    about = f"kiln train --slurm {nodes} of run {recipe.name}: {nodes} x {per_node} processes, its resolved recipe"
    job = train_job(recipe, folder, nodes, first_start, about=f"{about} {folder / RECIPE_FILE}")
    if dry_run:
        return job.text.rstrip()
    require_sbatch("kiln train --slurm", "train here without --slurm (--dry-run prints the script)")
    write_recipe(recipe, folder)
    job.script.write_text(job.text, encoding="utf-8")
    job_id = sbatch(job)
    return (
        f"kiln train: Slurm job {job_id}: {nodes} node(s) x {recipe.slurm.train.tasks_per_node} task(s), log "
        f"{log_of(job, job_id)}"
    )


def chain(until: str | None) -> list[Verb | None]:
    """The verbs a submission runs, in order: the demo's stages through `until`, or all of them and then
    None, the closing `kiln demo`."""
    if until is None:
        return [*DEMO_STAGES, None]
    return list(DEMO_STAGES[: [v.name for v in DEMO_STAGES].index(until) + 1])


def submit_run(recipe: Recipe, nodes: int, until: str | None, dry_run: bool) -> str:
    """`kiln submit`: one job per stage of the demo, each after the one before succeeded, then `kiln demo`;
    the scripts (dry_run), or each job's id, verb and log. The first job is held until the whole chain is
    in the queue: a refusal midway cancels what was submitted, so no half chain runs."""
    folder = submission_folder(recipe, "submit")
    jobs: list[tuple[Job, str]] = []
    after: str | None = None
    for verb in chain(until):
        if dry_run:
            after = f"<job id of {jobs[-1][0].verb}>" if jobs else None
        is_train = verb is not None and verb.stage == TRAIN
        job = train_job(recipe, folder, nodes, after=after) if is_train else stage_job(recipe, folder, verb, after)
        if dry_run:
            jobs.append((job, ""))
            continue
        if not jobs:
            require_sbatch("kiln submit", "run `kiln demo` here (--dry-run prints the scripts)")
            write_recipe(recipe, folder)
        job.script.write_text(job.text, encoding="utf-8")
        try:
            after = sbatch(job, *([] if jobs else ["--hold"]))
        except FatalError as e:
            if jobs:
                subprocess.run(["scancel", *(i for _, i in jobs)], capture_output=True)
                before = ", ".join(i for _, i in jobs)
                raise FatalError(f"{e} (the jobs submitted before it, {before}, were cancelled)") from None
            raise
        jobs.append((job, after))
    if dry_run:
        return "\n\n".join(f"# {job.script}\n{job.text.rstrip()}" for job, _ in jobs)
    released = subprocess.run(["scontrol", "release", jobs[0][1]], capture_output=True, text=True)
    if released.returncode != 0:
        subprocess.run(["scancel", *(i for _, i in jobs)], capture_output=True)
        raise FatalError(
            f"scontrol release {jobs[0][1]} refused ({released.stderr.strip()}): the chain's jobs were cancelled; "
            "submit again"
        )
    width, id_width = max(len(job.verb) for job, _ in jobs), max(len(job_id) for _, job_id in jobs)
    rows = [f"  {job_id:>{id_width}}  {job.verb:<{width}}  {log_of(job, job_id)}" for job, job_id in jobs]
    return "\n".join(
        [
            f"kiln submit: run {recipe.name} as {len(jobs)} Slurm jobs, each starting once the one before succeeded "
            f"(scripts and recipe in {folder}):",
            *rows,
            "A job that fails takes the ones after it out of the queue (--kill-on-invalid-dep=yes): the last log "
            f"written says why (ls -t {folder}/*.txt | head -1); squeue --me shows the rest.",
        ]
    )
