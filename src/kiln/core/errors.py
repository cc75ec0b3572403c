"""Named errors for bad user input. `assert` stays for internal invariants only.

Every message says where (key, file, document), what was found, the rule, and how to fix it.
"""


class KilnError(Exception):
    """Base of the errors kiln raises on purpose; the CLI prints these without a traceback."""


class ConfigError(KilnError):
    """A recipe or override is invalid; raised before any work starts."""


class DocumentError(KilnError):
    """One document cannot be processed; it is quarantined with this message and the run goes on."""


class FatalError(KilnError):
    """The run cannot continue (missing input, corrupt shard, inconsistent stages)."""


class Detached(KilnError):
    """The command handed its work to a scheduler and stopped on purpose (`--detach`): the message says what
    runs where, and running the same command again goes on from it."""
