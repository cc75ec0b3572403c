"""Input checks shared by the planner's modules, with messages that name the input, the rule and a fix.

Every `kiln plan` computation validates its own arguments with these before any work, so a
library caller and the CLI get the same ConfigError. The name given is the library argument;
where it differs from the CLI flag the meaning says which flag sets it.
Not handled here: checks that involve several inputs at once (each module words its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.core.errors import ConfigError


def require_positive(name: str, value: float, meaning: str) -> None:
    """value > 0 (also rejects NaN)."""
    if not value > 0:
        raise ConfigError(f"{name} = {value:g} must be above 0 ({meaning})")


def require_at_least(name: str, value: int, minimum: int, meaning: str) -> None:
    """An integer count or degree of at least `minimum`."""
    if not value >= minimum:
        raise ConfigError(f"{name} = {value} must be at least {minimum} ({meaning})")


def require_choice(name: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} = {value!r} is unknown; choose one of {', '.join(map(str, choices))}")


def require_fraction(name: str, value: float, meaning: str) -> None:
    """0 <= value < 1."""
    if not 0 <= value < 1:
        raise ConfigError(f"{name} = {value:g} must be in [0, 1) ({meaning})")
