"""Stage bookkeeping: skip-or-redo, a safe life cycle, and the manifest.json every stage finishes with.

A stage is current when its manifest records the same config hash, the same inputs (size and
sha256), the same upstream fingerprints, and its outputs are still there with their recorded
sizes. Then running it again does nothing; `force` or any change redoes it. The config hash
covers the kiln version and every field that can change results (not a section's NOT_HASHED
speed settings).

A stage's life never destroys what it has not replaced. It builds its outputs in
`<stage>.partial/` beside the finished `<stage>/` and swaps them in only when it succeeds, so a
failed re-run leaves the previous outputs as they were. It refuses a directory that kiln did
not write (no manifest.json, no in_progress.json), and holds `<stage>.lock` (host, pid) while it
builds, and before it moves anything aside: a second command on the same stage stops with the
holder's name before it touches anything; a lock left by a dead process on this host is taken
over. Inputs that an upstream stage wrote are checked against the sizes and sha256 that stage's
manifest recorded before anything reads them, and the chain above them must be current: a stage
refuses to read an upstream stage that was made from an earlier version of its own upstream
(a model trained on token shards that have been redone since, say), naming what to rerun.

A manifest's `fingerprint` is the sha256 of what identifies its result: config hash, inputs,
upstream fingerprints and outputs, not timings. Downstream stages record it, so a model traces
back to the exact data and rules that made it, and a redone stage whose outputs came out
byte-identical does not force its downstream stages to redo.
A run on an object store (runs_dir a URL) is worked on in a local mirror (kiln.core.mirror):
manifests are read fresh from the store, the upstream outputs a stage reads are fetched and
checked against their recorded sha256, the lock is also an object on the store, and a finished
stage is published there with its manifest last.
Not handled here: moving objects (kiln.core.storage, kiln.core.mirror).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import resource
import shutil
import socket
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from kiln import __version__
from kiln.core import storage
from kiln.core.atomic import write_atomically
from kiln.core.config import Section
from kiln.core.errors import FatalError
from kiln.core.layout import MANIFEST, SUMMARY
from kiln.core.mirror import (
    clear,
    fetch,
    fetch_recorded,
    key_path,
    move,
    parse_manifest,
    publish,
    push_files,
    refresh,
    shown,
    url_of,
)
from kiln.core.storage import describe_traffic, exists, identity, is_url, sha256_file, traffic_since
from kiln.core.store_lock import StoreLock, process_alive

TRAFFIC_MARK = [traffic_since()]  # the store traffic this process had when its last stage ended (see Stage)
IN_PROGRESS = "in_progress.json"  # what an unfinished attempt was doing; resume keeps its work only if it matches
FORMAT = "kiln-manifest v1"
log = logging.getLogger("kiln.core")


def hashed_settings(config: Mapping[str, Section]) -> dict[str, Any]:
    """The settings that identify a stage's result (each section less its NOT_HASHED keys), as JSON.

    Keys set to None are left out: a new optional setting left unset does not change the identity
    of stages that were run before it existed.
    """
    return {k: v.model_dump(mode="json", exclude=set(v.NOT_HASHED), exclude_none=True) for k, v in config.items()}


def config_hash(config: Mapping[str, Section]) -> str:
    canonical = json.dumps({"kiln": __version__, "sections": hashed_settings(config)}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def changed_settings(old: Any, new: Any, prefix: str = "") -> list[str]:
    """`key: old -> new` for every dotted key whose value differs between two JSON trees."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            change
            for key in sorted(old.keys() | new.keys())
            for change in changed_settings(old.get(key), new.get(key), f"{prefix}{key}.")
        ]
    return [] if old == new else [f"{prefix.rstrip('.')}: {json.dumps(old)} -> {json.dumps(new)}"]


IDENTITY = ("config_hash", "inputs", "upstream", "outputs")


