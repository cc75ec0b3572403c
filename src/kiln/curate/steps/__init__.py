"""Curation steps, one module each; `pipeline` puts them in order for code and prose."""
