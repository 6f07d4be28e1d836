"""pb_utils refuses bad arguments as Triton's bindings do: a wrong argument type (None where a
list, array, name or message is due; a plain int as a log level) is a TypeError, a bad value
inside a right type (a list holding None, an empty tensor name) a TritonModelException."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shoal.workers.backends.python import pb_utils

ARRAY = np.asarray([1, 2], dtype=np.int32)


@pytest.mark.parametrize("call", [
    lambda: pb_utils.Tensor(None, ARRAY),
    lambda: pb_utils.Tensor("OUTPUT0", None),
    lambda: pb_utils.Tensor("", None),
    lambda: pb_utils.InferenceRequest(inputs=None, model_name="m",
                                      requested_output_names=[]),
    lambda: pb_utils.InferenceRequest(inputs=[], model_name="m",
                                      requested_output_names=None),
    lambda: pb_utils.InferenceRequest(inputs=[], model_name="m",
                                      requested_output_names=[None]),
    lambda: pb_utils.InferenceRequest(inputs=[], model_name=None, requested_output_names=[]),
    *(lambda k=k: pb_utils.InferenceRequest(inputs=[], model_name="m",
                                            requested_output_names=[], **{k: None})
      for k in ("correlation_id", "request_id", "model_version", "flags", "timeout")),
    lambda: pb_utils.InferenceResponse(output_tensors=None),
    lambda: pb_utils.Logger.log("message", None),
    lambda: pb_utils.Logger.log("message", 1),
    lambda: pb_utils.Logger.log_info(None),
    lambda: pb_utils.Logger.log_warn(None),
    lambda: pb_utils.Logger.log_error(None),
    lambda: pb_utils.Logger.log_verbose(None),
])
def test_wrong_argument_types_are_type_errors(call: Any) -> None:
    with pytest.raises(TypeError):
        call()


@pytest.mark.parametrize("call", [
    lambda: pb_utils.InferenceRequest(inputs=[None], model_name="m",
                                      requested_output_names=["o"]),
    lambda: pb_utils.InferenceResponse(output_tensors=[None]),
    lambda: pb_utils.Tensor.from_dlpack("OUTPUT0", None),
    lambda: pb_utils.Tensor.from_dlpack("", None),
    lambda: pb_utils.Tensor("", ARRAY),
])
def test_bad_values_are_model_exceptions(call: Any) -> None:
    with pytest.raises(pb_utils.TritonModelException):
        call()


def test_right_arguments_pass() -> None:
    pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name="m")
    pb_utils.InferenceResponse(output_tensors=[])
    pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", ARRAY)])
    pb_utils.Logger.log("level unspecified")
    pb_utils.Logger.log("verbose", pb_utils.Logger.VERBOSE)
    pb_utils.Logger.log("warning", pb_utils.Logger.LogLevel.WARNING)
    assert pb_utils.Logger.ERROR == 2  # the levels still compare as numbers


@pytest.mark.parametrize("left_out", ["inputs", "requested_output_names", "model_name"])
def test_a_bls_request_needs_its_inputs_outputs_and_model(left_out: str) -> None:
    """No default in Triton's bindings: leaving one out is a TypeError naming it."""
    given: dict[str, Any] = {"inputs": [], "requested_output_names": ["OUTPUT0"],
                             "model_name": "add_sub"}
    del given[left_out]
    with pytest.raises(TypeError, match=f"missing required argument '{left_out}'"):
        pb_utils.InferenceRequest(**given)
