"""The torch-side layer every stage shares: the Llama-style decoder (math only), its config and
presets, attention rules, initialisation, weights on disk, the precision policy, the Batch
record and BatchSource protocol the trainer reads, and the validation scorer."""
