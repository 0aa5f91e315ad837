"""Replay: rebuild each workload's inputs, run the reference and candidate Solutions in isolated
workers, check them, time them, and write Benchmark Results (``fi-profile replay``)."""
