"""Planning reads: list every input's units, apply the byte cap fairly, cut tasks of ~shard_bytes.

Planning only lists files, sizes and Parquet footers, in the main process; reading happens in
tasks. A plan depends on the inputs, the cap and shard_bytes, never on the worker count, so
task indices can name output shards. How tasks are cut:
- one-document units (text and HTML files, built-in documents): consecutive units of one input
  and one source, sorted by id, up to shard_bytes per task (a bigger unit stands alone);
- Parquet: one task per run of row groups up to shard_bytes (row groups are never split);
- JSONL and WARC: one task per file (a compressed stream has no seekable line or record
  boundaries, and line numbers in ids need the file read from its start).
Planned paths are absolute and resolved, so a worker on another machine or in another folder
(Ray) reads the same files; ids stay relative to each input's root. A file named by two inputs
is read once, by the first (logged). An input whose path matches no file is an error (a typo
would silently drop a source), except the built-in corpus, which is skipped with a warning on
machines that lack it. Not handled here: reading (read.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import xxhash

from kiln.core.errors import FatalError
from kiln.core.storage import is_url, listing, open_read
from kiln.curate.readers.builtin import list_builtin
from kiln.curate.readers.config import BUILTIN_FORMATS, CONTAINER_FORMATS, InputConfig, detect_format, sanitize_source
from kiln.curate.readers.files import file_format, folder_source, list_files
from kiln.curate.readers.task import ReadTask, ReadUnit

log = logging.getLogger("kiln.curate")

CAP_SEED = 0x6B696C6E  # "kiln"; any seed but kiln.core.split's 0 works


def list_units(cfg: InputConfig) -> list[ReadUnit]:
    """All units of one input ([] when it names nothing; plan_reads decides what that means).

    Each unit's path is absolute and resolved; its name (the id stem) is relative to the root.
    """
    if cfg.format in BUILTIN_FORMATS:
        return list_builtin(cfg)
    if is_url(cfg.path):
        return store_units(cfg)
    root, files = list_files(cfg)
    units = []
    for path in files:
        source = cfg.source or folder_source(path)
        try:
            size = path.stat().st_size
        except OSError:  # gone or unreadable since it was listed: its task quarantines it
            size = 0
        units.append(
            ReadUnit(
                str(path.resolve()),
                f"{source}/{path.relative_to(root).as_posix()}",
                source,
                file_format(cfg, path),
                size,
            )
        )
    return units


def store_units(cfg: InputConfig) -> list[ReadUnit]:
    """All units of an input in an object store; ids are relative to the prefix before the first
    wildcard (the object's own prefix for one object), as for local files."""
    assert cfg.path is not None
    objects = listing(cfg.path)
    glob = next((i for i, c in enumerate(cfg.path) if c in "*?["), None)
    one = [u for u, _ in objects] == [cfg.path]
    if glob is not None:
        root = cfg.path[:glob].rsplit("/", 1)[0]
    else:
        root = cfg.path.rsplit("/", 1)[0] if one else cfg.path.rstrip("/")
    units = []
    for url, size in objects:
        if glob is None and not one and cfg.format not in ("auto", "text", detect_format(url)):
            continue  # a prefix with an explicit format: that format's objects only, as for a folder
        source = cfg.source or sanitize_source(url.rsplit("/", 2)[-2])
        name = url.removeprefix(root).lstrip("/")
        units.append(ReadUnit(url, f"{source}/{name}", source, file_format(cfg, Path(name)), size))
    return units


def plan_reads(inputs: tuple[InputConfig, ...], max_total_bytes: int | None, shard_bytes: int) -> list[ReadTask]:
    """The read tasks for these inputs, at most about max_total_bytes on disk (None: no cap).

    Raises FatalError when a file input's path matches no file.
    """
    listed = [list_units(cfg) for cfg in inputs]
    for index, (cfg, units) in enumerate(zip(inputs, listed)):
        if not units and cfg.format not in BUILTIN_FORMATS:
            raise FatalError(
                f"curate.inputs[{index}].path: {cfg.path!r} matches no file (format {cfg.format}), so it has no "
                "input documents; "
                "check the path or glob (relative paths start from the folder kiln runs in), or remove the input"
            )
    listed = drop_repeats(inputs, listed)
    chosen = listed if max_total_bytes is None else apply_cap(listed, max_total_bytes)
    tasks: list[ReadTask] = []
    for input_index, units in enumerate(chosen):
        for group in cut_tasks(sorted(units, key=lambda u: (u.source, u.name)), shard_bytes):
            tasks.append(
                ReadTask(len(tasks), input_index, inputs[input_index], tuple(group), sum(u.size for u in group))
            )
    return tasks


def drop_repeats(inputs: tuple[InputConfig, ...], listed: list[list[ReadUnit]]) -> list[list[ReadUnit]]:
    """Each file (and built-in document) once: overlapping inputs leave it to the first that names it."""
    planned: set[tuple[str, str | None]] = set()
    kept_lists = []
    for index, units in enumerate(listed):
        kept = []
        for unit in units:
            key = (unit.path, unit.key)  # pydoc topics share one file; the key tells them apart
            if key not in planned:
                planned.add(key)
                kept.append(unit)
        if len(kept) < len(units):
            log.warning(
                (
                    "input %d (%s): %d of its %d files are already planned (by an earlier input, or twice through "
                    "links); each is read once"
                ),
                index,
                inputs[index].path or inputs[index].format,
                len(units) - len(kept),
                len(units),
            )
        kept_lists.append(kept)
    return kept_lists


def apply_cap(listed: list[list[ReadUnit]], max_total_bytes: int) -> list[list[ReadUnit]]:
    """Choose units under the byte cap, shared fairly: a small source leaves its share to the rest.

    Within a source the cap keeps a pseudo-random but fixed subset (ordered by a hash of the
    unit's name), so a small cap still samples the whole source rather than its alphabetical
    start. A unit that does not fit is skipped, except a container (JSONL, Parquet, WARC): it
    takes what is left of the share and is read only that far (a prefix, fixed for the file).
    subtle: the hash is seeded differently from kiln.core.split's; with the same hash the kept
    documents would be exactly those with the smallest split scores, and a capped source would
    send far more than its validation fraction to validation.
    """
    by_source: dict[str, list[tuple[int, ReadUnit]]] = {}
    for input_index, units in enumerate(listed):
        for unit in units:
            by_source.setdefault(unit.source, []).append((input_index, unit))
    sizes = {s: sum(u.size for _, u in units) for s, units in by_source.items()}
    budget, shares = max_total_bytes, {}
    for rank, source in enumerate(sorted(sizes, key=lambda s: sizes[s])):  # water-filling, smallest first
        shares[source] = min(sizes[source], budget // (len(sizes) - rank))
        budget -= shares[source]
    chosen: list[list[ReadUnit]] = [[] for _ in listed]
    for source, units in by_source.items():
        used = 0
        for input_index, unit in sorted(
            units, key=lambda item: xxhash.xxh3_64_intdigest(item[1].name.encode(), seed=CAP_SEED)
        ):
            if used + unit.size <= shares[source]:
                chosen[input_index].append(unit)
                used += unit.size
            elif unit.format in CONTAINER_FORMATS and used < shares[source]:
                left = shares[source] - used
                chosen[input_index].append(replace(unit, max_bytes=left, size=left))
                used = shares[source]
    return chosen


def cut_tasks(units: list[ReadUnit], shard_bytes: int) -> list[list[ReadUnit]]:
    """Group one input's sorted units into tasks (see the module docstring)."""
    groups: list[list[ReadUnit]] = []
    size = 0
    open_group = False  # whether groups[-1] takes more one-document units
    for unit in units:
        if unit.format in CONTAINER_FORMATS:
            parts = split_parquet(unit, shard_bytes) if unit.format == "parquet" else [unit]
            groups.extend([part] for part in parts)
            open_group = False
            continue
        if not open_group or groups[-1][0].source != unit.source or size + unit.size > shard_bytes:
            groups.append([])
            size = 0
            open_group = True
        groups[-1].append(unit)
        size += unit.size
    return groups


def split_parquet(unit: ReadUnit, shard_bytes: int) -> list[ReadUnit]:
    """One unit per run of row groups of up to shard_bytes compressed (a bigger group alone).

    A file whose footer cannot be read stays one unit; reading it then quarantines it.
    """
    import pyarrow.parquet as pq

    try:
        with open_read(unit.path) as f:  # from a store: the footer's ranges only
            meta = pq.read_metadata(f)
    except Exception as e:  # noqa: BLE001 - any unreadable footer: reported once, by the task that reads it
        log.warning(
            "input %s: cannot read the Parquet footer of %s (%s); it will be quarantined", unit.source, unit.path, e
        )
        return [unit]
    parts: list[ReadUnit] = []
    first_row, taken = 0, 0
    run: list[int] = []
    run_size = run_first_row = 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        size = sum(group.column(j).total_compressed_size for j in range(group.num_columns))
        if unit.max_bytes is not None and taken + size > unit.max_bytes:
            break  # the cap's budget: a prefix of whole row groups
        if run and run_size + size > shard_bytes:
            parts.append(replace(unit, row_groups=tuple(run), first_row=run_first_row, size=run_size, max_bytes=None))
            run, run_size = [], 0
        if not run:
            run_first_row = first_row
        run.append(i)
        run_size += size
        taken += size
        first_row += group.num_rows
    if run:
        parts.append(replace(unit, row_groups=tuple(run), first_row=run_first_row, size=run_size, max_bytes=None))
    return parts
