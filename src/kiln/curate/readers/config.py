"""One entry of `curate.inputs`: where a stream of raw documents is and how to read it.

`format: auto` picks the reader from each file's extension (`detect_format`), so one input can
mix JSONL, Parquet, WARC, HTML and text files. Not handled here: listing the files or reading
them (kiln.curate.readers.plan and the format modules).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

import xxhash
from pydantic import Field, model_validator

from kiln.core.config import Section

Format = Literal[
    "auto",
    "jsonl",
    "parquet",
    "text",
    "html",
    "warc",
    "stdlib_code",
    "pydoc_topics",
    "usr_share_doc",
    "gettext_messages",
]
Extractor = Literal["resiliparse", "trafilatura"]

BUILTIN_FORMATS = frozenset({"stdlib_code", "pydoc_topics", "usr_share_doc", "gettext_messages"})
# A builtin input without `source` gets the name the demo recipe has always used for it.
BUILTIN_SOURCES = {"stdlib_code": "code", "pydoc_topics": "prose", "usr_share_doc": "docs"}
# Files holding many documents each; the cap may read only a prefix of one (see plan.py).
CONTAINER_FORMATS = frozenset({"jsonl", "parquet", "warc"})

COMPRESSIONS = (".gz", ".zst")
# Extension (after a .gz or .zst is stripped) -> format; anything unlisted is text.
EXTENSIONS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".warc": "warc",
    ".html": "html",
    ".htm": "html",
}

_UNSAFE_SOURCE_CHARS = re.compile(r"[^A-Za-z0-9_]")
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_]+")
# Shard files are named `<source>-<task>.jsonl.zst`; 64 characters keep them far below the
# 255-byte file name limit of common filesystems.
MAX_SOURCE_CHARS = 64
SOURCE_HASH_CHARS = 8


def detect_format(name: str) -> str:
    """The format a file name implies: `web.jsonl.zst` -> jsonl, `a.warc.gz` -> warc, `notes.md` -> text."""
    lower = name.lower()
    for suffix in COMPRESSIONS:
        if lower.endswith(suffix):
            lower = lower[: -len(suffix)]
            break
    dot = lower.rfind(".")
    return EXTENSIONS.get(lower[dot:], "text") if dot >= 0 else "text"


@lru_cache(maxsize=4096)  # called per record with a handful of distinct values
def sanitize_source(name: str) -> str:
    """A folder or field value made safe to name shard files, distinct names staying distinct.

    A valid name (A-Za-z0-9_, at most MAX_SOURCE_CHARS) is kept as is. Any other is replaced:
    characters outside A-Za-z0-9_ become _, it is cut to fit, and `_` + 8 hex digits of the
    xxh64 of the original (UTF-8) are appended, so `a-b` and `a_b`, or `日本語` and `中文`, do
    not merge: `my-web.data` -> `my_web_data_<hash>`, `日本語` -> `____<hash>`. Empty -> `input`.
    """
    if not name:
        return "input"
    if len(name) <= MAX_SOURCE_CHARS and _SOURCE_NAME.fullmatch(name):
        return name
    digest = xxhash.xxh64_hexdigest(name.encode("utf-8", "surrogatepass"))[:SOURCE_HASH_CHARS]
    return f"{_UNSAFE_SOURCE_CHARS.sub('_', name)[: MAX_SOURCE_CHARS - SOURCE_HASH_CHARS - 1]}_{digest}"


class InputConfig(Section):
    source: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_]+$",
        max_length=MAX_SOURCE_CHARS,
        description=(
            "Name of the stream (code, prose, web...), A-Za-z0-9_ and at most 64 characters; None: each record's "
            "source field when present, else the file's parent folder name (other names are made safe: characters "
            "outside A-Za-z0-9_ become _, cut to fit, plus _ and 8 hex digits of a hash of the original)."
        ),
    )
    format: Format = Field(
        default="auto",
        description=(
            "auto: from each file's extension (.jsonl/.json/.ndjson[.gz|.zst], .parquet, .warc[.gz], .html/.htm, "
            "anything else text); stdlib_code, pydoc_topics, usr_share_doc: the built-in demo corpus; "
            "gettext_messages: the machine's translated messages as a parallel corpus, one source per locale."
        ),
    )
    path: str | None = Field(
        default=None,
        description=(
            "A file, a folder (read recursively) or a glob such as data/**/*.jsonl.zst; ids use paths relative to the "
            "folder before the first wildcard. For stdlib_code, usr_share_doc and gettext_messages: the root folder "
            "(default: this Python's standard library, /usr/share/doc, /usr/share/locale)."
        ),
    )
    text_field: str = Field(
        default="text", min_length=1, description="JSONL key or Parquet column holding the document text."
    )
    id_field: str = Field(
        default="id",
        min_length=1,
        description=(
            "JSONL key or Parquet column holding a stable document id; records without it get `<source>/<file>:<line "
            "or row>`."
        ),
    )
    source_field: str = Field(
        default="source",
        min_length=1,
        description="JSONL key or Parquet column naming the record's source; used only when `source` is not set.",
    )
    code: bool | None = Field(
        default=None,
        description="True or False marks this input as code (or not) for the code rules; None: decided automatically.",
    )
    locales: tuple[str, ...] | None = Field(
        default=None,
        description=(
            "gettext_messages: the locales to align (folder names under path, such as fr, pt_BR, zh_TW; en: the "
            "English originals); each becomes a source of that name (<source>_<locale> when source is set); None: "
            "en fr de es pt_BR it ru ko ja zh_CN zh_TW th."
        ),
    )
    extractor: Extractor = Field(
        default="resiliparse",
        description=(
            "Main-text extractor for HTML files and WARC pages: resiliparse (fast) or trafilatura (slower, often "
            "cleaner)."
        ),
    )

    @model_validator(mode="after")
    def _path_for_file_formats(self) -> InputConfig:
        if self.format not in BUILTIN_FORMATS and not self.path:
            raise ValueError(
                f"input format {self.format} needs `path`: a file, a folder or a glob such as data/**/*.jsonl"
            )
        return self
