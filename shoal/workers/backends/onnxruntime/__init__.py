"""The ``onnxruntime`` backend (Triton platform ``onnxruntime_onnx``): ONNX models run by ONNX
Runtime. Optional: needs the ``onnxruntime`` package (``pip install 'shoal[onnx]'``).

Modules: ``runtime`` (importing onnxruntime, or the error naming the extra), ``graph_io`` (the
graph's tensors as Triton sees them), ``config_check`` (the config against the graph at load),
``session_setup`` (session options and execution providers from the config), ``autocomplete``
(Triton's auto-complete from the graph, in the broker) with ``onnx_graph`` (the graph's inputs
and outputs read from the file's protobuf), ``feeds`` (batch inputs and outputs as ONNX
Runtime takes and gives them) and ``backend`` (the backend class).
"""
