"""Shared helpers for the reader tests: read whole inputs through plan_reads and read_task."""

from __future__ import annotations

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.readers import InputConfig, ReadLimits, plan_reads, read_task


def read_inputs(
    *inputs: InputConfig, limits: ReadLimits | None = None, cap: int | None = None, shard_bytes: int = 10**9
) -> tuple[list[Document], Ledger]:
    """Every document the inputs yield, and the ledger, after checking the accounting balances."""
    ledger, docs = Ledger(), []
    for task in plan_reads(tuple(inputs), cap, shard_bytes):
        for doc in read_task(task, limits or ReadLimits(), ledger):
            docs.append(doc)
            ledger.seen(doc.source, len(doc.text.encode("utf-8")))  # what the stage does for each document it receives
            ledger.kept(doc)
    ledger.check_balanced("reader test")
    return docs, ledger


def errors(ledger: Ledger) -> list[str]:
    return [q["error"] for q in ledger.quarantined]
