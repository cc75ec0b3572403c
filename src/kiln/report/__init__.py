"""The HTML run report: one self-contained page per run, from its manifests, audit files and metrics."""
