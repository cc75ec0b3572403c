"""The Llama-style decoder, its config, and (later) size presets and objectives."""
