"""Operations view of a running server: one 1 Hz sampler in frontend 0 (``sampler.py``), the
JSON document it produces (``schema.py``), the ``/dashboard`` page and API on the metrics port
(``dashboard.py``, ``static/``) and the ``shoal top`` terminal view (``top.py``)."""
