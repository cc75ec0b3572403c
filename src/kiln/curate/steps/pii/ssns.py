"""US social security numbers written AAA-GG-SSSS that the SSA could have issued.

The SSA never assigns area 000, 666 or 900-999, group 00 or serial 0000; the numbers printed in
advertising and on sample cards (078-05-1120, ...) belong to no one and stay.
Not handled here: SSNs without dashes or with spaces, and national ids of other countries.
"""

from __future__ import annotations

# An alternative of the one digit scan (kiln.curate.steps.pii.numbers), led by its first digit.
SSN_SHAPE = r"(?<![\w-]\d)(?P<ssn>\d{2}-\d{2}-\d{4})(?!\w|-\d)"
# Printed in advertising and on sample cards, used by thousands, belonging to no one (SSA).
_PUBLISHED_SSNS = frozenset({"078-05-1120", "219-09-9999", "123-45-6789"})


def ssn_valid(area: str, group: str, serial: str) -> bool:
    """Whether AAA-GG-SSSS could have been issued: the SSA never assigns area 000, 666 or 900-999,
    group 00 or serial 0000 (SSA, "Social Security Number Randomization", 2011)."""
    return area != "000" and area != "666" and area[0] != "9" and group != "00" and serial != "0000"


def is_ssn(found: str) -> bool:
    """Whether a match of SSN_SHAPE could have been issued and is not a published sample."""
    return ssn_valid(found[0:3], found[4:6], found[7:11]) and found not in _PUBLISHED_SSNS
