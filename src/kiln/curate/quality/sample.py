"""Where the quality models' text comes from: the reference text and a sample of the raw corpus.

The reference is either separate inputs (`quality.reference`) or one source of curate.inputs
(`quality.reference_source`); the raw corpus is curate.inputs without that source. A sample is
whole read tasks (pieces of about PIECE_MB) taken in a seeded order until their size on disk
covers the budget, so the files a model was trained on are known before reading (the stage's
manifest hashes them) and a big corpus is not read whole. Documents are normalized as curate's
first step normalizes them, so the models see text in the form the filters will score, and code
documents are left out: the filters run in the prose branch only, so neither the models nor the
percentile cutoffs should learn from code. The sample is not passed through curate's other
prose steps (line edits, heuristic filters), so the fraction a filter keeps of curated text
differs from its nominal fraction of the raw sample.
Not handled here: the curate filters that apply the models (kiln.curate.steps.quality).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass

from tqdm import tqdm

from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.quality.config import QualityConfig
from kiln.curate.readers import InputConfig, ReadLimits, ReadTask, plan_reads, read_task, task_paths
from kiln.curate.steps.normalize import Normalize
from kiln.text.code import doc_is_code

log = logging.getLogger("kiln.curate.quality")

MB = 1_000_000
PIECE_MB = 4.0  # read-task size for sampling: a budget of 32 MB draws from at least 8 places


@dataclass(frozen=True)
class Selection:
    """What to read for one purpose: the planned tasks in sampling order, and a source to keep
    (`only`) or to leave out (`without`) when sources are known only from the records."""

    tasks: tuple[ReadTask, ...]
    only: str | None = None
    without: str | None = None

    @property
    def paths(self) -> set[str]:
        return {p for t in self.tasks for p in task_paths(t)}

    def wants(self, doc: Document) -> bool:
        return (self.only is None or doc.source == self.only) and (self.without is None or doc.source != self.without)


def reference_and_corpus(
    quality: QualityConfig, curate: CurateConfig
) -> tuple[tuple[InputConfig, ...], str | None, tuple[InputConfig, ...], str | None]:
    """(reference inputs, reference source to keep, corpus inputs, source to leave out of the corpus)."""
    if quality.reference:
        return quality.reference, None, curate.inputs, None
    name = quality.reference_source
    if name is None:
        raise ConfigError(
            "quality: no reference text; set quality.reference_source (a source of curate.inputs, e.g. wiki) or "
            "quality.reference (inputs, like curate.inputs)"
        )
    named = [i for i in curate.inputs if i.source == name]
    unnamed = [i for i in curate.inputs if i.source is None]  # their records name their sources
    if not named and not unnamed:
        sources = sorted({i.source for i in curate.inputs if i.source})
        raise ConfigError(
            f"quality.reference_source={name!r} is not a source of curate.inputs (sources: {', '.join(sources)}); "
            "name one of them or set quality.reference"
        )
    reference = tuple(named + unnamed)
    corpus = tuple(i for i in curate.inputs if i.source != name)
    if not corpus:
        raise ConfigError(
            f"quality: curate.inputs has no source other than the reference {name!r}, so there is no raw corpus "
            "to compare it with"
        )
    return reference, name, corpus, name


def select(
    inputs: tuple[InputConfig, ...], budget_mb: float, seed: int, only: str | None = None, without: str | None = None
) -> Selection:
    """Tasks of `inputs` in a seeded order, as many as cover `budget_mb` on disk."""
    tasks = plan_reads(inputs, None, int(PIECE_MB * MB))
    order = random.Random(seed).sample(tasks, len(tasks))
    chosen, size = [], 0
    for task in order:
        if size >= budget_mb * MB:
            break
        chosen.append(task)
        size += task.size
    return Selection(tuple(chosen), only, without)


def read_selection(selection: Selection, budget_mb: float, curate: CurateConfig, desc: str) -> list[Document]:
    """The selection's normalized prose documents, in sampling order, until `budget_mb` of text."""
    limits = ReadLimits(max_doc_bytes=int(curate.max_doc_mb * MB), extract_timeout_s=curate.extract_timeout_s)
    ledger, normalize = Ledger(0), Normalize()
    code = 0

    def prose() -> Iterator[Document]:
        nonlocal code
        for task in selection.tasks:
            for raw in read_task(task, limits, ledger):
                if selection.wants(raw):
                    if doc_is_code(raw, task.input.code):
                        code += 1
                    else:
                        yield from normalize.process((raw,), ledger)

    docs, used = [], 0
    with tqdm(total=int(budget_mb * MB), desc=desc, unit="B", unit_scale=True, dynamic_ncols=True, leave=False) as bar:
        for doc in prose():
            nbytes = len(doc.text.encode("utf-8", "surrogatepass"))
            docs.append(doc)
            used += nbytes
            bar.update(nbytes)
            if used >= budget_mb * MB:
                break
    if code:
        log.info("%s: %d code documents left out (the quality filters score prose only)", desc, code)
    return docs
