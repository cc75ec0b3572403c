"""Settings per language: the values each prose step uses for a document of a given language.

kiln ships FineWeb-2's per-language figures for 29 languages (languages.yaml beside this file, with
how each was derived); a recipe adds or changes any with `curate.languages.<code>.<step>.<key>`.
For a document whose meta.language has settings, each key of a step's section is, the first found:
the source's own (`curate.sources`), the recipe's for the language (`curate.languages`), a value
the recipe set for every language (`curate.<step>.<key>` other than kiln's default), the shipped
value for the language, kiln's default. So a recipe tuned for a kind of text (`technical`) keeps
its values in every language, and the web defaults become each language's own.
`ByLanguage` runs one instance of a step per language with settings of its own and the shared one
for every other document. Not handled here: identifying the language (the `language` step, which
takes each language's min_score as it predicts), splitting words (kiln.text.languages).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.base import Step

# The shipped file's version: what a stage records and hashes; bump it with any change to the file.
LANGUAGE_DEFAULTS = "kiln-languages v1"
LANGUAGES_FILE = Path(__file__).with_name("languages.yaml")
# The steps a language can set: the prose steps after language ID that judge one document alone
# (the model filters score groups, decontamination shares one index), and language ID's threshold.
PER_LANGUAGE_STEPS = ("language", "gopher_repetition", "gopher_quality", "c4", "fineweb", "pii", "length")
LANGUAGE_KEYS = {"language": ("min_score",)}  # language ID runs before the language is known: its threshold only
# Stats counter of the documents judged with a language's own settings (the manifest's `languages`).
USED = "language_settings:"


@functools.cache
def shipped() -> dict[str, dict[str, dict[str, Any]]]:
    """The per-language settings kiln ships: code -> step -> key -> value."""
    return yaml.safe_load(LANGUAGES_FILE.read_text(encoding="utf-8"))


@functools.cache
def shipped_source(code: str) -> str | None:
    """Where the shipped settings of `code` come from (the entry's comment in languages.yaml), or None."""
    for line in LANGUAGES_FILE.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"{code}:"):
            return "FineWeb-2 configs/" + line.partition("#")[2].strip().replace(" @", ".yml @", 1)
    return None


def used(stats: dict[str, int], own: dict[str, Any], defaults: str | None) -> dict[str, dict[str, Any]]:
    """What the manifest records of each language whose settings judged documents: how many, where the
    settings come from (`defaults`, the shipped file's version, or None) and the recipe's own keys."""
    out = {}
    for key, n in sorted(stats.items()):
        if key.startswith(USED):
            code = key.removeprefix(USED)
            source = shipped_source(code) if defaults and code in shipped() else None
            out[code] = {
                "documents": n,
                "shipped": f"{defaults}: {source}" if source else None,
                "recipe": own.get(code),
            }
    return out


def with_keys(section: Section, keys: dict[str, Any]) -> Section:
    """`section` with `keys` in place of its own values, validated (itself when there are none)."""
    return type(section).model_validate({**section.model_dump(), **keys}) if keys else section


def resolve(section: Section, shipped_keys: dict[str, Any], own_keys: dict[str, Any]) -> Section:
    """`section` (the recipe's, for every language) as one language uses it: each shipped key where the
    recipe left kiln's default, then the language's own keys from the recipe."""
    default = type(section)()
    keys = {k: v for k, v in shipped_keys.items() if getattr(section, k) == getattr(default, k)}
    return with_keys(section, {**keys, **own_keys})


class ByLanguage:
    """A step whose documents in a language with settings of its own go through that language's instance
    (None: the language turned the step off), every other document through the shared one. The chain's
    first such step counts each document of a language in `counted` (those with any setting of their own)."""

    def __init__(self, shared: Step, own: dict[str, Step | None], counted: frozenset[str] = frozenset()):
        self.name = shared.name
        self.shared, self.own, self.counted = shared, own, counted

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            code = doc.meta.get("language")
            if code in self.counted:
                ledger.count(doc.source, USED + code)
            if code not in self.own:
                yield from self.shared.process((doc,), ledger)
            elif (step := self.own[code]) is None:
                yield doc
            else:
                yield from step.process((doc,), ledger)
