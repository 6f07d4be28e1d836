"""Triton's response cache in the frontend (``response_cache { enable: true }`` per model,
``--cache-config local,size=N`` per server): see ``cache.ResponseCache``."""

from shoal.frontend.response_cache.cache import CacheProbe, ResponseCache

__all__ = ["CacheProbe", "ResponseCache"]
