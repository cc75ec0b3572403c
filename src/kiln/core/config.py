"""Base class for every recipe section: strict, frozen, documented.

Each stage's `config.py` defines its section on top of this. `extra="forbid"` turns a misspelt
key into an error that names it; `frozen` keeps a resolved config from changing under a stage;
`allow_inf_nan=False` rejects `.inf` and `.nan`, which no kiln setting means, and a boolean is
refused for a setting that is not a yes/no one (pydantic would read `true` as 1).
A section lists in `NOT_HASHED` the fields that change speed but never results (worker
counts, batch sizes of pure computations): changing them does not redo a finished stage.
"""

from __future__ import annotations

import types
import typing
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_validator


def takes_bool(annotation: Any) -> bool:
    """Whether a field of this type means a yes/no (bool, Any, a union or Literal holding one)."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    if origin is typing.Union or origin is types.UnionType:
        return any(takes_bool(a) for a in typing.get_args(annotation))
    return False


class Section(BaseModel):
    # coerce_numbers_to_str: `--set name=2024` parses as a YAML int but means the text "2024".
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, coerce_numbers_to_str=True, allow_inf_nan=False
    )
    NOT_HASHED: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """`min_chars: true` is a mistake, not 1: pydantic would take a boolean for a number."""
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if isinstance(value, bool) and field is not None and not takes_bool(field.annotation):
                    raise ValueError(
                        f"{name}: got {str(value).lower()}, a yes/no value, for a setting that takes "
                        f"{getattr(field.annotation, '__name__', field.annotation)}"
                    )
        return data
