"""The RAG client side: `RagClient`, its settings and wire, the KB producer and ingest."""