def fingerprint(manifest: Mapping[str, Any]) -> str:
    canonical = json.dumps({k: manifest[k] for k in IDENTITY}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def describe_files(
    paths: Iterable[Path | str], root: Path | None = None, known: Mapping[str, Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Each file's path (relative to root when given), size and sha256; an object of a store (a
    URL) its size and the store's fingerprint instead, read without downloading it. A file of a run on
    a store is named by its URL, not by where this machine's mirror keeps it, so that manifests read
    the same from every machine."""
    out = []
    # Local files in Path order (as manifests always listed them), then a store's objects by URL.
    for p in sorted(paths, key=lambda p: (True, str(p), Path()) if is_url(p) else (False, "", Path(p))):
        if is_url(p):
            out.append(identity(str(p)))
            continue
        p = Path(p)
        name = str(p.relative_to(root)) if root is not None else url_of(p) or str(p)
        if known and name in known:  # hashed by the task that wrote it (perhaps on another machine)
            out.append({"path": name, "bytes": known[name]["bytes"], "sha256": known[name]["sha256"]})
            continue
        out.append({"path": name, "bytes": p.stat().st_size, "sha256": sha256_file(p)})
    return out


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for pkg in ("kiln", "torch", "tokenizers", "numpy"):
        try:
            found[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            found[pkg] = "not installed"
    return found


def read_manifest(stage_dir: Path) -> dict[str, Any]:
    """A finished stage's manifest (read fresh from the store for a run on one)."""
    path = Path(stage_dir) / MANIFEST
    if not refresh(path):
        if (url := url_of(path)) is not None:
            storage.check_bucket(url)
        raise FatalError(f"{shown(stage_dir)}: no {MANIFEST}; run that stage first (or `kiln demo`)")
    return checked_manifest(path)


def checked_manifest(path: Path) -> dict[str, Any]:
    """load_manifest(path), or a FatalError naming it and the stage to redo."""
    manifest = load_manifest(path)
    if manifest is None:
        raise FatalError(
            f"{shown(path)}: not a manifest kiln writes (damaged, or written by something else); rerun the "
            f"{path.parent.name} stage with --force"
        )
    return manifest


def load_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest in a local file, or None when it is not one kiln writes (mirror.parse_manifest)."""
    return parse_manifest(path.read_bytes())


def recorded_outputs(stage_dir: Path, under: str = "", fetch: bool = True) -> list[Path]:
    """The outputs a finished stage's manifest lists (below `under`), in path order.

    Downstream stages take their input list from here rather than from a directory listing, so a
    deleted output is reported as missing instead of silently left out.
    """
    prefix = f"{under.rstrip('/')}/" if under else ""
    chosen = [o for o in read_manifest(Path(stage_dir))["outputs"] if o["path"].startswith(prefix)]
    if fetch:  # a run on a store: into this machine's mirror, checked (not for files only tasks elsewhere read)
        fetch_recorded(Path(stage_dir), chosen)
    return [key_path(Path(stage_dir), o["path"], f"{shown(stage_dir)}/{MANIFEST}") for o in chosen]


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Stage:
    """One stage of one run: `runs/<name>/<stage>/`, built in `<stage>.partial/`."""

    def __init__(
        self,
        run_dir: Path,
        name: str,
        config: Mapping[str, Section],
        inputs: Collection[Path | str],
        upstream: Iterable[str] = (),
        fetch_inputs: bool = True,
    ):
        # What this stage reads from and writes to stores counts from the end of the previous stage this process ran
        # (or its start): the upstream outputs its verb fetched before making it are its own (a train-tokenizer that
        # fetched 24 shards counted 2 requests when its count began here).
        self._traffic0 = TRAFFIC_MARK[0]
        self.run_dir = Path(run_dir)
        self.name = name
        self.final_dir = self.run_dir / name
        self.dir = self.final_dir  # where outputs are written: the partial folder between begin() and finish()
        self.partial_dir = self.final_dir.with_name(self.final_dir.name + ".partial")
        self.lock_path = self.final_dir.with_name(self.final_dir.name + ".lock")
        self.store = url_of(self.final_dir)  # the stage's location on a store, for a run on one
        self.store_lock: StoreLock | None = None
        self.config = dict(config)
        # Upstream first: a missing upstream stage explains a missing input better than the input does.
        # .get: a manifest written before fingerprints existed matches nothing, so this stage redoes.
        upstream_manifests = {u: read_manifest(self.run_dir / u) for u in upstream}
        self.upstream = {u: m.get("fingerprint") for u, m in upstream_manifests.items()}
        # A run on a store: inputs another stage recorded are taken as recorded, and fetched into the mirror
        # (checked) unless `fetch_inputs` is off (tasks on other machines fetch what they read).
        known = self._recorded_inputs(inputs, upstream_manifests) if self.store is not None else {}
        for record in known.values() if fetch_inputs else ():
            fetch(record["local"], record["bytes"], record["sha256"])
        missing = sorted(
            str(p) for p in inputs if not (exists(str(p)) if is_url(p) else Path(p).is_file() or url_of(p) in known)
        )
        if missing:
            raise FatalError(
                f"{name}: input files missing: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
                "rerun the stage that makes them with --force"
            )
        self.inputs = describe_files(inputs, known=known)
        self._check_upstream_records(upstream_manifests)
        self._check_upstream_chain(upstream_manifests)
        self.config_hash = config_hash(self.config)
        self.log = logging.getLogger(f"kiln.{name}")
        self._t0 = self._cpu0 = 0.0

    def _recorded_inputs(
        self, inputs: Collection[Path | str], manifests: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        """The inputs inside this run that a stage's manifest records, by URL: {"local", "bytes", "sha256"}."""
        found = {}
        for p in inputs:
            if is_url(p) or url_of(p) is None or not Path(p).is_relative_to(self.run_dir):
                continue
            rel = Path(p).relative_to(self.run_dir)
            stage, rel = rel.parts[0], rel.relative_to(rel.parts[0])
            if stage not in manifests and stage != self.name and refresh(self.run_dir / stage / MANIFEST):
                manifests = {**manifests, stage: read_manifest(self.run_dir / stage)}
            record = next((o for o in manifests.get(stage, {}).get("outputs", []) if o["path"] == rel.as_posix()), None)
            if record is not None:
                found[str(url_of(p))] = {"local": Path(p), "bytes": record["bytes"], "sha256": record["sha256"]}
        return found

    def _check_upstream_records(self, manifests: Mapping[str, Mapping[str, Any]]) -> None:
        """Every input inside an upstream stage's folder must be one of its recorded outputs, unchanged."""
        for u, manifest in manifests.items():
            folder = self.run_dir / u
            named = (url_of(folder) or str(folder)) + "/"  # how describe_files names the files in it
            recorded = {o["path"]: o for o in manifest.get("outputs", [])}
            for found in self.inputs:
                path = found["path"]
                if not path.startswith(named):
                    continue
                rel = path.removeprefix(named)
                want = recorded.get(rel)
                if want is None:
                    raise FatalError(
                        f"{self.name}: {path} is not an output recorded in {folder / MANIFEST}; rerun `{u}` with "
                        "--force"
                    )
                if (want["bytes"], want["sha256"]) != (found["bytes"], found["sha256"]):
                    raise FatalError(
                        f"{self.name}: {path} changed after the {u} stage wrote it ({found['bytes']:,} bytes now, "
                        f"{want['bytes']:,} recorded"
                        f"{'' if want['bytes'] != found['bytes'] else ', same size but a different sha256'}); "
                        f"rerun `{u}` with --force to rebuild it"
                    )

    def _check_upstream_chain(self, manifests: Mapping[str, Mapping[str, Any]]) -> None:
        """Every stage above this one, followed through the manifests' upstream records, must have
        been made from the current manifest of each stage it read (a stage since removed is not
        judged). Otherwise what this stage would read is stale: a FatalError names the stage to rerun."""
        seen: set[str] = set()
        pending = dict(manifests)
        while pending:
            name, manifest = pending.popitem()
            if name in seen:
                continue
            seen.add(name)
            for above, recorded in (manifest.get("upstream") or {}).items():
                path = self.run_dir / above / MANIFEST
                if not refresh(path):
                    continue
                current = checked_manifest(path)
                if current.get("fingerprint") != recorded:
                    raise FatalError(
                        f"{self.name}: {self.run_dir / name} was made from an earlier {above} stage "
                        f"({str(recorded)[:12]}), and {above} has "
                        f"been redone since ({str(current.get('fingerprint'))[:12]}), so it is stale; rerun the "
                        f"stages after {above} "
                        f"(`kiln demo` reruns every stale stage in order) before {self.name}"
                    )
                pending.setdefault(above, current)

    def current_manifest(self) -> dict[str, Any] | None:
        """The finished manifest if this stage is up to date, else None (with the reason logged)."""
        path = self.final_dir / MANIFEST
        if not refresh(path):
            return None
        old = load_manifest(path)
        if old is None:
            reason = f"its {MANIFEST} is damaged"
        elif old.get("config_hash") != self.config_hash:
            reason = "the config changed"
        elif old.get("inputs") != self.inputs:
            reason = "an input changed"
        elif old.get("upstream") != self.upstream:
            reason = "an upstream stage was redone"
        elif any(size != o["bytes"] for o, size in zip(old.get("outputs", []), self._output_sizes(old), strict=True)):
            reason = "an output is missing or was modified"
        else:
            refresh(self.final_dir / SUMMARY)
            return old
        self.log.info("%s: redoing because %s", self.name, reason)
        return None

    def _output_sizes(self, manifest: Mapping[str, Any]) -> list[int | None]:
        """The size each output of `manifest` has now (None: missing): on disk, or on the store for a run on one
        (listed once: this machine's mirror need not hold them)."""
        outputs = manifest.get("outputs", [])
        if self.store is not None:
            on_store = storage.objects(self.store + "/")
            return [on_store.get(o["path"], {}).get("bytes") for o in outputs]
        return [(p.stat().st_size if (p := self.final_dir / o["path"]).is_file() else None) for o in outputs]

    def up_to_date(
        self, force: bool, describe: Callable[[dict[str, Any]], str] = lambda m: ""
    ) -> dict[str, Any] | None:
        """The finished manifest when there is nothing to do (logged with `describe(manifest)`), else None."""
        if force or (done := self.current_manifest()) is None:
            return None
        TRAFFIC_MARK[0] = traffic_since()  # what deciding cost is not the next stage's
        what = describe(done)
        self.log.info("%s: up to date%s; nothing to do. Use --force to redo.", self.name, f" ({what})" if what else "")
        return done

    def refuse_to_replace(self, files: Iterable[str], why: str, force: bool) -> None:
        """Stop before work when the finished or partial folder holds any of `files` (e.g. checkpoints)
        that this run would not carry on from; with `force`, move those folders aside instead."""
        held = [d for d in (self.final_dir, self.partial_dir) if any(self._holds(d, f) for f in files)]
        if not held:
            return
        if not force:
            raise FatalError(
                f"{self.name}: {shown(held[0])} holds {why}; pass --force to move it aside (kept as "
                f"{self.final_dir.name}.old-<time>/) and start over"
            )
        for d in held:
            self.set_aside(d, "--force")

    def _holds(self, folder: Path, name: str) -> bool:
        """Whether the folder holds `name` (a file or a folder): on disk, or on the store for a run on one."""
        if (folder / name).exists():
            return True
        url = url_of(folder)
        return url is not None and any(rel == name or rel.startswith(name + "/") for rel in storage.objects(url + "/"))

    def set_aside(self, folder: Path, why: str) -> Path:
        """Rename the finished or partial folder to `<stage>.old-<time>[-partial]/` (kept, never
        deleted) under the stage's lock, logging where it went and why; returns the new path. For a run
        on a store the objects move there too (copied within the store, then removed), so the earlier
        result is kept where every machine finds it, not only in this machine's mirror."""
        self.lock()  # subtle: a live run's folder is never moved: its holder's lock stops us first
        stamp = time.strftime("%Y%m%d-%H%M%S")
        suffix = "-partial" if folder == self.partial_dir else ""
        aside = folder.with_name(f"{self.final_dir.name}.old-{stamp}{suffix}")
        n = 1
        while aside.exists() or (url_of(aside) is not None and storage.objects(f"{url_of(aside)}/")):
            n += 1  # two set aside within one second
            aside = folder.with_name(f"{self.final_dir.name}.old-{stamp}-{n}{suffix}")
        if folder.exists():
            folder.rename(aside)
        move(folder, aside, MANIFEST)
        self.log.warning("%s: moved %s aside to %s (%s); it is kept", self.name, shown(folder), shown(aside), why)
        return aside

    def _identity(self) -> dict[str, Any]:
        return {"config_hash": self.config_hash, "inputs": self.inputs, "upstream": self.upstream}

    def partial_matches(self) -> bool:
        """Whether `<stage>.partial/` holds an interrupted attempt with this config, inputs and upstream."""
        return (self.partial_dir / IN_PROGRESS).is_file() and not self.partial_changes()

    def partial_changes(self) -> list[str]:
        """What differs between the interrupted attempt in `<stage>.partial/` and this one: each
        changed setting (`train.optim.lr: 0.003 -> 0.001`), a changed input, a redone upstream
        stage; empty when they match, or when there is no interrupted attempt."""
        marker = self.partial_dir / IN_PROGRESS
        if not marker.is_file():
            return []
        try:
            found = json.loads(marker.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            found = None
        if not isinstance(found, dict):
            return [f"its record {shown(marker)} is damaged"]
        return self._changes(found)

    def finished_changes(self) -> list[str]:
        """What differs between the finished outputs in `<stage>/` and this attempt, as partial_changes says it."""
        old = read_manifest(self.final_dir)
        settings = {}
        for key, dump in old.get("config", {}).items():  # the manifest keeps whole sections: drop what is not hashed
            section = self.config.get(key)
            skipped = section.NOT_HASHED if section is not None else frozenset()
            settings[key] = _without_none({k: v for k, v in dump.items() if k not in skipped})
        return self._changes({**old, "settings": settings})

    def _changes(self, old: Mapping[str, Any]) -> list[str]:
        if {k: old.get(k) for k in self._identity()} == self._identity():
            return []
        changes = changed_settings(old["settings"], hashed_settings(self.config)) if "settings" in old else []
        if not changes and old.get("config_hash") != self.config_hash:
            changes.append("the settings (or the kiln version) changed")
        old_inputs = {i["path"]: i for i in old.get("inputs", [])}
        changes += [f"input {i['path']} changed" for i in self.inputs if old_inputs.get(i["path"]) != i]
        changes += [f"input {path} is no longer used" for path in old_inputs.keys() - {i["path"] for i in self.inputs}]
        changes += [
            f"upstream stage {u} was redone" for u, f in self.upstream.items() if old.get("upstream", {}).get(u) != f
        ]
        return changes

    def begin(self, resume: bool = False) -> bool:
        """Take the stage's lock and start building in `<stage>.partial/`: empty, or with `resume`,
        keeping the work of an interrupted attempt with the same config, inputs and upstream (its
        finished tasks left completion markers). Returns whether earlier work was kept."""
        for d in (self.final_dir, self.partial_dir):
            check_owned(d)
        self.lock()
        marker = self.partial_dir / IN_PROGRESS
        if self.store is not None:
            refresh(marker)  # the store's unfinished attempt, if any, is the one a resume continues
        kept = resume and self.partial_matches()
        if not kept:
            if self.partial_dir.exists():
                shutil.rmtree(self.partial_dir)  # an unfinished attempt of this stage: never a finished output
            self.partial_dir.mkdir(parents=True)
            marker.write_text(json.dumps({**self._identity(), "settings": hashed_settings(self.config)}))
            clear(self.partial_dir, IN_PROGRESS)  # a run on a store: the abandoned attempt's objects there
            push_files(self.partial_dir, [marker])
        else:
            self.log.info("%s: resuming the interrupted attempt in %s", self.name, self.partial_dir)
        self.dir = self.partial_dir
        self._t0, self._cpu0 = time.perf_counter(), _cpu_seconds()
        return kept

    def finish(
        self,
        outputs: Iterable[Path],
        counts: Mapping[str, Any],
        summary: str,
        extra: Mapping[str, Any] | None = None,
        logs: Iterable[Path] = (),
        known: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Write manifest.json last, then swap the partial folder in for the finished one.

        `logs` (e.g. per-step metrics with timings) are listed but are not results: they stay out
        of the fingerprint, so they never force downstream redos. `known`: the size and sha256 of
        outputs (by path in the stage) that tasks on other machines wrote to the store and this
        machine may not hold (taken as given: the task that wrote each one hashed it)."""
        manifest = {
            "format": FORMAT,
            "stage": self.name,
            "config": {k: v.model_dump(mode="json") for k, v in self.config.items()},
            "config_hash": self.config_hash,
            "inputs": self.inputs,
            "upstream": self.upstream,
            "outputs": describe_files(outputs, root=self.dir, known=known),
            "logs": describe_files(logs, root=self.dir),
            "counts": dict(counts),
            "wall_seconds": round(time.perf_counter() - self._t0, 3),
            "cpu_seconds": round(_cpu_seconds() - self._cpu0, 3),
            "versions": versions(),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(extra or {}),
        }
        manifest["fingerprint"] = fingerprint(manifest)
        if traffic := {s: c for s, c in traffic_since(self._traffic0).items() if any(c.values())}:
            manifest["store_traffic"] = traffic  # beside the identity, like the timings
            summary = "\n".join([summary.rstrip(), *describe_traffic(traffic)])
        (self.dir / SUMMARY).write_text(summary.rstrip() + "\n")
        (self.dir / IN_PROGRESS).unlink(missing_ok=True)
        # the manifest appears only once everything else is written
        write_atomically(self.dir / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=2) + "\n"))
        if self.store_lock is not None:
            self.store_lock.guard()
        self._swap_in()
        publish(self.final_dir, manifest, MANIFEST, self.partial_dir)
        clear(self.partial_dir, IN_PROGRESS)
        TRAFFIC_MARK[0] = traffic_since()  # publishing is this stage's (not in its manifest, written before it)
        self._unlock()
        self.log.info("%s: done in %.1fs\n%s", self.name, manifest["wall_seconds"], summary.rstrip())
        return manifest

    def _swap_in(self) -> None:
        """The finished folder becomes `<stage>.old`, the partial one takes its name, then the old one goes.
        A crash between the renames leaves both complete folders on disk, never neither."""
        old = self.final_dir.with_name(self.final_dir.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        if self.final_dir.exists():
            self.final_dir.rename(old)
        self.partial_dir.rename(self.final_dir)
        if old.exists():
            shutil.rmtree(old)
        self.dir = self.final_dir

    def lock(self) -> None:
        """Hold `<stage>.lock` (host, pid) until finish(), and for a run on a store the lock object beside the
        stage there; a no-op when this process holds them already. Stops with the holder's name when another
        live process holds one."""
        self._lock_here()
        if self.store is not None:
            self.store_lock = StoreLock.take(self.store + ".lock", self.name)

    def _lock_here(self) -> None:
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            # Under Slurm, which run of which job: a requeued job may start on another node.
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "slurm_restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
        }
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                holder = _read_lock(self.lock_path)
                if holder is None:
                    continue  # released (or half-written) between our two calls: try again
                if holder.get("host") == me["host"] and holder.get("pid") == me["pid"]:
                    return  # ours: taken earlier in this command (or by this process's earlier attempt)
                if me["slurm_job"] and holder.get("slurm_job") == me["slurm_job"]:
                    if holder.get("slurm_restart", 0) < me["slurm_restart"]:
                        # Slurm ended that run of this job before requeueing it, on whichever node it ran.
                        self.log.warning(
                            "%s: taking over %s left by Slurm job %s before its requeue (pid %s on %s)",
                            self.name,
                            self.lock_path,
                            me["slurm_job"],
                            holder.get("pid"),
                            holder.get("host"),
                        )
                        self.lock_path.unlink(missing_ok=True)
                        continue
                if holder.get("host") != me["host"] or process_alive(holder.get("pid")):
                    raise FatalError(
                        f"{self.name}: {self.final_dir} is being built by pid {holder.get('pid')} on "
                        f"{holder.get('host')} since {holder.get('since')}; "
                        f"wait for it to finish, or if that process is gone, delete {self.lock_path}"
                    ) from None
                # A dead process on this host left it.
                self.log.warning(
                    "%s: taking over %s left by pid %s, which is no longer running",
                    self.name,
                    self.lock_path,
                    holder.get("pid"),
                )
                self.lock_path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            return

    def _unlock(self) -> None:
        self.lock_path.unlink(missing_ok=True)
        if self.store_lock is not None:
            self.store_lock.release()
            self.store_lock = None


def _without_none(value: Any) -> Any:
    """A JSON tree without the keys whose value is None (as hashed_settings leaves them out)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def check_owned(folder: Path) -> None:
    """Refuse to touch a non-empty folder that kiln did not write (no manifest, no in-progress marker). A
    folder of a mirror is this machine's copy of a store's, never the user's: one the store no longer
    backs (its prefix was emptied, or it is another server's) is a stale copy, removed."""
    if (
        folder.is_dir()
        and any(folder.iterdir())
        and not (folder / MANIFEST).is_file()
        and not (folder / IN_PROGRESS).is_file()
    ):
        if url_of(folder) is not None:
            log.info("%s: this machine's copy is not on the store any more; removed from the mirror", shown(folder))
            shutil.rmtree(folder)
            return
        raise FatalError(
            f"{folder} exists but kiln did not write it (no {MANIFEST} or {IN_PROGRESS}); move it elsewhere or "
            "choose another run name (--set name=...)"
        )


def _read_lock(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return {}  # a lock whose writer died mid-write: no live holder to name
