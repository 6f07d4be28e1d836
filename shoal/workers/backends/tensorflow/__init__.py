"""The ``tensorflow`` backend (Triton platform ``tensorflow_savedmodel``): SavedModels run by
TensorFlow in each instance's worker. Optional: needs TensorFlow (``pip install
'shoal[tensorflow]'``, tensorflow-cpu); without it a model naming this backend fails its load
saying so (``not_built_in.py``).

Modules: ``signature`` (the serving signature as Triton sees it, read from ``saved_model.pb``
without TensorFlow), ``autocomplete`` (Triton's auto-complete from the signature, in the
broker), ``params`` (the config parameters Triton's backend reads, and the thread counts),
``config_check`` (the config against the signature at load), ``runtime`` (importing
TensorFlow, or the error naming the extra) and ``backend`` (the backend class).
"""
