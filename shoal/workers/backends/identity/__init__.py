"""The ``identity`` backend: each input ``INPUT<n>`` is answered as output ``OUTPUT<n>``
(Triton's identity backend, the one Triton's own tests serve)."""

from shoal.workers.backends.identity.backend import IdentityBackend

__all__ = ["IdentityBackend"]
