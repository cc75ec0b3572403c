"""The chain of document steps: which steps run, in what order, on which documents.

Steps run in two phases around the global line count (see kiln.curate.phases):
- early (while reading): normalize, URL filter;
- late (after the line count), one branch per kind of document:
  prose: boilerplate lines, language ID, Gopher repetition, Gopher quality, bad words, C4, FineWeb, the model
  filters (perplexity, quality classifier; off by default), classifiers trained on labels, PII, length, decontamination;
  code: the code rules, PII, length, decontamination.
Exact dedup, then MinHash near-dedup, run last, across all shards.
This is FineWeb's order (URL filter, language, Gopher repetition and quality, C4, FineWeb) with
CCNet's line removal before language ID, so a boilerplate banner in another language cannot
decide a page's language. A step whose config says `enabled: false` is left out (decontamination also when it names no
evaluation set, classifiers when they name no model). Decontamination runs before dedup, so every copy of a
contaminated text is reported, and (with action remove) a contaminated copy never becomes the kept one of a
duplicate group; flagged documents go on through dedup like any other.
`run_document` applies a list of steps to one document: a step that raises quarantines that
document with the error, never the run, and every step's output is counted in the funnel under
`<branch>/<step>` (the early steps under their own names). `run_documents` does the same for a
group of documents step by step, so that a step with a `prepare` (the model filters) scores the
whole group in one call before its per-document decisions; the outcome is run_document's.
A source with settings of its own (curate.sources) gets its own step lists: the phases' jobs carry
`SourceSteps`, every document step's section per source (`StepSettings`), never the whole curate
config; the builders take a StepSettings or a CurateConfig alike. A language with settings of its own
(kiln.curate.languages) gets its own instance of each prose step it sets, behind a ByLanguage step.
Not handled here: global work (line counts, exact and near dedup; kiln.curate.phases).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.languages import PER_LANGUAGE_STEPS, ByLanguage
from kiln.curate.steps.bad_words import BadWords, BadWordsConfig
from kiln.curate.steps.base import Step
from kiln.curate.steps.c4 import C4, C4Config
from kiln.curate.steps.code import CodeConfig, CodeQuality
from kiln.curate.steps.decontaminate import Decontaminate, DecontaminateConfig
from kiln.curate.steps.fineweb import FineWebQuality, FineWebQualityConfig
from kiln.curate.steps.gopher import GopherQuality, GopherQualityConfig, GopherRepetition, GopherRepetitionConfig
from kiln.curate.steps.labels import ClassifiersConfig, LabelFilters
from kiln.curate.steps.language import LanguageConfig, LanguageID
from kiln.curate.steps.lines import BoilerplateLines, LineDedupConfig
from kiln.curate.steps.normalize import LengthConfig, LengthFilter, Normalize
from kiln.curate.steps.pii import PIIConfig, RedactPII
from kiln.curate.steps.quality import ClassifierFilter, ClassifierFilterConfig, PerplexityConfig, PerplexityFilter
from kiln.curate.steps.url import URLFilter, URLFilterConfig

log = logging.getLogger("kiln.curate")

# Each branch's steps in order, named by their config section (which is also the step's name).
PROSE_STEPS = (
    "line_dedup",
    "language",
    "gopher_repetition",
    "gopher_quality",
    "bad_words",
    "c4",
    "fineweb",
    "perplexity",
    "quality_classifier",
    "classifiers",
    "pii",
    "length",
    "decontaminate",
)
CODE_STEPS = ("code_quality", "pii", "length", "decontaminate")
BRANCHES = ("prose", "code")
# run_documents' groups: the model filters score a group in one call, which pays their fixed cost
# per call once (kiln.curate.steps.quality.prepare_scores); a group's documents are a few MB in memory
GROUP_DOCS, GROUP_CHARS = 512, 1 << 20
_BUILD: dict[str, Callable[[Section], Step]] = {
    "language": LanguageID,
    "bad_words": BadWords,
    "gopher_repetition": GopherRepetition,
    "gopher_quality": GopherQuality,
    "c4": C4,
    "fineweb": FineWebQuality,
    "code_quality": CodeQuality,
    "pii": RedactPII,
    "length": LengthFilter,
}


@dataclass(frozen=True)
class StepSettings:
    """curate.<step> of every document step, with one source's own keys applied (CurateConfig.for_source):
    what a read or filter job builds its steps from. A CurateConfig has the same attributes."""

    url_filter: URLFilterConfig
    line_dedup: LineDedupConfig
    language: LanguageConfig
    bad_words: BadWordsConfig
    gopher_repetition: GopherRepetitionConfig
    gopher_quality: GopherQualityConfig
    c4: C4Config
    fineweb: FineWebQualityConfig
    perplexity: PerplexityConfig
    quality_classifier: ClassifierFilterConfig
    classifiers: ClassifiersConfig
    code_quality: CodeConfig
    pii: PIIConfig
    length: LengthConfig
    decontaminate: DecontaminateConfig

    @classmethod
    def of(cls, cfg: CurateConfig) -> StepSettings:
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class SourceSteps:
    """Every source's step settings: the sources with settings of their own (curate.sources), and the rest;
    and for each, the settings of every language with its own (curate.languages and kiln's)."""

    default: StepSettings
    own: dict[str, StepSettings]
    languages: dict[str, dict[str, StepSettings]]  # source ("" for the rest) -> language code -> settings

    @classmethod
    def of(cls, cfg: CurateConfig) -> SourceSteps:
        languages = {
            source: {code: StepSettings.of(cfg.for_language(source, code)) for code in cfg.language_codes()}
            for source in ("", *cfg.sources)
        }
        own = {source: _with_min_scores(cfg.for_source(source), languages[source]) for source in cfg.sources}
        return cls(_with_min_scores(cfg, languages[""]), own, languages)

    def for_source(self, source: str) -> StepSettings:
        return self.own.get(source, self.default)

    def languages_of(self, source: str) -> dict[str, StepSettings]:
        """Each language's settings for `source`'s documents."""
        return self.languages[source if source in self.own else ""]


def _with_min_scores(own: CurateConfig, languages: dict[str, StepSettings]) -> StepSettings:
    """A source's step settings (`own`), its language ID taking each language's own lowest score (from the
    source's `languages`, as for_language resolved them) where language.min_scores does not name one."""
    scores = {
        code: s.language.min_score for code, s in languages.items() if s.language.min_score != own.language.min_score
    }
    language = own.language.model_copy(update={"min_scores": {**scores, **own.language.min_scores}})
    return StepSettings.of(own.model_copy(update={"language": language}))


Steps = CurateConfig | StepSettings  # what the builders below read a source's step sections from


def enabled(cfg: Steps, names: Iterable[str]) -> list[str]:
    return [
        name
        for name in names
        if getattr(cfg, name).enabled
        and (name != "decontaminate" or cfg.decontaminate.eval_sets)
        and (name != "classifiers" or cfg.classifiers.models)
    ]


def early_steps(cfg: Steps) -> list[Step]:
    return [Normalize(), *([URLFilter(cfg.url_filter)] if cfg.url_filter.enabled else [])]


def prose_steps(
    cfg: Steps,
    boilerplate: Iterable[int] = (),
    index: Path | None = None,
    languages: dict[str, StepSettings] | None = None,
) -> list[Step]:
    """The prose branch; `index` is the decontamination index folder (kiln.curate.dedup.ngram_index.build_index),
    `languages` each language's settings (SourceSteps.languages_of). The quality filters' `model` folders must be
    set (kiln.curate.run.quality_models sets them)."""
    steps = []
    counted = frozenset(
        code
        for code, own in (languages or {}).items()
        if any(getattr(own, n) != getattr(cfg, n) for n in PER_LANGUAGE_STEPS)
    )
    for name in enabled(cfg, PROSE_STEPS):
        step = _build(cfg, name, boilerplate, index)
        differ = {code: own for code, own in (languages or {}).items() if getattr(own, name) != getattr(cfg, name)}
        if name != "language" and name in PER_LANGUAGE_STEPS and differ:
            own_steps = {
                code: _build(own, name, (), index) if enabled(own, [name]) else None for code, own in differ.items()
            }
            step = ByLanguage(step, own_steps, counted)
            counted = frozenset()  # the first such step counts
        steps.append(step)
    return steps


def code_steps(cfg: Steps, index: Path | None = None) -> list[Step]:
    return [_build(cfg, name, (), index) for name in enabled(cfg, CODE_STEPS)]


def _build(cfg: Steps, name: str, boilerplate: Iterable[int], index: Path | None) -> Step:
    if name == "line_dedup":
        return BoilerplateLines(boilerplate)
    if name == "decontaminate":
        assert index is not None, "decontamination needs its index folder"
        return Decontaminate(cfg.decontaminate, index)
    if name == "classifiers":
        return LabelFilters(cfg.classifiers)
    if name in ("perplexity", "quality_classifier"):
        section = getattr(cfg, name)
        assert section.model is not None, f"curate.{name}.model: quality_models names the folder before tasks start"
        return (PerplexityFilter if name == "perplexity" else ClassifierFilter)(section, Path(section.model))
    return _BUILD[name](getattr(cfg, name))


def funnel_rows(cfg: CurateConfig) -> list[str]:
    """Every funnel row the config can produce, in chain order (the summary shows them all,
    zeros included): the steps enabled for all sources or for any one of them."""
    configs = [cfg, *(cfg.for_source(s) for s in cfg.sources)]
    rows = ["read", "normalize", *(["url_filter"] if any(c.url_filter.enabled for c in configs) else [])]
    for branch, names in (("prose", PROSE_STEPS), ("code", CODE_STEPS)):
        on = {name for c in configs for name in enabled(c, names)}
        rows += [branch, *(f"{branch}/{name}" for name in names if name in on)]
    return (
        rows
        + (["exact_dedup"] if cfg.exact_dedup.enabled else [])
        + (["minhash_dedup"] if cfg.minhash_dedup.enabled else [])
    )


def run_document(doc: Document, steps: list[Step], ledger: Ledger, branch: str | None = None) -> Document | None:
    """`doc` after every step, or None when a step dropped it (recorded) or raised (quarantined)."""
    return run_documents([doc], steps, ledger, branch)[0]


def run_documents(
    docs: list[Document], steps: list[Step], ledger: Ledger, branch: str | None = None
) -> list[Document | None]:
    """run_document of each document, in order, computed step by step over the group."""
    prefix = "" if branch is None else f"{branch}/"
    if branch is not None:
        for doc in docs:
            ledger.passed(branch, doc)  # the branch's first row: documents that entered it
    alive: list[Document | None] = list(docs)
    for step in steps:
        prepare = getattr(step, "prepare", None)
        live = [d for d in alive if d is not None]
        if prepare is not None and len(live) > 1:
            try:
                prepare(live)
            except Exception as e:  # left to the per-document calls below, which quarantine the document at fault alone
                log.debug(
                    "%s: scoring %d documents in one call failed (%s: %s); scoring them one by one",
                    step.name,
                    len(live),
                    type(e).__name__,
                    e,
                )
        for i, doc in enumerate(alive):
            if doc is not None:
                alive[i] = _run_step(step, doc, ledger, prefix)
    return alive


def groups(docs: Iterable[Document]) -> Iterator[list[Document]]:
    """Documents in consecutive lists of up to GROUP_DOCS documents or GROUP_CHARS characters of
    text, the units of run_documents."""
    group, size = [], 0
    for doc in docs:
        group.append(doc)
        size += len(doc.text)
        if len(group) >= GROUP_DOCS or size >= GROUP_CHARS:
            yield group
            group, size = [], 0
    if group:
        yield group


def _run_step(step: Step, doc: Document, ledger: Ledger, prefix: str) -> Document | None:
    try:
        out = list(step.process((doc,), ledger))
    except Exception as e:  # one bad document is quarantined, never the run
        ledger.quarantine(
            doc.id,
            doc.source,
            f"{step.name}: {type(e).__name__}: {e}",
            file=doc.meta.get("path"),
            position=_position(doc.meta),
            counted=True,
        )
        return None
    assert len(out) <= 1, f"step {step.name} yielded {len(out)} documents for one"
    if not out:
        return None
    ledger.passed(prefix + step.name, out[0])
    return out[0]


def _position(meta: dict[str, Any]) -> Any:
    return next((meta[key] for key in ("line", "row", "offset") if key in meta), None)
