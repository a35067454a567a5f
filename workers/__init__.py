"""Inference workers: engines, KV-cache bookkeeping, the HTTP API, the command consumer."""
