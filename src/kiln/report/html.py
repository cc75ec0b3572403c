"""The report page's pieces: sections, tables that page themselves, and the self-contained page.

Everything the page needs is inline (one stylesheet, one short script for table paging), so the
file opens from disk with no server and no network. Every text from the run (ids, document
text, recipe values) goes through `escape`; nothing from a run is ever inserted as markup.
Not handled here: what a section says (kiln.report.curation, training, results), charts (kiln.report.svg).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

# Rows a table shows at once; the rest are a click away (the page stays quick for 100 sources).
PAGE_ROWS = 20
CHART_SOURCES = 8  # per-source series or bars a chart draws (the largest sources); tables list every source
MB = 1e6

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:12px 24px}header h1{margin:0;font-size:20px}
nav{padding:6px 24px;background:#eceff1;position:sticky;top:0;z-index:1}nav a{margin-right:12px;color:#1a4d7a}
main{padding:0 24px 48px;max-width:1100px}section{margin-top:28px}
h2{border-bottom:1px solid #ccc;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f4f4f4;padding:8px;overflow:auto;max-height:320px;white-space:pre-wrap;word-break:break-word}
.note{color:#666}.missing{color:#8a6d3b;background:#fcf8e3;padding:6px 10px}
.chart{display:block;margin:8px 0;background:#fff;max-width:100%;height:auto}.chart .plot{fill:none;stroke:#999}
.chart .grid{stroke:#eee}.chart .tick,.chart .legend{font-size:10px;fill:#444}.chart .axis{font-size:11px;fill:#222}
.chart .title{font-size:12px;font-weight:600}
.pager button{margin:0 4px}.side{display:flex;gap:12px}.side>div{flex:1;min-width:0}
"""

# Pages every table marked data-page; no other script runs. Written for old and new browsers alike.
SCRIPT = """
document.querySelectorAll('table[data-page]').forEach(function (table) {
  var size = parseInt(table.dataset.page, 10), rows = Array.prototype.slice.call(table.tBodies[0].rows);
  if (rows.length <= size) return;
  var page = 0, pages = Math.ceil(rows.length / size), bar = document.createElement('div');
  bar.className = 'pager';
  var prev = document.createElement('button'), next = document.createElement('button');
  var label = document.createElement('span');
  prev.textContent = 'previous'; next.textContent = 'next';
  function show() {
    rows.forEach(function (row, i) { row.style.display = Math.floor(i / size) === page ? '' : 'none'; });
    label.textContent = 'page ' + (page + 1) + ' of ' + pages + ' (' + rows.length + ' rows)';
    prev.disabled = page === 0; next.disabled = page === pages - 1;
  }
  prev.onclick = function () { page -= 1; show(); };
  next.onclick = function () { page += 1; show(); };
  bar.appendChild(prev); bar.appendChild(label); bar.appendChild(next);
  table.parentNode.insertBefore(bar, table.nextSibling);
  show();
});
"""


# Every section of the page, in page order: id -> title (spelled here only).
TITLES = {
    "lineage": "Recipe and lineage",
    "funnel": "Curation funnel",
    "removals": "Removal reasons",
    "duplicates": "Duplicate clusters",
    "languages": "Language mix",
    "decontamination": "Decontamination",
    "tokenizer": "Tokenizer",
    "mixture": "Realized mixture",
    "training": "Training curves",
    "evaluation": "Evaluation",
    "samples": "Generated samples",
    "throughput": "Planned and measured",
}


@dataclass(frozen=True)
class Section:
    id: str  # a key of TITLES
    body: str  # HTML built with this module's helpers

    @property
    def title(self) -> str:
        return TITLES[self.id]


def missing(what: str) -> str:
    """The body of a section whose files do not exist yet (a stage not run, or still running)."""
    return f'<p class="missing">{escape(what)}</p>'


def para(text: str, cls: str = "") -> str:
    return f"<p{f' class={cls!r}' if cls else ''}>{escape(text)}</p>"


def pre(text: str) -> str:
    return f"<pre>{escape(text)}</pre>"


def cell(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return f"<td>{'' if value is None else escape(str(value))}</td>"
    if isinstance(value, int):
        return f'<td class="num">{value:,}</td>'
    if isinstance(value, float):
        return (
            f'<td class="num">{value:,.4g}</td>'
            if abs(value) >= 1e-3 or value == 0
            else f'<td class="num">{value:.3e}</td>'
        )
    return f"<td>{escape(str(value))}</td>"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], raw: Sequence[int] = ()) -> str:
    """A table; columns listed in `raw` hold HTML made by this module (a <details>), the rest is escaped.
    Past PAGE_ROWS rows the page script splits it into pages."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{v}</td>" if i in raw else cell(v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    return f'<table data-page="{PAGE_ROWS}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def details(summary: str, body_html: str) -> str:
    return f"<details><summary>{escape(summary)}</summary>{body_html}</details>"


def page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    nav = "".join(f'<a href="#{s.id}">{escape(s.title)}</a>' for s in sections)
    body = "".join(
        f'<section id="{s.id}" data-section="{s.id}"><h2>{escape(s.title)}</h2>{s.body}</section>' for s in sections
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        'content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>{escape(title)}</h1><div>{escape(subtitle)}</div></header><nav>{nav}</nav><main>{body}</main>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )
