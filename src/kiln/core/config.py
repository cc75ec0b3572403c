"""Base class for every recipe section: strict, frozen, documented.

Each stage's `config.py` defines its section on top of this. `extra="forbid"` turns a misspelt
key into an error that names it; `frozen` keeps a resolved config from changing under a stage.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
