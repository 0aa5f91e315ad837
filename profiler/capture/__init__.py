"""Capture: record the kernel-level calls of a real engine run and write them out."""
