"""Benchmarks: engine, RAG, pipeline and warmup strategies, each printing figures (and --json)."""
