"""Warmup strategies side by side: workload, policies, the simulated-clock runner, metrics."""
