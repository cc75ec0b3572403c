"""Curation: read raw text, clean and filter it, remove duplicates, write curated shards."""
