"""The OpenAI-compatible gateway: chat and text completions over the RAG client."""
