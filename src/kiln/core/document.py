"""The document record that flows through curation and into tokenization.

`id` is stable across runs: it is derived from the source and the document's location in the
input (file path, topic name), never from processing order. Not handled here: reading or
writing documents (see kiln.curate.shards).
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

    def with_text(self, text: str) -> Document:
        return replace(self, text=text)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "source": self.source, "meta": self.meta}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Document:
        return cls(id=obj["id"], text=obj["text"], source=obj["source"], meta=obj.get("meta") or {})
