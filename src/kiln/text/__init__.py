"""Text analysis shared by curation, quality models and the tokenizer: segments, shingles, language ID, code detection,
and the tokenizer format."""
