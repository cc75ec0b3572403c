"""kiln: raw text to a pretrained base language model, one auditable stage at a time."""

__version__ = "0.1.0"
