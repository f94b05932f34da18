"""Benchmark harness: episodes, shipped tasks, loaders, metrics, runner, report."""
