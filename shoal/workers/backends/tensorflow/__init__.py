"""The ``tensorflow`` backend (Triton platforms ``tensorflow_savedmodel`` and
``tensorflow_graphdef``): SavedModels and frozen GraphDefs run by TensorFlow in each instance's
worker. Optional: needs TensorFlow (``pip install
'shoal[tensorflow]'``, tensorflow-cpu); without it a model naming this backend fails its load
saying so (``not_built_in.py``).

Modules: ``signature`` (the serving signature as Triton sees it, read from ``saved_model.pb``
without TensorFlow), ``autocomplete`` (Triton's auto-complete from the signature, in the
broker), ``params`` (the config parameters Triton's backend reads, and the thread counts),
``config_check`` (the config against the signature at load), ``graphdef`` (GraphDef models:
their check and their pruned function), ``runtime`` (importing
TensorFlow, or the error naming the extra) and ``backend`` (the backend class).
"""
