"""The `curate` recipe section: where text comes from and which rules keep it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kiln.core.config import Section

ReaderName = Literal["stdlib_code", "pydoc_topics", "usr_share_doc", "text_files"]


class InputConfig(Section):
    source: str = Field(description="Name of the stream (code, prose, web...); becomes a mixture component and an eval split.", pattern=r"^[A-Za-z0-9_]+$")
    reader: ReaderName = Field(description="stdlib_code: the interpreter's standard-library .py files; pydoc_topics: the Python docs text in pydoc_data; usr_share_doc: READMEs, changelogs and licenses under /usr/share/doc; text_files: one document per file matching `path`.")
    path: str | None = Field(default=None, description="For text_files: a glob (e.g. data/*.txt, data/**/*.md; ids are `<source>/<path below the folder before the first wildcard>`); for usr_share_doc: the root folder (default /usr/share/doc).")

    @model_validator(mode="after")
    def _path_for_text_files(self) -> InputConfig:
        if self.reader == "text_files" and not self.path:
            raise ValueError("reader text_files needs `path`, a glob such as data/**/*.txt")
        return self


DEFAULT_INPUTS = (
    InputConfig(source="code", reader="stdlib_code"),
    InputConfig(source="prose", reader="pydoc_topics"),
    InputConfig(source="docs", reader="usr_share_doc"),
)


class CurateConfig(Section):
    NOT_HASHED = frozenset({"workers"})  # shards do not depend on the worker count
    inputs: tuple[InputConfig, ...] = Field(default=DEFAULT_INPUTS, min_length=1, description="Input streams, read in this order.")
    max_total_mb: float = Field(default=50.0, gt=0, description="Cap on raw input in MB (1e6 bytes on disk, .gz counted compressed), shared fairly between inputs; a small input leaves its share to the others.")
    max_file_mb: float = Field(default=1.0, gt=0, description="A file larger than this (MB, after decompression) is quarantined with its path, never loaded whole.")
    shard_mb: float = Field(default=4.0, gt=0, description="Raw input bytes per shard task (MB); shard names depend on this, never on the worker count.")
    workers: int | None = Field(default=None, ge=1, description="Worker processes; None means one per CPU core.")
    min_chars: int = Field(default=200, ge=0, description="Length filter: drop documents with fewer characters after normalization.")
    max_chars: int = Field(default=1_000_000, gt=0, description="Length filter: drop documents with more characters after normalization.")
    min_mean_word_length: float = Field(default=3.0, ge=0, description="Drop documents whose mean word length (characters) is below this (Gopher: 3).")
    max_mean_word_length: float = Field(default=10.0, gt=0, description="Drop documents whose mean word length (characters) is above this (Gopher: 10).")
    max_symbol_word_ratio: float = Field(default=0.1, ge=0, description="Drop documents with more '#' plus ellipses per word than this (Gopher: 0.1).")
    exact_dedup: bool = Field(default=True, description="Remove exact duplicates (hash of normalized text) across all inputs, keeping the smallest id.")

    @model_validator(mode="after")
    def _ranges(self) -> CurateConfig:
        if self.min_chars >= self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must be below max_chars ({self.max_chars})")
        if self.min_mean_word_length >= self.max_mean_word_length:
            raise ValueError("min_mean_word_length must be below max_mean_word_length")
        sources = [i.source for i in self.inputs]
        if len(set(sources)) != len(sources):
            raise ValueError(f"input sources must be unique, got {sources}")
        return self
