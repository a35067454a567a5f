"""Traces in the shared format built from a documentation repository's git history."""
