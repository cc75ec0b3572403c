"""A structured record (a JSONL object, a Parquet row) to a Document: text, id, source, meta.

JSONL and Parquet share this so their records mean the same: the text field must be a string
(else the record is quarantined), the id field's value becomes the id when present, the source
field names the source when the input sets none (made safe by `sanitize_source`; when that
changed it, the original is kept in `meta["source_name"]`), and a `meta` or `metadata` object
becomes the document's meta, with these rules:
- a Parquet `map` meta column is taken as the object it stands for.
- `url`: a top-level `url` field (C4, FineWeb, RefinedWeb put it there) is copied to
  `meta["url"]`, where the URL filter reads it, unless the record's own meta has a non-empty
  `url`, which is kept (meta first: it is the more specific of the two).
- kiln's location keys, `path` (the input file) and `line` (JSONL) or `row` (Parquet), always
  hold kiln's values, so a document can be found in its input; a record's own value for one of
  them is kept under `record_<key>` (`record_path`, `record_line`, `record_row`).
- meta values are made JSON-safe (`json_value`), so every document can be written as strict
  JSON (a datetime made the shard write raise; NaN was written as a token JSON lacks):
  datetimes, dates and times become ISO 8601 strings, Decimals their exact `str`, bytes
  lowercase hex (digests, the usual bytes in meta, read as they are usually shown), non-finite
  floats the strings "NaN", "Infinity", "-Infinity" (never silently None), tuples and sets
  lists, non-string keys `str(key)`, lone surrogates U+FFFD, and any other type `str(value)`.
  A meta nested more than MAX_META_DEPTH deep quarantines its record (`read:bad_record`, with
  its position) instead of failing the conversion or the shard write later.
Other fields are ignored. Not handled here: parsing lines or reading row groups.
"""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Any

from kiln.core.document import Document
from kiln.curate.readers.config import InputConfig, sanitize_source
from kiln.curate.readers.decode import scrub_surrogates
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


MAX_META_DEPTH = 100  # levels of objects and lists in a record's meta; real metadata uses a handful
MISSING: Any = object()  # a record without the text field, told apart from one whose text is null


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
    """The record's Document, or None when it went to the ledger (quarantined or removed).

    `text` is MISSING when the record has no text field at all (a JSONL object without the key).
    """
    doc_id, source = record_id(unit, cfg, position, id_value, source_value)
    if not isinstance(text, str):
        found = "missing" if text is MISSING else "null" if text is None else f"a {type(text).__name__}, not a string"
        intake.quarantine(
            doc_id,
            source,
            f"read:bad_record: field {cfg.text_field!r} is {found} ({position_key} {position})",
            position,
        )
        return None
    try:
        meta = record_meta(unit, cfg, position_key, position, source_value, meta_value, url_value)
    except MetaTooDeep as e:  # this record's, never the run's
        intake.quarantine(doc_id, source, f"read:bad_record: {e} ({position_key} {position})", position)
        return None
    return intake.accept(doc_id, text, source, meta, position, "read:invalid_utf8" if replaced else None)


def record_meta(
    unit: ReadUnit,
    cfg: InputConfig,
    position_key: str,
    position: int,
    source_value: Any,
    meta_value: Any,
    url_value: Any,
) -> dict[str, Any]:
    """The document's meta (see the module docstring for the rules)."""
    if isinstance(meta_value, list) and all(isinstance(pair, tuple) and len(pair) == 2 for pair in meta_value):
        meta_value = dict(meta_value)  # a Parquet map column arrives as (key, value) tuples (JSON has none)
    meta = json_value(meta_value) if isinstance(meta_value, dict) else {}
    for key in ("path", position_key):
        if key in meta:
            meta[f"record_{key}"] = meta.pop(key)
    meta["path"], meta[position_key] = unit.shown_path, position
    if not meta.get("url") and isinstance(url_value, str) and url_value:
        meta["url"] = url_value
    if (
        cfg.source is None
        and isinstance(source_value, str)
        and source_value
        and sanitize_source(source_value) != source_value
    ):
        meta["source_name"] = source_value
    return meta


class MetaTooDeep(ValueError):
    """A meta nested past MAX_META_DEPTH: its record is quarantined."""


def json_value(value: Any, depth: int = 0) -> Any:
    """`value` as plain JSON data that `json.dumps(..., allow_nan=False)` writes (rules: module docstring).

    E.g. {"when": datetime(2020, 1, 1), "blob": b"\\x00\\xff", "score": nan}
      -> {"when": "2020-01-01T00:00:00", "blob": "00ff", "score": "NaN"}.
    Raises MetaTooDeep past MAX_META_DEPTH levels (an explicit limit: Python's recursion limit
    would depend on the caller's stack and the Python version).
    """
    # bool and int before float: bool is an int, and ints are always finite
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return value if value.isascii() else scrub_surrogates(value)[0]
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        if depth >= MAX_META_DEPTH:
            raise MetaTooDeep(f"meta is nested more than {MAX_META_DEPTH} levels deep")
        if isinstance(value, dict):
            return {
                (json_value(k) if isinstance(k, str) else str(k)): json_value(v, depth + 1) for k, v in value.items()
            }
        if isinstance(value, (set, frozenset)):
            value = sorted(value, key=repr)  # sorted: the same meta every run
        return [json_value(v, depth + 1) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)  # exact: a float would round a decimal128 column
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return json_value(str(value), depth)  # timedelta, UUID, a numpy scalar: readable, and never a crash
