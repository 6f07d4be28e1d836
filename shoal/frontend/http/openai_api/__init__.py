"""The OpenAI-compatible API (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``) on
the HTTP port, over models of the ``llm`` backend (``routes.py`` is the entry point)."""
