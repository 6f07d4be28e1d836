"""Triton's own examples and QA tests, run unchanged against shoal (run.py)."""
