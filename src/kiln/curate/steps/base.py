"""What every curation step is: a name, `process(docs, ledger)`, and for filters `check(doc)`.

A step yields the documents it keeps (possibly edited: PII redaction, line removal) and records
each document it drops in the ledger with a reason `<step>:<rule>`, the measured value and the
threshold. The ledger is passed in rather than held, so a step object has no per-shard state
and can be rebuilt in any worker. A filter implements only `check`, returning None to keep or a
`Drop` naming the failed rule. A step may also have `prepare(docs)`: given a group of documents
before their `process` calls, it computes what it can in one pass (the model filters score the
group in one model call) into each document's `cache`, never into the step. Not handled here: which steps run on which
documents (code or
prose) and in what order (kiln.curate.steps.chain builds the chain).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kiln.core.document import Document

if TYPE_CHECKING:
    from kiln.curate.audit import Ledger


@dataclass(frozen=True)
class Drop:
    """Why a filter drops a document: the rule (`mean_word_length`), what it measured, the limit,
    and for what numbers cannot say, a note (`detected de; allowed en`)."""

    rule: str
    value: float | None = None
    threshold: float | None = None
    note: str | None = None


class Step(Protocol):
    name: str

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]: ...


class Filter:
    """Base for steps that only decide keep or drop; subclasses set `name` and implement `check`."""

    name = "filter"

    def check(self, doc: Document) -> Drop | None:
        raise NotImplementedError

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            drop = self.check(doc)
            if drop is None:
                yield doc
            else:
                ledger.remove(doc, self.name, drop.rule, drop.value, drop.threshold, note=drop.note)
