"""Readers: turning raw input (JSONL, Parquet, text and HTML files, WARC, the built-in corpus)
into a deterministic plan of read tasks, and each task into a stream of Documents.

The stage calls `plan_reads` once in the main process, then `read_task` in workers, and
hashes `task_paths` for its manifest. Readers stream: memory follows one record (bounded by
`ReadLimits`), never a file. Not handled here: anything after reading (steps, shards).
"""

from kiln.curate.readers.config import InputConfig, detect_format
from kiln.curate.readers.intake import ReadLimits
from kiln.curate.readers.plan import CAP_SEED, plan_reads
from kiln.curate.readers.read import read_task
from kiln.curate.readers.task import ReadTask, ReadUnit, task_paths

__all__ = [
    "CAP_SEED",
    "InputConfig",
    "ReadLimits",
    "ReadTask",
    "ReadUnit",
    "detect_format",
    "plan_reads",
    "read_task",
    "task_paths",
]
