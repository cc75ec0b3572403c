"""Base class for every recipe section: strict, frozen, documented.

Each stage's `config.py` defines its section on top of this. `extra="forbid"` turns a misspelt
key into an error that names it; `frozen` keeps a resolved config from changing under a stage;
`allow_inf_nan=False` rejects `.inf` and `.nan`, which no kiln setting means.
A section lists in `NOT_HASHED` the fields that change speed but never results (worker
counts, batch sizes of pure computations): changing them does not redo a finished stage.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # coerce_numbers_to_str: `--set name=2024` parses as a YAML int but means the text "2024".
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, coerce_numbers_to_str=True, allow_inf_nan=False)
    NOT_HASHED: ClassVar[frozenset[str]] = frozenset()
