"""The ``openvino`` backend (Triton's ``backend: "openvino"``): OpenVINO IR models
(``model.xml`` + ``model.bin``) and ONNX models read by OpenVINO (``default_model_filename:
"model.onnx"``), run on the CPU by the OpenVINO runtime. Optional: needs the ``openvino``
package (``pip install 'shoal[openvino]'``).

Modules: ``runtime`` (importing openvino, or the error naming the extra), ``element_types``
(OpenVINO element types as Triton data types), ``parameters`` (the config's ``parameters`` as
Triton's openvino backend reads them, turned into compile properties), ``threads`` (the default
inference thread count of an instance), ``model_setup`` (reading the model and fitting it to the
config: checks, element types, the batch dimension), ``infer`` (one inference over shared-memory
inputs and lent outputs), ``autocomplete`` (Triton's auto-complete, run by the broker in a
throw-away interpreter, ``autocomplete_main``) and ``backend`` (the backend class).
"""
