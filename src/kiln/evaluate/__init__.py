"""Evaluation: validation loss, perplexity and bits per byte per source; text generation."""
