"""The training loop and what surrounds it: schedule, checkpoints, metrics."""
