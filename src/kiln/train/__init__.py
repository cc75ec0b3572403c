"""Training: the stage (run), the loop, loss, optimizer and schedule, checkpoints, monitoring.

Data comes in as a kiln.model.batch.BatchSource handed over by kiln.pipeline; this package
imports no other stage."""
