"""Parquet (the Hugging Face dataset layout: one text column, optional id, source, meta columns).

A task reads its row groups in batches of BATCH_ROWS rows, only the columns it needs, so memory
follows the batch, not the file. Before any Python string is built, the text column's byte
lengths are computed in Arrow (`binary_length`) and cells over the cap are nulled out and
quarantined; the rest become Python strings. Rows are numbered from 0 within the file. Not
handled here: a cell over the cap is still read into Arrow memory with its page (Parquet has no
way to skip part of a page); nested text columns (lists of strings) are quarantined row by row.
A file without the text column is quarantined as one entry (`read:bad_file`, its id the file's
`<source>/<relpath>`, its bytes the whole file's), however many tasks its row groups were split
into: it counts as one document in, not one per task or per row.
Which columns become the document's meta (`url`, `meta` or `metadata`, kiln's `path`, `row`):
records.py.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from kiln.core.document import Document
from kiln.core.storage import open_read
from kiln.curate.readers.config import InputConfig
from kiln.curate.readers.decode import decode_utf8
from kiln.curate.readers.intake import Intake
from kiln.curate.readers.records import record_document, record_id
from kiln.curate.readers.task import ReadUnit

BATCH_ROWS = 1024  # web documents average a few KB: a batch is a few MB of Arrow memory


def read_parquet(unit: ReadUnit, cfg: InputConfig, intake: Intake) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with open_read(unit.path) as raw, pq.ParquetFile(raw) as pf:  # from a store: its row groups' ranges
        names = set(pf.schema_arrow.names)
        if cfg.text_field not in names:
            # subtle: a file split into several tasks (plan.split_parquet) is quarantined once, by
            # the task holding its first row group, so "documents in" never depends on shard_mb.
            if not unit.row_groups or unit.row_groups[0] == 0:
                why = (
                    f"read:bad_file: {unit.path} has no column {cfg.text_field!r} (columns: {sorted(names)}); set the "
                    "input's text_field"
                )
                intake.quarantine(unit.name, unit.source, why, nbytes=raw.seek(0, io.SEEK_END))
            return
        wanted = [
            cfg.text_field,
            cfg.id_field,
            cfg.source_field if cfg.source is None else None,
            "meta",
            "metadata",
            "url",
        ]
        columns = list(dict.fromkeys(c for c in wanted if c is not None and c in names))
        row_groups = list(unit.row_groups) if unit.row_groups is not None else list(range(pf.num_row_groups))
        row = unit.first_row
        cap = intake.limits.max_doc_bytes
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=row_groups, columns=columns, use_threads=False):
            texts = batch.column(cfg.text_field)
            is_text = (
                pa.types.is_string(texts.type)
                or pa.types.is_large_string(texts.type)
                or pa.types.is_binary(texts.type)
                or pa.types.is_large_binary(texts.type)
            )
            over = [False] * batch.num_rows
            if is_text:
                lengths = pc.binary_length(texts)
                too_big = pc.fill_null(pc.greater(lengths, cap), False)
                if pc.any(too_big).as_py():
                    over = too_big.to_pylist()
                    sizes = lengths.to_pylist()
                    texts = pc.if_else(too_big, pa.scalar(None, texts.type), texts)  # drop them before any str exists
                values, replaced = _python_texts(texts)
            else:  # e.g. a list or number column: each row is quarantined saying what it holds
                values, replaced = texts.to_pylist(), [False] * batch.num_rows
            ids = _column(batch, cfg.id_field)
            sources = _column(batch, cfg.source_field) if cfg.source is None else [None] * batch.num_rows
            metas = _column(batch, "meta") if "meta" in columns else _column(batch, "metadata")
            urls = _column(batch, "url")  # C4 / FineWeb / RefinedWeb: see records.py
            for i in range(batch.num_rows):
                if over[i]:
                    doc_id, source = record_id(unit, cfg, row + i, ids[i], sources[i])
                    intake.too_large(doc_id, source, sizes[i], row + i, what=f"row {row + i}")
                    continue
                doc = record_document(
                    intake, unit, cfg, "row", row + i, values[i], ids[i], sources[i], metas[i], replaced[i], urls[i]
                )
                if doc is not None:
                    yield doc
            row += batch.num_rows


def _python_texts(texts) -> tuple[list, list[bool]]:
    """The cells as Python strings (None for nulls), and per cell whether bytes were replaced."""
    import pyarrow as pa

    if pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type):
        try:
            texts.validate(full=True)  # Parquet readers do not check UTF-8; to_pylist would raise on it
            return texts.to_pylist(), [False] * len(texts)
        except pa.ArrowInvalid:
            texts = texts.cast(pa.large_binary() if pa.types.is_large_string(texts.type) else pa.binary(), safe=False)
    decoded = [None if raw is None else decode_utf8(raw) for raw in texts.to_pylist()]
    return [None if d is None else d[0] for d in decoded], [d is not None and d[1] for d in decoded]


def _column(batch, name: str) -> list:
    if name not in batch.schema.names:
        return [None] * batch.num_rows
    try:
        return batch.column(name).to_pylist()
    except UnicodeDecodeError:  # an id or source column with invalid UTF-8: read it as bytes, replaced
        import pyarrow as pa

        return [
            None if raw is None else decode_utf8(raw)[0]
            for raw in batch.column(name).cast(pa.binary(), safe=False).to_pylist()
        ]
