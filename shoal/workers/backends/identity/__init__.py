"""The ``identity`` backend: each input ``INPUT<n>`` is answered as output ``OUTPUT<n>``
(Triton's identity backend, the one Triton's own tests serve); see ``backend.py``."""
