"""The records a plan is made of: a unit (one file, file slice or built-in document) and a task.

Both are frozen, picklable and small, so a plan travels to worker processes or Ray workers
cheaply. Not handled here: making a plan (plan.py) or reading one (read.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.curate.audit import printable
from kiln.curate.readers.config import InputConfig


@dataclass(frozen=True)
class ReadUnit:
    """One file to read (or one slice of one), or one built-in document.

    `name` is `<source>/<path relative to the input's root>`: the id of a one-document file and
    the stem of the ids of the records in a container. `source` is the planned source (the
    input's, else the folder's); a record's own source field may override it when reading.
    """

    path: str
    name: str
    source: str
    format: str  # resolved: never "auto"
    size: int  # bytes on disk (compressed for .gz/.zst); what the input cap counts

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", printable(self.name))

    @property
    def shown_path(self) -> str:
        """`path` as the metadata and the quarantine write it (printable, see printable)."""
        return printable(self.path)

    key: str | None = None  # pydoc_topics: the topic inside the module file; gettext_messages: <locale>:<document>
    row_groups: tuple[int, ...] | None = None  # parquet: the row groups to read; None: all
    first_row: int = 0  # parquet: index in the file of the first row of row_groups[0]
    max_bytes: int | None = None  # the input cap's budget: stop a container after about this many bytes on disk


@dataclass(frozen=True)
class ReadTask:
    index: int  # position in the plan; output shards are named by it, so plans never depend on the worker count
    input_index: int  # which entry of the inputs tuple
    input: InputConfig
    units: tuple[ReadUnit, ...]
    size: int  # bytes on disk the task reads (for progress bars and the cap)


def task_paths(task: ReadTask) -> list[str]:
    """The files (or a store's objects, by URL) the task reads, each once, in order (the stage records them)."""
    return list(dict.fromkeys(u.path for u in task.units))
