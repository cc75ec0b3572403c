"""Global duplicate removal across all shards and sources."""
