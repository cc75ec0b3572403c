"""Mixing: which source each training sequence comes from, as Batches for the trainer, and (later) schedules over steps."""
