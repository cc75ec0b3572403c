"""The document record that flows through curation and into tokenization.

`id` is stable across runs: it is derived from the source and the document's location in the
input (file path and line, record offset, row), never from processing order. `cache` holds
derived values (the shared split into lines and words) for the current text; it is never
serialized, and `with_text` starts a fresh one, so nothing derived from old text survives an edit.
Not handled here: reading or writing documents (see kiln.core.docshards).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def with_text(self, text: str) -> Document:
        return replace(self, text=text, cache={})

    def with_meta(self, **values: Any) -> Document:
        """A copy with these meta keys set; the text (and so the cache) is unchanged."""
        return replace(self, meta={**self.meta, **values})

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "source": self.source, "meta": self.meta}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Document:
        return cls(id=obj["id"], text=obj["text"], source=obj["source"], meta=obj.get("meta") or {})
