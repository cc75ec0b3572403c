"""Mixing: which source each training sequence comes from, and (later) schedules over steps."""
