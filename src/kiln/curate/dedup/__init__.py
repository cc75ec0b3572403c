"""Global duplicate removal across all shards and sources, and the n-gram index (with its Bloom filter) that
decontamination looks documents up in. Nothing here imports kiln.curate.steps."""
