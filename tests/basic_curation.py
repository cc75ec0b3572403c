"""The curate settings of the tests about tokens (tests/tokenize/, tests/train/): the prose rules would drop
Python docs topics (curly braces, short lines) and cut license lines shared by many files, so they are off.
Normalization, PII, length limits and exact dedup still run."""

ONLY_BASIC_STEPS = {
    step: {"enabled": False}
    for step in (
        "line_dedup",
        "language",
        "gopher_repetition",
        "gopher_quality",
        "bad_words",
        "c4",
        "fineweb",
        "code_quality",
    )
}
