"""Tokens: train the BPE tokenizer, encode curated shards into memory-mapped token shards."""
