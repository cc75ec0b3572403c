"""`kiln eval --data`: any text, JSONL or Parquet file read as curate reads its inputs.

The eval stage scores files it cannot read itself (evaluate never imports curate), so
kiln.stages hands it this reader: the format from the file's extension, the source from each
record's `source` field, a record that cannot be read reported, not raised.
Not handled here: scoring (kiln.evaluate.run), curate's filters (an eval file is scored as it is).
"""

from __future__ import annotations

from pathlib import Path


def read_for_eval(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """A file's documents as curate reads them, (source, text) each, and a line per record that
    could not be read (kiln.evaluate.run.ReadFile)."""
    from kiln.curate.audit import Ledger
    from kiln.curate.readers import InputConfig, ReadLimits, plan_reads, read_task

    ledger = Ledger()
    tasks = plan_reads((InputConfig(path=str(path)),), None, 1 << 40)  # one task: the file whole
    docs = [(d.source, d.text) for task in tasks for d in read_task(task, ReadLimits(), ledger)]
    unread = [
        f"{q.get('file') or path}:{q.get('position') or '?'}: {q.get('error') or 'unreadable'}"
        for q in ledger.quarantined
    ]
    return docs, unread
