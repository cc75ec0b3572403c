"""Planning: FLOPs, sizing, memory and layout from the same formulas the trainer measures with."""
