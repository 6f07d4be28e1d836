"""The ``llm`` backend: the in-process LLM executor served as a decoupled model."""
