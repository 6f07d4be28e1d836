"""Checks against the model's metadata, before anything is queued."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.core.decoded import DecodedInput, DecodedRequest, OutputRequest
from shoal.frontend.core.validation import check_bytes_framing, validate_request
from shoal.messages import ModelVersionInfo, TensorSpec
from tests.frontend.http.fakes import make_model


def tensor(name: str, datatype: str, shape: list[int], data: bytes | None = None) -> DecodedInput:
    count = int(np.prod(shape)) if shape else 1
    if data is None:
        data = b"\0" * (count * np.dtype(_NP[datatype]).itemsize)
    return DecodedInput(name, datatype, shape, memoryview(data), count)


_NP = {"FP32": np.float32, "INT32": np.int32, "FP16": np.float16, "INT64": np.int64,
       "BOOL": np.bool_, "UINT8": np.uint8}


def frame(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def error_of(request: DecodedRequest, model: ModelVersionInfo) -> str:
    with pytest.raises(ShoalError) as info:
        validate_request(request, model)
    assert info.value.code is ErrorCode.INVALID_ARG
    return info.value.message


NO_ID_TAG = "[request id: <id_unknown>] "


def core_error_of(request: DecodedRequest, model: ModelVersionInfo) -> str:
    """A message of one of Triton's core checks: it starts with the request's id, as there
    (``<id_unknown>`` without one); returned without it."""
    message = error_of(request, model)
    assert message.startswith(NO_ID_TAG), message
    return message[len(NO_ID_TAG):]


THREE = make_model("input_all_required", [TensorSpec(f"INPUT{i}", "FP32", [4]) for i in range(3)])
OPTIONAL = make_model("input_optional", [
    *[TensorSpec(f"INPUT{i}", "FP32", [4]) for i in range(3)],
    TensorSpec("INPUT3", "FP32", [4], optional=True)])
BATCHED = make_model("batched", [TensorSpec("A", "FP32", [-1, 4]), TensorSpec("B", "INT32", [2])],
                     max_batch_size=8)


def test_a_well_formed_request_passes_with_its_plan() -> None:
    request = DecodedRequest([tensor("A", "FP32", [3, 5, 4]), tensor("B", "INT32", [3, 2])])
    plan = validate_request(request, BATCHED)
    assert plan.batch_size == 3
    assert [o.name for o in plan.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert not plan.explicit_outputs


def test_missing_inputs_are_listed_as_triton_does() -> None:
    message = core_error_of(DecodedRequest([]), THREE)
    assert message == (
        "expected 3 inputs but got 0 inputs for model 'input_all_required'. Got input(s) [], "
        "but missing required input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all "
        "required input(s).")


def test_missing_inputs_with_optional_ones_give_the_range() -> None:
    message = core_error_of(DecodedRequest([tensor("INPUT1", "FP32", [4])]), OPTIONAL)
    assert message.startswith("expected number of inputs between 3 and 4 but got 1 inputs for "
                              "model 'input_optional'. Got input(s) ['INPUT1'], but missing "
                              "required input(s) ['INPUT0','INPUT2']")


def test_optional_inputs_may_be_left_out() -> None:
    inputs = [tensor(f"INPUT{i}", "FP32", [4]) for i in range(3)]
    assert validate_request(DecodedRequest(inputs), OPTIONAL).batch_size == 1


def test_unknown_input_is_named() -> None:
    inputs = [tensor(f"INPUT{i}", "FP32", [4]) for i in range(3)] + [tensor("BOGUS", "FP32", [4])]
    assert error_of(DecodedRequest(inputs), THREE) == \
        "unexpected inference input 'BOGUS' for model 'input_all_required'"


def test_duplicate_input_is_named() -> None:
    inputs = [tensor("INPUT0", "FP32", [4])] * 2 + [tensor("INPUT1", "FP32", [4])]
    assert core_error_of(DecodedRequest(inputs), THREE) == \
        "input 'INPUT0' already exists in request"


def test_datatype_must_equal_the_config() -> None:
    request = DecodedRequest([tensor("A", "INT32", [1, 1, 4]), tensor("B", "INT32", [1, 2])])
    assert core_error_of(request, BATCHED) == \
        "inference input 'A' data-type is 'INT32', but model 'batched' expects 'FP32'"


@pytest.mark.parametrize("shape", [[1, 4], [1, 2, 5], [1, 2, 4, 1]])
def test_shape_must_match_dims_with_wildcards(shape: list[int]) -> None:
    request = DecodedRequest([tensor("A", "FP32", shape), tensor("B", "INT32", [1, 2])])
    message = core_error_of(request, BATCHED)
    assert message.startswith(f"unexpected shape for input 'A' for model 'batched'. Expected "
                              f"[-1,-1,4], got [{','.join(map(str, shape))}].")
    assert "max_batch_size" in message


def test_shape_mismatch_without_batching_has_no_batch_note() -> None:
    message = error_of(DecodedRequest([tensor(f"INPUT{i}", "FP32", [5]) for i in range(3)]),
                       THREE)
    assert "Expected [4], got [5]." in message and "NOTE" not in message


def test_batch_over_max_batch_size() -> None:
    request = DecodedRequest([tensor("A", "FP32", [9, 1, 4]), tensor("B", "INT32", [9, 2])])
    assert core_error_of(request, BATCHED) == \
        "inference request batch-size must be <= 8 for 'batched'"


def test_batch_of_zero_is_rejected() -> None:
    request = DecodedRequest([tensor("A", "FP32", [0, 1, 4]), tensor("B", "INT32", [0, 2])])
    assert "batch-size must be >= 1 for 'batched'" in error_of(request, BATCHED)


def test_inputs_must_share_the_batch_size() -> None:
    request = DecodedRequest([tensor("A", "FP32", [2, 1, 4]), tensor("B", "INT32", [3, 2])])
    assert core_error_of(request, BATCHED) == \
        "input 'B' batch size does not match other inputs for 'batched'"


def test_batching_model_needs_a_batch_dimension() -> None:
    request = DecodedRequest([tensor("A", "FP32", []), tensor("B", "INT32", [1, 2])])
    assert "input 'A' has no shape but model requires batch dimension" in \
        error_of(request, BATCHED)


def test_byte_size_must_equal_the_shape() -> None:
    model = make_model("pt_identity", [TensorSpec("INPUT0", "FP32", [8])], max_batch_size=4)
    request = DecodedRequest([tensor("INPUT0", "FP32", [1, 8], b"\0" * 40)])
    assert core_error_of(request, model) == \
        "input byte size mismatch for input 'INPUT0' for model 'pt_identity'. Expected 32, got 40"


STRINGS = make_model("strings", [TensorSpec("S", "BYTES", [-1])])


def test_bytes_input_with_correct_framing_passes() -> None:
    request = DecodedRequest([DecodedInput("S", "BYTES", [3], memoryview(frame(b"a", b"", b"cd")),
                                           3)])
    assert validate_request(request, STRINGS).batch_size == 1


@pytest.mark.parametrize("data,needle", [
    (frame(b"a"), "expected 3 string elements for inference input 'S' for model 'strings', got 1"),
    (frame(b"a", b"b", b"c", b"d"),
     "unexpected number of string elements 4 for inference input 'S' for model 'strings', "
     "expecting 3"),
    (frame(b"a", b"b") + b"\x01\x00", "incomplete string length indicator for inference input "
                                      "'S'"),
    (frame(b"a", b"b") + struct.pack("<I", 10) + b"xy",
     "incomplete string data for inference input 'S'"),
])
def test_bytes_framing_errors_name_the_input(data: bytes, needle: str) -> None:
    request = DecodedRequest([DecodedInput("S", "BYTES", [3], memoryview(data), 3)])
    assert needle in error_of(request, STRINGS)


def test_framing_check_accepts_empty_tensor() -> None:
    check_bytes_framing(memoryview(b""), 0, "S", "m")


# ---------------------------------------------------------------- outputs


def _request_with_outputs(*outputs: OutputRequest, binary_default: bool = False) -> DecodedRequest:
    return DecodedRequest([tensor(f"INPUT{i}", "FP32", [4]) for i in range(3)],
                          list(outputs), binary_output_default=binary_default)


def test_requested_outputs_are_planned_in_request_order() -> None:
    plan = validate_request(_request_with_outputs(
        OutputRequest("OUTPUT2", binary=True), OutputRequest("OUTPUT0", classification=2)),
        THREE)
    assert plan.explicit_outputs
    assert [(o.name, o.binary, o.classification) for o in plan.outputs] == \
        [("OUTPUT2", True, 0), ("OUTPUT0", False, 2)]


def test_request_default_binary_applies_unless_the_output_overrides() -> None:
    plan = validate_request(_request_with_outputs(
        OutputRequest("OUTPUT0"), OutputRequest("OUTPUT1", binary=False), binary_default=True),
        THREE)
    assert [o.binary for o in plan.outputs] == [True, False]


def test_unknown_output_is_named() -> None:
    assert error_of(_request_with_outputs(OutputRequest("NOPE")), THREE) == \
        "unexpected inference output 'NOPE' for model 'input_all_required'"


def test_duplicate_output_is_rejected() -> None:
    request = _request_with_outputs(OutputRequest("OUTPUT0"), OutputRequest("OUTPUT0"))
    assert core_error_of(request, THREE) == \
        "output 'OUTPUT0' already exists in request"


HALF = make_model("half", [TensorSpec("X", "FP16", [2])])


def test_half_precision_output_as_json_is_left_to_the_answer() -> None:
    """Triton refuses FP16 as JSON only for an output the model produced (the response
    encoder does, tests/frontend/http/test_response.py): the request itself is valid."""
    for request in (DecodedRequest([tensor("X", "FP16", [2])]),
                    DecodedRequest([tensor("X", "FP16", [2])], [OutputRequest("OUTPUT0")])):
        plan = validate_request(request, HALF)
        assert [(o.name, o.datatype, o.binary) for o in plan.outputs] == \
            [("OUTPUT0", "FP16", False)]


def test_half_precision_output_as_binary_is_fine() -> None:
    request = DecodedRequest([tensor("X", "FP16", [2])], binary_output_default=True)
    assert validate_request(request, HALF).outputs[0].binary


def test_classification_of_bytes_output_is_refused() -> None:
    request = DecodedRequest(
        [DecodedInput("S", "BYTES", [1], memoryview(frame(b"a")), 1)],
        [OutputRequest("OUTPUT0", classification=1)])
    assert "class result not available for output 'OUTPUT0' due to unsupported type 'BYTES'" \
        in error_of(request, STRINGS)


# ---------------------------------------------------------------- per-model facts (kept)


def test_repeated_requests_meet_the_same_checks_as_the_first() -> None:
    """Validation keeps per-model facts and plans: the second request of each kind is judged
    (and refused) exactly as the first."""
    good = DecodedRequest([tensor(f"INPUT{i}", "FP32", [4]) for i in range(3)])
    duplicate = DecodedRequest([tensor("INPUT0", "FP32", [4]), tensor("INPUT0", "FP32", [4]),
                                tensor("INPUT1", "FP32", [4])])
    wrong_shape = DecodedRequest([tensor(f"INPUT{i}", "FP32", [4 + i]) for i in range(3)])
    for _ in range(2):
        assert [o.name for o in validate_request(good, THREE).outputs] == \
            ["OUTPUT0", "OUTPUT1", "OUTPUT2"]
        assert core_error_of(duplicate, THREE) == \
            "input 'INPUT0' already exists in request"
        assert core_error_of(wrong_shape, THREE).startswith(
            "unexpected shape for input 'INPUT1' for model 'input_all_required'. Expected [4], "
            "got [5]. ")
        assert not validate_request(DecodedRequest([tensor("X", "FP16", [2])]),
                                    HALF).outputs[0].binary


def test_every_input_named_once_with_an_unknown_one_is_still_refused() -> None:
    request = DecodedRequest([tensor("INPUT0", "FP32", [4]), tensor("INPUT1", "FP32", [4]),
                              tensor("OTHER", "FP32", [4])])
    assert error_of(request, THREE) == \
        "unexpected inference input 'OTHER' for model 'input_all_required'"


def test_a_model_replaced_under_the_same_name_is_validated_against_its_new_metadata() -> None:
    old = make_model("swap", [TensorSpec("A", "FP32", [4])])
    new = make_model("swap", [TensorSpec("B", "FP32", [4])])
    assert validate_request(DecodedRequest([tensor("A", "FP32", [4])]), old).outputs[0].name == \
        "OUTPUT0"
    assert error_of(DecodedRequest([tensor("A", "FP32", [4])]), new) == \
        "unexpected inference input 'A' for model 'swap'"


def test_named_output_plans_follow_binary_data_and_the_default() -> None:
    for binary_default in (False, True, False):
        plan = validate_request(_request_with_outputs(
            OutputRequest("OUTPUT0"), OutputRequest("OUTPUT1", binary=True),
            OutputRequest("OUTPUT2", binary=False), binary_default=binary_default), THREE)
        assert [(o.name, o.binary) for o in plan.outputs] == \
            [("OUTPUT0", binary_default), ("OUTPUT1", True), ("OUTPUT2", False)]
    request = DecodedRequest([tensor("X", "FP16", [2])], [OutputRequest("OUTPUT0")])
    for _ in range(2):
        assert not validate_request(request, HALF).outputs[0].binary


def test_an_output_with_parameters_keeps_its_own_plan() -> None:
    request = _request_with_outputs(OutputRequest("OUTPUT0", binary=True, parameters={"k": 1}))
    plan = validate_request(request, THREE)
    assert plan.outputs[0].parameters == {"k": 1}
    assert validate_request(_request_with_outputs(OutputRequest("OUTPUT0", binary=True)),
                            THREE).outputs[0].parameters == {}


def test_core_messages_name_the_request_id() -> None:
    inputs = [tensor("INPUT0", "FP32", [4])] * 2 + [tensor("INPUT1", "FP32", [4])]
    assert error_of(DecodedRequest(inputs, client_id="42"), THREE) == \
        "[request id: 42] input 'INPUT0' already exists in request"
    unknown = [tensor("NOPE", "FP32", [4])]  # Triton writes this one without the id
    assert error_of(DecodedRequest(unknown, client_id="42"), THREE) == \
        "unexpected inference input 'NOPE' for model 'input_all_required'"


def test_an_empty_batch_is_refused_after_the_shape_check_as_in_triton() -> None:
    no_batch_dim = DecodedRequest([tensor("A", "FP32", [0]), tensor("B", "INT32", [0])])
    assert core_error_of(no_batch_dim, BATCHED).startswith(
        "unexpected shape for input 'A' for model 'batched'. Expected [-1,-1,4], got [0]. ")
    empty = DecodedRequest([tensor("A", "FP32", [0, 1, 4]), tensor("B", "INT32", [0, 2])])
    assert core_error_of(empty, BATCHED) == "inference request batch-size must be >= 1 for " \
        "'batched'"
