"""Stage bookkeeping: skip-or-redo, and the manifest.json every stage finishes with.

A stage is current when its manifest records the same config hash, the same inputs (size and
sha256), the same upstream fingerprints, and its outputs are still there with their recorded
sizes. Then running it again does nothing; `force` or any change redoes it from an empty stage
directory. The config hash covers the kiln version and every field that can change results
(not a section's NOT_HASHED speed settings).

A manifest's `fingerprint` is the sha256 of what identifies its result: config hash, inputs,
upstream fingerprints and outputs, not timings. Downstream stages record it, so a model traces
back to the exact data and rules that made it, and a redone stage whose outputs came out
byte-identical does not force its downstream stages to redo.
Not handled here: remote filesystems (paths are local for now).
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import resource
import shutil
import time
from collections.abc import Collection, Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from kiln import __version__
from kiln.core.atomic import write_atomically
from kiln.core.config import Section
from kiln.core.errors import FatalError

MANIFEST = "manifest.json"
IN_PROGRESS = "in_progress.json"  # what an unfinished attempt was doing; resume keeps its work only if it matches
FORMAT = "kiln-manifest v1"
log = logging.getLogger("kiln.core")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def config_hash(config: Mapping[str, Section]) -> str:
    sections = {k: v.model_dump(mode="json", exclude=set(v.NOT_HASHED)) for k, v in config.items()}
    canonical = json.dumps({"kiln": __version__, "sections": sections}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


IDENTITY = ("config_hash", "inputs", "upstream", "outputs")


def fingerprint(manifest: Mapping[str, Any]) -> str:
    canonical = json.dumps({k: manifest[k] for k in IDENTITY}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def describe_files(paths: Iterable[Path], root: Path | None = None) -> list[dict[str, Any]]:
    out = []
    for p in sorted(Path(p) for p in paths):
        name = str(p.relative_to(root)) if root is not None else str(p)
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
    path = stage_dir / MANIFEST
    if not path.is_file():
        raise FatalError(f"{stage_dir}: no {MANIFEST}; run that stage first (or `kiln demo`)")
    return json.loads(path.read_text())


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Stage:
    """One stage of one run: `runs/<name>/<stage>/`."""

    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Section], inputs: Collection[Path], upstream: Iterable[str] = ()):
        self.run_dir = Path(run_dir)
        self.name = name
        self.dir = self.run_dir / name
        self.config = dict(config)
        # Upstream first: a missing upstream stage explains a missing input better than the input does.
        # .get: a manifest written before fingerprints existed matches nothing, so this stage redoes.
        self.upstream = {u: read_manifest(self.run_dir / u).get("fingerprint") for u in upstream}
        missing = sorted(str(p) for p in inputs if not Path(p).is_file())
        if missing:
            raise FatalError(f"{name}: input files missing: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; rerun the stage that makes them with --force")
        self.inputs = describe_files(inputs)
        self.config_hash = config_hash(self.config)
        self.log = logging.getLogger(f"kiln.{name}")
        self._t0 = self._cpu0 = 0.0

    def current_manifest(self) -> dict[str, Any] | None:
        """The finished manifest if this stage is up to date, else None (with the reason logged)."""
        path = self.dir / MANIFEST
        if not path.is_file():
            return None
        old = json.loads(path.read_text())
        if old.get("config_hash") != self.config_hash:
            reason = "the config changed"
        elif old.get("inputs") != self.inputs:
            reason = "an input changed"
        elif old.get("upstream") != self.upstream:
            reason = "an upstream stage was redone"
        elif any(not (self.dir / o["path"]).is_file() or (self.dir / o["path"]).stat().st_size != o["bytes"] for o in old.get("outputs", [])):
            reason = "an output is missing or was modified"
        else:
            return old
        self.log.info("%s: redoing because %s", self.name, reason)
        return None

    def begin(self, resume: bool = False) -> bool:
        """Start from an empty stage directory, or with `resume`, keep the work of an interrupted
        attempt with the same config, inputs and upstream (its finished tasks left completion
        markers). Returns whether earlier work was kept."""
        identity = {"config_hash": self.config_hash, "inputs": self.inputs, "upstream": self.upstream}
        marker = self.dir / IN_PROGRESS
        kept = resume and marker.is_file() and not (self.dir / MANIFEST).exists() and json.loads(marker.read_text()) == identity
        if not kept:
            if self.dir.exists():
                shutil.rmtree(self.dir)
            self.dir.mkdir(parents=True)
            marker.write_text(json.dumps(identity))
        else:
            self.log.info("%s: resuming the interrupted attempt in %s", self.name, self.dir)
        self._t0, self._cpu0 = time.perf_counter(), _cpu_seconds()
        return kept

    def finish(self, outputs: Iterable[Path], counts: Mapping[str, Any], summary: str, extra: Mapping[str, Any] | None = None, logs: Iterable[Path] = ()) -> dict[str, Any]:
        """Write manifest.json last. `logs` (e.g. per-step metrics with timings) are listed but are
        not results: they stay out of the fingerprint, so they never force downstream redos."""
        manifest = {
            "format": FORMAT,
            "stage": self.name,
            "config": {k: v.model_dump(mode="json") for k, v in self.config.items()},
            "config_hash": self.config_hash,
            "inputs": self.inputs,
            "upstream": self.upstream,
            "outputs": describe_files(outputs, root=self.dir),
            "logs": describe_files(logs, root=self.dir),
            "counts": dict(counts),
            "wall_seconds": round(time.perf_counter() - self._t0, 3),
            "cpu_seconds": round(_cpu_seconds() - self._cpu0, 3),
            "versions": versions(),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(extra or {}),
        }
        manifest["fingerprint"] = fingerprint(manifest)
        (self.dir / "summary.txt").write_text(summary.rstrip() + "\n")
        # the manifest appears only once everything else is written
        write_atomically(self.dir / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=2) + "\n"))
        (self.dir / IN_PROGRESS).unlink(missing_ok=True)
        self.log.info("%s: done in %.1fs\n%s", self.name, manifest["wall_seconds"], summary.rstrip())
        return manifest
