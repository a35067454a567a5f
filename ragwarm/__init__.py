"""ragwarm: keeps LLM inference workers warm for retrieval-augmented generation."""

__version__ = "0.1.0"
