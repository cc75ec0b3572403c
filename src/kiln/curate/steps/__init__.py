"""Curation steps, one module each; `chain` puts them in order for code and prose."""
