"""Helpers of the benchmarks (imported as modules; nothing here imports ``tests``)."""
