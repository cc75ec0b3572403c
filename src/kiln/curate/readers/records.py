"""A structured record (a JSONL object, a Parquet row) to a Document: text, id, source, meta.

JSONL and Parquet share this so their records mean the same: the text field must be a string
(else the record is quarantined), the id field's value becomes the id when present, the source
field names the source when the input sets none (made safe by `sanitize_source`; when that
changed it, the original is kept in `meta["source_name"]`), and a `meta` or `metadata` object
becomes the document's meta, with these rules:
- `url`: a top-level `url` field (C4, FineWeb, RefinedWeb put it there) is copied to
  `meta["url"]`, where the URL filter reads it, unless the record's own meta has a non-empty
  `url`, which is kept (meta first: it is the more specific of the two).
- kiln's location keys, `path` (the input file) and `line` (JSONL) or `row` (Parquet), always
  hold kiln's values, so a document can be found in its input; a record's own value for one of
  them is kept under `record_<key>` (`record_path`, `record_line`, `record_row`).
Other fields are ignored. Not handled here: parsing lines or reading row groups.
"""

from __future__ import annotations

from typing import Any

from kiln.core.document import Document
from kiln.curate.readers.config import InputConfig, sanitize_source
from kiln.curate.readers.intake import Intake
from kiln.curate.readers.task import ReadUnit


def record_id(unit: ReadUnit, cfg: InputConfig, position: int, id_value: Any, source_value: Any) -> tuple[str, str]:
    """(id, source) of a record: its id field, else `<source>/<relpath>:<line or row>`."""
    source = unit.source
    if cfg.source is None and isinstance(source_value, str) and source_value:
        source = sanitize_source(source_value)
    if id_value is not None and id_value != "":
        return str(id_value), source
    # unit.name is "<planned source>/<relpath>"; the id starts with the record's own source
    return f"{source}/{unit.name.partition('/')[2]}:{position}", source


def record_document(
    intake: Intake,
    unit: ReadUnit,
    cfg: InputConfig,
    position_key: str,
    position: int,
    text: Any,
    id_value: Any,
    source_value: Any,
    meta_value: Any,
    replaced: bool,
    url_value: Any = None,
) -> Document | None:
    """The record's Document, or None when it went to the ledger (quarantined or removed)."""
    doc_id, source = record_id(unit, cfg, position, id_value, source_value)
    if not isinstance(text, str):
        found = "missing" if text is None else f"a {type(text).__name__}, not a string"
        intake.quarantine(doc_id, source, f"read:bad_record: field {cfg.text_field!r} is {found} ({position_key} {position})", position)
        return None
    return intake.accept(doc_id, text, source, record_meta(unit, cfg, position_key, position, source_value, meta_value, url_value), position, "read:invalid_utf8" if replaced else None)


def record_meta(unit: ReadUnit, cfg: InputConfig, position_key: str, position: int, source_value: Any, meta_value: Any, url_value: Any) -> dict[str, Any]:
    """The document's meta (see the module docstring for the rules)."""
    meta = dict(meta_value) if isinstance(meta_value, dict) else {}
    for key in ("path", position_key):
        if key in meta:
            meta[f"record_{key}"] = meta.pop(key)
    meta["path"], meta[position_key] = unit.path, position
    if not meta.get("url") and isinstance(url_value, str) and url_value:
        meta["url"] = url_value
    if cfg.source is None and isinstance(source_value, str) and source_value and sanitize_source(source_value) != source_value:
        meta["source_name"] = source_value
    return meta
