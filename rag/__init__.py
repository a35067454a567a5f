"""Retrieval: chunking, embeddings, the Qdrant store, the canonical prompt."""
