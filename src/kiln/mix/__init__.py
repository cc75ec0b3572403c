"""Mixing: which source each training row comes from, in what order and how often, over training."""
